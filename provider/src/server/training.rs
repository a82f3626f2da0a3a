//! `/v1/training/clients`: LoRA training on the served base (SPEC §6). Each handler reads its
//! body through the door (a type error names its field, unknown fields are refused), then asks
//! the [`Trainer`](crate::training::Trainer), which owns the clients; the forward and backward
//! passes, sampling and saving run off the async workers.
//!
//! * `POST /v1/training/clients` — `{base_model?, rank?, lora_alpha?, target_modules?,
//!   use_rslora?, seed?}` → the client.
//! * `GET /v1/training/clients[/{id}]` — config, step, bytes, loss history (one client).
//! * `POST …/{id}/forward_backward` — `{tokens: [[id]], loss_mask?: [[w]]}` → the loss.
//! * `POST …/{id}/optim_step` — `{lr, betas?, eps?, weight_decay?, max_grad_norm?}`.
//! * `POST …/{id}/sample` — `{prompt, max_tokens?, temperature?, seed?, stop?}`.
//! * `POST …/{id}/save_weights` — `{name?, pin?}` → the adapter's id, resident at once.
//! * `DELETE …/{id}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use super::body::{Body, OptionalBody, Request};
use super::openai::request::Stop;
use super::openapi::fields;
use super::{ApiError, AppState, unix_now};
use crate::engine::Sampling;
use crate::error::{Error, Result};
use crate::model::Projection;
use crate::training::{AdamWParams, LoraSpec, Trainer};

/// The trainer, or a 503 naming how to turn training on.
fn trainer(state: &AppState) -> Result<Arc<Trainer>, ApiError> {
    state.training.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "training_off",
            "training is off on this server (start it with cx-provider serve, which enables it)",
        )
    })
}

/// Runs `f` off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or(Err(Error::ForwardPanicked))
        .map_err(ApiError::from)
}

fn required<T>(value: Option<T>, field: &'static str) -> Result<T, ApiError> {
    value.ok_or_else(|| ApiError::bad_request(format!("`{field}` is required")).field(field))
}

/// `POST /v1/training/clients`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateClientRequest {
    /// The base to train on: this server's model [default: it].
    base_model: Option<String>,
    /// LoRA rank, at most the server's --max-lora-rank [default: 8].
    #[schema(value_type = Option<u64>, minimum = 1)]
    rank: Option<usize>,
    /// `alpha` of the scale `alpha / rank` [default: 2 × rank].
    lora_alpha: Option<f64>,
    #[schema(schema_with = fields::target_modules)]
    target_modules: Option<Vec<String>>,
    /// rsLoRA: scale `alpha / √rank` [default: false].
    use_rslora: Option<bool>,
    /// Seed of `A`'s initialisation [default: 0].
    seed: Option<u64>,
}

/// `POST /v1/training/clients/{id}/forward_backward`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ForwardBackwardRequest {
    /// Token ids of each sequence.
    #[schema(value_type = Vec<Vec<u32>>, min_items = 1)]
    tokens: Option<Vec<Vec<u32>>>,
    #[schema(schema_with = fields::loss_mask)]
    loss_mask: Option<Vec<Vec<f32>>>,
}

/// `POST /v1/training/clients/{id}/optim_step` (AdamW).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OptimStepRequest {
    /// Learning rate.
    #[schema(value_type = f64, exclusive_minimum = 0.0)]
    lr: Option<f64>,
    #[schema(schema_with = fields::betas)]
    betas: Option<[f64; 2]>,
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
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SampleRequest {
    #[schema(schema_with = fields::sample_prompt, required = true)]
    prompt: Option<Prompt>,
    /// New tokens at most [default: 16].
    #[schema(value_type = Option<u64>, minimum = 1)]
    max_tokens: Option<usize>,
    /// 0 is greedy [default: 0].
    #[schema(minimum = 0.0, maximum = 3.4028234663852886e38)]
    temperature: Option<f64>,
    /// The sampling seed [default: the clock].
    seed: Option<u64>,
    #[schema(schema_with = fields::stop)]
    stop: Option<Stop>,
}

