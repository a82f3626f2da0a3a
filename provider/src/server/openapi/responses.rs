//! The response bodies, as `/openapi.json` describes them. The handlers write them with
//! `json!` or as the engine's and the trainer's own types, so these are never built: the
//! document's only reader is utoipa's derive.

#![expect(
    dead_code,
    reason = "shapes for the document, never built (the handlers answer with json! or the \
              trainer's types)"
)]

use serde_json::Value;
use utoipa::ToSchema;

/// Every error: OpenAI's shape plus `field`.
#[derive(ToSchema)]
pub(in crate::server) struct ErrorBody {
    error: ErrorDetail,
}

/// What was refused and why.
#[derive(ToSchema)]
pub(in crate::server) struct ErrorDetail {
    /// What went wrong and what to do.
    message: String,
    /// `invalid_request_error`, `not_found_error`, `unprocessable_entity_error`, `server_error`.
    #[serde(rename = "type")]
    kind: String,
    /// The request field at fault (OpenAI's name).
    param: Option<String>,
    /// Machine-readable code (`invalid_request`, `model_not_found`, `rate_limited`, …).
    code: String,
    /// The request field at fault.
    field: Option<String>,
}

/// `stop` (EOS or a stop string) or `length` (max_tokens or the context).
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
pub(in crate::server) enum FinishReason {
    Stop,
    Length,
}

/// Tokens counted.
#[derive(ToSchema)]
pub(in crate::server) struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

/// A text completion.
#[derive(ToSchema)]
pub(in crate::server) struct Completion {
    id: String,
    /// `text_completion`
    object: String,
    created: u64,
    /// The base model's name or the adapter's alias.
    model: String,
    choices: Vec<CompletionChoice>,
    usage: Usage,
}

/// The one choice.
#[derive(ToSchema)]
pub(in crate::server) struct CompletionChoice {
    index: u32,
    text: String,
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
    finish_reason: FinishReason,
    /// The new tokens' ids.
    token_ids: Vec<u32>,
}

/// A chat completion.
#[derive(ToSchema)]
pub(in crate::server) struct ChatCompletion {
    id: String,
    /// `chat.completion`
    object: String,
    created: u64,
    model: String,
    choices: Vec<ChatChoice>,
    usage: Usage,
}

/// The one choice.
#[derive(ToSchema)]
pub(in crate::server) struct ChatChoice {
    index: u32,
    message: AssistantMessage,
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
    finish_reason: FinishReason,
}

/// The answer.
#[derive(ToSchema)]
pub(in crate::server) struct AssistantMessage {
    /// `assistant`
    role: String,
    content: String,
}

/// `GET /v1/models`.
#[derive(ToSchema)]
pub(in crate::server) struct ModelList {
    /// `list`
    object: String,
    /// The base first, then each adapter.
    data: Vec<ModelCard>,
}

/// The base or an adapter.
#[derive(ToSchema)]
pub(in crate::server) struct ModelCard {
    /// The name to put in `model`.
    id: String,
    /// `model`
    object: String,
    created: u64,
    owned_by: String,
    /// The base's name, or the adapter's id.
    root: String,
    /// The base's name for an adapter; null for the base.
    parent: Option<String>,
    max_model_len: u64,
    /// The adapter's content id (adapters only).
    adapter_id: Option<String>,
    /// Whether it is in memory now (adapters only).
    resident: Option<bool>,
}

/// An adapter loaded.
#[derive(ToSchema)]
pub(in crate::server) struct LoadedAdapter {
    /// `ok`
    status: String,
    message: String,
    lora_name: String,
    /// Content id.
    id: String,
    rank: u64,
    /// Bytes it holds in the cache.
    bytes: u64,
    pinned: bool,
    /// Ids evicted to make room.
    evicted: Vec<String>,
}

/// An adapter unloaded.
#[derive(ToSchema)]
pub(in crate::server) struct Unloaded {
    /// `ok`
    status: String,
    message: String,
}

/// A training client's LoRA configuration.
#[derive(ToSchema)]
pub(in crate::server) struct ClientConfig {
    rank: u64,
    lora_alpha: f64,
    target_modules: Vec<String>,
    use_rslora: bool,
    seed: u64,
    /// The scale `s`.
    scale: f64,
}

/// One loss measured.
#[derive(ToSchema)]
pub(in crate::server) struct LossEntry {
    step: u64,
    loss: f64,
    loss_weight: f64,
}

/// A training client.
#[derive(ToSchema)]
pub(in crate::server) struct ClientInfo {
    id: String,
    base_model: String,
    config: ClientConfig,
    step: u64,
    accumulated: u64,
    tokens_seen: u64,
    parameters: u64,
    bytes: u64,
    created: u64,
    saved: Vec<String>,
    /// Losses, oldest first (only in the single-client view).
    loss_history: Option<Vec<LossEntry>>,
}

/// The training clients.
#[derive(ToSchema)]
pub(in crate::server) struct ClientList {
    /// `list`
    object: String,
    data: Vec<ClientInfo>,
}

/// A client deleted.
#[derive(ToSchema)]
pub(in crate::server) struct Deleted {
    id: String,
    deleted: bool,
}

/// What one `forward_backward` did.
#[derive(ToSchema)]
pub(in crate::server) struct ForwardBackward {
    loss: f64,
    loss_weight: f64,
    tokens: u64,
    accumulated: u64,
}

/// What one `optim_step` did.
#[derive(ToSchema)]
pub(in crate::server) struct OptimStep {
    step: u64,
    grad_norm: f64,
    clipped: bool,
    applied: u64,
}

/// What a sample produced.
#[derive(ToSchema)]
pub(in crate::server) struct Sample {
    tokens: Vec<u32>,
    text: String,
    finish_reason: FinishReason,
}

/// What a save did.
#[derive(ToSchema)]
pub(in crate::server) struct Saved {
    id: String,
    name: String,
    path: String,
    step: u64,
    rank: u64,
    bytes: u64,
    pinned: bool,
    evicted: Vec<String>,
}

/// The asks now.
#[derive(ToSchema)]
pub(in crate::server) struct AskView {
    /// The model's ask, integer wei per compute-second as a decimal string.
    ask_wei_per_s: String,
    /// Tiers priced apart, each its ask.
    tiers: std::collections::BTreeMap<String, String>,
}

/// The ask set.
#[derive(ToSchema)]
pub(in crate::server) struct AskSet {
    ask_wei_per_s: String,
    tier: Option<cx_protocol::Tier>,
}
