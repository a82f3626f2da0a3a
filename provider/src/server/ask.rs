//! `GET|PUT /v1/exchange/ask`: the provider's ask on the exchange, changed while running (SPEC
//! §1: providers bid and quote). The operator-facing door, beside `/v1/load_lora_adapter`: the
//! new ask is signed into a fresh offer and registered at once; jobs already assigned keep the
//! price they were assigned at.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::body::{Body, Request};
use super::openapi::fields;
use super::{ApiError, AppState};

fn ask(state: &AppState) -> Result<&crate::exchange_link::Ask, ApiError> {
    state.ask.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_on_an_exchange",
            "this provider serves no exchange (start it with --exchange)",
        )
    })
}

#[utoipa::path(get, path = "/v1/exchange/ask", operation_id = "get_ask", tag = "exchange", responses((status = 200, description = "the asks now", body = super::openapi::responses::AskView), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
/// The asks now: the model's, and each tier priced apart.
pub(super) async fn get(State(state): State<AppState>) -> Result<axum::Json<Value>, ApiError> {
    let ask = ask(&state)?;
    let tiers: serde_json::Map<String, Value> = ask
        .tiers()
        .into_iter()
        .map(|(t, w)| (format!("{t:?}"), json!(w.to_string())))
        .collect();
    Ok(axum::Json(
        json!({ "ask_wei_per_s": ask.get().to_string(), "tiers": tiers }),
    ))
}

/// `PUT /v1/exchange/ask`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AskRequest {
    // A decimal string or a number: read whole, its refusal says what it must be.
    #[schema(schema_with = fields::wei, required = true)]
    ask_wei_per_s: Option<Value>,
    /// Sets that tier's ask alone (offered apart from then on) [default: the model's ask].
    tier: Option<cx_protocol::Tier>,
}

impl Request for AskRequest {}

/// Sets an ask: `{"ask_wei_per_s": "<integer wei>"}` (a decimal string or a number) for the
/// model, with `"tier": "T0" | "T1" | "T3"` for that tier alone (offered apart from then on).
#[utoipa::path(put, path = "/v1/exchange/ask", operation_id = "set_ask", tag = "exchange", request_body = AskRequest, responses((status = 200, description = "the ask set, signed into a fresh offer", body = super::openapi::responses::AskSet), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::responses::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::responses::ErrorBody)))]
pub(super) async fn put(
    State(state): State<AppState>,
    // Read after the exchange check: a provider on none answers 404 to any body.
    request: Result<Body<AskRequest>, ApiError>,
) -> Result<axum::Json<Value>, ApiError> {
    let handle = ask(&state)?;
    let Body(request) = request?;
    let tier = request.tier;
    let value = request.ask_wei_per_s.ok_or_else(|| {
        ApiError::bad_request("`ask_wei_per_s` is required").field("ask_wei_per_s")
    })?;
    let wei = match &value {
        Value::String(text) => text.parse::<u64>().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
    .filter(|w| *w > 0)
    .ok_or_else(|| {
        ApiError::bad_request("an integer number of wei per compute-second, above zero")
            .field("ask_wei_per_s")
    })?;
    handle.set(wei, tier).map_err(|e| {
        ApiError::from(e).field(if tier.is_some() {
            "tier"
        } else {
            "ask_wei_per_s"
        })
    })?;
    Ok(axum::Json(
        json!({ "ask_wei_per_s": wei.to_string(), "tier": tier }),
    ))
}
