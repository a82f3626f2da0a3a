//! OpenAI's `/v1/completions` and `/v1/chat/completions`: the request's checks (prompt,
//! context length, temperature), then the engine; the answer whole or as server-sent events.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::body::Body;
use super::{ApiError, AppState, unix_now};
use crate::chat_template::ChatMessage as TemplateMessage;
use crate::engine::{Conversation, Event, FinishReason, GenerateRequest, Sampling, TokenLogprobs};
use crate::error::Error;
use crate::tokenizer::Tokenizer;
use request::{
    ChatCompletionRequest, ChatMessage, Common, CompletionRequest, Logprobs, Prompt, Stop,
};

pub(super) mod request;

/// Default `max_tokens` when a request names none.
const DEFAULT_MAX_TOKENS: u64 = 16;

/// Stop sequences per request at most (OpenAI's limit).
pub(super) const MAX_STOP_SEQUENCES: usize = 4;

/// Bytes of one stop sequence at most. The scheduler checks every running sequence's stops
/// after each token on the one batch thread, so their size bounds what one request can cost
/// all the others.
pub(super) const MAX_STOP_BYTES: usize = 512;

/// Choices per request at most (`n`): each is a sequence of its own in the batch.
pub(super) const MAX_CHOICES: u32 = 8;

/// `top_logprobs` at most (OpenAI's limit for chat; 5 for the legacy completions).
pub(super) const MAX_TOP_LOGPROBS: u8 = 20;

/// The legacy completions' `logprobs` at most.
pub(super) const MAX_COMPLETION_LOGPROBS: u8 = 5;

/// `temperature` [default: 0]: read as an f64 and checked before it narrows, so a value past
/// f32's range is refused rather than rounded to `f32::MAX` (or to infinity).
pub(super) fn temperature(temperature: Option<f64>) -> Result<f32, ApiError> {
    let temperature = temperature.unwrap_or(0.0);
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

/// A number field within `range`, or a 400 naming it.
fn number_in(
    value: Option<f64>,
    name: &'static str,
    default: f64,
    range: std::ops::RangeInclusive<f64>,
    what: &str,
) -> Result<f64, ApiError> {
    let value = value.unwrap_or(default);
    if !range.contains(&value) {
        return Err(
            ApiError::bad_request(format!("`{name}` must be {what}, got {value}")).field(name),
        );
    }
    Ok(value)
}

/// OpenAI's sampling parameters and `n`. Without a `seed`, one is drawn from the operating
/// system (and each choice draws on its own stream of it).
fn sampling(body: &Common, kind: Kind) -> Result<(Sampling, u32), ApiError> {
    let temperature = temperature(body.temperature)?;
    let top_p = number_in(
        body.top_p,
        "top_p",
        1.0,
        f64::MIN_POSITIVE..=1.0,
        "in (0, 1]",
    )?;
    let top_k = match body.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k => u32::try_from(k).map_err(|_| {
            ApiError::bad_request(format!(
                "`top_k` must be a positive number of tokens, or 0 or -1 for all, got {k}"
            ))
            .field("top_k")
        })?,
    };
    let penalty = |value, name| number_in(value, name, 0.0, -2.0..=2.0, "in [-2, 2]");
    let presence_penalty = penalty(body.presence_penalty, "presence_penalty")?;
    let frequency_penalty = penalty(body.frequency_penalty, "frequency_penalty")?;
    let n = body.n.unwrap_or(1);
    if !(1..=u64::from(MAX_CHOICES)).contains(&n) {
        return Err(ApiError::bad_request(format!(
            "`n` must be 1 to {MAX_CHOICES} choices, got {n}"
        ))
        .field("n"));
    }
    let logprobs = match (kind, &body.logprobs) {
        (_, None | Some(Logprobs::Flag(false))) => None,
        (Kind::Chat, Some(Logprobs::Flag(true))) => {
            let top = body.top_logprobs.unwrap_or(0);
            if top > u64::from(MAX_TOP_LOGPROBS) {
                return Err(ApiError::bad_request(format!(
                    "`top_logprobs` must be 0 to {MAX_TOP_LOGPROBS}, got {top}"
                ))
                .field("top_logprobs"));
            }
            Some(top as u8)
        }
        (Kind::Completion, Some(Logprobs::Count(k))) if *k <= MAX_COMPLETION_LOGPROBS => Some(*k),
        (Kind::Chat, Some(Logprobs::Count(_))) => {
            return Err(ApiError::bad_request(
                "`logprobs` is a boolean on chat completions (the number of alternatives is \
                 `top_logprobs`)",
            )
            .field("logprobs"));
        }
        (Kind::Completion, Some(_)) => {
            return Err(ApiError::bad_request(format!(
                "`logprobs` is the number of alternatives per token on completions, 0 to \
                 {MAX_COMPLETION_LOGPROBS}"
            ))
            .field("logprobs"));
        }
    };
    if logprobs.is_none() && body.top_logprobs.is_some_and(|k| k > 0) {
        return Err(
            ApiError::bad_request("`top_logprobs` needs `logprobs: true`").field("top_logprobs"),
        );
    }
    let seed = match body.seed {
        Some(seed) => seed,
        None => getrandom::u64().unwrap_or_else(|_| unix_now()),
    };
    Ok((
        Sampling {
            temperature,
            top_p: top_p as f32,
            top_k,
            presence_penalty: presence_penalty as f32,
            frequency_penalty: frequency_penalty as f32,
            seed,
            choice: 0,
            logprobs,
        },
        n as u32,
    ))
}

