//! The providers' door: `POST /v1/providers/register` (an ML-DSA-signed offer of bundles),
//! `POST /v1/providers/jobs` (a long poll for assigned jobs) and `POST /v1/jobs/{id}/result` (the
//! output with its signed receipt). Providers connect out to the exchange; the last two carry the
//! provider's dispatch token as `Authorization: Bearer`.

use super::error::ApiError;
use super::extract::{AppJson, Bearer};
use super::state::AppState;
use crate::intake::now_s;
use alloy::primitives::B256;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use cx_protocol::offer::SignedOffer;
use cx_protocol::wire::{
    Completed, MAX_PULL_JOBS, MAX_PULL_WAIT_S, Pull, Pulled, Registered, ResultSubmission,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Largest result body: the largest product's base64 ([`crate::orders::matmul::MAX_PRODUCT_BASE64_BYTES`],
/// 5.6 MB) or the longest text, with room for the receipt and the JSON around them.
pub(super) const RESULT_BODY_LIMIT_BYTES: usize = 8 << 20;

#[utoipa::path(post, path = "/v1/providers/register", tag = "providers", request_body(content = Object, description = "a `SignedOffer`: the offer, the ML-DSA-65 key and its signature (context `cx-offer-v1`)"), responses((status = 201, body = Registered), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn register(
    State(state): State<AppState>,
    AppJson(signed): AppJson<SignedOffer>,
) -> Result<(StatusCode, AppJson<Registered>), ApiError> {
    let provider = state.intake()?.register_offer(&signed, now_s()).await?;
    Ok((
        StatusCode::CREATED,
        AppJson(Registered {
            key_hash: provider.key_hash,
            operator: provider.operator,
            payout: provider.payout,
            bundles: signed.offer.bundles.iter().map(|b| b.id.clone()).collect(),
        }),
    ))
}

#[utoipa::path(post, path = "/v1/providers/jobs", tag = "providers", request_body = Pull, security(("provider_token" = [])), responses((status = 200, body = Pulled), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn pull(
    State(state): State<AppState>,
    Bearer(token): Bearer,
    AppJson(pull): AppJson<Pull>,
) -> Result<AppJson<Pulled>, ApiError> {
    if pull.max_jobs == 0 || pull.max_jobs > MAX_PULL_JOBS {
        return Err(ApiError::invalid(
            "max_jobs",
            format!("must be within 1..={MAX_PULL_JOBS}"),
        ));
    }
    if pull.wait_s > MAX_PULL_WAIT_S {
        return Err(ApiError::invalid(
            "wait_s",
            format!("must be within 0..={MAX_PULL_WAIT_S}"),
        ));
    }
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    let jobs = intake
        .pull(
            &provider,
            pull.max_jobs,
            Duration::from_secs(pull.wait_s.into()),
        )
        .await?;
    Ok(AppJson(Pulled { jobs }))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/result", tag = "providers", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), request_body = ResultSubmission, security(("provider_token" = [])), responses((status = 200, body = Completed), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn result(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Bearer(token): Bearer,
    AppJson(submission): AppJson<ResultSubmission>,
) -> Result<AppJson<Completed>, ApiError> {
    let id: B256 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a job id is 32 bytes of 0x-hex"))?;
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    let completed = intake
        .accept_result(&provider, id, &submission, now_s())
        .await?;
    Ok(AppJson(completed))
}

/// `POST /v1/jobs/{id}/release`: why a provider gives up a job it was assigned.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReleaseBody {
    /// What stopped it (shown to the buyer as the job's `released` event), at most
    /// [`MAX_RELEASE_REASON_BYTES`] bytes.
    reason: String,
}

/// Longest reason a release may give, bytes.
const MAX_RELEASE_REASON_BYTES: usize = 1024;

/// What a release did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Released {
    /// The job.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    job_id: B256,
    /// The bundle it moved to, or none when it was refunded (no other bundle takes it in time
    /// within the buyer's limit).
    moved_to: Option<String>,
}

#[utoipa::path(post, path = "/v1/jobs/{id}/release", tag = "providers", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), request_body = ReleaseBody, security(("provider_token" = [])), responses((status = 200, description = "re-cleared onto another bundle, or refunded", body = Released), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn release(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Bearer(token): Bearer,
    AppJson(body): AppJson<ReleaseBody>,
) -> Result<AppJson<Released>, ApiError> {
    let id: B256 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a job id is 32 bytes of 0x-hex"))?;
    if body.reason.len() > MAX_RELEASE_REASON_BYTES {
        return Err(ApiError::invalid(
            "reason",
            format!("at most {MAX_RELEASE_REASON_BYTES} bytes"),
        ));
    }
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    let moved_to = intake.release(&provider, id, &body.reason, now_s()).await?;
    Ok(AppJson(Released {
        job_id: id,
        moved_to,
    }))
}

