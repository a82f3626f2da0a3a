//! `POST /v1/bindings`: an account binds its ML-DSA-65 key, once. Both halves are checked (the
//! account's EIP-712 signature over `PqBinding`, the key's signature over the account) before the
//! books keep it; binding the same key again is a no-op, another key is a conflict.

use super::error::ApiError;
use super::extract::AppJson;
use super::state::AppState;
use crate::books::StoredBinding;
use alloy::primitives::{Address, B256};
use axum::extract::State;
use axum::http::StatusCode;
use cx_protocol::order::Binding;
use serde::Serialize;

/// What a stored binding says.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Bound {
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$")]
    account: Address,
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    mldsa_key_hash: B256,
}

#[utoipa::path(post, path = "/v1/bindings", tag = "agents", request_body(content = Object, description = "a `Binding`: the account's EIP-712 PqBinding and the ML-DSA key's signature over the account"), responses((status = 201, body = Bound), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn bind(
    State(state): State<AppState>,
    AppJson(binding): AppJson<Binding>,
) -> Result<(StatusCode, AppJson<Bound>), ApiError> {
    let intake = state.intake()?;
    let domain = intake
        .domain(binding.chain_id)
        .ok_or_else(|| ApiError::invalid("chain_id", "not a chain this exchange serves"))?;
    let bound = binding.verify(domain).map_err(crate::Error::from)?;
    let mldsa_key_hash = B256::from(bound.key_id.0);
    intake
        .books()
        .bind(&StoredBinding {
            account: bound.account,
            chain_id: binding.chain_id,
            mldsa_key: bound.key.to_bytes().to_vec(),
            mldsa_key_hash,
            binding: serde_json::to_value(&binding).map_err(crate::Error::from)?,
        })
        .await?;
    Ok((
        StatusCode::CREATED,
        AppJson(Bound {
            account: bound.account,
            mldsa_key_hash,
        }),
    ))
}
