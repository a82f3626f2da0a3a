//! `GET /openapi.json`: the API's OpenAPI 3.1 document, from the handlers' `#[utoipa::path]`
//! annotations and the doc-only request and response types below.
//!
//! The handlers read their bodies field by field ([`Body`](super::body::Body)), so the request
//! types here are never deserialized: each holds exactly the fields its route accepts, with
//! their types, ranges and which are required. They cannot drift from the handlers: every
//! route names its fields in one const (`LOAD_LORA_FIELDS`, …) that the handler passes to
//! `refuse_unknown` and the test below compares with the schema's properties. The parameters
//! the completions accept only at their neutral value (`n` = 1, `top_p` = 1, …) come into the
//! document from the handler's own table, each with the one value it accepts.
//!
//! The door's refusals (429 `rate_limited`, 503 `overloaded`, each with `Retry-After`) are
//! added to every operation here, in one place, as the door applies them to every route.

#![allow(dead_code)] // the doc-only types are read by utoipa's derive, never built

use axum::Json;
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::{OpenApi, ToSchema};

use super::{adapters, ask, metrics, openai, training};
use crate::model::Projection;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "cx-provider",
        description = "A provider node of compute-exchange: one Llama base with many LoRA \
                       adapters in one batched forward. OpenAI-compatible completions (SSE \
                       streaming), vLLM-compatible adapter load and unload, LoRA training \
                       clients, the ask on the exchange, Prometheus metrics. Every error is \
                       OpenAI's shape plus `field`."
    ),
    paths(
        health,
        metrics::metrics,
        document,
        adapters::models,
        openai::completions,
        openai::chat_completions,
        adapters::load_lora,
        adapters::unload_lora,
        training::create,
        training::list,
        training::get,
        training::delete,
        training::forward_backward,
        training::optim_step,
        training::sample,
        training::save_weights,
        ask::get,
        ask::put,
    )
)]
struct ApiDoc;

/// The document: utoipa's, with the neutral parameters and the door's refusals added.
pub(super) fn openapi() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    let schemas = &mut doc["components"]["schemas"];
    for name in ["CompletionRequest", "ChatCompletionRequest"] {
        if let Some(properties) = schemas[name]["properties"].as_object_mut() {
            for (field, _, schema) in openai::NEUTRAL {
                let mut schema: Value = serde_json::from_str(schema).unwrap_or_else(|_| json!({}));
                schema["description"] = json!(
                    "Not implemented by this server: accepted only at its neutral value \
                     (or null), refused by name otherwise."
                );
                properties.insert((*field).to_string(), schema);
            }
        }
    }
    // utoipa writes u64 as `int64`, whose range a client (or schemathesis) takes to end at
    // 2⁶³ - 1: the server reads the whole u64 range.
    unsigned_64(schemas);
    let error = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}});
    let retry_after = |what: &str| json!({"Retry-After": {"description": what, "schema": {"type": "integer", "minimum": 1}}});
    let Some(paths) = doc["paths"].as_object_mut() else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else {
            continue;
        };
        for operation in operations.values_mut() {
            let responses = &mut operation["responses"];
            responses["429"] = json!({
                "description": "`rate_limited`: over this server's rate per IP address \
                                (--rate-per-ip, --rate-burst-ip)",
                "headers": retry_after("whole seconds until a request is allowed again"),
                "content": error,
            });
            if !super::limits::exempt_from_in_flight(path) {
                responses["503"] = json!({
                    "description": "`overloaded` (over --max-in-flight requests in flight), or \
                                    the engine cannot take the request now (`unavailable`, \
                                    `cache_full`, `training_limit`, `training_off`)",
                    "headers": retry_after("seconds after which trying again may succeed"),
                    "content": error,
                });
            }
        }
    }
    doc
}

/// Every `{"format": "int64", "minimum": ≥ 0}` under `schema` (only the doc types' u64 fields
/// have both) becomes `uint64` up to 2⁶⁴ - 1.
fn unsigned_64(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let unsigned = object.get("format").and_then(Value::as_str) == Some("int64")
                && object
                    .get("minimum")
                    .and_then(Value::as_f64)
                    .is_some_and(|m| m >= 0.0);
            if unsigned {
                object.insert("format".into(), json!("uint64"));
                object.insert("maximum".into(), json!(u64::MAX));
            }
            object.values_mut().for_each(unsigned_64);
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned_64),
        _ => {}
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "service", responses((status = 200, description = "this OpenAPI 3.1 document", body = Object)))]
pub(super) async fn document() -> Json<Value> {
    Json(openapi())
}