/// `POST /v1/jobs/{id}/progress`: a piece of a running job's output.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ProgressBody {
    /// Bytes of output already sent before this piece (an output is at most 1 MiB).
    #[schema(maximum = 1_048_576)]
    offset: usize,
    /// The piece (UTF-8).
    text: String,
}

#[utoipa::path(post, path = "/v1/jobs/{id}/progress", tag = "providers", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), request_body = ProgressBody, security(("provider_token" = [])), responses((status = 200, description = "relayed to the buyer's stream, if one is open", body = Relayed), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody)))]
pub(super) async fn progress(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Bearer(token): Bearer,
    AppJson(body): AppJson<ProgressBody>,
) -> Result<AppJson<Relayed>, ApiError> {
    let id: B256 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a job id is 32 bytes of 0x-hex"))?;
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    intake
        .progress(&provider, id, body.offset, body.text)
        .await?;
    Ok(AppJson(Relayed { relayed: true }))
}

/// What a progress call did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Relayed {
    relayed: bool,
}

/// Open searches, as a provider reads them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct OpenSearches {
    /// Each open search: its id, the buyer's signed order (prefix, target, success
    /// probability, deadline, limit) and the exchange's price beside it (`order.price`: what a
    /// witness is paid, `witness_wei`, exactly what a receipt claims), what it holds.
    searches: Vec<crate::books::StandingOrder>,
}

#[utoipa::path(get, path = "/v1/providers/searches", tag = "providers", security(("provider_token" = [])), responses((status = 200, body = OpenSearches), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn searches(
    State(state): State<AppState>,
    Bearer(token): Bearer,
) -> Result<AppJson<OpenSearches>, ApiError> {
    let intake = state.intake()?;
    intake.provider(&token).await?;
    let searches = intake
        .books()
        .open_searches(crate::intake::now_s(), 32)
        .await?;
    Ok(AppJson(OpenSearches { searches }))
}

/// A witness for an open search, with the provider's receipt claiming it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Witness {
    /// The nonce: SHA-256(prefix ‖ nonce as 8 bytes little-endian) must be below the target.
    witness: u64,
    /// The provider-signed receipt (job id and input: the search's digest; output: SHA-256 of
    /// the witness's 8 bytes; amount: the search's `price.witness_wei`).
    #[schema(value_type = Object, required = true)]
    receipt: cx_protocol::receipt::SignedReceipt,
}

#[utoipa::path(post, path = "/v1/searches/{id}/witness", tag = "providers", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), request_body = Witness, security(("provider_token" = [])), responses((status = 200, description = "the search is filled: the first valid witness won", body = crate::books::StandingOrder), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn witness(
    State(state): State<AppState>,
    Bearer(token): Bearer,
    Path(id): Path<String>,
    AppJson(body): AppJson<Witness>,
) -> Result<AppJson<crate::books::StandingOrder>, ApiError> {
    let id: alloy::primitives::B256 = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a search id is 32 bytes of 0x-hex"))?;
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    intake
        .fill_search(
            &provider,
            id,
            body.witness,
            &body.receipt,
            crate::intake::now_s(),
        )
        .await?;
    let filled = intake
        .books()
        .standing_order(id)
        .await?
        .ok_or(ApiError::NotFound {
            what: "order".into(),
        })?;
    Ok(AppJson(filled))
}

/// Reserves as a provider reads them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct ProviderReserves {
    /// Open reserves still taking bids (window not started) and those committed to this
    /// provider (it claims their take-or-pay at the window's end): each with the buyer's signed
    /// order (model, tier, window, compute, limit) and its fill (bids, commitment, draws).
    reserves: Vec<crate::books::StandingOrder>,
}

#[utoipa::path(get, path = "/v1/providers/reserves", tag = "providers", security(("provider_token" = [])), responses((status = 200, body = ProviderReserves), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn reserves(
    State(state): State<AppState>,
    Bearer(token): Bearer,
) -> Result<AppJson<ProviderReserves>, ApiError> {
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    let reserves = intake
        .books()
        .provider_reserves(provider.key_hash, crate::intake::now_s(), 32)
        .await?;
    Ok(AppJson(ProviderReserves { reserves }))
}

/// A provider's bid on an open reserve.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BidBody {
    /// The bid (reserve id, bundle, rate, provider key) and the provider's ML-DSA signature.
    #[schema(value_type = Object, required = true)]
    bid: cx_protocol::bid::SignedBid,
}