struct CommonParams {
    model: Option<String>,
    adapter: Option<String>,
    max_tokens: u64,
    max_tokens_field: &'static str,
    sampling: Sampling,
    n: u32,
    stop: Vec<String>,
    stream: bool,
}

impl CommonParams {
    /// The fields both endpoints read, checked.
    fn read(body: Common, kind: Kind) -> Result<Self, ApiError> {
        let (max_tokens, max_tokens_field) = match body.max_completion_tokens {
            Some(n) => (n, "max_completion_tokens"),
            None => (body.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS), "max_tokens"),
        };
        if max_tokens == 0 {
            return Err(ApiError::bad_request(format!(
                "{max_tokens_field} must be at least 1, got 0"
            ))
            .field(max_tokens_field));
        }
        let (sampling, n) = sampling(&body, kind)?;
        let stop = Stop::into_vec(body.stop);
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
            model: body.model,
            adapter: body.adapter,
            max_tokens,
            max_tokens_field,
            sampling,
            n,
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
            stream: body.stream.unwrap_or(false),
        })
    }
}

/// The engine requests of one API request (one per choice) and where their events arrive.
struct Prepared {
    choices: Vec<(GenerateRequest, tokio::sync::mpsc::UnboundedReceiver<Event>)>,
    model: String,
    stream: bool,
    logprobs: bool,
}

/// The checks every completion shares, and the engine requests. `text` is the prompt's text
/// when it came as text: with it, a chat-shaped prompt continues a held conversation prefix and
/// its turn is held as the next one (the first choice's only).
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
    let model = adapter
        .as_ref()
        .map_or_else(|| state.model_name.clone(), |a| a.alias.clone());
    let choices = (0..common.n)
        .map(|choice| {
            let (tx, rx) = unbounded_channel();
            let request = GenerateRequest {
                prompt: prompt.clone(),
                adapter: adapter.clone(),
                max_tokens,
                stop: common.stop.clone(),
                sampling: Sampling {
                    choice,
                    ..common.sampling
                },
                events: tx,
                stream: common.stream,
                conversation: text.as_ref().filter(|_| choice == 0).map(|prompt_text| {
                    Conversation {
                        model: state.model_name.clone(),
                        prompt_text: prompt_text.clone(),
                    }
                }),
            };
            (request, rx)
        })
        .collect();
    Ok(Prepared {
        choices,
        model,
        stream: common.stream,
        logprobs: common.sampling.logprobs.is_some(),
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

#[utoipa::path(post, path = "/v1/completions", operation_id = "create_completion", tag = "openai", request_body = request::CompletionRequest, responses((status = 200, description = "the completion, or with `stream` its server-sent events (each `data:` a chunk, `data: [DONE]` last)", content((super::openapi::responses::Completion = "application/json"), (String = "text/event-stream"))), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn completions(
    State(state): State<AppState>,
    Body(request): Body<CompletionRequest>,
) -> Result<Response, ApiError> {
    let (common, prompt) = request.split();
    let common = CommonParams::read(common, Kind::Completion)?;
    let one_prompt = || {
        ApiError::bad_request(
            "send one prompt per request (batched prompts are not supported; send each as \
             its own request, they are batched by the server)",
        )
        .field("prompt")
    };
    let (prompt, text) = match prompt {
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

#[utoipa::path(post, path = "/v1/chat/completions", operation_id = "create_chat_completion", tag = "openai", request_body = request::ChatCompletionRequest, responses((status = 200, description = "the chat completion, or with `stream` its server-sent events (each `data:` a chunk, `data: [DONE]` last)", content((super::openapi::responses::ChatCompletion = "application/json"), (String = "text/event-stream"))), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn chat_completions(
    State(state): State<AppState>,
    Body(request): Body<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let (common, messages) = request.split();
    let common = CommonParams::read(common, Kind::Chat)?;
    let messages = messages
        .ok_or_else(|| ApiError::bad_request("`messages` is required").field("messages"))?;
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages is empty").field("messages"));
    }
    let messages = template_messages(&messages)?;
    // The model's own chat template renders the chat (see `chat_template`).
    let (text, prompt) = state
        .engine
        .tokenizer()
        .encode_chat(&messages)
        .map_err(|e| ApiError::from(&e))?;
    let prepared = prepare(&state, prompt, Some(text), common)?;
    run(state, prepared, Kind::Chat).await
}

/// The messages as the template sees them: a content of text parts is their text joined; any
/// other part (an image, audio) is refused by name rather than dropped.
fn template_messages(messages: &[ChatMessage]) -> Result<Vec<TemplateMessage>, ApiError> {
    messages
        .iter()
        .map(|m| {
            let content = match &m.content {
                Value::String(s) => s.clone(),
                Value::Array(parts) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.get("type").and_then(Value::as_str), part.get("text")) {
                            (Some("text") | None, Some(Value::String(t))) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad_request(format!(
                                    "message content part of type `{}` is not supported (text \
                                     only)",
                                    kind.unwrap_or("?")
                                ))
                                .field("messages"));
                            }
                        }
                    }
                    text
                }
                Value::Null => String::new(),
                _ => {
                    return Err(ApiError::bad_request(
                        "message content must be a string or a list of text parts",
                    )
                    .field("messages"));
                }
            };
            Ok(TemplateMessage::new(m.role.clone(), content))
        })
        .collect()
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

