//! Storage for free: uploads need an account with money at stake (a bound key and an open tab,
//! or a session key) and count against its quota; a refusal writes nothing.

use crate::door::Door;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine as _;
use cx_exchange_server::Error;
use cx_exchange_server::books::{Content, StoredAdapter, Upload};
use cx_protocol::access::Scope;
use cx_protocol::order::{self, SigningKey};
use serde_json::{Value, json};

fn adapter_files(seed: u8) -> (String, Vec<u8>, Value) {
    let data: Vec<u8> = (0..64u8).map(|b| b.wrapping_add(seed)).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4, 4], &data).unwrap();
    let weights = safetensors::serialize(
        [(
            "base_model.model.layers.0.self_attn.q_proj.lora_A.weight",
            view,
        )],
        None,
    )
    .unwrap();
    let config = r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}"#
        .to_owned();
    let files = json!({
        "adapter_config": config,
        "adapter_model_safetensors_base64": base64::engine::general_purpose::STANDARD.encode(&weights),
    });
    (config, weights, files)
}

async fn put(door: &Door, files: &Value, authorization: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::put("/v1/adapters").header(header::CONTENT_TYPE, "application/json");
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    door.call(request.body(Body::from(files.to_string())).unwrap())
        .await
}

#[tokio::test]
async fn storing_needs_a_bound_account_with_an_open_tab_and_writes_nothing_when_refused() {
    let door = Door::new().await;
    let (_, _, files) = adapter_files(1);
    let (status, body) = put(&door, &files, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // A stranger's own, valid credential: no bound key, no tab, nothing at stake.
    let stranger = SigningKey::from_slice(&[79; 32]).unwrap();
    let theirs = crate::common::credential(door.intake(), &stranger, Scope::Store);
    let (status, body) = put(&door, &files, Some(&theirs)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "store_forbidden", "{body}");
    // A read credential does not store, nor does a provider's token without a training job.
    let read = door.credential(Scope::Read);
    let (status, _) = put(&door, &files, Some(&read)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(door.count("exchange_adapters").await, 0);
    assert_eq!(door.count("exchange_content_owners").await, 0);
    // The buyer (bound, tab open) stores it and owns it.
    let (status, stored) = put(&door, &files, Some(&door.credential(Scope::Store))).await;
    assert_eq!(status, StatusCode::CREATED, "{stored}");
    let id = stored["id"].as_str().unwrap();
    assert!(
        door.books
            .owns(Content::Adapter, id, order::account_of(&door.key))
            .await
            .unwrap()
    );
    assert!(
        !door
            .books
            .owns(Content::Adapter, id, order::account_of(&stranger))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn an_account_cannot_store_past_its_quota_and_a_refusal_writes_nothing() {
    let door = Door::new().await;
    let account = order::account_of(&door.key);
    let adapter = |seed: u8| {
        let (config, weights, _) = adapter_files(seed);
        StoredAdapter {
            config: config.into_bytes(),
            weights,
        }
    };
    let (a, b) = (adapter(1), adapter(2));
    let size = (a.config.len() + a.weights.len()) as u64;
    let quota = size + size / 2;
    let id = |n: u8| format!("{n:02x}").repeat(32);
    assert!(
        door.books
            .store(&id(1), Upload::Adapter(&a), &[account], quota)
            .await
            .unwrap()
    );
    // The same content again costs nothing more.
    assert!(
        !door
            .books
            .store(&id(1), Upload::Adapter(&a), &[account], quota)
            .await
            .unwrap()
    );
    match door
        .books
        .store(&id(2), Upload::Adapter(&b), &[account], quota)
        .await
    {
        Err(Error::StoreQuota {
            used,
            bytes,
            quota: q,
        }) => {
            assert_eq!((used, bytes, q), (size, size, quota));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(door.books.adapter(&id(2)).await.unwrap(), None);
    assert_eq!(door.count("exchange_adapters").await, 1);
    assert_eq!(door.count("exchange_content_owners").await, 1);
}
