//! The HTTP API driven without a socket (`tower::ServiceExt::oneshot`): error shapes, adapter
//! load/unload, streaming, and batching determinism through the scheduler.
//!
//! Long (~800 lines) because every HTTP test shares one engine and scheduler fixture (a generated
//! model and adapters) and each endpoint's cases sit together; one binary saves link time.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use cx_kernels::CpuConfig;
use cx_provider::cache::{CacheConfig, EvictionPolicy, ResidencyCache};
use cx_provider::engine::{Engine, EngineConfig};
use cx_provider::lora::write_random_adapter;
use cx_provider::model::{
    GenModelOptions, KvCache, Model, Projection, SeqInput, write_generated_model,
};
use cx_provider::server::{ApiError, AppState, HttpLimits, app};
use cx_provider::tokenizer::Tokenizer;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common::{TempDir, adapters, tiny_model, tiny_options};

pub(crate) struct Server {
    pub(crate) app: Router,
    pub(crate) dir: TempDir,
    model: Arc<Model>,
    pub(crate) config: cx_provider::model::ModelConfig,
}

pub(crate) fn server(tag: &str, max_rank: usize) -> Server {
    server_with_budget(tag, max_rank, 10_000_000)
}

fn server_with_budget(tag: &str, max_rank: usize, budget_bytes: u64) -> Server {
    server_with(tag, max_rank, budget_bytes, HttpLimits::default())
}

/// The fixture behind the door's `limits`.
pub(crate) fn server_with_limits(tag: &str, limits: HttpLimits) -> Server {
    server_with(tag, 64, 10_000_000, limits)
}

fn server_with(tag: &str, max_rank: usize, budget_bytes: u64, limits: HttpLimits) -> Server {
    let dir = TempDir::new(tag);
    let (model_dir, config) = tiny_model(dir.path(), 11);
    let adapter_dir = dir.path().join("adapters");
    adapters(&adapter_dir, &config, 4, &[4, 8]);
    let model =
        Arc::new(Model::load(&model_dir, CpuConfig::deterministic().with_threads(2)).unwrap());
    let engine = Engine::start(
        model.clone(),
        Arc::new(Tokenizer::generated()),
        ResidencyCache::new(CacheConfig::new(budget_bytes, EvictionPolicy::ValuePerByte)),
        EngineConfig {
            max_rank,
            ..EngineConfig::default()
        },
    );
    assert_eq!(engine.register_dir(&adapter_dir).unwrap().len(), 4);
    // The test's own directory is the root `load_lora_adapter` may read from.
    engine
        .add_adapter_roots(&[dir.path().to_path_buf()])
        .unwrap();
    Server {
        app: app(AppState::new(engine, "tiny").with_limits(limits)),
        dir,
        model,
        config,
    }
}

pub(crate) async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Vec<u8>) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes)
}

pub(crate) async fn call_json(app: &Router, uri: &str, body: Value) -> (StatusCode, Value) {
    let (status, bytes) = call(app, "POST", uri, Some(body)).await;
    (
        status,
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&bytes)})),
    )
}

pub(crate) fn assert_error_shape(body: &Value, code: &str) {
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
}

