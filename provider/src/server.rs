//! The HTTP API: OpenAI-compatible completions and chat completions (streaming by SSE or
//! not), vLLM-compatible adapter load/unload, `/v1/models` and Prometheus `/metrics`.
//!
//! The adapter of a request is named by `model` (an adapter alias or id, as vLLM does; the
//! base model's name means no adapter) or by an explicit `adapter` field, which wins.
//! Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, plus the
//! house's `field`; every status is chosen in [`ApiError`].

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::engine::{AdapterRef, Engine, Event, FinishReason, GenerateRequest, Sampling};
use crate::error::Error;
use crate::lora::{ADAPTER_CONFIG, load_adapter, read_adapter_id};

/// An HTTP error in OpenAI's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// Status.
    pub status: StatusCode,
    /// OpenAI `type` (`invalid_request_error`, `not_found_error`, …).
    pub kind: &'static str,
    /// Machine-readable code.
    pub code: &'static str,
    /// What went wrong and what to do.
    pub message: String,
    /// The request field at fault.
    pub field: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let kind = match status {
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::UNPROCESSABLE_ENTITY => "unprocessable_entity_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        Self {
            status,
            kind,
            code,
            message: message.into(),
            field: None,
        }
    }
    fn field(mut self, field: &'static str) -> Self {
        self.field = Some(field);
        self
    }
    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match &e {
            Error::UnknownAdapter(_) => {
                Self::new(StatusCode::NOT_FOUND, "model_not_found", e.to_string()).field("model")
            }
            Error::Config { .. }
            | Error::Safetensors { .. }
            | Error::AdapterMismatch(_)
            | Error::RankOverLimit { .. }
            | Error::Io { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_adapter",
                e.to_string(),
            ),
            Error::BadRequest(_) => Self::bad_request(e.to_string()),
            Error::CacheFull { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "cache_full", e.to_string())
            }
            // Internal text is not echoed.
            _ => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "internal error; see the provider's log",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.field,
                "code": self.code,
                "field": self.field,
            }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

/// What the router serves.
#[derive(Clone, Debug)]
pub struct AppState {
    engine: Engine,
    model_name: String,
    registry: Arc<Mutex<BTreeMap<String, AdapterRef>>>,
    max_rank: usize,
}

impl AppState {
    /// State over a running `engine`; the base answers to `model_name`.
    pub fn new(engine: Engine, model_name: impl Into<String>, max_rank: usize) -> Self {
        Self {
            engine,
            model_name: model_name.into(),
            registry: Arc::new(Mutex::new(BTreeMap::new())),
            max_rank,
        }
    }

    /// Registers every sub-directory of `dir` holding an `adapter_config.json` under its
    /// folder name (loaded on first use). Returns the aliases.
    pub fn register_dir(&self, dir: &Path) -> crate::Result<Vec<String>> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join(ADAPTER_CONFIG).exists())
            .collect();
        entries.sort();
        let mut aliases = Vec::new();
        for path in entries {
            let alias = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            self.register(&alias, &path)?;
            aliases.push(alias);
        }
        Ok(aliases)
    }

    /// Registers one adapter directory under `alias` (hashing its files for the id).
    pub fn register(&self, alias: &str, dir: &Path) -> crate::Result<AdapterRef> {
        let adapter = AdapterRef {
            id: read_adapter_id(dir)?,
            alias: alias.to_string(),
            dir: dir.to_path_buf(),
        };
        self.registry().insert(alias.to_string(), adapter.clone());
        Ok(adapter)
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AdapterRef>> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The adapter named `name` (alias or id); `None` for the base model's name.
    fn resolve(&self, name: &str) -> Result<Option<AdapterRef>, ApiError> {
        if name == self.model_name {
            return Ok(None);
        }
        let registry = self.registry();
        if let Some(a) = registry.get(name) {
            return Ok(Some(a.clone()));
        }
        if let Some(a) = registry.values().find(|a| a.id == name) {
            return Ok(Some(a.clone()));
        }
        Err(Error::UnknownAdapter(name.to_string()).into())
    }
}

