//! Who is reading: job reads carry the buyer's credential, because a job's output is the buyer's
//! alone. Anyone who could read it — a replica of the same verification group above all — could
//! sign the same hash without computing, or take the answer without paying for it.
//!
//! Two credentials prove an account: `Authorization: CX-Read account=…,expires=…,signature=…`
//! (the account's own EIP-191 signature naming this exchange, [`cx_protocol::read`]), or
//! `Authorization: Bearer <session key>` of one of the account's live sessions. A provider's
//! dispatch token proves no account: its jobs come to it by `POST /v1/providers/jobs`.

use super::{ApiError, AppState};
use crate::books::JobRecord;
use crate::intake::now_s;
use alloy::primitives::Address;
use axum::http::{HeaderMap, header};
use cx_protocol::order::SessionGrant;
use cx_protocol::read::{ReadGrant, SCHEME};

fn unauthorized(why: impl std::fmt::Display) -> ApiError {
    ApiError::Unauthorized {
        message: format!(
            "{why}: a job is read by its buyer, with `Authorization: {SCHEME} \
             account=0x…,expires=<unix s>,signature=0x…` (the account's personal_sign of the read \
             message, `cx agent` makes it) or `Authorization: Bearer <session key>`"
        ),
    }
}

/// The account the request's credential proves.
pub(super) async fn account(state: &AppState, headers: &HeaderMap) -> Result<Address, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("no credential"))?
        .to_str()
        .map_err(|_| unauthorized("the credential is not text"))?;
    let intake = state.intake()?;
    let (scheme, token) = value.trim().split_once(' ').unwrap_or((value, ""));
    if scheme.eq_ignore_ascii_case(SCHEME) {
        let exchange = intake.identity().public().id().0.into();
        return ReadGrant::verify(value, exchange, now_s()).map_err(unauthorized);
    }
    if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() {
        let session = intake
            .books()
            .session_by_bearer(SessionGrant::bearer_hash_of(token.trim().as_bytes()))
            .await?
            .ok_or_else(|| unauthorized("no session has this key"))?;
        session
            .check_live(now_s())
            .map_err(|e| unauthorized(format!("the session is not live ({e})")))?;
        return Ok(session.account);
    }
    Err(unauthorized("an unknown scheme"))
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
