//! `POST /v1/intents`: a signed intent in, a job out (202; with `"wait": true`, 200 with the job
//! once it is done or its deadline passed), or the reason it was refused.

use super::error::ApiError;
use super::extract::AppJson;
use super::state::AppState;
use crate::books::StandingOrder;
use crate::intake::now_s;
use crate::intake::{
    IntentSubmission, RentSubmission, ReserveSubmission, SearchSubmission, StandingAccepted,
};
use alloy::primitives::B256;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[utoipa::path(post, path = "/v1/intents", tag = "orders", request_body = crate::intake::IntentSubmission, responses((status = 202, body = cx_protocol::wire::Accepted), (status = 200, description = "with `wait: true`: the job when done or at its deadline", body = crate::books::JobRecord), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
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
                + 2 * crate::sweeps::SWEEP_PERIOD;
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

/// An intake error of a standing order, its intent-named fields renamed to the order's kind.
fn standing_error(kind: &'static str) -> impl Fn(crate::Error) -> ApiError {
    move |err| {
        ApiError::from(err).map_field(|f| match f {
            "intent.order.want" => format!("{kind}.order.model"),
            "intent.order.adapter_id" => format!("{kind}.order.target"),
            "intent.order.deadline_s" => format!("{kind}.order"),
            other => other.replacen("intent.", &format!("{kind}."), 1),
        })
    }
}

#[utoipa::path(post, path = "/v1/reserves", tag = "orders", request_body = crate::intake::ReserveSubmission, responses((status = 202, body = crate::intake::StandingAccepted), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn submit_reserve(
    State(state): State<AppState>,
    AppJson(body): AppJson<ReserveSubmission>,
) -> Result<(StatusCode, AppJson<StandingAccepted>), ApiError> {
    let accepted = state
        .intake()?
        .submit_reserve(&body.reserve, now_s())
        .await
        .map_err(standing_error("reserve"))?;
    Ok((StatusCode::ACCEPTED, AppJson(accepted)))
}

#[utoipa::path(post, path = "/v1/rents", tag = "orders", request_body = crate::intake::RentSubmission, responses((status = 202, body = crate::intake::StandingAccepted), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn submit_rent(
    State(state): State<AppState>,
    AppJson(body): AppJson<RentSubmission>,
) -> Result<(StatusCode, AppJson<StandingAccepted>), ApiError> {
    let accepted = state
        .intake()?
        .submit_rent(&body.rent, now_s())
        .await
        .map_err(standing_error("rent"))?;
    Ok((StatusCode::ACCEPTED, AppJson(accepted)))
}

#[utoipa::path(post, path = "/v1/searches", tag = "orders", request_body = crate::intake::SearchSubmission, responses((status = 202, body = crate::intake::StandingAccepted), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn submit_search(
    State(state): State<AppState>,
    AppJson(body): AppJson<SearchSubmission>,
) -> Result<(StatusCode, AppJson<StandingAccepted>), ApiError> {
    let accepted = state
        .intake()?
        .submit_search(&body.search, now_s())
        .await
        .map_err(standing_error("search"))?;
    Ok((StatusCode::ACCEPTED, AppJson(accepted)))
}

/// `GET /v1/orders/{id}`: a standing order and its state.
#[utoipa::path(get, path = "/v1/orders/{id}", tag = "orders", params(("id" = String, Path, description = "the order's EIP-712 digest, 0x-hex", pattern = "^0x[0-9a-fA-F]{64}$")), responses((status = 200, body = crate::books::StandingOrder), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn standing_order(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<AppJson<StandingOrder>, ApiError> {
    let id: B256 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "an order id is 32 bytes of 0x-hex"))?;
    state
        .books()?
        .standing_order(id)
        .await?
        .map(AppJson)
        .ok_or(ApiError::NotFound {
            what: "order".into(),
        })
}
