//! `POST /v1/intents`: a signed intent in, a job out (202), or the reason it was refused.

use super::{ApiError, AppJson, AppState};
use crate::intake::{Accepted, IntentSubmission};
use axum::extract::State;
use axum::http::StatusCode;

pub(super) async fn submit_intent(
    State(state): State<AppState>,
    AppJson(submission): AppJson<IntentSubmission>,
) -> Result<(StatusCode, AppJson<Accepted>), ApiError> {
    let started = std::time::Instant::now();
    let result = async { Ok(state.intake()?.submit_intent(&submission, now_s()).await?) }.await;
    let micros = started.elapsed().as_micros() as u64;
    match result {
        Ok(accepted) => {
            state.metrics().accepted(micros);
            Ok((StatusCode::ACCEPTED, AppJson(accepted)))
        }
        Err(err) => {
            let err: ApiError = err;
            state.metrics().refused(err.code(), micros);
            Err(err)
        }
    }
}

/// The exchange's clock, unix seconds: expiries and deadlines are judged against it.
pub(super) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
