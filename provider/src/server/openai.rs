//! OpenAI's `/v1/completions` and `/v1/chat/completions`: the request's checks (prompt,
//! context length, temperature), then the engine; the answer whole or as server-sent events.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::body::Body;
use super::{ApiError, AppState, unix_now};
use crate::engine::{Conversation, Event, FinishReason, GenerateRequest, Sampling};
use crate::error::Error;

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Value,
}

/// Default `max_tokens` when a request names none.
const DEFAULT_MAX_TOKENS: u64 = 16;

/// Stop sequences per request at most (OpenAI's limit).
pub(super) const MAX_STOP_SEQUENCES: usize = 4;

/// Bytes of one stop sequence at most. The scheduler checks every running sequence's stops
/// after each token on the one batch thread, so their size bounds what one request can cost
/// all the others.
pub(super) const MAX_STOP_BYTES: usize = 512;

/// Refuses every field of `body` that is neither read (`read`) nor an unimplemented one at
/// its neutral value: a parameter the server does not implement is never silently ignored.
fn refuse_unsupported(body: &Body, read: &[&str]) -> Result<(), ApiError> {
    {
        for (key, value) in &body.0 {
            if read.contains(&key.as_str()) || value.is_null() {
                continue;
            }
            let Some(&(name, neutral, _)) = NEUTRAL.iter().find(|(n, _, _)| n == key) else {
                return Err(leaked_field(
                    key,
                    format!(
                        "unknown parameter `{key}`; this server implements {}",
                        read.join(", ")
                    ),
                ));
            };
            if !neutral(value) {
                return Err(leaked_field(
                    name,
                    format!(
                        "`{name}` = {value} is not implemented by this server (only its default)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A 400 naming a field given by the client (its name is not `'static`, so it is matched
/// against the known names or quoted in the message only).
fn leaked_field(key: &str, message: String) -> ApiError {
    let known = NEUTRAL.iter().map(|(n, _, _)| *n).find(|n| *n == key);
    let error = ApiError::new(StatusCode::BAD_REQUEST, "unsupported_parameter", message);
    match known {
        Some(name) => error.field(name),
        None => error,
    }
}

type Neutral = fn(&Value) -> bool;

/// Parameters of the OpenAI and vLLM APIs this server does not implement, each with the test
/// for its neutral value (the one that changes nothing) and the JSON schema of what that test
/// accepts (for `/openapi.json`). Anything else is refused.
pub(super) const NEUTRAL: &[(&str, Neutral, &str)] = &[
    (
        "n",
        |v| v.as_u64() == Some(1),
        r#"{"type": "integer", "const": 1}"#,
    ),
    (
        "best_of",
        |v| v.as_u64() == Some(1),
        r#"{"type": "integer", "const": 1}"#,
    ),
    (
        "logprobs",
        |v| v == &Value::Bool(false),
        r#"{"type": "boolean", "const": false}"#,
    ),
    (
        "top_logprobs",
        |v| v.as_u64() == Some(0),
        r#"{"type": "integer", "const": 0}"#,
    ),
    (
        "echo",
        |v| v == &Value::Bool(false),
        r#"{"type": "boolean", "const": false}"#,
    ),
    (
        "top_p",
        |v| v.as_f64() == Some(1.0),
        r#"{"type": "number", "const": 1}"#,
    ),
    (
        "top_k",
        |v| matches!(v.as_i64(), Some(-1 | 0)),
        r#"{"type": "integer", "enum": [-1, 0]}"#,
    ),
    (
        "min_p",
        |v| v.as_f64() == Some(0.0),
        r#"{"type": "number", "const": 0}"#,
    ),
    (
        "presence_penalty",
        |v| v.as_f64() == Some(0.0),
        r#"{"type": "number", "const": 0}"#,
    ),
    (
        "frequency_penalty",
        |v| v.as_f64() == Some(0.0),
        r#"{"type": "number", "const": 0}"#,
    ),
    (
        "repetition_penalty",
        |v| v.as_f64() == Some(1.0),
        r#"{"type": "number", "const": 1}"#,
    ),
    (
        "logit_bias",
        |v| v.as_object().is_some_and(|o| o.is_empty()),
        r#"{"type": "object", "maxProperties": 0}"#,
    ),
    (
        "suffix",
        |v| v.as_str() == Some(""),
        r#"{"type": "string", "const": ""}"#,
    ),
    (
        "min_tokens",
        |v| v.as_u64() == Some(0),
        r#"{"type": "integer", "const": 0}"#,
    ),
    (
        "ignore_eos",
        |v| v == &Value::Bool(false),
        r#"{"type": "boolean", "const": false}"#,
    ),
    (
        "stop_token_ids",
        |v| v.as_array().is_some_and(|a| a.is_empty()),
        r#"{"type": "array", "maxItems": 0}"#,
    ),
    (
        "tools",
        |v| v.as_array().is_some_and(|a| a.is_empty()),
        r#"{"type": "array", "maxItems": 0}"#,
    ),
    (
        "tool_choice",
        |v| v.as_str() == Some("none"),
        r#"{"type": "string", "const": "none"}"#,
    ),
    (
        "response_format",
        |v| v.get("type").and_then(Value::as_str) == Some("text"),
        r#"{"type": "object", "required": ["type"], "properties": {"type": {"const": "text"}}}"#,
    ),
    (
        "stream_options",
        |v| {
            v.get("include_usage")
                .is_none_or(|u| u == &Value::Bool(false))
        },
        r#"{"type": "object", "properties": {"include_usage": {"const": false}}}"#,
    ),
    // Informational: they change nothing the server computes.
    ("user", |_| true, "{}"),
    ("parallel_tool_calls", |_| true, "{}"),
    (
        "skip_special_tokens",
        |v| v == &Value::Bool(true),
        r#"{"type": "boolean", "const": true}"#,
    ),
];

/// The fields `/v1/completions` reads (the schema of `/openapi.json` has these and
/// [`NEUTRAL`]'s, and a test holds them equal).
pub(super) const COMPLETION_FIELDS: &[&str] = &[
    "model",
    "adapter",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "seed",
    "stop",
    "stream",
    "prompt",
];

/// The fields `/v1/chat/completions` reads.
pub(super) const CHAT_FIELDS: &[&str] = &[
    "model",
    "adapter",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "seed",
    "stop",
    "stream",
    "messages",
];

/// `temperature` [default: 0]: read as an f64 and checked before it narrows, so a value past
/// f32's range is refused rather than rounded to `f32::MAX` (or to infinity).
pub(super) fn temperature(body: &Body) -> Result<f32, ApiError> {
    let temperature = body.get::<f64>("temperature")?.unwrap_or(0.0);
    if !(0.0..=f64::from(f32::MAX)).contains(&temperature) {
        return Err(ApiError::bad_request(format!(
            "temperature must be ≥ 0 and at most {:e}",
            f32::MAX
        ))
        .field("temperature"));
    }
    // In f32's range: the cast rounds to the nearest f32, never to infinity.
    Ok(temperature as f32)
}

struct CommonParams {
    model: Option<String>,
    adapter: Option<String>,
    max_tokens: u64,
    max_tokens_field: &'static str,
    temperature: f32,
    seed: Option<u64>,
    stop: Vec<String>,
    stream: bool,
}

impl CommonParams {
    /// The fields both endpoints read; `fields` is all the route reads.
    fn read(body: &Body, fields: &[&str]) -> Result<Self, ApiError> {
        refuse_unsupported(body, fields)?;
        let (max_tokens, max_tokens_field) = match body.get::<u64>("max_completion_tokens")? {
            Some(n) => (n, "max_completion_tokens"),
            None => (
                body.get::<u64>("max_tokens")?.unwrap_or(DEFAULT_MAX_TOKENS),
                "max_tokens",
            ),
        };
        if max_tokens == 0 {
            return Err(ApiError::bad_request(format!(
                "{max_tokens_field} must be at least 1, got 0"
            ))
            .field(max_tokens_field));
        }
        let temperature = temperature(body)?;
        let stop = match body.get::<Stop>("stop")? {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        if stop.len() > MAX_STOP_SEQUENCES {
            return Err(ApiError::bad_request(format!(
                "at most {MAX_STOP_SEQUENCES} stop sequences, got {}",
                stop.len()
            ))
            .field("stop"));
        }
        if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::bad_request(format!(
                "a stop sequence is at most {MAX_STOP_BYTES} bytes, got {}",
                long.len()
            ))
            .field("stop"));
        }
        Ok(Self {
            model: body.get("model")?,
            adapter: body.get("adapter")?,
            max_tokens,
            max_tokens_field,
            temperature,
            seed: body.get("seed")?,
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
            stream: body.get("stream")?.unwrap_or(false),
        })
    }
}

struct Prepared {
    request: GenerateRequest,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    model: String,
    stream: bool,
}

/// The checks every completion shares, and the engine request. `text` is the prompt's text when
/// it came as text: with it, a chat-shaped prompt continues a held conversation prefix and its
/// turn is held as the next one.
fn prepare(
    state: &AppState,
    prompt: Vec<u32>,
    text: Option<String>,
    common: CommonParams,
) -> Result<Prepared, ApiError> {
    let name = common
        .adapter
        .clone()
        .or(common.model.clone())
        .ok_or_else(|| {
            ApiError::bad_request("`model` is required (the base model or an adapter)")
                .field("model")
        })?;
    let adapter = state.resolve(&name).map_err(|e| {
        if common.adapter.is_some() {
            e.field("adapter")
        } else {
            e
        }
    })?;
    let config = state.engine.model().config();
    let limit = config.max_position_embeddings as u64;
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty").field("prompt"));
    }
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= config.vocab_size) {
        return Err(ApiError::bad_request(format!(
            "token id {bad} is outside the vocabulary (size {})",
            config.vocab_size
        ))
        .field("prompt"));
    }
    // Checked: a `max_tokens` near 2⁶⁴ must not wrap past the context check.
    let prompt_len = prompt.len() as u64;
    let total = prompt_len.checked_add(common.max_tokens);
    if prompt_len >= limit || total.is_none_or(|t| t > limit) {
        let field = if prompt_len >= limit {
            "prompt"
        } else {
            common.max_tokens_field
        };
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
            format!(
                "this model's maximum context length is {limit} tokens; the prompt has \
                 {prompt_len} tokens and {} is {}; shorten the prompt or lower {}",
                common.max_tokens_field, common.max_tokens, common.max_tokens_field
            ),
        )
        .field(field));
    }
    // Fits in usize: it is below the context length.
    let max_tokens = common.max_tokens as usize;
    let (tx, rx) = unbounded_channel();
    let model = adapter
        .as_ref()
        .map_or_else(|| state.model_name.clone(), |a| a.alias.clone());
    Ok(Prepared {
        request: GenerateRequest {
            prompt,
            adapter,
            max_tokens,
            stop: common.stop,
            sampling: Sampling {
                temperature: common.temperature,
                seed: common.seed.unwrap_or_else(unix_now),
            },
            events: tx,
            stream: common.stream,
            conversation: text.map(|prompt_text| Conversation {
                model: state.model_name.clone(),
                prompt_text,
            }),
        },
        events: rx,
        model,
        stream: common.stream,
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

#[utoipa::path(post, path = "/v1/completions", operation_id = "create_completion", tag = "openai", request_body = super::openapi::CompletionRequest, responses((status = 200, description = "the completion, or with `stream` its server-sent events (each `data:` a chunk, `data: [DONE]` last)", content((super::openapi::Completion = "application/json"), (String = "text/event-stream"))), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn completions(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = Body::parse(&body)?;
    let common = CommonParams::read(&body, COMPLETION_FIELDS)?;
    let one_prompt = || {
        ApiError::bad_request(
            "send one prompt per request (batched prompts are not supported; send each as \
             its own request, they are batched by the server)",
        )
        .field("prompt")
    };
    let (prompt, text) = match body.get::<Prompt>("prompt")? {
        None => return Err(ApiError::bad_request("`prompt` is required").field("prompt")),
        Some(Prompt::Text(text)) => (encode(&state, &text)?, Some(text)),
        Some(Prompt::Texts(mut texts)) if texts.len() == 1 => {
            let text = texts.remove(0);
            (encode(&state, &text)?, Some(text))
        }
        Some(Prompt::TokenBatches(mut batches)) if batches.len() == 1 => (batches.remove(0), None),
        Some(Prompt::Texts(_) | Prompt::TokenBatches(_)) => return Err(one_prompt()),
        Some(Prompt::Tokens(tokens)) => (tokens, None),
    };
    let prepared = prepare(&state, prompt, text, common)?;
    run(state, prepared, Kind::Completion).await
}

#[utoipa::path(post, path = "/v1/chat/completions", operation_id = "create_chat_completion", tag = "openai", request_body = super::openapi::ChatCompletionRequest, responses((status = 200, description = "the chat completion, or with `stream` its server-sent events (each `data:` a chunk, `data: [DONE]` last)", content((super::openapi::ChatCompletion = "application/json"), (String = "text/event-stream"))), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn chat_completions(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = Body::parse(&body)?;
    let common = CommonParams::read(&body, CHAT_FIELDS)?;
    let messages: Vec<ChatMessage> = body
        .get("messages")?
        .ok_or_else(|| ApiError::bad_request("`messages` is required").field("messages"))?;
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").field("messages"));
    }
    // The protocol's one chat template (no Jinja chat templates), the same the exchange's
    // OpenAI-compatible door renders a chat with before it prices and dispatches it.
    let mut contents = Vec::with_capacity(messages.len());
    for m in &messages {
        let content = match &m.content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            Value::Null => String::new(),
            _ => {
                return Err(
                    ApiError::bad_request("message content must be a string").field("messages")
                );
            }
        };
        contents.push(content);
    }
    let text = cx_protocol::order::chat_prompt(
        messages
            .iter()
            .zip(&contents)
            .map(|(m, c)| (m.role.as_str(), c.as_str())),
    );
    let prompt = encode(&state, &text)?;
    let prepared = prepare(&state, prompt, Some(text), common)?;
    run(state, prepared, Kind::Chat).await
}

fn encode(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    state
        .engine
        .tokenizer()
        .encode(text)
        .map_err(|e| ApiError::bad_request(e.to_string()).field("prompt"))
}

fn request_id(kind: Kind) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let prefix = if kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    format!("{prefix}-{:x}{n:06x}", unix_now())
}

