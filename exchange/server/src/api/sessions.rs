//! Session keys: `POST /v1/sessions` stores an agent's signed `SessionGrant`; the bearer of its
//! secret then calls the OpenAI-compatible door, and `GET`/`DELETE /v1/sessions/{id}` (with that
//! bearer) show and revoke it.

use super::error::ApiError;
use super::extract::{AppJson, bearer};
use super::state::AppState;
use crate::books::Session;
use crate::intake::{SessionOpened, now_s};
use alloy::primitives::B256;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use cx_protocol::order::{SessionGrant, Signed};
use serde::{Deserialize, Serialize};

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OpenSession {
    /// The grant with both signatures.
    grant: Signed<SessionGrant>,
}

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = OpenSession, responses((status = 201, body = crate::intake::SessionOpened), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn open(
    State(state): State<AppState>,
    AppJson(body): AppJson<OpenSession>,
) -> Result<(StatusCode, AppJson<SessionOpened>), ApiError> {
    let opened = state
        .intake()?
        .open_session(&body.grant, now_s())
        .await
        .map_err(|e| ApiError::from(e).map_field(|f| f.replacen("intent.", "grant.", 1)))?;
    Ok((StatusCode::CREATED, AppJson(opened)))
}

/// A session as its bearer sees it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct SessionView {
    #[serde(flatten)]
    session: Session,
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,38}$")]
    left_wei: u128,
}

#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), security(("session_key" = [])), responses((status = 200, body = SessionView), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<AppJson<SessionView>, ApiError> {
    let session = own_session(&state, &id, &headers).await?;
    let left_wei = session
        .grant
        .spend_cap_wei
        .saturating_sub(session.spent_wei);
    Ok(AppJson(SessionView { session, left_wei }))
}

/// What a revocation did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Revoked {
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    session_id: B256,
    revoked: bool,
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), security(("session_key" = [])), responses((status = 200, body = Revoked), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn revoke(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<AppJson<Revoked>, ApiError> {
    let session = own_session(&state, &id, &headers).await?;
    state.intake()?.books().revoke_session(session.id).await?;
    Ok(AppJson(Revoked {
        session_id: session.id,
        revoked: true,
    }))
}

/// The session `id`, revoked and expired ones included, if the request's bearer token is its key
/// (else the same 401 as an unknown key: a token never learns of other sessions).
async fn own_session(state: &AppState, id: &str, headers: &HeaderMap) -> Result<Session, ApiError> {
    // The credential first: a caller without one learns nothing of the path's validity.
    let token = bearer(headers)?;
    let id: B256 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a session id is 32 bytes of 0x-hex"))?;
    let session = state
        .intake()?
        .books()
        .session_by_bearer(SessionGrant::bearer_hash_of(token.as_bytes()))
        .await?
        .ok_or(crate::Error::UnknownSession)?;
    if session.id != id {
        return Err(crate::Error::UnknownSession.into());
    }
    Ok(session)
}

/// What a cancellation did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Cancelled {
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    job_id: B256,
    status: &'static str,
}

/// `DELETE /v1/jobs/{id}` with the session key whose call made the job: cancels it while no
/// provider has taken it (its hold returns; nothing is charged). A running or ended job is a
/// 409; another session's job is a 404, as if it did not exist.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "sessions", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), security(("session_key" = [])), responses((status = 200, body = Cancelled), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody)))]
pub(super) async fn cancel_job(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<AppJson<Cancelled>, ApiError> {
    // The credential first: a caller without one learns nothing of the path's validity.
    let token = bearer(&headers)?;
    let job_id: B256 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a job id is 32 bytes of 0x-hex"))?;
    let intake = state.intake()?;
    let session = intake
        .books()
        .session_by_bearer(SessionGrant::bearer_hash_of(token.as_bytes()))
        .await?
        .ok_or(crate::Error::UnknownSession)?;
    if intake.books().cancel_job(job_id, session.id).await? {
        intake.waiters().notify(job_id);
        return Ok(AppJson(Cancelled {
            job_id,
            status: "cancelled",
        }));
    }
    match intake.books().job(job_id).await? {
        Some(job) if job.session_id == Some(session.id) => Err(ApiError::Conflict {
            field: None,
            message: format!(
                "the job is {}: only a job no provider has taken (assigned) can be cancelled",
                job.status
            ),
        }),
        _ => Err(ApiError::NotFound { what: "job".into() }),
    }
}
