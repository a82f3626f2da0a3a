//! `GET|PUT /v1/exchange/ask`: the provider's ask on the exchange, changed while running (SPEC
//! §1: providers bid and quote). The operator-facing door, beside `/v1/load_lora_adapter`: the
//! new ask is signed into a fresh offer and registered at once; jobs already assigned keep the
//! price they were assigned at.

use super::body::Body;
use super::{ApiError, AppState};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

fn ask(state: &AppState) -> Result<&crate::exchange_link::Ask, ApiError> {
    state.ask.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_on_an_exchange",
            "this provider serves no exchange (start it with --exchange)",
        )
    })
}

#[utoipa::path(get, path = "/v1/exchange/ask", operation_id = "get_ask", tag = "exchange", responses((status = 200, description = "the asks now", body = super::openapi::AskView), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
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

/// The fields `PUT /v1/exchange/ask` reads.
pub(super) const ASK_FIELDS: &[&str] = &["ask_wei_per_s", "tier"];

/// Sets an ask: `{"ask_wei_per_s": "<integer wei>"}` (a decimal string or a number) for the
/// model, with `"tier": "T0" | "T1" | "T3"` for that tier alone (offered apart from then on).
#[utoipa::path(put, path = "/v1/exchange/ask", operation_id = "set_ask", tag = "exchange", request_body = super::openapi::AskRequest, responses((status = 200, description = "the ask set, signed into a fresh offer", body = super::openapi::AskSet), (status = "4XX", description = "refused: `{error: {message, type, param, code, field}}`", body = super::openapi::ErrorBody), (status = "5XX", description = "failed inside the server", body = super::openapi::ErrorBody)))]
pub(super) async fn put(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let handle = ask(&state)?;
    let body = Body::parse(&body)?;
    body.refuse_unknown(ASK_FIELDS)?;
    let tier: Option<cx_protocol::Tier> = body.get("tier")?;
    let value: Value = body.get("ask_wei_per_s")?.ok_or_else(|| {
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
