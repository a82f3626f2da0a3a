//! The HTTP door: one router, one error shape, one JSON extractor, and the explorer's pages
//! ([`explorer`]) served beside the API on the same state.
//!
//! Every failure a client sees is `{"error": {"code", "message", "field"}}` with the right
//! status ([`ApiError`]); malformed bodies get the same shape because [`AppJson`] rejects with
//! it, and unknown paths because the router's fallback answers with it.

mod adapters;
mod bindings;
mod credential;
mod datasets;
mod error;
pub mod explorer;
mod extract;
mod health;
mod jobs;
mod market;
mod metrics;
mod openai;
mod openapi;
mod orders;
mod providers;
mod sessions;
mod settlement;
mod state;

pub use error::ApiError;
pub use extract::{AppJson, AppPath, Bearer};
pub use state::AppState;

use axum::Router;
use axum::routing::{get, post};

/// What a node that does not write serves itself ([`AppState::reading`]): the explorer's pages
/// read from the books alone and the API's reads of the books — a job, an account's jobs, a
/// tab, a standing order, each checked against the same credential as on the writer — from its
/// own connections, under the same per-address limits as the writer's router. Every other
/// request, and every other method on those paths (cancelling a job), goes to `rest`: a
/// standby's forwarder to the writer. A job's event stream is forwarded too: the writer wakes
/// it on each change, where a reader here could only poll.
pub fn reads(state: AppState, rest: Router) -> Router {
    Router::new()
        .route(
            "/v1/jobs",
            get(jobs::list_jobs).fallback_service(rest.clone()),
        )
        .route(
            "/v1/jobs/{id}",
            get(jobs::job).fallback_service(rest.clone()),
        )
        .route(
            "/v1/tabs/{chain_id}/{escrow_id}",
            get(jobs::tab).fallback_service(rest.clone()),
        )
        .route(
            "/v1/orders/{id}",
            get(orders::standing_order).fallback_service(rest.clone()),
        )
        .merge(explorer::book_routes())
        // Not on what goes to `rest`: the writer limits forwarded requests by their client.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            limit_by_ip,
        ))
        .with_state(state)
        .fallback_service(rest)
}

/// The exchange's router. Tests drive it with `tower::ServiceExt::oneshot`, without a socket.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(openapi::document))
        .route(
            "/v1/adapters",
            axum::routing::put(adapters::put).layer(axum::extract::DefaultBodyLimit::max(
                adapters::BODY_LIMIT_BYTES,
            )),
        )
        .route("/v1/adapters/{id}", get(adapters::get))
        .route(
            "/v1/datasets",
            axum::routing::put(datasets::put).layer(axum::extract::DefaultBodyLimit::max(
                datasets::BODY_LIMIT_BYTES,
            )),
        )
        .route("/v1/datasets/{id}", get(datasets::get))
        .route("/v1/bindings", post(bindings::bind))
        .route("/v1/intents", post(orders::submit_intent))
        .route("/v1/reserves", post(orders::submit_reserve))
        .route("/v1/rents", post(orders::submit_rent))
        .route("/v1/searches", post(orders::submit_search))
        .route("/v1/orders/{id}", get(orders::standing_order))
        .route("/v1/jobs", get(jobs::list_jobs))
        .route("/v1/jobs/{id}", get(jobs::job).delete(sessions::cancel_job))
        .route("/v1/jobs/{id}/events", get(jobs::events))
        .route(
            "/v1/jobs/{id}/result",
            // A product (up to 4 MiB of f32, base64) is larger than axum's default 2 MB.
            post(providers::result).layer(axum::extract::DefaultBodyLimit::max(
                providers::RESULT_BODY_LIMIT_BYTES,
            )),
        )
        .route("/v1/jobs/{id}/progress", post(providers::progress))
        .route("/v1/jobs/{id}/release", post(providers::release))
        .route("/v1/providers/register", post(providers::register))
        .route("/v1/providers/jobs", post(providers::pull))
        .route("/v1/providers/searches", get(providers::searches))
        .route("/v1/searches/{id}/witness", post(providers::witness))
        .route("/v1/providers/reserves", get(providers::reserves))
        .route("/v1/reserves/{id}/bids", post(providers::bid))
        .route(
            "/v1/reserves/{id}/take_or_pay",
            post(providers::take_or_pay),
        )
        .route("/v1/providers/pins", get(providers::pins))
        .route("/v1/rents/{id}/claim", post(providers::claim_rent))
        .route("/v1/sessions", post(sessions::open))
        .route(
            "/v1/sessions/{id}",
            get(sessions::show).delete(sessions::revoke),
        )
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/tabs/{chain_id}/{escrow_id}", get(jobs::tab))
        .route("/v1/chains", get(market::chains))
        .route("/v1/claims/{chain_id}/{account}", get(settlement::claim))
        .route(
            "/v1/tabs/{chain_id}/{escrow_id}/close",
            post(settlement::close_tab),
        )
        .route("/v1/eip712/{kind}", get(market::eip712))
        .route("/v1/market", get(market::quotes))
        .route("/v1/exchange", get(market::exchange))
        .route("/v1/models", get(market::models))
        .route("/v1/providers", get(market::providers))
        .merge(crate::api::explorer::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), shed))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            limit_by_ip,
        ))
        .with_state(state)
}

/// Requests that wait by design rather than work: a provider's long poll, a job's event stream,
/// the OpenAI door's calls (which wait for their provider), health and metrics. They are not
/// counted against [`crate::limits::InFlight`]: holding a slot while idle would shed real work.
fn waits_by_design(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/metrics" | "/v1/providers/jobs" | "/v1/chat/completions" | "/v1/completions"
    ) || (path.starts_with("/v1/jobs/") && path.ends_with("/events"))
}

/// Past the bound on requests doing work at once, a request is answered 503 `overloaded` with
/// `Retry-After` before anything it sent is read; its slot is held until its answer is made.
async fn shed(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let bound = match state.intake() {
        Ok(intake) if !waits_by_design(request.uri().path()) => intake.in_flight().cloned(),
        _ => None,
    };
    let _slot = match bound.map(|b| b.enter()).transpose() {
        Ok(slot) => slot,
        Err(err) => return ApiError::from(err).into_response(),
    };
    next.run(request).await
}

/// Every request counts against its client's IP address ([`crate::limits`]), before anything
/// it sent is read; past the limit it is answered 429 with `Retry-After`. The accept loop tags
/// requests with their peer ([`axum::extract::ConnectInfo`]); a request another node forwarded
/// counts against the client it names ([`crate::cluster::client_ip`]); a request without a peer
/// (a test's `oneshot`) is not counted.
async fn limit_by_ip(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let connected = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let peer = crate::cluster::client_ip(request.headers(), connected, state.forward_token());
    if let (Some(ip), Some(limits)) = (peer, state.rate_limits())
        && let Err(err) = limits.request_from(ip)
    {
        return ApiError::from(err).into_response();
    }
    next.run(request).await
}

async fn not_found() -> ApiError {
    ApiError::NotFound {
        what: "route".to_owned(),
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
