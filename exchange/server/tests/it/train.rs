//! Train orders on a real PostgreSQL: a dataset is stored by its content id, a train intent
//! (`cx/train/<base>`) is cleared onto the one bundle that trains on the base, the provider
//! reads the dataset (no one else may), stores the adapter it trained and returns a receipt
//! naming it; the exchange checks the stored adapter is the LoRA ordered before the job is
//! done. Every refusal names its field and writes nothing.

use crate::door::{Door, domain, now_s};
use alloy::primitives::{Address, B256};
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine as _;
use cx_protocol::offer::{Offer, SignedOffer};
use cx_protocol::order::{self, Intent};
use cx_protocol::pq::Identity;
use cx_protocol::receipt::{Receipt, SignedReceipt};
use cx_protocol::train::{Dataset, TrainRequest, dataset_id, train_market};
use cx_protocol::{Bundle, DeterminismClass, Tier};
use serde_json::{Value, json};

const PAYOUT: Address = Address::repeat_byte(0x78);
const TOKEN: &str = "train-provider-token";
const BASE: &str = "llama-3.1-8b-instruct";

fn dataset() -> Vec<u8> {
    let data = Dataset {
        sequences: (0..4u32).map(|i| vec![256, 97 + i, 65 + i]).collect(),
        loss_mask: vec![vec![0.0, 0.0, 1.0]; 4],
    };
    serde_json::to_vec(&data).unwrap()
}

fn bundle(id: &str, tiers: Value, classes: Value, bases: Value) -> Bundle {
    serde_json::from_value(json!({
        "id": id, "provider": "op-t", "price_wei_per_s": "1000000",
        "memory_bytes": 80_000_000_000u64, "bandwidth_bps": 1e10, "rtt_s": 0.01,
        "flops_per_s": 1e14, "context_max": 4096, "determinism": classes,
        "tiers": tiers, "resident_bases": bases,
    }))
    .unwrap()
}

/// A provider with a training bundle for the base, and an inference bundle holding the base
/// (which must not take train orders).
async fn provider(door: &Door) -> Identity {
    let id = Identity::from_seed([23; 32]);
    let offer = Offer {
        operator: "op-t".into(),
        payout: PAYOUT,
        bundles: vec![
            bundle(
                "trainer",
                json!(["T0"]),
                json!(["S"]),
                json!([train_market(BASE)]),
            ),
            bundle(
                "infer",
                json!(["T0", "T1"]),
                json!(["D", "S"]),
                json!([BASE]),
            ),
        ],
        token_hash: Offer::token_hash_of(TOKEN.as_bytes()),
        issued_at_s: now_s(),
        residency: None,
        search_trials_per_s: None,
    };
    let signed = serde_json::to_value(SignedOffer::sign(offer, &id).unwrap()).unwrap();
    let (status, body) = door.post("/v1/providers/register", None, &signed).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    id
}

async fn put_dataset(door: &Door, body: &[u8], content_type: &str) -> (StatusCode, Value) {
    door.call(
        Request::put("/v1/datasets")
            .header(header::CONTENT_TYPE, content_type)
            .header(
                header::AUTHORIZATION,
                door.credential(cx_protocol::access::Scope::Store),
            )
            .body(Body::from(body.to_vec()))
            .unwrap(),
    )
    .await
}