/// Liveness.
#[utoipa::path(get, path = "/health", operation_id = "health", tag = "service", responses((status = 200, description = "`ok`", body = String, content_type = "text/plain")))]
pub(super) async fn health() -> &'static str {
    "ok"
}

// ---------------------------------------------------------------------------------------------
// Field schemas that serde-shaped types cannot say (one of several shapes, PEFT names).

fn null() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::Null)
}

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

fn token_id() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(0))
        .maximum(Some(u32::MAX))
}

fn array(items: impl Into<RefOr<Schema>>) -> ArrayBuilder {
    ArrayBuilder::new().items(items.into())
}

/// Token ids: at least one, each in the vocabulary (checked against the model served).
fn tokens() -> ArrayBuilder {
    array(token_id()).min_items(Some(1))
}

/// `prompt` of `/v1/completions`: a text or token ids, or a batch of exactly one of either.
fn completion_prompt() -> impl Into<RefOr<Schema>> {
    OneOfBuilder::new()
        .item(string())
        .item(array(string()).min_items(Some(1)).max_items(Some(1)))
        .item(tokens())
        .item(array(tokens()).min_items(Some(1)).max_items(Some(1)))
        .description(Some(
            "one prompt: a text or token ids (a batch of one is accepted; send each prompt \
             as its own request, the server batches them)",
        ))
}

/// `prompt` of a training client's `sample`: a text or token ids.
fn sample_prompt() -> impl Into<RefOr<Schema>> {
    OneOfBuilder::new().item(string()).item(tokens())
}

/// `stop`: one string or at most four, each at most 512 bytes.
fn stop() -> impl Into<RefOr<Schema>> {
    let one = || {
        string()
            .max_length(Some(openai::MAX_STOP_BYTES))
            .description(Some("at most 512 bytes of UTF-8"))
    };
    OneOfBuilder::new()
        .item(one())
        .item(array(one()).max_items(Some(openai::MAX_STOP_SEQUENCES)))
        .item(null())
}

/// A chat message's `content`: text, parts whose `text` is joined, or null.
fn chat_content() -> impl Into<RefOr<Schema>> {
    let part = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("type", string())
        .property("text", string());
    OneOfBuilder::new()
        .item(string())
        .item(array(part))
        .item(null())
}

/// PEFT's module names.
fn target_modules() -> impl Into<RefOr<Schema>> {
    let name = string().enum_values(Some(Projection::ALL.iter().map(|p| p.name())));
    OneOfBuilder::new()
        .item(array(name).min_items(Some(1)))
        .item(null())
        .description(Some("the projections to adapt [default: all seven]"))
}

/// `betas` of AdamW, each in [0, 1) [default: [0.9, 0.999]].
fn betas() -> impl Into<RefOr<Schema>> {
    let beta = ObjectBuilder::new()
        .schema_type(Type::Number)
        .minimum(Some(0))
        .exclusive_maximum(Some(1));
    OneOfBuilder::new()
        .item(array(beta).min_items(Some(2)).max_items(Some(2)))
        .item(null())
}

/// `loss_mask`: a weight per token of each sequence.
fn loss_mask() -> impl Into<RefOr<Schema>> {
    let weight = ObjectBuilder::new().schema_type(Type::Number);
    OneOfBuilder::new()
        .item(array(array(weight)))
        .item(null())
        .description(Some(
            "weights of each token as a target [default: all but the first]",
        ))
}

/// `ask_wei_per_s`: integer wei, as a decimal string or a number, above zero.
fn wei() -> impl Into<RefOr<Schema>> {
    OneOfBuilder::new()
        .item(string().pattern(Some("^[0-9]+$")).max_length(Some(20)))
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(u64::MAX)),
        )
}

// ---------------------------------------------------------------------------------------------
// Request bodies (doc-only; the handlers read fields by name).