async fn run(state: AppState, prepared: Prepared, kind: Kind) -> Result<Response, ApiError> {
    let Prepared {
        request,
        mut events,
        model,
        stream,
    } = prepared;
    state.engine.submit(request);
    let id = request_id(kind);
    let created = unix_now();
    if !stream {
        let mut text = String::new();
        let mut tokens = Vec::new();
        loop {
            match events.recv().await {
                Some(Event::Text { delta, token }) => {
                    text.push_str(&delta);
                    tokens.push(token);
                }
                Some(Event::Done {
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    let usage = json!({
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    });
                    let choice = match kind {
                        Kind::Completion => json!({
                            "index": 0, "text": text, "logprobs": null,
                            "finish_reason": finish_reason, "token_ids": tokens,
                        }),
                        Kind::Chat => json!({
                            "index": 0, "message": {"role": "assistant", "content": text},
                            "logprobs": null, "finish_reason": finish_reason,
                        }),
                    };
                    let object = match kind {
                        Kind::Completion => "text_completion",
                        Kind::Chat => "chat.completion",
                    };
                    return Ok(axum::Json(json!({
                        "id": id, "object": object, "created": created, "model": model,
                        "choices": [choice], "usage": usage,
                    }))
                    .into_response());
                }
                Some(Event::Failed(error)) => return Err(ApiError::from(error.as_ref())),
                None => return Err(Error::SchedulerStopped.into()),
            }
        }
    }
    // Streaming: the first event decides between an error status and a 200 SSE stream.
    let first = events.recv().await;
    if let Some(Event::Failed(error)) = &first {
        return Err(ApiError::from(error.as_ref()));
    }
    let (tx, rx) = unbounded_channel::<Result<SseEvent, Infallible>>();
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let chunk = move |delta: Option<&str>, finish: Option<FinishReason>, first: bool| {
        let choice = match kind {
            Kind::Completion => json!({
                "index": 0, "text": delta.unwrap_or(""), "logprobs": null, "finish_reason": finish,
            }),
            Kind::Chat => {
                let mut d = serde_json::Map::new();
                if first {
                    d.insert("role".into(), json!("assistant"));
                }
                if let Some(delta) = delta {
                    d.insert("content".into(), json!(delta));
                }
                json!({"index": 0, "delta": d, "logprobs": null, "finish_reason": finish})
            }
        };
        json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]})
    };
    tokio::spawn(async move {
        let mut next = first;
        let mut is_first = true;
        while let Some(event) = next {
            let data = match event {
                Event::Text { delta, .. } => chunk(Some(&delta), None, is_first),
                Event::Done { finish_reason, .. } => chunk(None, Some(finish_reason), is_first),
                Event::Failed(error) => json!({"error": {"message": error.to_string()}}),
            };
            is_first = false;
            if tx
                .send(Ok(SseEvent::default().data(data.to_string())))
                .is_err()
            {
                return; // the client left; dropping `events` cancels the sequence
            }
            next = events.recv().await;
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Ok(Sse::new(UnboundedReceiverStream::new(rx)).into_response())
}
