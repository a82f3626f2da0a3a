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

use super::{ApiError, AppState, parse, unix_now};
use crate::engine::{Event, FinishReason, GenerateRequest, Sampling};
use crate::error::Error;

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct CommonParams {
    model: Option<String>,
    adapter: Option<String>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f32>,
    seed: Option<u64>,
    stop: Option<Stop>,
    #[serde(default)]
    stream: bool,
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: Prompt,
    #[serde(flatten)]
    common: CommonParams,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Value,
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMessage>,
    #[serde(flatten)]
    common: CommonParams,
}

/// Default `max_tokens` when a request names none.
const DEFAULT_MAX_TOKENS: usize = 16;

struct Prepared {
    request: GenerateRequest,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    model: String,
    stream: bool,
}

fn prepare(state: &AppState, prompt: Vec<u32>, common: CommonParams) -> Result<Prepared, ApiError> {
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
    let max_tokens = common
        .max_completion_tokens
        .or(common.max_tokens)
        .unwrap_or(DEFAULT_MAX_TOKENS);
    let limit = config.max_position_embeddings;
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
    if prompt.len() >= limit || prompt.len() + max_tokens > limit {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
            format!(
                "this model's maximum context length is {limit} tokens; the prompt has {} \
                 tokens and max_tokens is {max_tokens}; shorten the prompt or lower max_tokens",
                prompt.len()
            ),
        )
        .field("prompt"));
    }
    let temperature = common.temperature.unwrap_or(0.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::bad_request("temperature must be ≥ 0").field("temperature"));
    }
    let stop = match common.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    let (tx, rx) = unbounded_channel();
    let model = adapter
        .as_ref()
        .map_or_else(|| state.model_name.clone(), |a| a.alias.clone());
    Ok(Prepared {
        request: GenerateRequest {
            prompt,
            adapter,
            max_tokens,
            stop,
            sampling: Sampling {
                temperature,
                seed: common.seed.unwrap_or_else(unix_now),
            },
            events: tx,
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

pub(super) async fn completions(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse(&body)?;
    let prompt = match request.prompt {
        Prompt::Text(text) => encode(&state, &text)?,
        Prompt::Texts(texts) if texts.len() == 1 => encode(&state, &texts[0])?,
        Prompt::Texts(_) => {
            return Err(ApiError::bad_request(
                "send one prompt per request (batched prompts are not supported)",
            )
            .field("prompt"));
        }
        Prompt::Tokens(tokens) => tokens,
    };
    let prepared = prepare(&state, prompt, request.common)?;
    run(state, prepared, Kind::Completion).await
}

pub(super) async fn chat_completions(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse(&body)?;
    if request.messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").field("messages"));
    }
    // A fixed role-tagged template (no Jinja chat templates): `<|role|>\ncontent\n` per
    // message, then `<|assistant|>\n`.
    let mut text = String::new();
    for m in &request.messages {
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
        text.push_str(&format!("<|{}|>\n{content}\n", m.role));
    }
    text.push_str("<|assistant|>\n");
    let prompt = encode(&state, &text)?;
    let prepared = prepare(&state, prompt, request.common)?;
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