/// `POST /v1/training/clients/{id}/save_weights` (an empty body is `{}`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SaveWeightsRequest {
    /// The alias to register it under (not the base model's name) [default: its id].
    #[schema(min_length = 1)]
    name: Option<String>,
    /// Never evicted while pinned [default: false].
    pin: Option<bool>,
}

impl Request for CreateClientRequest {}
impl Request for ForwardBackwardRequest {}
impl Request for OptimStepRequest {}
impl Request for SampleRequest {}
impl Request for SaveWeightsRequest {}

/// `prompt` of `sample`: a text or token ids.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// The rank of a client whose request names none.
const DEFAULT_RANK: usize = 8;

#[utoipa::path(post, path = "/v1/training/clients", operation_id = "create_training_client", tag = "training", request_body = CreateClientRequest, responses((status = 201, description = "the new client", body = super::openapi::responses::ClientInfo), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn create(
    State(state): State<AppState>,
    request: Result<Body<CreateClientRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let Body(request) = request?;
    if let Some(base) = request.base_model
        && base != trainer.model_name()
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!(
                "base model `{base}` is not held here; this provider trains on `{}`",
                trainer.model_name()
            ),
        )
        .field("base_model"));
    }
    let rank = request.rank.unwrap_or(DEFAULT_RANK);
    let lora_alpha = request.lora_alpha.unwrap_or(2.0 * rank as f64);
    let names = request.target_modules.unwrap_or_else(|| {
        Projection::ALL
            .iter()
            .map(|p| p.name().to_string())
            .collect()
    });
    let mut targets = Vec::new();
    for name in &names {
        let target = Projection::from_name(name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "target module `{name}` is not one of {}",
                Projection::NAMES
            ))
            .field("target_modules")
        })?;
        targets.push(target);
    }
    let spec = LoraSpec {
        use_rslora: request.use_rslora.unwrap_or(false),
        seed: request.seed.unwrap_or(0),
        ..LoraSpec::new(rank, lora_alpha, &targets)
    };
    let info = blocking(move || trainer.create(&spec)).await?;
    Ok((StatusCode::CREATED, axum::Json(info)).into_response())
}

#[utoipa::path(get, path = "/v1/training/clients", operation_id = "list_training_clients", tag = "training", responses((status = 200, description = "every client", body = super::openapi::responses::ClientList), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn list(State(state): State<AppState>) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    Ok(axum::Json(json!({ "object": "list", "data": trainer.list() })).into_response())
}

#[utoipa::path(get, path = "/v1/training/clients/{id}", operation_id = "get_training_client", tag = "training", params(("id" = String, Path, description = "the training client's id")), responses((status = 200, description = "the client, with its loss history", body = super::openapi::responses::ClientInfo), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    Ok(axum::Json(trainer.get(&id)?).into_response())
}

#[utoipa::path(delete, path = "/v1/training/clients/{id}", operation_id = "delete_training_client", tag = "training", params(("id" = String, Path, description = "the training client's id")), responses((status = 200, description = "deleted", body = super::openapi::responses::Deleted), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    trainer.delete(&id)?;
    Ok(axum::Json(json!({ "id": id, "deleted": true })).into_response())
}

#[utoipa::path(post, path = "/v1/training/clients/{id}/forward_backward", operation_id = "forward_backward", tag = "training", params(("id" = String, Path, description = "the training client's id")), request_body = ForwardBackwardRequest, responses((status = 200, description = "the loss; gradients accumulated", body = super::openapi::responses::ForwardBackward), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn forward_backward(
    State(state): State<AppState>,
    Path(id): Path<String>,
    request: Result<Body<ForwardBackwardRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let Body(request) = request?;
    let tokens = required(request.tokens, "tokens")?;
    // Without a mask, every token but the first is a target.
    let loss_mask = match request.loss_mask {
        Some(mask) => mask,
        None => tokens
            .iter()
            .map(|seq| {
                (0..seq.len())
                    .map(|k| if k == 0 { 0.0 } else { 1.0 })
                    .collect()
            })
            .collect(),
    };
    let outcome = blocking(move || trainer.forward_backward(&id, &tokens, &loss_mask)).await?;
    Ok(axum::Json(outcome).into_response())
}