/// `POST /v1/completions`.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CompletionRequest {
    /// The base model's name or an adapter's alias or id.
    model: String,
    /// An adapter (alias or id); wins over `model`.
    adapter: Option<String>,
    #[schema(schema_with = completion_prompt)]
    prompt: Value,
    /// New tokens at most (prompt + max_tokens within the context) [default: 16].
    #[schema(minimum = 1)]
    max_tokens: Option<u64>,
    /// OpenAI's newer name of `max_tokens`; wins over it.
    #[schema(minimum = 1)]
    max_completion_tokens: Option<u64>,
    /// 0 is greedy [default: 0].
    #[schema(minimum = 0.0, maximum = 3.4028234663852886e38)]
    temperature: Option<f64>,
    /// Nucleus sampling: the likeliest tokens whose probabilities add up to this [default: 1].
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    /// Sample from this many likeliest tokens; 0 or -1: all [default: 0].
    #[schema(minimum = -1)]
    top_k: Option<i64>,
    /// Subtracted once from the logit of every token already generated [default: 0].
    #[schema(minimum = -2.0, maximum = 2.0)]
    presence_penalty: Option<f64>,
    /// Subtracted from a token's logit per time it was generated [default: 0].
    #[schema(minimum = -2.0, maximum = 2.0)]
    frequency_penalty: Option<f64>,
    /// The sampling seed: the same request and seed give the same text on every provider of
    /// the same kernels [default: drawn at random].
    seed: Option<u64>,
    /// Choices to generate, each its own draw [default: 1].
    #[schema(minimum = 1, maximum = 8)]
    n: Option<u64>,
    /// Log-probabilities of each chosen token and of this many likeliest alternatives.
    #[schema(minimum = 0, maximum = 5)]
    logprobs: Option<u8>,
    #[schema(schema_with = stop)]
    stop: Option<Value>,
    /// Server-sent events, `data: [DONE]` last.
    stream: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ChatCompletionRequest {
    /// The base model's name or an adapter's alias or id.
    model: String,
    /// An adapter (alias or id); wins over `model`.
    adapter: Option<String>,
    /// The conversation, rendered by the model's own chat template.
    #[schema(min_items = 1)]
    messages: Vec<ChatMessage>,
    /// New tokens at most (prompt + max_tokens within the context) [default: 16].
    #[schema(minimum = 1)]
    max_tokens: Option<u64>,
    /// OpenAI's newer name of `max_tokens`; wins over it.
    #[schema(minimum = 1)]
    max_completion_tokens: Option<u64>,
    /// 0 is greedy [default: 0].
    #[schema(minimum = 0.0, maximum = 3.4028234663852886e38)]
    temperature: Option<f64>,
    /// Nucleus sampling: the likeliest tokens whose probabilities add up to this [default: 1].
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    top_p: Option<f64>,
    /// Sample from this many likeliest tokens; 0 or -1: all [default: 0].
    #[schema(minimum = -1)]
    top_k: Option<i64>,
    /// Subtracted once from the logit of every token already generated [default: 0].
    #[schema(minimum = -2.0, maximum = 2.0)]
    presence_penalty: Option<f64>,
    /// Subtracted from a token's logit per time it was generated [default: 0].
    #[schema(minimum = -2.0, maximum = 2.0)]
    frequency_penalty: Option<f64>,
    /// The sampling seed: the same request and seed give the same text on every provider of
    /// the same kernels [default: drawn at random].
    seed: Option<u64>,
    /// Choices to generate, each its own draw [default: 1].
    #[schema(minimum = 1, maximum = 8)]
    n: Option<u64>,
    /// Log-probabilities of each chosen token [default: false].
    logprobs: Option<bool>,
    /// With `logprobs`, this many likeliest alternatives per token [default: 0].
    #[schema(minimum = 0, maximum = 20)]
    top_logprobs: Option<u8>,
    #[schema(schema_with = stop)]
    stop: Option<Value>,
    /// Server-sent events, `data: [DONE]` last.
    stream: Option<bool>,
}

/// One chat message.
#[derive(ToSchema)]
pub(super) struct ChatMessage {
    /// `system`, `user`, `assistant`, …
    role: String,
    #[schema(schema_with = chat_content)]
    content: Value,
}

/// `POST /v1/load_lora_adapter` (vLLM's).
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LoadLoraRequest {
    /// The alias to register (new, non-empty, not the base model's name).
    #[schema(min_length = 1)]
    lora_name: String,
    /// A PEFT adapter folder under one of the server's --adapter-root directories.
    lora_path: String,
    /// Never evicted while pinned [default: false].
    pin: Option<bool>,
}

/// `POST /v1/unload_lora_adapter` (vLLM's).
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct UnloadLoraRequest {
    /// The alias to unregister.
    lora_name: String,
}

