//! Adapters by content: `PUT /v1/adapters` stores PEFT's two files under their content id
//! (checked, size-limited), owned by the uploading account and counted against its quota;
//! `GET /v1/adapters/{id}` serves them to their owners and to the providers whose work needs
//! them, and to no one else (not even whether they are stored).
//!
//! The id is [`cx_protocol::content_id`] of `adapter_config.json` and
//! `adapter_model.safetensors` — what `cx-provider` computes for the same files — so an intent's
//! `adapter_id` names exactly these bytes, and their size is the |a| clearing prices.

use super::credential::{self, Caller};
use super::error::ApiError;
use super::extract::AppJson;
use super::state::AppState;
use crate::books::{Content, StoredAdapter, Upload};
use crate::intake::now_s;
use alloy::primitives::Address;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use cx_protocol::access::Scope;
use serde::{Deserialize, Serialize};

/// The largest request body `PUT /v1/adapters` takes (base64 weights are 4/3 of their size).
pub(super) const BODY_LIMIT_BYTES: usize = 160 << 20;
/// The largest adapter (both files) the store keeps.
pub(super) const MAX_ADAPTER_BYTES: usize = 96 << 20;
/// The largest `adapter_config.json`.
const MAX_CONFIG_BYTES: usize = 64 << 10;

/// An adapter as it travels: the config file's text and the weights file in base64.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AdapterFiles {
    /// The content id the sender expects (checked when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    /// `adapter_config.json`, as text.
    adapter_config: String,
    /// `adapter_model.safetensors`, base64 (standard alphabet, padded).
    adapter_model_safetensors_base64: String,
}

/// What the store says of an adapter.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Stored {
    id: String,
    bytes: u64,
    created: bool,
}