fn reserve_id(id: &str) -> Result<alloy::primitives::B256, ApiError> {
    id.parse()
        .map_err(|_| ApiError::invalid("id", "a reserve id is 32 bytes of 0x-hex"))
}

async fn shown(
    intake: &crate::intake::Intake,
    id: alloy::primitives::B256,
) -> Result<AppJson<crate::books::StandingOrder>, ApiError> {
    let order = intake
        .books()
        .standing_order(id)
        .await?
        .ok_or(ApiError::NotFound {
            what: "order".into(),
        })?;
    Ok(AppJson(order))
}

#[utoipa::path(post, path = "/v1/reserves/{id}/bids", tag = "providers", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), request_body = BidBody, security(("provider_token" = [])), responses((status = 200, description = "the bid is taken (it replaces this provider's earlier one); the reserve with its bids", body = crate::books::StandingOrder), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn bid(
    State(state): State<AppState>,
    Bearer(token): Bearer,
    Path(id): Path<String>,
    AppJson(body): AppJson<BidBody>,
) -> Result<AppJson<crate::books::StandingOrder>, ApiError> {
    let id = reserve_id(&id)?;
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    intake
        .bid_reserve(&provider, id, &body.bid, crate::intake::now_s())
        .await?;
    shown(intake, id).await
}

/// The committed provider's take-or-pay claim on a reserve whose window is over.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TakeOrPay {
    /// The provider-signed receipt (job id and input: the reserve's digest; output and adapter
    /// zero; compute: the reserved compute-ms; amount: the committed rate × it).
    #[schema(value_type = Object, required = true)]
    receipt: cx_protocol::receipt::SignedReceipt,
}

#[utoipa::path(post, path = "/v1/reserves/{id}/take_or_pay", tag = "providers", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), request_body = TakeOrPay, security(("provider_token" = [])), responses((status = 200, description = "the reserve is filled: its take-or-pay is a job of its tab", body = crate::books::StandingOrder), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn take_or_pay(
    State(state): State<AppState>,
    Bearer(token): Bearer,
    Path(id): Path<String>,
    AppJson(body): AppJson<TakeOrPay>,
) -> Result<AppJson<crate::books::StandingOrder>, ApiError> {
    let id = reserve_id(&id)?;
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    intake
        .claim_reserve(&provider, id, &body.receipt, crate::intake::now_s())
        .await?;
    shown(intake, id).await
}

/// The rents a provider keeps pinned.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct ProviderPins {
    /// The rents committed to this provider: each with the buyer's signed rent (the adapter
    /// as `target`, the term, ε) and its fill (bundle, ρ, measured residency). It keeps each
    /// adapter pinned on its bundle until the order's `ends_s`, then claims the rent.
    pins: Vec<crate::books::StandingOrder>,
}

#[utoipa::path(get, path = "/v1/providers/pins", tag = "providers", security(("provider_token" = [])), responses((status = 200, body = ProviderPins), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn pins(
    State(state): State<AppState>,
    Bearer(token): Bearer,
) -> Result<AppJson<ProviderPins>, ApiError> {
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    let pins = intake
        .books()
        .provider_rents(provider.key_hash, 256)
        .await?;
    Ok(AppJson(ProviderPins { pins }))
}

/// The holding provider's claim on a rent whose term is over.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RentClaim {
    /// The provider-signed receipt (job id and input: the rent's digest; output zero; adapter:
    /// the rented one; compute 0; amount: the term's rent less its rebate).
    #[schema(value_type = Object, required = true)]
    receipt: cx_protocol::receipt::SignedReceipt,
}

#[utoipa::path(post, path = "/v1/rents/{id}/claim", tag = "providers", params(("id" = String, Path, description = "0x-hex, 32 bytes", pattern = "^0x[0-9a-fA-F]{64}$")), request_body = RentClaim, security(("provider_token" = [])), responses((status = 200, description = "the rent is filled: its term is a job of its tab", body = crate::books::StandingOrder), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn claim_rent(
    State(state): State<AppState>,
    Bearer(token): Bearer,
    Path(id): Path<String>,
    AppJson(body): AppJson<RentClaim>,
) -> Result<AppJson<crate::books::StandingOrder>, ApiError> {
    let id = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "a rent id is 32 bytes of 0x-hex"))?;
    let intake = state.intake()?;
    let provider = intake.provider(&token).await?;
    intake
        .claim_rent(&provider, id, &body.receipt, crate::intake::now_s())
        .await?;
    shown(intake, id).await
}