/// `POST /v1/training/clients`.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateClientRequest {
    /// The base to train on: this server's model [default: it].
    base_model: Option<String>,
    /// LoRA rank, at most the server's --max-lora-rank [default: 8].
    #[schema(minimum = 1)]
    rank: Option<u64>,
    /// `alpha` of the scale `alpha / rank` [default: 2 × rank].
    lora_alpha: Option<f64>,
    #[schema(schema_with = target_modules)]
    target_modules: Option<Value>,
    /// rsLoRA: scale `alpha / √rank` [default: false].
    use_rslora: Option<bool>,
    /// Seed of `A`'s initialisation [default: 0].
    seed: Option<u64>,
}

/// `POST /v1/training/clients/{id}/forward_backward`.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ForwardBackwardRequest {
    /// Token ids of each sequence.
    #[schema(min_items = 1)]
    tokens: Vec<Vec<u32>>,
    #[schema(schema_with = loss_mask)]
    loss_mask: Option<Value>,
}

/// `POST /v1/training/clients/{id}/optim_step` (AdamW).
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OptimStepRequest {
    /// Learning rate.
    #[schema(exclusive_minimum = 0.0)]
    lr: f64,
    #[schema(schema_with = betas)]
    betas: Option<Value>,
    /// [default: 1e-8]
    #[schema(exclusive_minimum = 0.0)]
    eps: Option<f64>,
    /// Decoupled weight decay [default: 0.01].
    #[schema(minimum = 0.0)]
    weight_decay: Option<f64>,
    /// Clip the gradients' global L2 norm to this [default: no clipping].
    #[schema(exclusive_minimum = 0.0)]
    max_grad_norm: Option<f64>,
}

/// `POST /v1/training/clients/{id}/sample`.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SampleRequest {
    #[schema(schema_with = sample_prompt)]
    prompt: Value,
    /// New tokens at most [default: 16].
    #[schema(minimum = 1)]
    max_tokens: Option<u64>,
    /// 0 is greedy [default: 0].
    #[schema(minimum = 0.0, maximum = 3.4028234663852886e38)]
    temperature: Option<f64>,
    /// The sampling seed [default: the clock].
    seed: Option<u64>,
    #[schema(schema_with = stop)]
    stop: Option<Value>,
}

/// `POST /v1/training/clients/{id}/save_weights` (an empty body is `{}`).
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SaveWeightsRequest {
    /// The alias to register it under (not the base model's name) [default: its id].
    #[schema(min_length = 1)]
    name: Option<String>,
    /// Never evicted while pinned [default: false].
    pin: Option<bool>,
}

/// `PUT /v1/exchange/ask`.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AskRequest {
    #[schema(schema_with = wei)]
    ask_wei_per_s: Value,
    /// Sets that tier's ask alone (offered apart from then on) [default: the model's ask].
    tier: Option<cx_protocol::Tier>,
}

// ---------------------------------------------------------------------------------------------
// Responses.

/// Every error: OpenAI's shape plus `field`.
#[derive(ToSchema)]
pub(super) struct ErrorBody {
    error: ErrorDetail,
}