#[utoipa::path(put, path = "/v1/adapters", tag = "adapters", request_body = AdapterFiles, security(("store_credential" = []), ("session_key" = []), ("provider_token" = [])), responses((status = 201, body = Stored), (status = 200, description = "already stored", body = Stored), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn put(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<(StatusCode, AppJson<Stored>), ApiError> {
    // The credential first, before a byte of the body is read.
    let owners = uploaders(&state, &headers, Content::Adapter).await?;
    let bytes = axum::body::to_bytes(body, BODY_LIMIT_BYTES)
        .await
        .map_err(|_| ApiError::PayloadTooLarge)?;
    let AppJson(files) = AppJson::<AdapterFiles>::from_bytes(&bytes)?;
    let intake = state.intake()?;
    if files.adapter_config.len() > MAX_CONFIG_BYTES {
        return Err(ApiError::invalid(
            "adapter_config",
            format!("longer than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    let config: serde_json::Value = serde_json::from_str(&files.adapter_config)
        .map_err(|e| ApiError::invalid("adapter_config", format!("not JSON: {e}")))?;
    if !config.is_object() {
        return Err(ApiError::invalid(
            "adapter_config",
            "must be a JSON object (PEFT's config)",
        ));
    }
    let weights = BASE64
        .decode(files.adapter_model_safetensors_base64.as_bytes())
        .map_err(|e| {
            ApiError::invalid(
                "adapter_model_safetensors_base64",
                format!("not base64: {e}"),
            )
        })?;
    let total = weights.len() + files.adapter_config.len();
    if total > MAX_ADAPTER_BYTES {
        return Err(ApiError::invalid(
            "adapter_model_safetensors_base64",
            format!(
                "the adapter is {total} bytes; this exchange stores at most {MAX_ADAPTER_BYTES}"
            ),
        ));
    }
    safetensors::SafeTensors::deserialize(&weights).map_err(|e| {
        ApiError::invalid(
            "adapter_model_safetensors_base64",
            format!("not a safetensors file: {e}"),
        )
    })?;
    let id = cx_protocol::content_id(&[
        ("adapter_config.json", files.adapter_config.as_bytes()),
        ("adapter_model.safetensors", &weights),
    ]);
    if let Some(expected) = files.id.as_deref()
        && expected.trim_start_matches("0x") != id
    {
        return Err(ApiError::invalid(
            "id",
            format!(
                "the files hash to {id}, not {expected}: an id names exactly the bytes it hashes"
            ),
        ));
    }
    let adapter = StoredAdapter {
        config: files.adapter_config.into_bytes(),
        weights,
    };
    let created = intake
        .books()
        .store(
            &id,
            Upload::Adapter(&adapter),
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
        AppJson(Stored {
            id,
            bytes: total as u64,
            created,
        }),
    ))
}

#[utoipa::path(get, path = "/v1/adapters/{id}", tag = "adapters", params(("id" = String, Path, description = "content id, 64 hex digits (0x optional)", pattern = "^(0x)?[0-9a-fA-F]{64}$")), security(("read_credential" = []), ("session_key" = []), ("provider_token" = [])), responses((status = 200, body = AdapterFiles), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<AppJson<AdapterFiles>, ApiError> {
    let id = id.trim_start_matches("0x").to_ascii_lowercase();
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid("id", "an adapter id is 32 bytes of hex"));
    }
    let intake = state.intake()?;
    let hidden = || ApiError::NotFound {
        what: "adapter among yours or your work's".into(),
    };
    match credential::caller(&state, &headers, Scope::Read).await? {
        Caller::Account(account) => {
            if !intake.books().owns(Content::Adapter, &id, account).await? {
                return Err(hidden());
            }
        }
        Caller::Provider(provider) => {
            if !intake
                .books()
                .works_with_adapter(provider.key_hash, &id)
                .await?
            {
                return Err(hidden());
            }
            // A provider fetching an adapter it was cleared on as holding has revealed that
            // claim false (SPEC §8).
            let misses = intake
                .books()
                .record_fetch_misses(provider.key_hash, &id)
                .await?;
            if misses > 0 {
                tracing::info!(provider = %provider.key_hash, adapter = %id, jobs = misses,
                    "residency miss: fetched an adapter it was cleared on as holding");
            }
        }
    }
    let adapter = intake
        .books()
        .adapter(&id)
        .await?
        .ok_or(ApiError::NotFound {
            what: "adapter".into(),
        })?;
    let config = String::from_utf8(adapter.config).map_err(|e| ApiError::Internal(Box::new(e)))?;
    Ok(AppJson(AdapterFiles {
        id: Some(id),
        adapter_config: config,
        adapter_model_safetensors_base64: BASE64.encode(&adapter.weights),
    }))
}

/// Who owns what the request stores: the account its credential proves (one that has bound its
/// key and holds an open tab: storage is for parties with money at stake), or, for a provider
/// storing the adapter it trained, the buyers of its running training jobs (their quota pays).
pub(super) async fn uploaders(
    state: &AppState,
    headers: &HeaderMap,
    kind: Content,
) -> Result<Vec<Address>, ApiError> {
    let forbidden = |message: &str| ApiError::Refused {
        status: StatusCode::FORBIDDEN,
        code: "store_forbidden",
        message: message.to_owned(),
        field: None,
    };
    let intake = state.intake()?;
    match credential::caller(state, headers, Scope::Store).await? {
        Caller::Account(account) => {
            if !intake.books().may_store(account, now_s()).await? {
                return Err(forbidden(
                    "an account stores content once it has bound its key (POST /v1/bindings) and \
                     holds an open tab",
                ));
            }
            Ok(vec![account])
        }
        Caller::Provider(provider) if kind == Content::Adapter => {
            let buyers = intake.books().training_buyers(provider.key_hash).await?;
            if buyers.is_empty() {
                return Err(forbidden(
                    "a provider stores only the adapter it trains, while its training job runs",
                ));
            }
            Ok(buyers)
        }
        Caller::Provider(_) => Err(forbidden("a provider stores no datasets")),
    }
}