async fn get_dataset(door: &Door, id: &str, bearer: Option<&str>) -> (StatusCode, String) {
    let mut request = Request::get(format!("/v1/datasets/{id}"));
    if let Some(token) = bearer {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    door.text(request.body(Body::empty()).unwrap()).await
}

fn request(data: &str) -> TrainRequest {
    let mut r = TrainRequest::example(data);
    r.steps = 10;
    r.batch_size = 2;
    r
}

fn intent(r: &TrainRequest, nonce: u64, change: impl FnOnce(&mut Intent)) -> Intent {
    let mut intent = Intent {
        want: train_market(BASE),
        adapter_id: None,
        request_hash: r.hash(),
        deadline_s: now_s() + 120,
        max_price_wei: 1_000_000_000,
        market_limit: false,
        min_tier: Tier::T0,
        determinism: DeterminismClass::S,
        tab_id: 3,
        nonce,
        expiry_s: now_s() + 120,
    };
    change(&mut intent);
    intent
}

async fn submit(door: &Door, intent: Intent, body: Value) -> (StatusCode, Value) {
    let signed = order::sign(intent, &domain(), &door.key, &door.pq).unwrap();
    let mut body = body;
    body["intent"] = serde_json::to_value(&signed).unwrap();
    door.post("/v1/intents", None, &body).await
}

/// PEFT's config of `r`'s LoRA on `base`, and an (empty) safetensors file: what the store keeps.
fn adapter(r: &TrainRequest, base: &str, rank: u32) -> (String, Vec<u8>) {
    let config = json!({
        "peft_type": "LORA", "r": rank, "lora_alpha": r.lora.lora_alpha,
        "use_rslora": r.lora.use_rslora, "target_modules": r.lora.target_modules,
        "base_model_name_or_path": base,
    })
    .to_string();
    let weights =
        safetensors::serialize(Vec::<(&str, safetensors::tensor::TensorView)>::new(), None)
            .unwrap();
    (config, weights)
}

/// Stores an adapter as the provider that trained it, with its dispatch token (its training
/// job running: the buyer owns what it stores).
async fn store_adapter(door: &Door, config: &str, weights: &[u8]) -> String {
    let body = json!({
        "adapter_config": config,
        "adapter_model_safetensors_base64": base64::engine::general_purpose::STANDARD.encode(weights),
    });
    let (status, stored) = door
        .call(
            Request::put("/v1/adapters")
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await;
    assert!(status.is_success(), "{stored}");
    stored["id"].as_str().unwrap().to_owned()
}

/// The result for pulled job `job` naming adapter `adapter_id`, with a receipt for `tokens`.
async fn result(
    door: &Door,
    prov: &Identity,
    job: &Value,
    adapter_id: &str,
    tokens: u64,
) -> (StatusCode, Value) {
    let job_id: B256 = job["job_id"].as_str().unwrap().parse().unwrap();
    let buyer: Address = job["buyer"].as_str().unwrap().parse().unwrap();
    let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
    let mut output_hash = [0u8; 32];
    hex::decode_to_slice(adapter_id, &mut output_hash).unwrap();
    let receipt = SignedReceipt::sign(
        Receipt {
            job_id: job_id.0,
            chain_id: job["chain_id"].as_u64().unwrap(),
            escrow_id: job["escrow_id"].as_u64().unwrap(),
            input_hash: order::request_value_hash(&job["train"]).0,
            output_hash,
            adapter_hash: [0; 32],
            tokens,
            compute_ms: 40,
            class: DeterminismClass::S,
            provider: PAYOUT.0.0,
            provider_key: prov.id().0,
            amount_owed_wei: price,
            buyer: buyer.0.0,
        },
        prov,
    )
    .unwrap();
    let output = json!({
        "text": "", "finish_reason": "trained", "prompt_tokens": 0, "completion_tokens": 0,
        "trained": {"adapter_id": adapter_id, "steps": 10, "loss_first": 5.1, "loss_last": 0.2},
    });
    door.post(
        &format!("/v1/jobs/{job_id}/result"),
        Some(TOKEN),
        &json!({"output": output, "receipt": receipt}),
    )
    .await
}

#[tokio::test]
async fn a_train_order_is_cleared_on_a_trainer_and_done_when_its_adapter_is_stored() {
    let door = Door::new().await;
    let prov = provider(&door).await;
    let file = dataset();
    let (status, stored) = put_dataset(&door, &file, "application/json").await;
    assert_eq!(status, StatusCode::CREATED, "{stored}");
    let data = dataset_id(&file);
    assert_eq!(stored["id"], data.as_str());
    assert_eq!(
        (stored["sequences"].as_u64(), stored["tokens"].as_u64()),
        (Some(4), Some(12))
    );
    let (status, again) = put_dataset(&door, &file, "application/json").await;
    assert_eq!((status, &again["created"]), (StatusCode::OK, &json!(false)));

    let r = request(&data);
    let (status, accepted) = submit(&door, intent(&r, 1, |_| {}), json!({"train": r})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(accepted["bundle_id"], "trainer");
    assert_eq!(accepted["tier"], "T0");
    // 10 steps × 2 sequences × 3 tokens at 6 FLOPs per parameter and token (8.03e9 params),
    // at 1e14 FLOP/s and 1e6 wei/s.
    let held: u128 = accepted["held_wei"].as_str().unwrap().parse().unwrap();
    assert!(held > 0 && held < 1_000_000_000, "{held}");

    // Nobody but the provider running the job reads the data.
    assert_eq!(
        get_dataset(&door, &data, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, pulled) = door
        .post(
            "/v1/providers/jobs",
            Some(TOKEN),
            &json!({"max_jobs": 4, "wait_s": 5}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{pulled}");
    let job = pulled["jobs"][0].clone();
    assert_eq!(job["model"], train_market(BASE));
    assert_eq!(job["train"], serde_json::to_value(&r).unwrap());
    let (status, body) = get_dataset(&door, &data, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body.as_bytes(),
        &file[..],
        "the bytes as stored, so their id checks"
    );
    let (status, _) = get_dataset(&door, &"ab".repeat(32), Some(TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // An adapter the store lacks, a LoRA other than the one ordered, or the wrong token count
    // are refused; the job stays running.
    let (config, weights) = adapter(&r, BASE, r.lora.rank);
    let right = cx_protocol::content_id(&[
        ("adapter_config.json", config.as_bytes()),
        ("adapter_model.safetensors", &weights),
    ]);
    let (status, refused) = result(&door, &prov, &job, &right, 60).await;
    assert_eq!(status.as_u16() / 100, 4, "{refused}");
    assert_eq!(
        refused["error"]["field"], "output.trained.adapter_id",
        "{refused}"
    );
    let (wrong_config, wrong_weights) = adapter(&r, BASE, 4);
    let wrong = store_adapter(&door, &wrong_config, &wrong_weights).await;
    let (status, refused) = result(&door, &prov, &job, &wrong, 60).await;
    assert_eq!(status.as_u16() / 100, 4, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains(" r "),
        "{refused}"
    );
    assert_eq!(store_adapter(&door, &config, &weights).await, right);
    let (status, refused) = result(&door, &prov, &job, &right, 59).await;
    assert_eq!(status.as_u16() / 100, 4, "{refused}");
    assert_eq!(
        refused["error"]["field"], "receipt.receipt.tokens",
        "{refused}"
    );
    assert_eq!(door.count("exchange_receipts").await, 0);

    let (status, done) = result(&door, &prov, &job, &right, 60).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["charged_wei"], held.to_string());
    let (status, record) = door
        .read(&format!("/v1/jobs/{}", job["job_id"].as_str().unwrap()))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(record["status"], "done");
    assert_eq!(record["result"]["trained"]["adapter_id"], right.as_str());
    // The explorer's job page names the adapter it trained.
    let (status, page) = door
        .text(
            Request::get(format!(
                "/explorer/jobs/{}",
                job["job_id"].as_str().unwrap()
            ))
            .body(Body::empty())
            .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("id=\"trained-adapter\""), "{page}");
    assert!(page.contains(&right), "the page names the adapter");
    // It settles as any intent: the buyer signed the train request's hash, the receipt names
    // it as its input and the adapter as its output.
    let paid = door.books.paid_jobs(31337, 3).await.unwrap();
    assert_eq!((paid.len(), paid[0].charged_wei), (1, held));
    // The job's data is no longer readable once it has ended.
    assert_eq!(
        get_dataset(&door, &data, Some(TOKEN)).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn bad_datasets_and_train_orders_are_refused_by_field_and_write_nothing() {
    let door = Door::new().await;
    provider(&door).await;
    for (body, field) in [
        (&b"[1, 2]"[..], "dataset"),
        (
            br#"{"sequences": [[1]], "loss_mask": [[0]]}"#,
            "sequences[0]",
        ),
        (
            br#"{"sequences": [[1, 2]], "loss_mask": [[1, 1]]}"#,
            "loss_mask[0]",
        ),
        (
            br#"{"sequences": [[1, 2]], "loss_mask": [[0, 0]]}"#,
            "loss_mask",
        ),
        (
            br#"{"sequences": [[1, 2]], "loss_mask": [[0, 1]], "epochs": 2}"#,
            "dataset",
        ),
    ] {
        let (status, answer) = put_dataset(&door, body, "application/json").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    let (status, _) = put_dataset(&door, &dataset(), "text/plain").await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(door.count("exchange_datasets").await, 0);
    let (status, answer) = get_dataset(&door, "nothex", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");

    let file = dataset();
    let data = dataset_id(&file);
    let r = request(&data);
    // Not stored yet: the order names no dataset.
    let (status, answer) = submit(&door, intent(&r, 1, |_| {}), json!({"train": r})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(answer["error"]["field"], "train.data", "{answer}");
    assert_eq!(
        put_dataset(&door, &file, "application/json").await.0,
        StatusCode::CREATED
    );
    let zero_steps = TrainRequest {
        steps: 0,
        ..r.clone()
    };
    let mut big_rank = r.clone();
    big_rank.lora.rank = 1_000;
    let mut nan_lr = r.clone();
    nan_lr.optimizer.lr = f64::NAN;
    let cases: Vec<(Intent, Value, &str)> = vec![
        (
            intent(&zero_steps, 2, |_| {}),
            json!({"train": zero_steps}),
            "train.steps",
        ),
        (
            intent(&big_rank, 3, |_| {}),
            json!({"train": big_rank}),
            "train.lora.rank",
        ),
        (
            intent(&r, 4, |i| i.min_tier = Tier::T1),
            json!({"train": r}),
            "min_tier",
        ),
        (
            intent(&r, 5, |i| i.determinism = DeterminismClass::D),
            json!({"train": r}),
            "determinism",
        ),
        (
            intent(&r, 6, |i| i.want = BASE.into()),
            json!({"train": r}),
            "want",
        ),
        (
            intent(&r, 7, |i| i.adapter_id = Some(B256::repeat_byte(1))),
            json!({"train": r}),
            "adapter_id",
        ),
        (
            intent(&r, 8, |_| {}),
            json!({"train": r, "request": {"prompt": "x", "max_tokens": 1}}),
            "train",
        ),
    ];
    for (intent, body, field) in cases {
        let (status, answer) = submit(&door, intent, body.clone()).await;
        assert!(status.is_client_error(), "{body}: {answer}");
        let named = answer["error"]["field"].as_str().unwrap_or_default();
        assert!(named.ends_with(field), "{field}: {answer}");
    }
    // NaN does not survive JSON: the body is refused before any field is read.
    let (status, answer) =
        submit(&door, intent(&nan_lr, 9, |_| {}), json!({"train": nan_lr})).await;
    assert!(status.is_client_error(), "{answer}");
    // A request other than the one signed.
    let other = TrainRequest {
        steps: 11,
        ..r.clone()
    };
    let (status, answer) = submit(&door, intent(&r, 10, |_| {}), json!({"train": other})).await;
    assert!(status.is_client_error(), "{answer}");
    assert_eq!(door.count("exchange_jobs").await, 0);
    assert_eq!(door.count("exchange_orders").await, 0);
    assert_eq!(door.held().await, 0);
    // A refused order spent no nonce: the same nonce goes through once the order is right.
    let (status, answer) = submit(&door, intent(&r, 2, |_| {}), json!({"train": r})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
}

#[tokio::test]
async fn a_job_its_provider_gives_up_is_refunded_at_once_with_the_reason() {
    let door = Door::new().await;
    provider(&door).await;
    let file = dataset();
    assert_eq!(
        put_dataset(&door, &file, "application/json").await.0,
        StatusCode::CREATED
    );
    let r = request(&dataset_id(&file));
    let (status, accepted) = submit(&door, intent(&r, 1, |_| {}), json!({"train": r})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert!(door.held().await > 0);
    let id = accepted["job_id"].as_str().unwrap().to_owned();
    let path = format!("/v1/jobs/{id}/release");
    let reason = json!({"reason": "residency cache full: 1066368 bytes needed"});
    // Only the provider it is assigned to may give it up, with a bounded reason.
    let (status, _) = door.post(&path, None, &reason).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, answer) = door
        .post(&path, Some(TOKEN), &json!({"reason": "x".repeat(2000)}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["field"], "reason");
    let (status, answer) = door
        .post(
            &format!("/v1/jobs/{}/release", B256::repeat_byte(9)),
            Some(TOKEN),
            &reason,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert!(door.held().await > 0, "refusals change nothing");

    // The one bundle that trains on the base gave it up: no other takes it, so it is refunded
    // now, not at its deadline, and the buyer reads why.
    let (status, released) = door.post(&path, Some(TOKEN), &reason).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["moved_to"], Value::Null);
    assert_eq!(door.held().await, 0);
    let (_, record) = door.read(&format!("/v1/jobs/{id}")).await;
    assert_eq!(record["status"], "refunded", "{record}");
    let events: Vec<&Value> = record["events"].as_array().unwrap().iter().collect();
    let released = events.iter().find(|e| e["status"] == "released").unwrap();
    assert_eq!(released["detail"]["reason"], reason["reason"]);
    // Once ended it is not released again.
    assert_eq!(
        door.post(&path, Some(TOKEN), &reason).await.0,
        StatusCode::NOT_FOUND
    );
}

/// A job its provider gives up moves to another operator's bundle when one can take it, never
/// back to the one that gave it up: the second trainer (dearer) pulls it.
#[tokio::test]
async fn a_released_job_moves_to_another_operators_bundle() {
    let door = Door::new().await;
    provider(&door).await;
    let other = Identity::from_seed([24; 32]);
    let token = "train-provider-token-2";
    let mut dearer = bundle(
        "trainer-2",
        json!(["T0"]),
        json!(["S"]),
        json!([train_market(BASE)]),
    );
    dearer.provider = "op-u".into();
    dearer.price_wei_per_s = 2_000_000;
    let offer = Offer {
        operator: "op-u".into(),
        payout: Address::repeat_byte(0x79),
        bundles: vec![dearer],
        token_hash: Offer::token_hash_of(token.as_bytes()),
        issued_at_s: now_s(),
        residency: None,
        search_trials_per_s: None,
    };
    let signed = serde_json::to_value(SignedOffer::sign(offer, &other).unwrap()).unwrap();
    let (status, body) = door.post("/v1/providers/register", None, &signed).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let file = dataset();
    assert_eq!(
        put_dataset(&door, &file, "application/json").await.0,
        StatusCode::CREATED
    );
    let r = request(&dataset_id(&file));
    let (status, accepted) = submit(&door, intent(&r, 1, |_| {}), json!({"train": r})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(accepted["bundle_id"], "trainer", "the cheaper one first");
    let held: u128 = accepted["held_wei"].as_str().unwrap().parse().unwrap();
    let id = accepted["job_id"].as_str().unwrap().to_owned();
    let (status, released) = door
        .post(
            &format!("/v1/jobs/{id}/release"),
            Some(TOKEN),
            &json!({"reason": "out of memory"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["moved_to"], "trainer-2");
    // At the dearer bundle's price, within the buyer's limit.
    assert_eq!(door.held().await, 2 * held);
    let (status, pulled) = door
        .post(
            "/v1/providers/jobs",
            Some(token),
            &json!({"max_jobs": 4, "wait_s": 5}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{pulled}");
    assert_eq!(pulled["jobs"][0]["job_id"], id.as_str());
}