/// What was refused and why.
#[derive(ToSchema)]
pub(super) struct ErrorDetail {
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
pub(super) enum FinishReason {
    Stop,
    Length,
}

/// Tokens counted.
#[derive(ToSchema)]
pub(super) struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

/// A text completion.
#[derive(ToSchema)]
pub(super) struct Completion {
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
pub(super) struct CompletionChoice {
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
pub(super) struct ChatCompletion {
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
pub(super) struct ChatChoice {
    index: u32,
    message: AssistantMessage,
    #[schema(value_type = Option<Object>)]
    logprobs: Option<Value>,
    finish_reason: FinishReason,
}

/// The answer.
#[derive(ToSchema)]
pub(super) struct AssistantMessage {
    /// `assistant`
    role: String,
    content: String,
}

/// `GET /v1/models`.
#[derive(ToSchema)]
pub(super) struct ModelList {
    /// `list`
    object: String,
    /// The base first, then each adapter.
    data: Vec<ModelCard>,
}

/// The base or an adapter.
#[derive(ToSchema)]
pub(super) struct ModelCard {
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
pub(super) struct LoadedAdapter {
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
pub(super) struct Unloaded {
    /// `ok`
    status: String,
    message: String,
}

/// A training client's LoRA configuration.
#[derive(ToSchema)]
pub(super) struct ClientConfig {
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
pub(super) struct LossEntry {
    step: u64,
    loss: f64,
    loss_weight: f64,
}

/// A training client.
#[derive(ToSchema)]
pub(super) struct ClientInfo {
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
pub(super) struct ClientList {
    /// `list`
    object: String,
    data: Vec<ClientInfo>,
}

/// A client deleted.
#[derive(ToSchema)]
pub(super) struct Deleted {
    id: String,
    deleted: bool,
}

/// What one `forward_backward` did.
#[derive(ToSchema)]
pub(super) struct ForwardBackward {
    loss: f64,
    loss_weight: f64,
    tokens: u64,
    accumulated: u64,
}

/// What one `optim_step` did.
#[derive(ToSchema)]
pub(super) struct OptimStep {
    step: u64,
    grad_norm: f64,
    clipped: bool,
    applied: u64,
}

/// What a sample produced.
#[derive(ToSchema)]
pub(super) struct Sample {
    tokens: Vec<u32>,
    text: String,
    finish_reason: FinishReason,
}

/// What a save did.
#[derive(ToSchema)]
pub(super) struct Saved {
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
pub(super) struct AskView {
    /// The model's ask, integer wei per compute-second as a decimal string.
    ask_wei_per_s: String,
    /// Tiers priced apart, each its ask.
    tiers: std::collections::BTreeMap<String, String>,
}

/// The ask set.
#[derive(ToSchema)]
pub(super) struct AskSet {
    ask_wei_per_s: String,
    tier: Option<cx_protocol::Tier>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn properties(doc: &Value, schema: &str) -> BTreeSet<String> {
        let schema = &doc["components"]["schemas"][schema];
        let names: BTreeSet<String> = schema["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{schema}"))
            .keys()
            .cloned()
            .collect();
        for required in schema["required"].as_array().into_iter().flatten() {
            assert!(names.contains(required.as_str().unwrap()), "{schema}");
        }
        assert_eq!(schema["additionalProperties"], false, "{schema}");
        names
    }

    fn set(fields: &[&str]) -> BTreeSet<String> {
        fields.iter().map(|f| f.to_string()).collect()
    }

    /// Each route's request schema has exactly the fields its handler accepts: the list it
    /// passes to `refuse_unknown` (and, for the completions, the neutral-only parameters).
    #[test]
    fn every_request_schema_is_the_list_its_handler_accepts() {
        let doc = openapi();
        let neutral: Vec<&str> = openai::NEUTRAL.iter().map(|(n, _, _)| *n).collect();
        for (schema, fields, with_neutral) in [
            ("CompletionRequest", openai::COMPLETION_FIELDS, true),
            ("ChatCompletionRequest", openai::CHAT_FIELDS, true),
            ("LoadLoraRequest", adapters::LOAD_LORA_FIELDS, false),
            ("UnloadLoraRequest", adapters::UNLOAD_LORA_FIELDS, false),
            ("CreateClientRequest", training::CREATE_FIELDS, false),
            (
                "ForwardBackwardRequest",
                training::FORWARD_BACKWARD_FIELDS,
                false,
            ),
            ("OptimStepRequest", training::OPTIM_STEP_FIELDS, false),
            ("SampleRequest", training::SAMPLE_FIELDS, false),
            ("SaveWeightsRequest", training::SAVE_WEIGHTS_FIELDS, false),
            ("AskRequest", ask::ASK_FIELDS, false),
        ] {
            let mut expected = set(fields);
            if with_neutral {
                expected.extend(set(&neutral));
            }
            assert_eq!(properties(&doc, schema), expected, "{schema}");
        }
        // Every neutral value's schema parses (a typo would silently document `{}`).
        for (name, accepts, schema) in openai::NEUTRAL {
            let schema: Value =
                serde_json::from_str(schema).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(schema.is_object(), "{name}");
            if let Some(value) = schema.get("const") {
                assert!(accepts(value), "{name}: its documented value is refused");
            }
        }
    }

    #[test]
    fn every_operation_documents_the_doors_refusals() {
        let doc = openapi();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let responses = &operation["responses"];
                assert!(
                    responses["429"]["headers"]["Retry-After"].is_object(),
                    "{method} {path}"
                );
                let exempt = path == "/health" || path == "/metrics";
                assert_eq!(responses["503"].is_object(), !exempt, "{method} {path}");
            }
        }
    }
}
