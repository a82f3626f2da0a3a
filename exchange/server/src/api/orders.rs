//! `POST /v1/intents`: a signed intent in, a job out (202; with `"wait": true`, 200 with the job
//! once it is done or its deadline passed), or the reason it was refused.

use super::{ApiError, AppJson, AppState};
use crate::intake::IntentSubmission;
use crate::intake::now_s;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub(super) async fn submit_intent(
    State(state): State<AppState>,
    AppJson(submission): AppJson<IntentSubmission>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let result = async { Ok(state.intake()?.submit_intent(&submission, now_s()).await?) }.await;
    let micros = started.elapsed().as_micros() as u64;
    match result {
        Ok(accepted) => {
            state.metrics().accepted(micros);
            if !submission.wait {
                return Ok((StatusCode::ACCEPTED, AppJson(accepted)).into_response());
            }
            // `"wait": true`: answer with the job once it is done, or as it stands at its
            // deadline (the sweep expires it within a period of that).
            let deadline_s = submission.intent.order.deadline_s;
            let until = tokio::time::Instant::now()
                + std::time::Duration::from_secs(deadline_s.saturating_sub(now_s()))
                + 2 * crate::dispatch::SWEEP_PERIOD;
            let job = state
                .intake()?
                .wait(accepted.job_id, until)
                .await?
                .ok_or(ApiError::NotFound { what: "job".into() })?;
            Ok(AppJson(job).into_response())
        }
        Err(err) => {
            let err: ApiError = err;
            state.metrics().refused(err.code(), micros);
            Err(err)
        }
    }
}