/// The router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/load_lora_adapter", post(load_lora))
        .route("/v1/unload_lora_adapter", post(unload_lora))
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok" }))
        .with_state(state)
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models(State(state): State<AppState>) -> axum::Json<Value> {
    let created = unix_now();
    let max_len = state.engine.model().config().max_position_embeddings;
    let mut data = vec![json!({
        "id": state.model_name, "object": "model", "created": created,
        "owned_by": "cx-provider", "root": state.model_name, "parent": null,
        "max_model_len": max_len,
    })];
    let resident: Vec<String> = {
        let cache = state.engine.shared().cache();
        state
            .registry()
            .values()
            .filter(|a| cache.contains(&a.id))
            .map(|a| a.id.clone())
            .collect()
    };
    for a in state.registry().values() {
        data.push(json!({
            "id": a.alias, "object": "model", "created": created, "owned_by": "cx-provider",
            "root": a.id, "parent": state.model_name, "max_model_len": max_len,
            "adapter_id": a.id, "resident": resident.contains(&a.id),
        }));
    }
    axum::Json(json!({ "object": "list", "data": data }))
}

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

async fn completions(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
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

async fn chat_completions(
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

fn failed(status: u16, message: String) -> ApiError {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let code = match status.as_u16() {
        422 => "invalid_adapter",
        503 => "unavailable",
        _ => "generation_failed",
    };
    ApiError::new(status, code, message)
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
                Some(Event::Failed { status, message }) => return Err(failed(status, message)),
                None => {
                    return Err(failed(503, "the scheduler dropped the request".into()));
                }
            }
        }
    }
    // Streaming: the first event decides between an error status and a 200 SSE stream.
    let first = events.recv().await;
    if let Some(Event::Failed { status, message }) = first {
        return Err(failed(status, message));
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
                Event::Failed { message, .. } => json!({"error": {"message": message}}),
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

#[derive(Deserialize)]
struct LoadLora {
    lora_name: String,
    lora_path: PathBuf,
    /// Rent on state: never evicted while pinned.
    #[serde(default)]
    pin: bool,
}

async fn load_lora(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let request: LoadLora = parse(&body)?;
    if request.lora_name.is_empty() || request.lora_name == state.model_name {
        return Err(
            ApiError::bad_request("lora_name must be a new, non-empty name").field("lora_name"),
        );
    }
    let engine = state.engine.clone();
    let max_rank = state.max_rank;
    let dir = request.lora_path.clone();
    // Parsing and checking run off the async workers (and off the batch thread).
    let loaded = tokio::task::spawn_blocking(move || {
        let t = std::time::Instant::now();
        load_adapter(&dir, engine.model().config(), max_rank).map(|a| (a, t.elapsed()))
    })
    .await
    .map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "load task failed",
        )
    })?;
    let (adapter, took) = loaded.map_err(|e| ApiError::from(e).field("lora_path"))?;
    let adapter = Arc::new(adapter);
    let shared = state.engine.shared().clone();
    let evicted = {
        let mut cache = shared.cache();
        cache.record_load_time(adapter.bytes(), took.as_secs_f64());
        cache.insert(adapter.clone(), request.pin, shared.now_s())?
    };
    state.registry().insert(
        request.lora_name.clone(),
        AdapterRef {
            id: adapter.id().to_string(),
            alias: request.lora_name.clone(),
            dir: request.lora_path,
        },
    );
    Ok(axum::Json(json!({
        "status": "ok",
        "message": format!("Success: LoRA adapter '{}' added successfully.", request.lora_name),
        "lora_name": request.lora_name, "id": adapter.id(), "rank": adapter.rank(),
        "bytes": adapter.bytes(), "pinned": request.pin, "evicted": evicted,
    }))
    .into_response())
}

#[derive(Deserialize)]
struct UnloadLora {
    lora_name: String,
}

async fn unload_lora(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let request: UnloadLora = parse(&body)?;
    let removed = state.registry().remove(&request.lora_name);
    let Some(adapter) = removed else {
        return Err(Error::UnknownAdapter(request.lora_name).into());
    };
    let still_named = state.registry().values().any(|a| a.id == adapter.id);
    if !still_named {
        state.engine.shared().cache().remove(&adapter.id);
    }
    Ok(axum::Json(json!({
        "status": "ok",
        "message": format!("Success: LoRA adapter '{}' removed successfully.", request.lora_name),
    }))
    .into_response())
}

