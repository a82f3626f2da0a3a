//! Jobs and tabs: `GET /v1/jobs/{id}`, `GET /v1/jobs?account=&status=&limit=`,
//! `GET /v1/tabs/{chain_id}/{escrow_id}`.

use super::{ApiError, AppJson, AppState};
use crate::books::{JobRecord, Tab};
use alloy::primitives::{Address, B256};
use axum::extract::{Path, Query, State};
use serde::Deserialize;

/// Most jobs one list returns.
const MAX_LIMIT: u32 = 500;

pub(super) async fn job(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<AppJson<JobRecord>, ApiError> {
    let id: B256 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a job id is 32 bytes of 0x-hex"))?;
    state
        .intake()?
        .books()
        .job(id)
        .await?
        .map(AppJson)
        .ok_or(ApiError::NotFound { what: "job".into() })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    account: Option<String>,
    status: Option<String>,
    limit: Option<u32>,
}

pub(super) async fn list_jobs(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<AppJson<Vec<JobRecord>>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::Invalid {
        field: None,
        message: e.body_text(),
    })?;
    let account: Address = query
        .account
        .as_deref()
        .ok_or_else(|| ApiError::invalid("account", "required: the 0x address whose jobs to list"))?
        .parse()
        .map_err(|_| ApiError::invalid("account", "an account is a 0x-hex address"))?;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::invalid(
            "limit",
            format!("must be within 1..={MAX_LIMIT}"),
        ));
    }
    let jobs = state
        .intake()?
        .books()
        .jobs(account, query.status.as_deref(), limit)
        .await?;
    Ok(AppJson(jobs))
}

pub(super) async fn tab(
    State(state): State<AppState>,
    Path((chain_id, escrow_id)): Path<(u64, u64)>,
) -> Result<AppJson<Tab>, ApiError> {
    state
        .intake()?
        .books()
        .tab(chain_id, escrow_id)
        .await?
        .map(AppJson)
        .ok_or(ApiError::NotFound { what: "tab".into() })
}
