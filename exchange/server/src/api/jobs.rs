//! Jobs and tabs: `GET /v1/jobs/{id}`, `GET /v1/jobs?account=&status=&limit=`,
//! `GET /v1/tabs/{chain_id}/{escrow_id}`. Job reads are the buyer's ([`super::reader`]).

use super::credential;
use super::error::ApiError;
use super::extract::{AppJson, AppPath};
use super::state::AppState;
use crate::books::{JobRecord, Tab};
use alloy::primitives::{Address, B256};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cx_protocol::access::Scope;
use serde::Deserialize;
use std::convert::Infallible;

/// Most jobs one list returns.
const MAX_LIMIT: u32 = 500;

fn job_id(id: &str) -> Result<B256, ApiError> {
    id.parse()
        .map_err(|_| ApiError::invalid("id", "a job id is 32 bytes of 0x-hex"))
}

#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = String, Path, description = "job id, 0x-hex", pattern = "^0x[0-9a-fA-F]{64}$")), security(("read_credential" = []), ("session_key" = [])), responses((status = 200, body = crate::books::JobRecord), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn job(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<AppJson<JobRecord>, ApiError> {
    // The credential first: a caller without one learns nothing of the path's validity.
    let account = credential::account(&state, &headers, Scope::Read).await?;
    let id = job_id(&id)?;
    let job = state
        .books()?
        .job(id)
        .await?
        .ok_or(ApiError::NotFound { what: "job".into() })?;
    credential::visible(job, account).map(AppJson)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    account: Option<String>,
    status: Option<String>,
    limit: Option<u32>,
}

#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(("account" = String, Query, description = "whose jobs: a 0x-hex EVM address", pattern = "^0x[0-9a-fA-F]{40}$"), ("status" = Option<String>, Query, description = "only jobs in this state", pattern = "^[a-z_]{1,32}$"), ("limit" = Option<u32>, Query, description = "1..=500, default 100", minimum = 1, maximum = 500)), security(("read_credential" = []), ("session_key" = [])), responses((status = 200, body = Vec<crate::books::JobRecord>), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn list_jobs(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<AppJson<Vec<JobRecord>>, ApiError> {
    let reader = credential::account(&state, &headers, Scope::Read).await?;
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
    if account != reader {
        return Err(ApiError::Refused {
            status: axum::http::StatusCode::FORBIDDEN,
            code: "forbidden",
            message: format!("the credential is {reader}'s: an account lists its own jobs only"),
            field: Some("account".into()),
        });
    }
    let jobs = state
        .books()?
        .jobs(account, query.status.as_deref(), limit)
        .await?;
    Ok(AppJson(
        jobs.into_iter().map(credential::redacted).collect(),
    ))
}

/// A tab's path: `/v1/tabs/{chain_id}/{escrow_id}`.
#[derive(Debug, serde::Deserialize)]
pub(super) struct TabPath {
    pub(super) chain_id: u64,
    pub(super) escrow_id: u64,
}

#[utoipa::path(get, path = "/v1/tabs/{chain_id}/{escrow_id}", tag = "jobs", params(("chain_id" = u64, Path), ("escrow_id" = u64, Path)), responses((status = 200, body = crate::books::Tab), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn tab(
    State(state): State<AppState>,
    AppPath(TabPath {
        chain_id,
        escrow_id,
    }): AppPath<TabPath>,
) -> Result<AppJson<Tab>, ApiError> {
    state
        .books()?
        .tab(chain_id, escrow_id)
        .await?
        .map(AppJson)
        .ok_or(ApiError::NotFound { what: "tab".into() })
}

/// How long an events stream waits at most between reads of the books.
const EVENTS_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /v1/jobs/{id}/events`: the job's state transitions as server-sent events (`event:` the
/// state, `data:` the event's JSON), those already past first, then each as it happens; the
/// stream ends after a state the job never leaves.
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", params(("id" = String, Path, description = "job id, 0x-hex", pattern = "^0x[0-9a-fA-F]{64}$")), security(("read_credential" = []), ("session_key" = [])), responses((status = 200, description = "server-sent events: `event:` the state, `data:` its JSON; ends at a final state", content_type = "text/event-stream"), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let account = credential::account(&state, &headers, Scope::Read).await?;
    let id = job_id(&id)?;
    let intake = state.intake()?;
    // Subscribe before the first read, so no change between the two is missed.
    let mut changed = intake.waiters().subscribe(id);
    let Some(mut job) = intake.books().job(id).await? else {
        return Err(ApiError::NotFound { what: "job".into() });
    };
    job = credential::visible(job, account)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(16);
    tokio::spawn(async move {
        let mut sent = 0;
        loop {
            for event in &job.events[sent..] {
                let data = serde_json::json!({
                    "job_id": id,
                    "status": event.status,
                    "detail": event.detail,
                    "at_ms": event.at_ms,
                });
                let event = Event::default().event(&event.status).data(data.to_string());
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            sent = job.events.len();
            if job.status.is_terminal() {
                return;
            }
            let _ = tokio::time::timeout(EVENTS_POLL, changed.recv()).await;
            let Ok(intake) = state.intake() else { return };
            match intake.books().job(id).await {
                Ok(Some(next)) => job = next,
                Ok(None) => return,
                Err(err) => {
                    tracing::warn!(error = %err, "events stream: reading the job failed");
                    return;
                }
            }
        }
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}
