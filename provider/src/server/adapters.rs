//! `/v1/models`, and vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`: each asks
//! the engine, which owns the alias registry and the residency cache.

use std::path::PathBuf;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, parse, unix_now};
use crate::error::Error;

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

#[derive(Deserialize)]
struct LoadLora {
    lora_name: String,
    lora_path: PathBuf,
    /// Rent on state: never evicted while pinned.
    #[serde(default)]
    pin: bool,
}

pub(super) async fn load_lora(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: LoadLora = parse(&body)?;
    if request.lora_name.is_empty() || request.lora_name == state.model_name {
        return Err(
            ApiError::bad_request("lora_name must be a new, non-empty name").field("lora_name"),
        );
    }
    let engine = state.engine.clone();
    let (name, dir, pin) = (
        request.lora_name.clone(),
        request.lora_path.clone(),
        request.pin,
    );
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
        "message": format!("Success: LoRA adapter '{}' added successfully.", request.lora_name),
        "lora_name": request.lora_name, "id": loaded.id, "rank": loaded.rank,
        "bytes": loaded.bytes, "pinned": loaded.pinned, "evicted": loaded.evicted,
    }))
    .into_response())
}

#[derive(Deserialize)]
struct UnloadLora {
    lora_name: String,
}

pub(super) async fn unload_lora(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: UnloadLora = parse(&body)?;
    state.engine.unload_adapter(&request.lora_name)?;
    Ok(axum::Json(json!({
        "status": "ok",
        "message": format!("Success: LoRA adapter '{}' removed successfully.", request.lora_name),
    }))
    .into_response())
}
