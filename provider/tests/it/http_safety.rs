//! Hostile and careless requests: ids that would shadow other bytes (409), paths outside the
//! adapter roots, wrapped token arithmetic, stop sequences that would slow every request,
//! parameters the server does not implement, and errors axum answers itself — each refused in
//! our JSON shape, and nothing changed.

use std::time::Instant;

use axum::http::StatusCode;
use cx_provider::lora::write_random_adapter;
use cx_provider::model::Projection;
use serde_json::{Value, json};

use crate::http::{assert_error_shape, call, call_json, model_ids, server};

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

/// Guards the bug where `load_lora_adapter` with `lora_name` = another adapter's id registered
/// that id as an alias of other bytes: a request for id X then ran adapter Y.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_would_shadow_an_id_is_a_409() {
    let s = server("409", 64);
    let listed = |models: &Value, alias: &str| -> String {
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == alias)
            .unwrap()["adapter_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (_, models) = call(&s.app, "GET", "/v1/models", None).await;
    let models: Value = serde_json::from_slice(&models).unwrap();
    let id0 = listed(&models, "adapter-0");
    let other = s.dir.path().join("adapters/adapter-1");
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": id0, "lora_path": other}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_error_shape(&body, "adapter_conflict");
    assert_eq!(body["error"]["field"], "lora_name");
    // An id-shaped name of no registered adapter is refused too: it would shadow those bytes
    // once they are loaded.
    let (status, _) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "ab".repeat(32), "lora_path": other}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    // An existing alias with other bytes: refused; with the same bytes: fine.
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "adapter-0", "lora_path": other}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "adapter-1", "lora_path": other}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Its own id as its name is no shadowing.
    let id1 = body["id"].as_str().unwrap().to_string();
    let (status, _) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": id1, "lora_path": other}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // Nothing changed: the id still names adapter-0's bytes.
    let (_, models) = call(&s.app, "GET", "/v1/models", None).await;
    let models: Value = serde_json::from_slice(&models).unwrap();
    assert_eq!(listed(&models, "adapter-0"), id0);
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": id0, "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["model"], "adapter-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_paths_outside_the_roots_are_refused_alike() {
    let s = server("roots", 64);
    let outside = crate::common::TempDir::new("outside-root");
    write_random_adapter(outside.path(), &s.config, 4, &[Projection::Q], 0.1, 3).unwrap();
    let mut answers = Vec::new();
    for path in [
        outside.path().to_path_buf(),
        outside.path().join("does-not-exist"),
        s.dir.path().join("../../etc"),
        "/dev/zero".into(),
    ] {
        let (status, body) = call_json(
            &s.app,
            "/v1/load_lora_adapter",
            json!({"lora_name": "x", "lora_path": path}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_error_shape(&body, "invalid_lora_path");
        let text = message(&body).replace(&path.display().to_string(), "P");
        answers.push(text);
    }
    // Existing or not, the answer is the same: it tells nothing about the filesystem.
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
    // A symlink inside the root that leaves it is refused like the rest.
    #[cfg(unix)]
    {
        let link = s.dir.path().join("escape");
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let (status, _) = call_json(
            &s.app,
            "/v1/load_lora_adapter",
            json!({"lora_name": "x", "lora_path": link}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
    // A FIFO or an oversized weights file inside the root: 422, and the load returns.
    let bad = s.dir.path().join("fifo");
    write_random_adapter(&bad, &s.config, 4, &[Projection::Q], 0.1, 4).unwrap();
    std::fs::remove_file(bad.join("adapter_model.safetensors")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(bad.join("adapter_model.safetensors"))
        .status()
        .is_ok_and(|s| s.success());
    if made {
        let (status, body) = call_json(
            &s.app,
            "/v1/load_lora_adapter",
            json!({"lora_name": "fifo", "lora_path": bad}),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(message(&body).contains("not a regular file"), "{body}");
    }
    let big = s.dir.path().join("big");
    write_random_adapter(&big, &s.config, 4, &[Projection::Q], 0.1, 5).unwrap();
    let file = std::fs::File::options()
        .append(true)
        .open(big.join("adapter_model.safetensors"))
        .unwrap();
    file.set_len(1 << 30).unwrap(); // sparse: no disk used
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "big", "lora_path": big}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(message(&body).contains("over the limit"), "{body}");
    assert!(!model_ids(&s.app).await.contains(&"big".to_string()));
}

/// An adapter whose scale overflows (`lora_alpha: 1e38`) served NaN; it is refused at load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_that_would_serve_non_finite_outputs_is_a_422() {
    let s = server("nan", 64);
    let dir = s.dir.path().join("huge-alpha");
    write_random_adapter(&dir, &s.config, 4, &[Projection::Q], 0.1, 9).unwrap();
    let config_path = dir.join("adapter_config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["lora_alpha"] = json!(1e38);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "huge", "lora_path": dir}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(message(&body).contains("not be finite"), "{body}");
    // An unknown key that is set is refused by name; one that is off is not.
    config["lora_alpha"] = json!(8);
    config["use_dora"] = json!(false);
    config["some_future_variant"] = json!({"on": true});
    std::fs::write(&config_path, config.to_string()).unwrap();
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "huge", "lora_path": dir}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(message(&body).contains("some_future_variant"), "{body}");
    config["some_future_variant"] = Value::Null;
    std::fs::write(&config_path, config.to_string()).unwrap();
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "fine", "lora_path": dir}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Guards the bug where `max_tokens` near 2⁶⁴ wrapped past the context check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_arithmetic_is_checked_and_max_tokens_0_is_refused() {
    let s = server("bounds", 64);
    for max_tokens in [u64::MAX, u64::MAX - 1, 1 << 63] {
        let (status, body) = call_json(
            &s.app,
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hello", "max_tokens": max_tokens}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_error_shape(&body, "context_length_exceeded");
        assert_eq!(body["error"]["field"], "max_tokens");
    }
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hello", "max_tokens": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "max_tokens");
    let (status, body) = call_json(
        &s.app,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
               "max_completion_tokens": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "max_completion_tokens");
    // Type errors name their field.
    for (field, value) in [
        ("max_tokens", json!(-1)),
        ("max_tokens", json!("ten")),
        ("temperature", json!("hot")),
        ("stream", json!("yes")),
        ("prompt", json!([1, -2])),
    ] {
        let mut request = json!({"model": "tiny", "prompt": "x"});
        request[field] = value;
        let (status, body) = call_json(&s.app, "/v1/completions", request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_parameters_are_refused_by_name() {
    let s = server("params", 64);
    for (field, value) in [
        ("best_of", json!(3)),
        ("min_p", json!(0.1)),
        ("repetition_penalty", json!(1.2)),
        ("echo", json!(true)),
        ("logit_bias", json!({"65": 10})),
    ] {
        let mut request = json!({"model": "tiny", "prompt": "x", "max_tokens": 2});
        request[field] = value;
        let (status, body) = call_json(&s.app, "/v1/completions", request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {body}");
        assert_error_shape(&body, "unsupported_parameter");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "frobnicate": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("frobnicate"), "{body}");
    // Neutral values of the same parameters are accepted.
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "max_tokens": 2, "best_of": 1, "min_p": 0.0,
               "repetition_penalty": 1, "echo": null, "user": "me"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The batch form: one prompt works, several are refused clearly.
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [[256, 72]], "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [[256, 72], [256, 73]], "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "prompt");
    assert!(message(&body).contains("one prompt per request"), "{body}");
}

/// Guards the bug where six 1.9 MB stop strings slowed an unrelated request 30×: stops are at
/// most 4 of bounded length, and matched over the new text only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequences_are_bounded() {
    let s = server("stops", 64);
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "stop");
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "stop": "z".repeat(4096)}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "stop");
    // Four stops of the largest size that never match cost a request little more than none.
    let request = json!({"model": "tiny", "prompt": "x", "max_tokens": 40});
    let mut with_stops = request.clone();
    with_stops["stop"] = json!(vec!["\u{1}".repeat(512); 4]);
    let time = |body: Value| {
        let app = s.app.clone();
        async move {
            let t = Instant::now();
            let (status, _) = call_json(&app, "/v1/completions", body).await;
            assert_eq!(status, StatusCode::OK);
            t.elapsed().as_secs_f64()
        }
    };
    time(request.clone()).await;
    let plain = time(request).await;
    let stopped = time(with_stops).await;
    assert!(
        stopped < plain * 3.0 + 0.05,
        "stops cost {stopped:.4}s against {plain:.4}s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_axum_answers_itself_are_json_too() {
    let s = server("shapes", 64);
    let (status, bytes) = call(&s.app, "GET", "/v1/nothing", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error_shape(&body, "not_found");
    let (status, bytes) = call(&s.app, "GET", "/v1/completions", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error_shape(&body, "method_not_allowed");
    let huge = json!({"model": "tiny", "prompt": "x".repeat(3 << 20)});
    let (status, bytes) = call(&s.app, "POST", "/v1/completions", Some(huge)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_error_shape(&body, "payload_too_large");
    let (status, bytes) = call(&s.app, "GET", "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = String::from_utf8(bytes).unwrap();
    // No adapter resident: the shadow price is +Inf, spelled as Prometheus parses it.
    assert!(!metrics.contains(" inf"), "{metrics}");
}
