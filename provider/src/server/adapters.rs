//! `/v1/models`, and vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`: each asks
//! the engine, which owns the alias registry and the residency cache.

use std::path::PathBuf;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::body::Body;
use super::{ApiError, AppState, unix_now};
use crate::error::Error;

#[utoipa::path(get, path = "/v1/models", operation_id = "list_models", tag = "adapters", responses((status = 200, description = "the base, then every adapter", body = super::openapi::ModelList)))]
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

/// The fields `/v1/load_lora_adapter` reads.
pub(super) const LOAD_LORA_FIELDS: &[&str] = &["lora_name", "lora_path", "pin"];

/// The fields `/v1/unload_lora_adapter` reads.
pub(super) const UNLOAD_LORA_FIELDS: &[&str] = &["lora_name"];

#[utoipa::path(post, path = "/v1/load_lora_adapter", operation_id = "load_lora_adapter", tag = "adapters", request_body = super::openapi::LoadLoraRequest, responses((status = 200, description = "loaded and resident", body = super::openapi::LoadedAdapter), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn load_lora(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = Body::parse(&body)?;
    body.refuse_unknown(LOAD_LORA_FIELDS)?;
    let lora_name: String = body
        .get("lora_name")?
        .ok_or_else(|| ApiError::bad_request("`lora_name` is required").field("lora_name"))?;
    let lora_path: PathBuf = body
        .get("lora_path")?
        .ok_or_else(|| ApiError::bad_request("`lora_path` is required").field("lora_path"))?;
    // Rent on state: never evicted while pinned.
    let pin: bool = body.get("pin")?.unwrap_or(false);
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

#[utoipa::path(post, path = "/v1/unload_lora_adapter", operation_id = "unload_lora_adapter", tag = "adapters", request_body = super::openapi::UnloadLoraRequest, responses((status = 200, description = "unregistered", body = super::openapi::Unloaded), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn unload_lora(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = Body::parse(&body)?;
    body.refuse_unknown(UNLOAD_LORA_FIELDS)?;
    let lora_name: String = body
        .get("lora_name")?
        .ok_or_else(|| ApiError::bad_request("`lora_name` is required").field("lora_name"))?;
    state.engine.unload_adapter(&lora_name)?;
    Ok(axum::Json(json!({
        "status": "ok",
        "message": format!("Success: LoRA adapter '{lora_name}' removed successfully."),
    }))
    .into_response())
}