#[utoipa::path(post, path = "/v1/training/clients/{id}/optim_step", operation_id = "optim_step", tag = "training", params(("id" = String, Path, description = "the training client's id")), request_body = OptimStepRequest, responses((status = 200, description = "one AdamW step taken", body = super::openapi::responses::OptimStep), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn optim_step(
    State(state): State<AppState>,
    Path(id): Path<String>,
    request: Result<Body<OptimStepRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let Body(request) = request?;
    let defaults = AdamWParams::default();
    let params = AdamWParams {
        lr: required(request.lr, "lr")?,
        betas: request.betas.map_or(defaults.betas, |[b1, b2]| (b1, b2)),
        eps: request.eps.unwrap_or(defaults.eps),
        weight_decay: request.weight_decay.unwrap_or(defaults.weight_decay),
        max_grad_norm: request.max_grad_norm,
    };
    let outcome = blocking(move || trainer.optim_step(&id, &params)).await?;
    Ok(axum::Json(outcome).into_response())
}

#[utoipa::path(post, path = "/v1/training/clients/{id}/sample", operation_id = "sample", tag = "training", params(("id" = String, Path, description = "the training client's id")), request_body = SampleRequest, responses((status = 200, description = "the sample", body = super::openapi::responses::Sample), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn sample(
    State(state): State<AppState>,
    Path(id): Path<String>,
    request: Result<Body<SampleRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let Body(request) = request?;
    let prompt = match required(request.prompt, "prompt")? {
        Prompt::Tokens(tokens) => tokens,
        Prompt::Text(text) => state
            .engine
            .tokenizer()
            .encode(&text)
            .map_err(|e| ApiError::from(e).field("prompt"))?,
    };
    let max_tokens = request.max_tokens.unwrap_or(16);
    let temperature = super::openai::temperature(request.temperature)?;
    let stop = Stop::into_vec(request.stop);
    if stop.len() > super::openai::MAX_STOP_SEQUENCES
        || stop.iter().any(|s| s.len() > super::openai::MAX_STOP_BYTES)
    {
        return Err(ApiError::bad_request(format!(
            "at most {} stop sequences of at most {} bytes",
            super::openai::MAX_STOP_SEQUENCES,
            super::openai::MAX_STOP_BYTES
        ))
        .field("stop"));
    }
    let request = crate::training::SampleRequest {
        prompt,
        max_tokens,
        sampling: Sampling {
            temperature,
            seed: request.seed.unwrap_or_else(unix_now),
            ..Sampling::default()
        },
        stop,
    };
    let sample = blocking(move || trainer.sample(&id, &request)).await?;
    Ok(axum::Json(sample).into_response())
}

#[utoipa::path(post, path = "/v1/training/clients/{id}/save_weights", operation_id = "save_weights", tag = "training", params(("id" = String, Path, description = "the training client's id")), request_body = Option<SaveWeightsRequest>, responses((status = 200, description = "saved, registered and resident", body = super::openapi::responses::Saved), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn save_weights(
    State(state): State<AppState>,
    Path(id): Path<String>,
    // An empty (or null) body saves under the id, unpinned.
    request: Result<OptionalBody<SaveWeightsRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let OptionalBody(request) = request?;
    let name = request.name;
    if let Some(name) = &name
        && (name.is_empty() || name == &state.model_name)
    {
        return Err(ApiError::bad_request(
            "name must be a non-empty name other than the base model's",
        )
        .field("name"));
    }
    let pin = request.pin.unwrap_or(false);
    let saved = blocking(move || trainer.save(&id, name.as_deref(), pin))
        .await
        .map_err(|e| {
            if e.code == "adapter_conflict" {
                ApiError {
                    field: Some("name"),
                    ..e
                }
            } else {
                e
            }
        })?;
    Ok(axum::Json(saved).into_response())
}
