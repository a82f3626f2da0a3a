//! `/v1/training/clients`: LoRA training on the served base (SPEC §6). Each handler checks its
//! body field by field (a type error names its field, unknown fields are refused), then asks
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

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::body::Body;
use super::{ApiError, AppState, unix_now};
use crate::engine::Sampling;
use crate::error::{Error, Result};
use crate::model::Projection;
use crate::training::{AdamWParams, LoraSpec, SampleRequest, Trainer};

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

/// The fields `POST /v1/training/clients` reads.
pub(super) const CREATE_FIELDS: &[&str] = &[
    "base_model",
    "rank",
    "lora_alpha",
    "target_modules",
    "use_rslora",
    "seed",
];

/// The fields `forward_backward` reads.
pub(super) const FORWARD_BACKWARD_FIELDS: &[&str] = &["tokens", "loss_mask"];

/// The fields `optim_step` reads.
pub(super) const OPTIM_STEP_FIELDS: &[&str] =
    &["lr", "betas", "eps", "weight_decay", "max_grad_norm"];

/// The fields `sample` reads.
pub(super) const SAMPLE_FIELDS: &[&str] = &["prompt", "max_tokens", "temperature", "seed", "stop"];

/// The fields `save_weights` reads.
pub(super) const SAVE_WEIGHTS_FIELDS: &[&str] = &["name", "pin"];

/// The rank of a client whose request names none.
const DEFAULT_RANK: usize = 8;

#[utoipa::path(post, path = "/v1/training/clients", operation_id = "create_training_client", tag = "training", request_body = super::openapi::CreateClientRequest, responses((status = 201, description = "the new client", body = super::openapi::ClientInfo), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn create(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let body = Body::parse(&body)?;
    body.refuse_unknown(CREATE_FIELDS)?;
    if let Some(base) = body.get::<String>("base_model")?
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
    let rank: usize = body.get("rank")?.unwrap_or(DEFAULT_RANK);
    let lora_alpha: f64 = body.get("lora_alpha")?.unwrap_or(2.0 * rank as f64);
    let names: Vec<String> = body.get("target_modules")?.unwrap_or_else(|| {
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
        use_rslora: body.get("use_rslora")?.unwrap_or(false),
        seed: body.get("seed")?.unwrap_or(0),
        ..LoraSpec::new(rank, lora_alpha, &targets)
    };
    let info = blocking(move || trainer.create(&spec)).await?;
    Ok((StatusCode::CREATED, axum::Json(info)).into_response())
}

#[utoipa::path(get, path = "/v1/training/clients", operation_id = "list_training_clients", tag = "training", responses((status = 200, description = "every client", body = super::openapi::ClientList), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn list(State(state): State<AppState>) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    Ok(axum::Json(json!({ "object": "list", "data": trainer.list() })).into_response())
}

#[utoipa::path(get, path = "/v1/training/clients/{id}", operation_id = "get_training_client", tag = "training", params(("id" = String, Path, description = "the training client's id")), responses((status = 200, description = "the client, with its loss history", body = super::openapi::ClientInfo), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    Ok(axum::Json(trainer.get(&id)?).into_response())
}

#[utoipa::path(delete, path = "/v1/training/clients/{id}", operation_id = "delete_training_client", tag = "training", params(("id" = String, Path, description = "the training client's id")), responses((status = 200, description = "deleted", body = super::openapi::Deleted), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    trainer.delete(&id)?;
    Ok(axum::Json(json!({ "id": id, "deleted": true })).into_response())
}

#[utoipa::path(post, path = "/v1/training/clients/{id}/forward_backward", operation_id = "forward_backward", tag = "training", params(("id" = String, Path, description = "the training client's id")), request_body = super::openapi::ForwardBackwardRequest, responses((status = 200, description = "the loss; gradients accumulated", body = super::openapi::ForwardBackward), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn forward_backward(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let body = Body::parse(&body)?;
    body.refuse_unknown(FORWARD_BACKWARD_FIELDS)?;
    let tokens: Vec<Vec<u32>> = required(body.get("tokens")?, "tokens")?;
    // Without a mask, every token but the first is a target.
    let loss_mask: Vec<Vec<f32>> = match body.get("loss_mask")? {
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

#[utoipa::path(post, path = "/v1/training/clients/{id}/optim_step", operation_id = "optim_step", tag = "training", params(("id" = String, Path, description = "the training client's id")), request_body = super::openapi::OptimStepRequest, responses((status = 200, description = "one AdamW step taken", body = super::openapi::OptimStep), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn optim_step(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let body = Body::parse(&body)?;
    body.refuse_unknown(OPTIM_STEP_FIELDS)?;
    let defaults = AdamWParams::default();
    let betas: Option<[f64; 2]> = body.get("betas")?;
    let params = AdamWParams {
        lr: required(body.get("lr")?, "lr")?,
        betas: betas.map_or(defaults.betas, |[b1, b2]| (b1, b2)),
        eps: body.get("eps")?.unwrap_or(defaults.eps),
        weight_decay: body.get("weight_decay")?.unwrap_or(defaults.weight_decay),
        max_grad_norm: body.get("max_grad_norm")?,
    };
    let outcome = blocking(move || trainer.optim_step(&id, &params)).await?;
    Ok(axum::Json(outcome).into_response())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[utoipa::path(post, path = "/v1/training/clients/{id}/sample", operation_id = "sample", tag = "training", params(("id" = String, Path, description = "the training client's id")), request_body = super::openapi::SampleRequest, responses((status = 200, description = "the sample", body = super::openapi::Sample), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn sample(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    let body = Body::parse(&body)?;
    body.refuse_unknown(SAMPLE_FIELDS)?;
    let prompt = match required(body.get::<Prompt>("prompt")?, "prompt")? {
        Prompt::Tokens(tokens) => tokens,
        Prompt::Text(text) => state
            .engine
            .tokenizer()
            .encode(&text)
            .map_err(|e| ApiError::from(e).field("prompt"))?,
    };
    let max_tokens: usize = body.get("max_tokens")?.unwrap_or(16);
    let temperature = super::openai::temperature(&body)?;
    let stop = match body.get::<Stop>("stop")? {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
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
    let request = SampleRequest {
        prompt,
        max_tokens,
        sampling: Sampling {
            temperature,
            seed: body.get("seed")?.unwrap_or_else(unix_now),
            ..Sampling::default()
        },
        stop,
    };
    let sample = blocking(move || trainer.sample(&id, &request)).await?;
    Ok(axum::Json(sample).into_response())
}

#[utoipa::path(post, path = "/v1/training/clients/{id}/save_weights", operation_id = "save_weights", tag = "training", params(("id" = String, Path, description = "the training client's id")), request_body = Option<super::openapi::SaveWeightsRequest>, responses((status = 200, description = "saved, registered and resident", body = super::openapi::Saved), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn save_weights(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let trainer = trainer(&state)?;
    // An empty (or null) body saves under the id, unpinned.
    let body = Body::parse_optional(&body)?;
    body.refuse_unknown(SAVE_WEIGHTS_FIELDS)?;
    let name: Option<String> = body.get("name")?;
    if let Some(name) = &name
        && (name.is_empty() || name == &state.model_name)
    {
        return Err(ApiError::bad_request(
            "name must be a non-empty name other than the base model's",
        )
        .field("name"));
    }
    let pin: bool = body.get("pin")?.unwrap_or(false);
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