/// A log-probability as JSON: finite (a token the model rules out gets -9999, as vLLM writes
/// it; JSON has no -∞).
fn finite(logprob: f32) -> f64 {
    if logprob.is_finite() {
        f64::from(logprob)
    } else {
        -9999.0
    }
}

/// One chat `logprobs.content` entry.
fn chat_logprob(tokenizer: &Tokenizer, token: u32, lp: &TokenLogprobs) -> Value {
    let entry = |id: u32, logprob: f32| {
        let text = tokenizer.token_text(id);
        json!({"token": text, "logprob": finite(logprob), "bytes": text.as_bytes()})
    };
    let mut e = entry(token, lp.logprob);
    e["top_logprobs"] = lp.top.iter().map(|&(id, l)| entry(id, l)).collect();
    e
}

/// The legacy completions' `logprobs` object of `tokens` (text offsets from `offset`).
fn completion_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[(u32, TokenLogprobs)],
    mut offset: usize,
) -> Value {
    let mut texts = Vec::new();
    let mut values = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for (token, lp) in tokens {
        let text = tokenizer.token_text(*token);
        offsets.push(offset);
        offset += text.len();
        texts.push(text);
        values.push(finite(lp.logprob));
        let top: serde_json::Map<String, Value> = lp
            .top
            .iter()
            .map(|&(id, l)| (tokenizer.token_text(id), json!(finite(l))))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
}

/// What one choice produced.
#[derive(Default)]
struct Choice {
    text: String,
    tokens: Vec<u32>,
    logprobs: Vec<(u32, TokenLogprobs)>,
    finish_reason: Option<FinishReason>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

/// Waits for one choice's events to the end.
async fn collect(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Choice, ApiError> {
    let mut choice = Choice::default();
    loop {
        match events.recv().await {
            Some(Event::Text {
                delta,
                token,
                logprobs,
            }) => {
                choice.text.push_str(&delta);
                choice.tokens.push(token);
                if let Some(lp) = logprobs {
                    choice.logprobs.push((token, lp));
                }
            }
            Some(Event::Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
            }) => {
                choice.finish_reason = Some(finish_reason);
                choice.prompt_tokens = prompt_tokens;
                choice.completion_tokens = completion_tokens;
                return Ok(choice);
            }
            Some(Event::Failed(error)) => return Err(ApiError::from(error.as_ref())),
            None => return Err(Error::SchedulerStopped.into()),
        }
    }
}

async fn run(state: AppState, prepared: Prepared, kind: Kind) -> Result<Response, ApiError> {
    let Prepared {
        choices,
        model,
        stream,
        logprobs,
    } = prepared;
    let mut receivers = Vec::with_capacity(choices.len());
    for (request, rx) in choices {
        state.engine.submit(request);
        receivers.push(rx);
    }
    let tokenizer = state.engine.tokenizer().clone();
    let id = request_id(kind);
    let created = unix_now();
    if !stream {
        let mut out = Vec::with_capacity(receivers.len());
        let (mut prompt_tokens, mut completion_tokens) = (0, 0);
        for (index, rx) in receivers.iter_mut().enumerate() {
            let choice = collect(rx).await?;
            prompt_tokens = choice.prompt_tokens;
            completion_tokens += choice.completion_tokens;
            let lp = logprobs.then(|| match kind {
                Kind::Completion => completion_logprobs(&tokenizer, &choice.logprobs, 0),
                Kind::Chat => json!({"content": choice
                    .logprobs
                    .iter()
                    .map(|(t, lp)| chat_logprob(&tokenizer, *t, lp))
                    .collect::<Vec<_>>()}),
            });
            out.push(match kind {
                Kind::Completion => json!({
                    "index": index, "text": choice.text, "logprobs": lp,
                    "finish_reason": choice.finish_reason, "token_ids": choice.tokens,
                }),
                Kind::Chat => json!({
                    "index": index, "message": {"role": "assistant", "content": choice.text},
                    "logprobs": lp, "finish_reason": choice.finish_reason,
                }),
            });
        }
        let usage = json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        });
        let object = match kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion",
        };
        return Ok(axum::Json(json!({
            "id": id, "object": object, "created": created, "model": model,
            "choices": out, "usage": usage,
        }))
        .into_response());
    }
    // Streaming: the first event of every choice decides between an error status and a 200
    // SSE stream.
    let mut firsts = Vec::with_capacity(receivers.len());
    for rx in &mut receivers {
        let first = rx.recv().await;
        if let Some(Event::Failed(error)) = &first {
            return Err(ApiError::from(error.as_ref()));
        }
        firsts.push(first);
    }
    // Each choice's events go, tagged with its index, into one channel the response reads; a
    // client that leaves drops it, which drops every choice's receiver and cancels them.
    let (merged_tx, mut merged) = unbounded_channel::<(usize, Event)>();
    for (index, (first, mut rx)) in firsts.into_iter().zip(receivers).enumerate() {
        let merged_tx = merged_tx.clone();
        tokio::spawn(async move {
            let mut next = first;
            while let Some(event) = next {
                if merged_tx.send((index, event)).is_err() {
                    return;
                }
                next = rx.recv().await;
            }
        });
    }
    drop(merged_tx);
    let (tx, rx) = unbounded_channel::<Result<SseEvent, Infallible>>();
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let chunk = move |index: usize,
                      delta: Option<&str>,
                      lp: Option<Value>,
                      finish: Option<FinishReason>,
                      first: bool| {
        let choice = match kind {
            Kind::Completion => json!({
                "index": index, "text": delta.unwrap_or(""), "logprobs": lp,
                "finish_reason": finish,
            }),
            Kind::Chat => {
                let mut d = serde_json::Map::new();
                if first {
                    d.insert("role".into(), json!("assistant"));
                }
                if let Some(delta) = delta {
                    d.insert("content".into(), json!(delta));
                }
                json!({"index": index, "delta": d, "logprobs": lp, "finish_reason": finish})
            }
        };
        json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]})
    };
    tokio::spawn(async move {
        // Per choice: whether its first chunk went out, and the text offset of its next token.
        let mut started = std::collections::HashSet::new();
        let mut offsets = std::collections::HashMap::<usize, usize>::new();
        while let Some((index, event)) = merged.recv().await {
            let first = started.insert(index);
            let data = match event {
                Event::Text {
                    delta,
                    token,
                    logprobs,
                } => {
                    let offset = offsets.entry(index).or_default();
                    let lp = logprobs.map(|lp| match kind {
                        Kind::Completion => {
                            completion_logprobs(&tokenizer, &[(token, lp)], *offset)
                        }
                        Kind::Chat => json!({"content": [chat_logprob(&tokenizer, token, &lp)]}),
                    });
                    *offset += delta.len();
                    chunk(index, Some(&delta), lp, None, first)
                }
                Event::Done { finish_reason, .. } => {
                    chunk(index, None, None, Some(finish_reason), first)
                }
                Event::Failed(error) => json!({"error": {"message": error.to_string()}}),
            };
            if tx
                .send(Ok(SseEvent::default().data(data.to_string())))
                .is_err()
            {
                return; // the client left; dropping `merged` cancels every choice
            }
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Ok(Sse::new(UnboundedReceiverStream::new(rx)).into_response())
}