async fn metrics(State(state): State<AppState>) -> Response {
    let shared = state.engine.shared();
    let stats = shared
        .stats
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let now = shared.now_s();
    let (cache_stats, resident, slot_bytes, shadow) = {
        let cache = shared.cache();
        let resident = cache.resident(now);
        let slot_bytes = if resident.is_empty() {
            0
        } else {
            resident.iter().map(|r| r.bytes).sum::<u64>() / resident.len() as u64
        };
        let shadow = cache.shadow_price(slot_bytes, now);
        (cache.stats(), resident, slot_bytes, shadow)
    };
    let aliases: BTreeMap<String, String> = state
        .registry()
        .values()
        .map(|a| (a.id.clone(), a.alias.clone()))
        .collect();
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, kind: &str, rows: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, value) in rows {
            out.push_str(&format!("{name}{labels} {value}\n"));
        }
    };
    let per_adapter = |m: &BTreeMap<String, usize>| {
        m.iter()
            .map(|(a, n)| (format!("{{adapter=\"{}\"}}", escape(a)), *n as f64))
            .collect::<Vec<_>>()
    };
    gauge(
        "cx_provider_running_sequences",
        "Sequences in the running batch, by adapter.",
        "gauge",
        per_adapter(&stats.running),
    );
    gauge(
        "cx_provider_waiting_sequences",
        "Sequences waiting to join the batch, by adapter.",
        "gauge",
        per_adapter(&stats.waiting),
    );
    gauge(
        "cx_provider_resident_adapters",
        "Adapters resident in memory.",
        "gauge",
        vec![(String::new(), cache_stats.resident_adapters as f64)],
    );
    gauge(
        "cx_provider_resident_adapter_bytes",
        "Bytes held by resident adapters.",
        "gauge",
        vec![(String::new(), cache_stats.resident_bytes as f64)],
    );
    gauge(
        "cx_provider_cache_budget_bytes",
        "Byte budget of the adapter cache.",
        "gauge",
        vec![(String::new(), cache_stats.budget_bytes as f64)],
    );
    gauge(
        "cx_provider_cache_hits_total",
        "Adapter lookups that found it resident.",
        "counter",
        vec![(String::new(), cache_stats.hits as f64)],
    );
    gauge(
        "cx_provider_cache_misses_total",
        "Adapter lookups that had to load from disk.",
        "counter",
        vec![(String::new(), cache_stats.misses as f64)],
    );
    gauge(
        "cx_provider_cache_evictions_total",
        "Adapters evicted to make room.",
        "counter",
        vec![(String::new(), cache_stats.evictions as f64)],
    );
    gauge(
        "cx_provider_cache_loads_total",
        "Adapters made resident.",
        "counter",
        vec![(String::new(), cache_stats.loads as f64)],
    );
    gauge(
        "cx_provider_slot_shadow_price",
        "Expected discounted value (seconds of loading saved) given up to make room for a slot of slot_bytes (SPEC §4); +Inf when no room can be made.",
        "gauge",
        vec![(
            format!("{{slot_bytes=\"{slot_bytes}\"}}"),
            shadow.unwrap_or(f64::INFINITY),
        )],
    );
    gauge(
        "cx_provider_adapter_value_per_byte",
        "Expected discounted value per byte of each resident adapter.",
        "gauge",
        resident
            .iter()
            .map(|r| {
                let alias = aliases.get(&r.id).cloned().unwrap_or_default();
                (
                    format!(
                        "{{adapter=\"{}\",id=\"{}\",pinned=\"{}\"}}",
                        escape(&alias),
                        r.id,
                        r.pinned
                    ),
                    r.value_per_byte,
                )
            })
            .collect(),
    );
    gauge(
        "cx_provider_batch_steps_total",
        "Forward steps run.",
        "counter",
        vec![(String::new(), stats.steps as f64)],
    );
    gauge(
        "cx_provider_generated_tokens_total",
        "Tokens generated.",
        "counter",
        vec![(String::new(), stats.generated_tokens as f64)],
    );
    gauge(
        "cx_provider_max_batch_sequences",
        "Largest batch seen, in sequences.",
        "gauge",
        vec![(String::new(), stats.max_batch_seen as f64)],
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
