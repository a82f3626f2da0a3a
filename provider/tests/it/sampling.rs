//! OpenAI's sampling parameters and the model's chat template through the HTTP API: seeded
//! draws that give the same bytes whatever the batch, `n` choices, log-probabilities, and each
//! bad value refused naming its field.

use std::sync::Arc;

use axum::http::StatusCode;
use cx_kernels::CpuConfig;
use cx_provider::cache::{CacheConfig, EvictionPolicy, ResidencyCache};
use cx_provider::engine::{Engine, EngineConfig};
use cx_provider::model::Model;
use cx_provider::server::{AppState, app};
use cx_provider::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::common::{TempDir, tiny_model};
use crate::http::{assert_error_shape, call_json, server};

/// A server whose tokenizer and chat template are read from the model directory, after
/// `edit` changed it.
fn server_from_dir(tag: &str, edit: impl FnOnce(&std::path::Path)) -> (TempDir, axum::Router) {
    let dir = TempDir::new(tag);
    let (model_dir, config) = tiny_model(dir.path(), 11);
    edit(&model_dir);
    let model =
        Arc::new(Model::load(&model_dir, CpuConfig::deterministic().with_threads(2)).unwrap());
    let tokenizer = Tokenizer::for_model(&model_dir, &config).unwrap();
    let engine = Engine::start(
        model,
        Arc::new(tokenizer),
        ResidencyCache::new(CacheConfig::new(1_000_000, EvictionPolicy::ValuePerByte)),
        EngineConfig::default(),
    );
    (dir, app(AppState::new(engine, "tiny")))
}

fn texts(body: &Value) -> Vec<String> {
    body["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["text"]
                .as_str()
                .or(c["message"]["content"].as_str())
                .unwrap()
                .to_string()
        })
        .collect()
}

/// A seeded sampled completion is the same bytes run alone and run beside other requests (a
/// batch of different composition), so a sampled job stays checkable by byte equality; another
/// seed gives another text, and `n` choices are each their own draw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_sample_is_the_same_bytes_whatever_the_batch() {
    let s = server("seeded", 64);
    let request = json!({"model": "tiny", "prompt": "Once upon", "max_tokens": 24,
        "temperature": 1.3, "top_p": 0.95, "top_k": 200, "presence_penalty": 0.3,
        "frequency_penalty": 0.2, "seed": 42});
    let (status, alone) = call_json(&s.app, "/v1/completions", request.clone()).await;
    assert_eq!(status, StatusCode::OK, "{alone}");
    // The same request among others of other lengths and seeds, in one batch.
    let mut calls = Vec::new();
    for k in 0..4u64 {
        let app = s.app.clone();
        let other = json!({"model": "tiny", "prompt": "x".repeat(k as usize * 7 + 1),
            "max_tokens": 20, "temperature": 0.8, "seed": k});
        calls.push(tokio::spawn(async move {
            call_json(&app, "/v1/completions", other).await
        }));
    }
    let (status, batched) = call_json(&s.app, "/v1/completions", request.clone()).await;
    for c in calls {
        assert_eq!(c.await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(status, StatusCode::OK, "{batched}");
    assert_eq!(
        alone["choices"][0]["token_ids"],
        batched["choices"][0]["token_ids"]
    );
    assert_eq!(texts(&alone), texts(&batched));

    let mut other_seed = request.clone();
    other_seed["seed"] = json!(43);
    let (_, other) = call_json(&s.app, "/v1/completions", other_seed).await;
    assert_ne!(
        alone["choices"][0]["token_ids"],
        other["choices"][0]["token_ids"]
    );

    let mut three = request.clone();
    three["n"] = json!(3);
    let (status, body) = call_json(&s.app, "/v1/completions", three).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    assert_eq!(
        choices
            .iter()
            .map(|c| c["index"].clone())
            .collect::<Vec<_>>(),
        vec![json!(0), json!(1), json!(2)]
    );
    // Choice 0 is the request with n = 1; the others draw on their own streams.
    assert_eq!(choices[0]["token_ids"], alone["choices"][0]["token_ids"]);
    assert_ne!(choices[1]["token_ids"], choices[0]["token_ids"]);
    let completion: u64 = choices
        .iter()
        .map(|c| c["token_ids"].as_array().unwrap().len() as u64)
        .sum();
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() >= completion);
}

