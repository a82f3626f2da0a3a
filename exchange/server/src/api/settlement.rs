//! Settlement's doors: a buyer closes a tab so it settles now
//! (`POST /v1/tabs/{chain_id}/{escrow_id}/close`), and anyone reads what an account was
//! credited by settled batches on one chain, with the Merkle proof `Escrow.claim` takes
//! (`GET /v1/claims/{chain_id}/{account}`: the balances are public on chain through their root,
//! and only the account itself can claim).

use super::error::ApiError;
use super::extract::{AppJson, AppPath};
use super::state::AppState;
use crate::books::Tab;
use crate::settlement::Claim;
use alloy::primitives::{Address, Bytes};
use axum::extract::State;
use serde::Deserialize;

/// A buyer's signed request to settle a tab now.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CloseTab {
    /// The tab's buyer.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$")]
    account: Address,
    /// ML-DSA-65 signature by the key bound to `account` over `"CXC1" ‖ chain_id u64 ‖
    /// Settlement 20 ‖ escrow_id u64`, context `cx-tab-close-v1` (0x-hex).
    #[schema(value_type = String, pattern = "^0x([0-9a-fA-F]{2})*$")]
    mldsa_signature: Bytes,
}

#[utoipa::path(post, path = "/v1/tabs/{chain_id}/{escrow_id}/close", tag = "settlement", request_body = CloseTab, params(("chain_id" = u64, Path), ("escrow_id" = u64, Path)), responses((status = 200, description = "the tab, now closing (or further along)", body = Tab), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn close_tab(
    State(state): State<AppState>,
    AppPath(super::jobs::TabPath {
        chain_id,
        escrow_id,
    }): AppPath<super::jobs::TabPath>,
    AppJson(body): AppJson<CloseTab>,
) -> Result<AppJson<Tab>, ApiError> {
    state.settler()?;
    let tab = state
        .intake()?
        .close_tab(chain_id, escrow_id, body.account, &body.mldsa_signature)
        .await?;
    Ok(AppJson(tab))
}

/// A claim's path: `/v1/claims/{chain_id}/{account}`.
#[derive(Debug, Deserialize)]
pub(super) struct ClaimPath {
    chain_id: u64,
    account: String,
}

#[utoipa::path(get, path = "/v1/claims/{chain_id}/{account}", tag = "settlement", params(("chain_id" = u64, Path), ("account" = String, Path, description = "0x-hex EVM address", pattern = "^0x[0-9a-fA-F]{40}$")), responses((status = 200, body = Claim), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn claim(
    State(state): State<AppState>,
    AppPath(ClaimPath { chain_id, account }): AppPath<ClaimPath>,
) -> Result<AppJson<Claim>, ApiError> {
    let account: Address = account
        .parse()
        .map_err(|_| ApiError::invalid("account", "a 0x-hex EVM address (20 bytes)"))?;
    if state.intake()?.domain(chain_id).is_none() {
        return Err(crate::Error::UnknownChain(chain_id).into());
    }
    state
        .settler()?
        .claim(chain_id, account)
        .await?
        .map(AppJson)
        .ok_or_else(|| ApiError::NotFound {
            what: format!(
                "credit for {account} on chain {chain_id} (no posted batch credits it yet)"
            ),
        })
}
