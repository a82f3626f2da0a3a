//! Training data by content: `PUT /v1/datasets` stores a dataset file (checked, size-limited)
//! under its content id, owned by the uploading account and counted against its quota; `GET /v1/datasets/{id}` gives it to the provider running a training
//! job that names it, and to no one else (the buyer already has it).
//!
//! The id is [`cx_protocol::train::dataset_id`] of the bytes sent, so a train order's `data`
//! names exactly these bytes, and the provider re-checks them on arrival.

use super::error::ApiError;
use super::extract::{AppJson, Bearer};
use super::state::AppState;
use crate::books::{Content, DatasetSummary, Upload};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use cx_protocol::train::{Dataset, MAX_DATASET_BYTES, dataset_id, is_content_id};
use serde::Serialize;

/// The largest request body `PUT /v1/datasets` takes: the largest dataset file.
pub(super) const BODY_LIMIT_BYTES: usize = MAX_DATASET_BYTES;

/// What the store says of a dataset.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct StoredDataset {
    /// The content id: what a train order's `data` names.
    id: String,
    /// Bytes of the file.
    bytes: u64,
    /// Sequences in it.
    sequences: u32,
    /// Tokens over all sequences.
    tokens: u64,
    /// Whether this call stored it (false: it was there).
    created: bool,
}

fn json_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim() == "application/json")
        });
    if declared {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType)
    }
}

#[utoipa::path(put, path = "/v1/datasets", operation_id = "put_dataset", tag = "datasets", request_body(content = Object, description = "the dataset file: `{\"sequences\": [[token id, …], …], \"loss_mask\": [[weight, …], …]}`, one weight per token, entry 0 of each row 0", content_type = "application/json"), security(("store_credential" = []), ("session_key" = [])), responses((status = 201, body = StoredDataset), (status = 200, description = "already stored", body = StoredDataset), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn put(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<(StatusCode, AppJson<StoredDataset>), ApiError> {
    json_body(&headers)?;
    // The credential first, before a byte of the body is read.
    let owners = super::adapters::uploaders(&state, &headers, Content::Dataset).await?;
    let body = axum::body::to_bytes(body, BODY_LIMIT_BYTES)
        .await
        .map_err(|_| ApiError::PayloadTooLarge)?;
    let intake = state.intake()?;
    let data = Dataset::parse(&body).map_err(crate::Error::from)?;
    let id = dataset_id(&body);
    let summary = DatasetSummary {
        sequences: data.sequences.len() as u32,
        tokens: data.sequences.iter().map(|s| s.len() as u64).sum(),
        max_token: data.max_token(),
    };
    let created = intake
        .books()
        .store(
            &id,
            Upload::Dataset {
                body: &body,
                summary,
            },
            &owners,
            intake.store_quota_bytes(),
        )
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        AppJson(StoredDataset {
            id,
            bytes: body.len() as u64,
            sequences: summary.sequences,
            tokens: summary.tokens,
            created,
        }),
    ))
}

#[utoipa::path(get, path = "/v1/datasets/{id}", operation_id = "get_dataset", tag = "datasets", params(("id" = String, Path, description = "content id, 64 lowercase hex digits", pattern = "^[0-9a-f]{64}$")), security(("provider_token" = [])), responses((status = 200, description = "the dataset file, as stored", content_type = "application/json", body = Object), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Bearer(token): Bearer,
) -> Result<([(header::HeaderName, &'static str); 1], Bytes), ApiError> {
    if !is_content_id(&id) {
        return Err(ApiError::invalid(
            "id",
            "a dataset id is 64 lowercase hex digits",
        ));
    }
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    // Training data is the buyer's: only the provider running a job on it reads it. Any other
    // caller learns nothing, not even whether it is stored.
    if !intake
        .books()
        .runs_training_on(provider.key_hash, &id)
        .await?
    {
        return Err(ApiError::NotFound {
            what: "dataset among your running training jobs".into(),
        });
    }
    let body = intake
        .books()
        .dataset(&id)
        .await?
        .ok_or(ApiError::NotFound {
            what: "dataset".into(),
        })?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        Bytes::from(body),
    ))
}