pub(crate) async fn model_ids(app: &Router) -> Vec<String> {
    let (status, bytes) = call(app, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_adapter_is_a_404_in_openai_shape() {
    let s = server("404", 64);
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "nope", "prompt": "hi"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error_shape(&body, "model_not_found");
    assert_eq!(body["error"]["param"], "model");
    let (status, body) = call_json(
        &s.app,
        "/v1/chat/completions",
        json!({"model": "tiny", "adapter": "nope", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["param"], "adapter");
    let (status, body) = call_json(
        &s.app,
        "/v1/unload_lora_adapter",
        json!({"lora_name": "nope"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error_shape(&body, "model_not_found");
    // Malformed JSON gets our shape too.
    let (status, bytes) = call(&s.app, "POST", "/v1/completions", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error_shape(&serde_json::from_slice(&bytes).unwrap(), "invalid_request");
}

/// Every kind of bad adapter is refused at load with a 422 and the reason, nothing is
/// registered, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_adapters_are_422_and_nothing_is_loaded() {
    let s = server("422", 16);
    let root = s.dir.path().join("bad");
    // Shapes of another base (hidden 48).
    let other = write_generated_model(
        &root.join("other-model"),
        &GenModelOptions {
            hidden: 48,
            ..tiny_options(1)
        },
    )
    .unwrap();
    write_random_adapter(
        &root.join("wrong-shape"),
        &other,
        4,
        &[Projection::Q],
        0.1,
        1,
    )
    .unwrap();
    // Rank over the server's limit (16).
    write_random_adapter(
        &root.join("rank-32"),
        &s.config,
        32,
        &[Projection::V],
        0.1,
        2,
    )
    .unwrap();
    // Malformed safetensors.
    write_random_adapter(
        &root.join("garbage"),
        &s.config,
        4,
        &[Projection::Q],
        0.1,
        3,
    )
    .unwrap();
    std::fs::write(
        root.join("garbage/adapter_model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
    )
    .unwrap();
    // Malformed config (no r).
    write_random_adapter(&root.join("no-r"), &s.config, 4, &[Projection::Q], 0.1, 4).unwrap();
    std::fs::write(
        root.join("no-r/adapter_config.json"),
        r#"{"lora_alpha": 8, "target_modules": ["q_proj"]}"#,
    )
    .unwrap();
    // A target the base has no projection for.
    write_random_adapter(
        &root.join("lm-head"),
        &s.config,
        4,
        &[Projection::Q],
        0.1,
        5,
    )
    .unwrap();
    std::fs::write(
        root.join("lm-head/adapter_config.json"),
        r#"{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "lm_head"]}"#,
    )
    .unwrap();
    // Tensors for a layer the base does not have (config lists it correctly).
    let deeper = write_generated_model(
        &root.join("deeper"),
        &GenModelOptions {
            layers: 3,
            ..tiny_options(1)
        },
    )
    .unwrap();
    write_random_adapter(&root.join("layer-2"), &deeper, 4, &[Projection::Q], 0.1, 6).unwrap();
    for (name, needle) in [
        ("wrong-shape", "shape"),
        ("rank-32", "rank 32"),
        ("garbage", "safetensors"),
        ("no-r", "missing field `r`"),
        ("lm-head", "lm_head"),
        ("layer-2", "layer 2"),
    ] {
        let (status, body) = call_json(
            &s.app,
            "/v1/load_lora_adapter",
            json!({"lora_name": name, "lora_path": root.join(name)}),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {body}");
        assert_error_shape(&body, "invalid_adapter");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(needle),
            "{name}: `{message}` should mention `{needle}`"
        );
        assert!(
            !model_ids(&s.app).await.contains(&name.to_string()),
            "{name} must not be registered"
        );
        let (status, _) = call_json(
            &s.app,
            "/v1/completions",
            json!({"model": name, "prompt": "x"}),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    // Still serving.
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "adapter-1", "prompt": "ok", "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() <= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_over_the_context_limit_is_a_400() {
    let s = server("400", 64);
    let long = "x".repeat(80); // context is 64 tokens
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "adapter-0", "prompt": long}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error_shape(&body, "context_length_exceeded");
    // Prompt fits but prompt + max_tokens does not.
    let (status, _) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x".repeat(40), "max_tokens": 40}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [256, 9999]}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "token outside the vocabulary"
    );
    let (status, _) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// Greedy generation with the model directly, as the reference for the server.
fn greedy(
    model: &Model,
    adapter: Option<&cx_provider::lora::Adapter>,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    let mut cache = KvCache::default();
    let mut out = Vec::new();
    let mut tokens = prompt.to_vec();
    for _ in 0..n {
        let logits = model
            .forward(&mut [SeqInput {
                tokens: &tokens,
                cache: &mut cache,
                adapter,
            }])
            .unwrap()
            .remove(0);
        let mut best = 0;
        for (i, v) in logits.iter().enumerate() {
            if *v > logits[best] {
                best = i;
            }
        }
        if best == 257 {
            break;
        }
        out.push(best as u32);
        tokens = vec![best as u32];
    }
    out
}

/// Greedy outputs are the same bytes whether a request runs alone or beside others with other
/// adapters (the scheduler batches them; /metrics shows it did), and equal the model's own
/// greedy decoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn greedy_output_does_not_depend_on_the_batch() {
    let s = server("batching", 64);
    let requests: Vec<Value> = (0..8)
        .map(|i| {
            let model = if i % 4 == 3 { "tiny".to_string() } else { format!("adapter-{}", i % 4) };
            json!({"model": model, "prompt": format!("prompt {i}: hello"), "max_tokens": 10 + i % 3})
        })
        .collect();
    let mut alone = Vec::new();
    for r in &requests {
        let (status, body) = call_json(&s.app, "/v1/completions", r.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        alone.push(body["choices"][0].clone());
    }
    for round in 0..2 {
        let handles: Vec<_> = requests
            .iter()
            .cycle()
            .skip(round * 3)
            .take(requests.len())
            .map(|r| {
                let (app, r) = (s.app.clone(), r.clone());
                tokio::spawn(
                    async move { (r.clone(), call_json(&app, "/v1/completions", r).await) },
                )
            })
            .collect();
        for h in handles {
            let (r, (status, body)) = h.await.unwrap();
            assert_eq!(status, StatusCode::OK);
            let i = requests.iter().position(|x| *x == r).unwrap();
            assert_eq!(
                body["choices"][0]["text"], alone[i]["text"],
                "request {i} round {round}"
            );
            assert_eq!(body["choices"][0]["token_ids"], alone[i]["token_ids"]);
        }
    }
    let (_, metrics) = call(&s.app, "GET", "/metrics", None).await;
    let metrics = String::from_utf8(metrics).unwrap();
    let max_batch: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cx_provider_max_batch_sequences "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        max_batch >= 2.0,
        "requests were batched together:\n{metrics}"
    );
    // The server's greedy equals the forward's argmax, token for token.
    let adapter_dir = s.dir.path().join("adapters/adapter-1");
    let adapter = cx_provider::lora::load_adapter(&adapter_dir, &s.config, 64).unwrap();
    let prompt = Tokenizer::generated().encode("prompt 1: hello").unwrap();
    let expected = greedy(&s.model, Some(&adapter), &prompt, 11);
    let got: Vec<u32> = alone[1]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(got, expected);
}

fn sse_data(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_matches_non_streaming_and_chat_works() {
    let s = server("stream", 64);
    let request = json!({"model": "adapter-2", "prompt": "stream me", "max_tokens": 8});
    let (_, whole) = call_json(&s.app, "/v1/completions", request.clone()).await;
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (status, bytes) = call(&s.app, "POST", "/v1/completions", Some(streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&bytes);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    // Chat, both ways, named by the adapter's id.
    let id = {
        let (_, bytes) = call(&s.app, "GET", "/v1/models", None).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == "adapter-2")
            .unwrap()["root"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(id.len(), 64, "the id is a SHA-256");
    let chat =
        json!({"model": id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6});
    let (status, body) = call_json(&s.app, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "adapter-2");
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let mut chat_stream = chat;
    chat_stream["stream"] = json!(true);
    let (_, bytes) = call(&s.app, "POST", "/v1/chat/completions", Some(chat_stream)).await;
    let data = sse_data(&bytes);
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_unload_and_metrics() {
    let s = server("load", 64);
    let extra = s.dir.path().join("extra");
    write_random_adapter(
        &extra,
        &s.config,
        8,
        &[Projection::Q, Projection::Down],
        0.1,
        77,
    )
    .unwrap();
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "mine", "lora_path": extra, "pin": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["pinned"], true);
    assert!(model_ids(&s.app).await.contains(&"mine".to_string()));
    let (status, _) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "adapter": "mine", "prompt": "a", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, metrics) = call(&s.app, "GET", "/metrics", None).await;
    let metrics = String::from_utf8(metrics).unwrap();
    for name in [
        "cx_provider_running_sequences",
        "cx_provider_waiting_sequences",
        "cx_provider_resident_adapters 1",
        "cx_provider_resident_adapter_bytes",
        "cx_provider_cache_hits_total 1",
        "cx_provider_cache_misses_total 0",
        "cx_provider_slot_shadow_price",
        "pinned=\"true\"",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
    let (status, _) = call_json(
        &s.app,
        "/v1/unload_lora_adapter",
        json!({"lora_name": "mine"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "mine", "prompt": "a"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, metrics) = call(&s.app, "GET", "/metrics", None).await;
    assert!(
        String::from_utf8(metrics)
            .unwrap()
            .contains("cx_provider_resident_adapters 0")
    );
}

pub(crate) fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
        .parse()
        .unwrap()
}

/// A budget of two rank-8 adapters: using four in turn loads on miss and evicts, a pinned one
/// is never evicted, and requests keep succeeding; when everything resident is pinned, a
/// request for another adapter is refused (503) instead of waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_budget_evicts_but_never_the_pin() {
    let dir = TempDir::new("budget-probe");
    let (_, config) = tiny_model(dir.path(), 11);
    let one = cx_provider::lora::adapter_bytes(&config, 8, &Projection::ALL.into_iter().collect());
    let s = server_with_budget("budget", 64, 2 * one);
    let root = s.dir.path().join("same-size");
    for i in 0..4 {
        write_random_adapter(
            &root.join(format!("s{i}")),
            &s.config,
            8,
            &Projection::ALL,
            0.1,
            200 + i,
        )
        .unwrap();
    }
    let (status, body) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": "s0", "lora_path": root.join("s0"), "pin": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["bytes"].as_u64(),
        Some(one),
        "adapter_bytes predicts the resident size"
    );
    for i in 1..4 {
        let (status, _) = call_json(
            &s.app,
            "/v1/load_lora_adapter",
            json!({"lora_name": format!("s{i}"), "lora_path": root.join(format!("s{i}"))}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    for round in 0..2 {
        for i in 0..4 {
            let (status, body) = call_json(
                &s.app,
                "/v1/completions",
                json!({"model": format!("s{i}"), "prompt": "p", "max_tokens": 2}),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "round {round} s{i}: {body}");
        }
    }
    let (_, metrics) = call(&s.app, "GET", "/metrics", None).await;
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metric(&metrics, "cx_provider_cache_evictions_total") >= 4.0,
        "{metrics}"
    );
    assert!(metric(&metrics, "cx_provider_cache_misses_total") >= 4.0);
    assert!(metric(&metrics, "cx_provider_resident_adapter_bytes") <= (2 * one) as f64);
    assert!(
        metrics.contains("pinned=\"true\""),
        "s0 is still resident and pinned"
    );
    // Pin the other resident one too: no room can be made for a third.
    let resident: Vec<String> = {
        let (_, bytes) = call(&s.app, "GET", "/v1/models", None).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["resident"] == true)
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(resident.len(), 2);
    assert!(resident.contains(&"s0".to_string()));
    let other = resident.iter().find(|r| *r != "s0").unwrap().clone();
    let (status, _) = call_json(
        &s.app,
        "/v1/load_lora_adapter",
        json!({"lora_name": other, "lora_path": root.join(&other), "pin": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let absent = (0..4)
        .map(|i| format!("s{i}"))
        .find(|n| !resident.contains(n))
        .unwrap();
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": absent, "prompt": "p", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_error_shape(&body, "unavailable");
    // And the pinned ones still serve.
    let (status, _) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "s0", "prompt": "p", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// A sequence whose forward fails (a token id outside the vocabulary, sent straight to the
/// engine past the HTTP checks) gets an error; its batch neighbours finish with the same
/// tokens as when they run alone, and the engine keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_sequence_does_not_take_the_batch_down() {
    use cx_provider::engine::{Event, GenerateRequest, Sampling};
    let dir = TempDir::new("isolate");
    let (model_dir, _) = tiny_model(dir.path(), 12);
    let model = Arc::new(Model::load(&model_dir, CpuConfig::deterministic()).unwrap());
    let engine = Engine::start(
        model.clone(),
        Arc::new(Tokenizer::generated()),
        ResidencyCache::new(CacheConfig::new(1_000_000, EvictionPolicy::Lru)),
        EngineConfig::default(),
    );
    let submit = |prompt: Vec<u32>| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        engine.submit(GenerateRequest {
            prompt,
            adapter: None,
            max_tokens: 6,
            stop: Vec::new(),
            sampling: Sampling::default(),
            events: tx,
            stream: true,
            conversation: None,
        });
        rx
    };
    async fn drain(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Result<Vec<u32>, u16> {
        let mut tokens = Vec::new();
        while let Some(event) = rx.recv().await {
            match event {
                Event::Text { token, .. } => tokens.push(token),
                Event::Done { .. } => return Ok(tokens),
                // The status the HTTP layer would answer with.
                Event::Failed(error) => return Err(ApiError::from(error.as_ref()).status.as_u16()),
            }
        }
        Err(0)
    }
    let good = submit(vec![256, 1, 2, 3]);
    let bad = submit(vec![256, 5000]);
    let good2 = submit(vec![256, 9]);
    assert_eq!(drain(bad).await, Err(500));
    let got = drain(good).await.unwrap();
    let got2 = drain(good2).await.unwrap();
    assert_eq!(got, greedy(&model, None, &[256, 1, 2, 3], 6));
    assert_eq!(got2, greedy(&model, None, &[256, 9], 6));
    // Still serving.
    assert_eq!(drain(submit(vec![256, 1, 2, 3])).await.unwrap(), got);
}

/// A stop string cuts the answer before it, streamed or not, with finish_reason `stop`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_streamed_and_whole_answers_alike() {
    let s = server("stop", 64);
    let mut checked = 0;
    for model in ["tiny", "adapter-0", "adapter-1", "adapter-2", "adapter-3"] {
        let base = json!({"model": model, "prompt": "tell me", "max_tokens": 24});
        let (_, whole) = call_json(&s.app, "/v1/completions", base.clone()).await;
        let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
        let chars: Vec<char> = text.chars().collect();
        // A stop string that first occurs after at least one other character.
        let Some(k) =
            (1..chars.len()).find(|&k| chars[k] != '\u{FFFD}' && !chars[..k].contains(&chars[k]))
        else {
            continue;
        };
        let stop = chars[k].to_string();
        let expected: String = chars[..k].iter().collect();
        let mut with_stop = base.clone();
        with_stop["stop"] = json!([stop]);
        let (status, cut) = call_json(&s.app, "/v1/completions", with_stop.clone()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            cut["choices"][0]["text"],
            expected.as_str(),
            "{model}: stop {stop:?} in {text:?}"
        );
        assert_eq!(cut["choices"][0]["finish_reason"], "stop");
        with_stop["stream"] = json!(true);
        let (_, bytes) = call(&s.app, "POST", "/v1/completions", Some(with_stop)).await;
        let data = sse_data(&bytes);
        let streamed: String = data[..data.len() - 1]
            .iter()
            .map(|d| {
                serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(streamed, expected, "{model}");
        checked += 1;
    }
    assert!(
        checked >= 2,
        "at least two answers had a usable stop character"
    );
}

/// An adapter registered from `--adapters` but broken on disk fails its requests with 422 and
/// the reason when first used (the load on miss), and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_registered_adapter_fails_its_request_with_422() {
    let s = server("broken-registered", 64);
    std::fs::write(
        s.dir
            .path()
            .join("adapters/adapter-3/adapter_model.safetensors"),
        b"garbage",
    )
    .unwrap();
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "adapter-3", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_error_shape(&body, "invalid_adapter");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("safetensors"),
        "{body}"
    );
    let (status, _) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "adapter-0", "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}
