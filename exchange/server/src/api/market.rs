//! Market data: the chains served (`/v1/chains`), the EIP-712 typed data a wallet signs
//! (`/v1/eip712/{kind}?chain_id=`), the catalog (`/v1/models`), the bundles (`/v1/providers`),
//! the market maker's quotes (`/v1/market`).

use super::error::ApiError;
use super::extract::AppJson;
use super::state::AppState;
use axum::extract::{Path, Query, State};
use cx_exchange::routing::catalog::Model;
use cx_protocol::Bundle;
use cx_protocol::order::Kind;
use serde::{Deserialize, Serialize};

/// A chain this exchange serves and the contract orders on it are signed for.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct ChainInfo {
    chain_id: u64,
    verifying_contract: String,
}

#[utoipa::path(get, path = "/v1/chains", tag = "market", responses((status = 200, body = Vec<ChainInfo>)))]
pub(super) async fn chains(
    State(state): State<AppState>,
) -> Result<AppJson<Vec<ChainInfo>>, ApiError> {
    let intake = state.intake()?;
    let mut chains: Vec<ChainInfo> = intake
        .chain_ids()
        .filter_map(|id| {
            let domain = intake.domain(id)?;
            Some(ChainInfo {
                chain_id: id,
                verifying_contract: domain.verifying_contract?.to_string(),
            })
        })
        .collect();
    chains.sort_by_key(|c| c.chain_id);
    Ok(AppJson(chains))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Eip712Query {
    chain_id: u64,
}

/// Exactly what `eth_signTypedData_v4` takes, less the message: `{types, primaryType, domain}`.
#[utoipa::path(get, path = "/v1/eip712/{kind}", tag = "market", params(("kind" = String, Path, description = "intent, reserve, rent, search, tab_terms, session_grant or pq_binding", pattern = "^(intent|reserve|rent|search|tab_terms|session_grant|pq_binding)$"), ("chain_id" = u64, Query)), responses((status = 200, description = "`{types, primaryType, domain}` for eth_signTypedData_v4", body = Object), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn eip712(
    State(state): State<AppState>,
    Path(kind): Path<String>,
    query: Result<Query<Eip712Query>, axum::extract::rejection::QueryRejection>,
) -> Result<AppJson<serde_json::Value>, ApiError> {
    let Query(query) = query.map_err(|_| {
        ApiError::invalid("chain_id", "required: the chain whose domain to sign under")
    })?;
    let kind: Kind = kind.parse().map_err(|_| {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        ApiError::invalid("kind", format!("one of {}", known.join(", ")))
    })?;
    let domain = state
        .intake()?
        .domain(query.chain_id)
        .ok_or_else(|| ApiError::invalid("chain_id", "not a chain this exchange serves"))?;
    Ok(AppJson(cx_protocol::order::wallet_typed_data(
        kind, domain, None,
    )))
}

/// `GET /v1/models` as OpenAI (and vLLM) answer it, so `client.models.list()` of any OpenAI
/// client works against the door: `{"object": "list", "data": [...]}`, each entry `{id, object:
/// "model", created, owned_by}` and, beside those, the catalog's own fields (aliases, shape,
/// quality, rungs).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct ModelList {
    object: &'static str,
    data: Vec<ModelEntry>,
}

/// One catalog model in OpenAI's model shape.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct ModelEntry {
    /// The model's canonical name (what `model` names in a call).
    id: String,
    object: &'static str,
    /// Unix seconds; the catalog keeps no dates, so 0.
    created: u64,
    owned_by: &'static str,
    /// The catalog entry.
    #[serde(flatten)]
    #[schema(value_type = Object, required = true)]
    catalog: Model,
}

#[utoipa::path(get, path = "/v1/models", tag = "market", responses((status = 200, description = "the catalog, in OpenAI's list shape", body = ModelList)))]
pub(super) async fn models(State(state): State<AppState>) -> Result<AppJson<ModelList>, ApiError> {
    let data = state
        .intake()?
        .market()
        .catalog()
        .models()
        .iter()
        .map(|m| ModelEntry {
            id: m.name.clone(),
            object: "model",
            created: 0,
            owned_by: "compute-exchange",
            catalog: m.clone(),
        })
        .collect();
    Ok(AppJson(ModelList {
        object: "list",
        data,
    }))
}

#[utoipa::path(get, path = "/v1/providers", tag = "market", responses((status = 200, description = "live bundles", body = Vec<Object>)))]
pub(super) async fn providers(
    State(state): State<AppState>,
) -> Result<AppJson<Vec<Bundle>>, ApiError> {
    Ok(AppJson(state.intake()?.market().bundles()))
}

/// `GET /v1/market`: the market maker's open quote in every market (model × tier): bid, ask,
/// regime and its belief.
#[utoipa::path(get, path = "/v1/market", tag = "market", responses((status = 200, body = Vec<crate::books::MarketQuote>)))]
pub(super) async fn quotes(
    State(state): State<AppState>,
) -> Result<AppJson<Vec<crate::books::MarketQuote>>, ApiError> {
    Ok(AppJson(state.intake()?.market().quotes()?))
}

/// The exchange's own identity: the ML-DSA-65 key its assignments are signed with, for providers
/// and signers to pin.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct ExchangeInfo {
    /// SHA-256 of the key (0x-hex).
    mldsa_key_hash: String,
    /// The encoded ML-DSA-65 verification key (hex).
    mldsa_key: String,
    /// The FIPS 204 context of assignment signatures.
    assignment_context: &'static str,
}

#[utoipa::path(get, path = "/v1/exchange", tag = "market", responses((status = 200, body = ExchangeInfo)))]
pub(super) async fn exchange(
    State(state): State<AppState>,
) -> Result<AppJson<ExchangeInfo>, ApiError> {
    let public = state.intake()?.identity().public();
    Ok(AppJson(ExchangeInfo {
        mldsa_key_hash: format!("0x{}", hex::encode(public.id().0)),
        mldsa_key: hex::encode(public.to_bytes()),
        assignment_context: "cx-assignment-v1",
    }))
}
