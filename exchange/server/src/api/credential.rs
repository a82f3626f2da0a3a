//! Who is acting: an account proves itself to read its jobs — a job's output is the buyer's
//! alone: anyone who could read it, a replica of the same verification group above all, could
//! sign the same hash without computing or take the answer without paying — and to store
//! adapters and datasets, which cost the exchange memory and disk and so count against the
//! account's quota.
//!
//! Two credentials prove an account: `Authorization: CX-Read …` or `CX-Store …` (the account's
//! own EIP-191 signature naming the scope and this exchange, [`cx_protocol::access`]), or
//! `Authorization: Bearer <session key>` of one of the account's live sessions. A provider's
//! dispatch token proves a provider ([`caller`]), never an account.

use super::error::ApiError;
use super::state::AppState;
use crate::books::JobRecord;
use crate::intake::now_s;
use alloy::primitives::Address;
use axum::http::{HeaderMap, header};
use cx_protocol::access::{AccessGrant, Scope};
use cx_protocol::order::SessionGrant;

fn unauthorized(scope: Scope, why: impl std::fmt::Display) -> ApiError {
    let what = match scope {
        Scope::Read => "a job is read by its buyer",
        Scope::Store => "content is stored by an account with an open tab, under its quota",
    };
    ApiError::Unauthorized {
        message: format!(
            "{why}: {what}, with `Authorization: {} account=0x…,expires=<unix s>,signature=0x…` \
             (the account's personal_sign of the access message, `cx agent` makes it) or \
             `Authorization: Bearer <session key>`",
            scope.scheme()
        ),
    }
}

/// Who a request's credential proves.
pub(super) enum Caller {
    /// An account, by its signed credential for the scope or a live session key.
    Account(Address),
    /// A registered provider, by its dispatch token.
    Provider(crate::books::Provider),
}

/// The account the request's credential proves for `scope`.
pub(super) async fn account(
    state: &AppState,
    headers: &HeaderMap,
    scope: Scope,
) -> Result<Address, ApiError> {
    match caller(state, headers, scope).await? {
        Caller::Account(account) => Ok(account),
        Caller::Provider(_) => Err(unauthorized(scope, "a provider's token proves no account")),
    }
}

/// Who the request's credential proves for `scope`: an account, or a provider (a bearer token
/// that is no session's key is tried as a dispatch token).
pub(super) async fn caller(
    state: &AppState,
    headers: &HeaderMap,
    scope: Scope,
) -> Result<Caller, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized(scope, "no credential"))?
        .to_str()
        .map_err(|_| unauthorized(scope, "the credential is not text"))?;
    // The books and the exchange's id alone: a node serving reads (a standby) checks them too.
    let books = state.books()?;
    let (scheme, token) = value.trim().split_once(' ').unwrap_or((value, ""));
    if Scope::of_scheme(scheme).is_some() {
        return AccessGrant::verify(value, scope, state.exchange_id()?, now_s())
            .map(Caller::Account)
            .map_err(|e| unauthorized(scope, e));
    }
    let token = token.trim();
    if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() {
        if let Some(session) = books
            .session_by_bearer(SessionGrant::bearer_hash_of(token.as_bytes()))
            .await?
        {
            session
                .check_live(now_s())
                .map_err(|e| unauthorized(scope, format!("the session is not live ({e})")))?;
            return Ok(Caller::Account(session.account));
        }
        return match books
            .provider_by_token(cx_protocol::offer::Offer::token_hash_of(token.as_bytes()))
            .await?
        {
            Some(provider) => Ok(Caller::Provider(provider)),
            None => Err(unauthorized(scope, "no session or provider has this key")),
        };
    }
    Err(unauthorized(scope, "an unknown scheme"))
}

/// `job` as `reader` may see it: another account's job is not found (a reader never learns which
/// ids exist), and the output and its receipt are withheld until the buyer owes for them — while
/// a replicated job awaits its verdict, and for good once it ended unpaid (expired, refunded,
/// cancelled): a buyer who stalls its own replica must not get the honest answer for free.
pub(super) fn visible(job: JobRecord, reader: Address) -> Result<JobRecord, ApiError> {
    if job.account != reader {
        return Err(ApiError::NotFound { what: "job".into() });
    }
    Ok(redacted(job))
}

/// `job` with its output and receipt left out unless [`JobRecord::output_released`].
pub(super) fn redacted(mut job: JobRecord) -> JobRecord {
    if !job.output_released() {
        job.result = None;
        job.receipt = None;
    }
    job
}
