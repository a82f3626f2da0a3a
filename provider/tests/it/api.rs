//! The API's description and its door: `/openapi.json` valid (checked by an implementation we
//! did not write) and naming exactly the routes served; the per-IP rate (429 with
//! `Retry-After`, nothing done for the refused request); the bound on requests in flight (503
//! `overloaded` at once, `/health` and `/metrics` still answering); unknown fields refused by
//! name.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode, header};
use cx_provider::server::HttpLimits;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::http::{assert_error_shape, call, call_json, model_ids, server, server_with_limits};

/// A request from `peer`, as the accept loop tags it.
async fn call_from(
    app: &Router,
    peer: &str,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> Response<Body> {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let peer: SocketAddr = peer.parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    app.clone().oneshot(request).await.unwrap()
}

async fn json_of(response: Response<Body>) -> Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_valid_and_names_every_route() {
    let s = server("openapi", 64);
    let (status, bytes) = call(&s.app, "GET", "/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");

    // Every documented operation is routed: none falls through to the 404 of no route or to
    // a 405 (training is off on this fixture: its routes answer 503 `training_off`).
    let paths = doc["paths"].as_object().unwrap();
    let mut operations = 0;
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            let uri = path.replace("{id}", "no-such-client");
            let body = matches!(method.as_str(), "post" | "put").then(|| json!({}));
            let (status, bytes) = call(&s.app, &method.to_uppercase(), &uri, body).await;
            let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert_ne!(
                answer["error"]["code"], "not_found",
                "{method} {path}: not routed"
            );
            operations += 1;
        }
    }
    // The routes of `server::app`, each once.
    assert_eq!(operations, 18, "{:?}", paths.keys().collect::<Vec<_>>());
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["LoadLoraRequest"]["required"],
        json!(["lora_name", "lora_path"])
    );
    assert_eq!(
        schemas["CompletionRequest"]["properties"]["best_of"]["const"], 1,
        "the neutral-only parameters are documented with their one value"
    );
    let too_many = &doc["paths"]["/v1/completions"]["post"]["responses"]["429"];
    assert!(too_many["headers"]["Retry-After"].is_object(), "{too_many}");

    // An implementation we did not write checks it against the OpenAPI specification.
    let path =
        std::env::temp_dir().join(format!("cx-provider-openapi-{}.json", std::process::id()));
    std::fs::write(&path, doc.to_string()).unwrap();
    let validator = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../.tools/py/bin/openapi-spec-validator"
    );
    let out = std::process::Command::new(validator)
        .arg(&path)
        .output()
        .expect("openapi-spec-validator in the project's virtualenv (scripts/setup.sh)");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_rate_per_ip_is_a_429_with_retry_after_and_nothing_is_done() {
    let s = server_with_limits(
        "rate",
        HttpLimits {
            rate_per_ip_s: 1,
            rate_burst_ip: 2,
            max_in_flight: 0,
        },
    );
    let a = "10.0.0.1:5000";
    for _ in 0..2 {
        let response = call_from(&s.app, a, "GET", "/v1/models", None).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    // The third in the same second: refused before its body is read.
    let adapter = s.dir.path().join("adapters/adapter-1");
    let response = call_from(
        &s.app,
        a,
        "POST",
        "/v1/load_lora_adapter",
        Some(json!({"lora_name": "refused", "lora_path": adapter})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        retry_after, 1,
        "whole seconds, rounded up, at a rate of 1/s"
    );
    let body = json_of(response).await;
    assert_error_shape(&body, "rate_limited");
    // Another address has its own bucket; it sees that nothing was loaded.
    let response = call_from(&s.app, "10.0.0.2:5000", "GET", "/v1/models", None).await;
    assert_eq!(response.status(), StatusCode::OK);
    let ids: Vec<String> = json_of(response).await["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert!(!ids.contains(&"refused".to_string()), "{ids:?}");
    // After the wait it says, the same address is served again.
    tokio::time::sleep(std::time::Duration::from_secs(retry_after)).await;
    let response = call_from(
        &s.app,
        a,
        "POST",
        "/v1/load_lora_adapter",
        Some(json!({"lora_name": "admitted", "lora_path": adapter})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(model_ids(&s.app).await.contains(&"admitted".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_in_flight_is_a_503_overloaded_at_once_and_health_still_answers() {
    let s = server_with_limits(
        "in-flight",
        HttpLimits {
            max_in_flight: 1,
            ..HttpLimits::off()
        },
    );
    // A stream holds its slot until its body is done or dropped: this one is never read.
    let held = call_from(
        &s.app,
        "10.0.0.1:5000",
        "POST",
        "/v1/completions",
        Some(json!({"model": "tiny", "prompt": "hold", "max_tokens": 32, "stream": true})),
    )
    .await;
    assert_eq!(held.status(), StatusCode::OK);
    let started = std::time::Instant::now();
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_error_shape(&body, "overloaded");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "shed, not queued"
    );
    let response = call_from(&s.app, "10.0.0.1:5000", "GET", "/v1/models", None).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    // Watching an overloaded server keeps working.
    for uri in ["/health", "/metrics"] {
        let (status, _) = call(&s.app, "GET", uri, None).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
    }
    // The stream read to its end frees the slot.
    let bytes = held.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&bytes).contains("[DONE]"));
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_field_is_still_refused_by_name() {
    let s = server("refuse", 64);
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "best_of": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error_shape(&body, "unsupported_parameter");
    assert_eq!(body["error"]["field"], "best_of");
    for (uri, request) in [
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "frobnicate": 1}),
        ),
        (
            "/v1/unload_lora_adapter",
            json!({"lora_name": "adapter-0", "frobnicate": 1}),
        ),
    ] {
        let (status, body) = call_json(&s.app, uri, request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("`frobnicate`"),
            "{uri}: {body}"
        );
    }
    // The refused unload did nothing.
    assert!(model_ids(&s.app).await.contains(&"adapter-0".to_string()));
}
