//! The router and the error shape, driven with `oneshot` (no socket).

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{Request, StatusCode, header};
use axum::routing::post;
use cx_exchange_server::api::{ApiError, AppJson, AppState, app};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tower::ServiceExt;

async fn call(router: Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = router.oneshot(request).await.expect("router answers");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "the body is JSON, got {:?}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, body)
}

fn post_json(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Order {
    #[allow(dead_code)]
    max_price_wei: u64,
    #[allow(dead_code)]
    inner: Inner,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Inner {
    #[allow(dead_code)]
    deadline_s: u32,
}

/// A router with one JSON route, to exercise the extractor as handlers will use it.
fn echo() -> Router {
    async fn take(AppJson(order): AppJson<Order>) -> AppJson<Value> {
        AppJson(json!({ "max_price_wei": order.max_price_wei }))
    }
    async fn fail() -> Result<(), ApiError> {
        Err(ApiError::Internal(
            "connection to postgres://secret@db refused".into(),
        ))
    }
    Router::new()
        .route("/order", post(take))
        .route("/fail", post(fail))
        .layer(DefaultBodyLimit::max(256))
}

#[tokio::test]
async fn healthz_answers_ok_with_the_version() {
    let (status, body) = call(
        app(AppState::new()),
        Request::get("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn unknown_route_is_a_json_404_and_wrong_method_a_json_405() {
    let (status, body) = call(
        app(AppState::new()),
        Request::get("/nope").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");

    let (status, body) = call(
        app(AppState::new()),
        Request::post("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["error"]["code"], "method_not_allowed");
}

#[tokio::test]
async fn a_good_body_is_taken() {
    let (status, body) = call(
        echo(),
        post_json(
            "/order",
            r#"{"max_price_wei": 7, "inner": {"deadline_s": 3}}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["max_price_wei"], 7);
}

#[tokio::test]
async fn a_wrong_value_names_its_field() {
    let (status, body) = call(
        echo(),
        post_json(
            "/order",
            r#"{"max_price_wei": 7, "inner": {"deadline_s": -1}}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "invalid_field");
    assert_eq!(body["error"]["field"], "inner.deadline_s");

    let (status, body) = call(
        echo(),
        post_json("/order", r#"{"inner": {"deadline_s": 1}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_price_wei"),
        "{body}"
    );

    let (status, body) = call(
        echo(),
        post_json(
            "/order",
            r#"{"max_price_wei": 7, "inner": {"deadline_s": 1}, "max_price_per_hour": 1.5}"#,
        ),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an unknown field is refused, never ignored"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_price_per_hour"),
        "{body}"
    );
}

#[tokio::test]
async fn malformed_bodies_get_our_shape_not_axums_text() {
    for text in [
        "{",
        "not json",
        r#"{"max_price_wei": 7, "inner": {"deadline_s": 3}} trailing"#,
    ] {
        let (status, body) = call(echo(), post_json("/order", text)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert_eq!(body["error"]["code"], "malformed_json", "{text}");
        assert!(body["error"]["field"].is_null());
    }
}

#[tokio::test]
async fn a_body_without_json_content_type_is_415() {
    let request = Request::post("/order")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(r#"{"max_price_wei": 7}"#))
        .unwrap();
    let (status, body) = call(echo(), request).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(body["error"]["code"], "unsupported_media_type");
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let big = format!(r#"{{"max_price_wei": 7, "pad": "{}"}}"#, "x".repeat(1024));
    let (status, body) = call(echo(), post_json("/order", &big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"]["code"], "payload_too_large");
}

#[tokio::test]
async fn an_internal_error_is_not_echoed() {
    let (status, body) = call(echo(), post_json("/fail", "{}")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"]["code"], "internal");
    assert!(!body.to_string().contains("postgres"), "{body}");
}

#[tokio::test]
async fn the_openapi_document_names_every_route_and_its_types() {
    let (status, doc) = call(
        app(AppState::new()),
        Request::get("/openapi.json").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let routes = [
        ("/healthz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        ("/v1/adapters", "put"),
        ("/v1/adapters/{id}", "get"),
        ("/v1/datasets", "put"),
        ("/v1/datasets/{id}", "get"),
        ("/v1/bindings", "post"),
        ("/v1/intents", "post"),
        ("/v1/reserves", "post"),
        ("/v1/rents", "post"),
        ("/v1/searches", "post"),
        ("/v1/orders/{id}", "get"),
        ("/v1/jobs", "get"),
        ("/v1/jobs/{id}", "get"),
        ("/v1/jobs/{id}", "delete"),
        ("/v1/jobs/{id}/events", "get"),
        ("/v1/jobs/{id}/result", "post"),
        ("/v1/jobs/{id}/progress", "post"),
        ("/v1/jobs/{id}/release", "post"),
        ("/v1/sessions", "post"),
        ("/v1/sessions/{id}", "get"),
        ("/v1/sessions/{id}", "delete"),
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/providers/register", "post"),
        ("/v1/providers/jobs", "post"),
        ("/v1/providers/searches", "get"),
        ("/v1/searches/{id}/witness", "post"),
        ("/v1/providers/reserves", "get"),
        ("/v1/reserves/{id}/bids", "post"),
        ("/v1/reserves/{id}/take_or_pay", "post"),
        ("/v1/providers/pins", "get"),
        ("/v1/rents/{id}/claim", "post"),
        ("/v1/tabs/{chain_id}/{escrow_id}", "get"),
        ("/v1/tabs/{chain_id}/{escrow_id}/close", "post"),
        ("/v1/claims/{chain_id}/{account}", "get"),
        ("/v1/chains", "get"),
        ("/v1/eip712/{kind}", "get"),
        ("/v1/market", "get"),
        ("/v1/exchange", "get"),
        ("/v1/models", "get"),
        ("/v1/providers", "get"),
    ];
    for (path, method) in routes {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is not in /openapi.json"
        );
    }
    assert_eq!(
        doc["paths"].as_object().unwrap().len(),
        routes
            .iter()
            .map(|(p, _)| p)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        "every documented path is a route above"
    );
    // The signed intent's schema comes from the protocol's own type: its fields, with wei as
    // strings.
    let schemas = &doc["components"]["schemas"];
    let signed = &schemas["Signed_Intent"]["properties"];
    assert_eq!(signed["signature"]["type"], "string");
    let intent = &signed["order"]["properties"];
    for field in [
        "want",
        "request_hash",
        "deadline_s",
        "max_price_wei",
        "min_tier",
        "tab_id",
    ] {
        assert!(intent[field].is_object(), "Intent.{field}: {intent}");
    }
    assert_eq!(intent["max_price_wei"]["type"], "string");
    assert!(schemas["IntentSubmission"].is_object());
    assert!(schemas["ErrorBody"].is_object());
    assert!(doc["components"]["securitySchemes"]["session_key"].is_object());

    // An implementation we did not write checks it against the OpenAPI specification.
    let path = std::env::temp_dir().join(format!("cx-openapi-{}.json", std::process::id()));
    std::fs::write(&path, doc.to_string()).unwrap();
    let validator = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../.tools/py/bin/openapi-spec-validator"
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