/// Log-probabilities in OpenAI's two shapes: chat's `content` entries and the legacy
/// completions' parallel lists; the chosen token's log-probability under greedy decoding is
/// the largest of the alternatives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_in_openais_shapes() {
    let s = server("logprobs", 64);
    let (status, body) = call_json(
        &s.app,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 5, "logprobs": true, "top_logprobs": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert!(!content.is_empty());
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{entry}");
        let chosen = entry["logprob"].as_f64().unwrap();
        assert!(chosen <= 0.0);
        assert_eq!(chosen, top[0]["logprob"].as_f64().unwrap(), "{entry}");
        assert!(entry["bytes"].is_array());
    }
    let (status, body) = call_json(
        &s.app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "Hi", "max_tokens": 4, "logprobs": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let lp = &body["choices"][0]["logprobs"];
    let n = lp["tokens"].as_array().unwrap().len();
    assert!(n > 0);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(lp["text_offset"].as_array().unwrap().len(), n);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
}

/// Every out-of-range sampling value is a 400 naming its field, before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_sampling_values_are_refused_by_name() {
    let s = server("sampling-bad", 64);
    for (uri, field, value) in [
        ("/v1/completions", "top_p", json!(0)),
        ("/v1/completions", "top_p", json!(1.5)),
        ("/v1/completions", "top_k", json!(-5)),
        ("/v1/completions", "presence_penalty", json!(2.5)),
        ("/v1/completions", "frequency_penalty", json!(-3)),
        ("/v1/completions", "n", json!(9)),
        ("/v1/completions", "n", json!(0)),
        ("/v1/completions", "seed", json!(-1)),
        ("/v1/completions", "seed", json!("abc")),
        ("/v1/completions", "logprobs", json!(6)),
        ("/v1/chat/completions", "top_logprobs", json!(21)),
        ("/v1/chat/completions", "logprobs", json!(3)),
        ("/v1/chat/completions", "temperature", json!(-0.5)),
    ] {
        let mut request = if uri.contains("chat") {
            json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                   "logprobs": true})
        } else {
            json!({"model": "tiny", "prompt": "x"})
        };
        request[field] = value.clone();
        let (status, body) = call_json(&s.app, uri, request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}={value}: {body}");
        assert_eq!(body["error"]["field"], field, "{field}={value}: {body}");
    }
    let (status, body) = call_json(
        &s.app,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
               "top_logprobs": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "top_logprobs");
}

/// A model without a chat template answers chats with a 400 naming `chat_template`, and
/// completions still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_chat_template_refuses_chats_naming_it() {
    let (_dir, app) = server_from_dir("no-template", |dir| {
        std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    });
    let (status, body) = call_json(
        &app,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error_shape(&body, "no_chat_template");
    assert_eq!(body["error"]["field"], "chat_template");
    let (status, body) = call_json(
        &app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The model's own template renders the chat: a template that raises refuses the messages
/// with its own message (400 naming `messages`), and one that accepts them is what runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_template_decides_and_its_refusal_is_a_400() {
    let (_dir, app) = server_from_dir("raising-template", |dir| {
        std::fs::write(
            dir.join("chat_template.jinja"),
            "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System \
             role not supported') }}{% endif %}{{ m['role'] | upper }}: {{ m['content'] }}\n\
             {% endfor %}ASSISTANT:",
        )
        .unwrap();
    });
    let (status, body) = call_json(
        &app,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "system", "content": "x"},
               {"role": "user", "content": "y"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error_shape(&body, "invalid_messages");
    assert_eq!(body["error"]["field"], "messages");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("System role not supported"),
        "{body}"
    );
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "y"}],
                      "max_tokens": 6});
    let (status, by_chat) = call_json(&app, "/v1/chat/completions", chat).await;
    assert_eq!(status, StatusCode::OK, "{by_chat}");
    // The same prompt as a raw completion (the template writes no BOS here, so the prompt is
    // sent as the ids the chat was encoded to: bytes only).
    let ids: Vec<u32> = "USER: y\nASSISTANT:".bytes().map(u32::from).collect();
    let (status, by_ids) = call_json(
        &app,
        "/v1/completions",
        json!({"model": "tiny", "prompt": ids, "max_tokens": 6}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{by_ids}");
    assert_eq!(texts(&by_chat), texts(&by_ids));
}
