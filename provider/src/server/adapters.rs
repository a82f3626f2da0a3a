//! `/v1/models`, and vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`: each asks
//! the engine, which owns the alias registry and the residency cache.

use std::path::PathBuf;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::body::{Body, Request};
use super::{ApiError, AppState, unix_now};
use crate::error::Error;

#[utoipa::path(get, path = "/v1/models", operation_id = "list_models", tag = "adapters", responses((status = 200, description = "the base, then every adapter", body = super::openapi::responses::ModelList)))]
pub(super) async fn models(State(state): State<AppState>) -> axum::Json<Value> {
    let created = unix_now();
    let max_len = state.engine.model().config().max_position_embeddings;
    let mut data = vec![json!({
        "id": state.model_name, "object": "model", "created": created,
        "owned_by": "cx-provider", "root": state.model_name, "parent": null,
        "max_model_len": max_len,
    })];
    for a in state.engine.adapters() {
        data.push(json!({
            "id": a.alias, "object": "model", "created": created, "owned_by": "cx-provider",
            "root": a.id, "parent": state.model_name, "max_model_len": max_len,
            "adapter_id": a.id, "resident": a.resident,
        }));
    }
    axum::Json(json!({ "object": "list", "data": data }))
}

/// `POST /v1/load_lora_adapter` (vLLM's).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LoadLoraRequest {
    /// The alias to register (new, non-empty, not the base model's name).
    #[schema(value_type = String, min_length = 1)]
    lora_name: Option<String>,
    /// A PEFT adapter folder under one of the server's --adapter-root directories.
    #[schema(value_type = String)]
    lora_path: Option<PathBuf>,
    /// Never evicted while pinned [default: false].
    pin: Option<bool>,
}

impl Request for LoadLoraRequest {}

/// `POST /v1/unload_lora_adapter` (vLLM's).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct UnloadLoraRequest {
    /// The alias to unregister.
    #[schema(value_type = String)]
    lora_name: Option<String>,
}

impl Request for UnloadLoraRequest {}

#[utoipa::path(post, path = "/v1/load_lora_adapter", operation_id = "load_lora_adapter", tag = "adapters", request_body = LoadLoraRequest, responses((status = 200, description = "loaded and resident", body = super::openapi::responses::LoadedAdapter), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn load_lora(
    State(state): State<AppState>,
    Body(request): Body<LoadLoraRequest>,
) -> Result<Response, ApiError> {
    let lora_name = request
        .lora_name
        .ok_or_else(|| ApiError::bad_request("`lora_name` is required").field("lora_name"))?;
    let lora_path = request
        .lora_path
        .ok_or_else(|| ApiError::bad_request("`lora_path` is required").field("lora_path"))?;
    // Rent on state: never evicted while pinned.
    let pin = request.pin.unwrap_or(false);
    if lora_name.is_empty() || lora_name == state.model_name {
        return Err(
            ApiError::bad_request("lora_name must be a new, non-empty name").field("lora_name"),
        );
    }
    let engine = state.engine.clone();
    let (name, dir) = (lora_name.clone(), lora_path);
    // Parsing and checking run off the async workers (and off the batch thread).
    let loaded = tokio::task::spawn_blocking(move || engine.load_adapter(&name, &dir, pin))
        .await
        .unwrap_or(Err(Error::LoadPanicked))
        .map_err(|e| {
            let error = ApiError::from(e);
            // A refused adapter is the fault of the files `lora_path` names.
            if error.status == StatusCode::UNPROCESSABLE_ENTITY {
                error.field("lora_path")
            } else {
                error
            }
        })?;
    Ok(axum::Json(json!({
        "status": "ok",
        "message": format!("Success: LoRA adapter '{lora_name}' added successfully."),
        "lora_name": lora_name, "id": loaded.id, "rank": loaded.rank,
        "bytes": loaded.bytes, "pinned": loaded.pinned, "evicted": loaded.evicted,
    }))
    .into_response())
}

#[utoipa::path(post, path = "/v1/unload_lora_adapter", operation_id = "unload_lora_adapter", tag = "adapters", request_body = UnloadLoraRequest, responses((status = 200, description = "unregistered", body = super::openapi::responses::Unloaded), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn unload_lora(
    State(state): State<AppState>,
    Body(request): Body<UnloadLoraRequest>,
) -> Result<Response, ApiError> {
    let lora_name = request
        .lora_name
        .ok_or_else(|| ApiError::bad_request("`lora_name` is required").field("lora_name"))?;
    state.engine.unload_adapter(&lora_name)?;
    Ok(axum::Json(json!({
        "status": "ok",
        "message": format!("Success: LoRA adapter '{lora_name}' removed successfully."),
    }))
    .into_response())
}
