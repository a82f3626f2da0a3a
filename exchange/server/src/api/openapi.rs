//! `GET /openapi.json`: the API's OpenAPI 3.1 document, generated from the handlers'
//! `#[utoipa::path]` annotations and the request and response types (`utoipa::ToSchema`), so it
//! cannot drift from what the server parses and writes.

use super::{
    adapters, bindings, datasets, health, jobs, market, openai, orders, providers, sessions,
    settlement,
};
use axum::Json;
use cx_protocol::access::Scope;
use utoipa::OpenApi;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "compute-exchange",
        description = "Agents buy inference from providers; residency is priced. Orders are \
                       EIP-712 typed data with an ML-DSA-65 co-signature (see /v1/eip712/{kind}); \
                       money is integer wei as decimal strings."
    ),
    paths(
        health::healthz,
        health::metrics,
        adapters::put,
        adapters::get,
        datasets::put,
        datasets::get,
        bindings::bind,
        orders::submit_intent,
        orders::submit_reserve,
        orders::submit_rent,
        orders::submit_search,
        orders::standing_order,
        jobs::job,
        jobs::list_jobs,
        jobs::events,
        jobs::tab,
        sessions::open,
        sessions::show,
        sessions::revoke,
        sessions::cancel_job,
        openai::chat_completions,
        openai::completions,
        providers::register,
        providers::pull,
        providers::result,
        providers::progress,
        providers::release,
        providers::searches,
        providers::witness,
        providers::reserves,
        providers::bid,
        providers::take_or_pay,
        providers::pins,
        providers::claim_rent,
        market::chains,
        settlement::claim,
        settlement::close_tab,
        market::eip712,
        market::models,
        market::providers,
        market::quotes,
        market::exchange,
        document,
    ),
    modifiers(&Security)
)]
struct ApiDoc;

/// The credentials: an agent's session key and a provider's dispatch token (bearer secrets),
/// and an account's signed read credential.
struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        for (name, what) in [
            (
                "session_key",
                "the bearer secret of a signed SessionGrant (`cx agent session`)",
            ),
            (
                "provider_token",
                "the secret whose SHA-256 is the provider's signed offer's token_hash",
            ),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(what))
                        .build(),
                ),
            );
        }
        for (name, scope, word) in [
            ("read_credential", Scope::Read, "read"),
            ("store_credential", Scope::Store, "store"),
        ] {
            let scheme = scope.scheme();
            components.add_security_scheme(
                name,
                SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                    "Authorization",
                    format!(
                        "`{scheme} account=0x…,expires=<unix s>,signature=0x…`: the account's \
                         EIP-191 personal_sign of `compute-exchange {word}\\naccount: <EIP-55>\\n\
                         exchange: <ML-DSA key hash of GET /v1/exchange>\\nexpires: <unix s>`, \
                         good for at most an hour"
                    )
                    .as_str(),
                ))),
            );
        }
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "service", responses((status = 200, description = "this OpenAPI document", body = Object)))]
pub(super) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
