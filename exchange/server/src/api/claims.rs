//! Claims (`GET /v1/claims/{chain_id}/{account}`): what an account was credited by settled
//! batches on one chain, with the Merkle proof `Escrow.claim` takes. Anyone may ask: the
//! balances are public on chain through their root, and only the account itself can claim.

use super::{ApiError, AppJson, AppState};
use crate::settlement::Claim;
use alloy::primitives::Address;
use axum::extract::{Path, State};

#[utoipa::path(get, path = "/v1/claims/{chain_id}/{account}", tag = "settlement", params(("chain_id" = u64, Path), ("account" = String, Path, description = "0x-hex EVM address")), responses((status = 200, body = Claim), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn claim(
    State(state): State<AppState>,
    Path((chain_id, account)): Path<(u64, String)>,
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
