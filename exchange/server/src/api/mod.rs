//! The HTTP door: one router, one error shape, one JSON extractor.
//!
//! Every failure a client sees is `{"error": {"code", "message", "field"}}` with the right
//! status ([`ApiError`]); malformed bodies get the same shape because [`AppJson`] rejects with
//! it, and unknown paths because the router's fallback answers with it.

mod adapters;
mod bindings;
mod credential;
mod datasets;
mod error;
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

pub use error::ApiError;
pub use extract::{AppJson, AppPath, Bearer};

use crate::intake::Intake;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use std::sync::Arc;
use std::time::Instant;

/// What every handler shares. Cheap to clone (one `Arc`).
#[derive(Clone, Debug)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    started_at: Instant,
    intake: Option<Intake>,
    settler: Option<Arc<crate::settlement::Settler>>,
    metrics: metrics::Metrics,
    explorer: crate::explorer::Config,
}

impl AppState {
    /// A state that answers health checks only (no books, no market): every market route
    /// answers 503 until [`AppState::with_intake`] gives it one. The uptime counts from here.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                started_at: Instant::now(),
                intake: None,
                settler: None,
                metrics: metrics::Metrics::default(),
                explorer: crate::explorer::Config::default(),
            }),
        }
    }

    /// The state of a serving exchange: its books, market and chains.
    pub fn with_intake(intake: Intake) -> Self {
        Self {
            inner: Arc::new(Inner {
                started_at: Instant::now(),
                intake: Some(intake),
                settler: None,
                metrics: metrics::Metrics::default(),
                explorer: crate::explorer::Config::default(),
            }),
        }
    }

    /// The state of a serving exchange that also settles: `settler` serves the claims.
    pub fn with_settlement(intake: Intake, settler: Arc<crate::settlement::Settler>) -> Self {
        Self {
            inner: Arc::new(Inner {
                started_at: Instant::now(),
                intake: Some(intake),
                settler: Some(settler),
                metrics: metrics::Metrics::default(),
                explorer: crate::explorer::Config::default(),
            }),
        }
    }

    /// The background sweeps of a serving exchange ([`crate::dispatch::run_sweeps`]); pending
    /// forever on a state without books.
    pub async fn run_sweeps(self) {
        match &self.inner.intake {
            Some(intake) => crate::dispatch::run_sweeps(intake).await,
            None => std::future::pending().await,
        }
    }

    /// The same state with each chain's block explorer (`chain id → base URL`), which the
    /// explorer's pages link transaction hashes to (EIP-3091 `{url}/tx/{hash}`). Call it before
    /// the state is cloned (it sets nothing on a state already shared).
    pub fn with_chain_explorers(mut self, urls: impl IntoIterator<Item = (u64, String)>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.explorer.chain_explorers = urls.into_iter().collect();
        }
        self
    }

    /// What the explorer is configured with.
    pub(crate) fn explorer(&self) -> &crate::explorer::Config {
        &self.inner.explorer
    }

    fn metrics(&self) -> &metrics::Metrics {
        &self.inner.metrics
    }

    /// The intake of a serving state (`None` for one that answers health checks only): for the
    /// sweeps and for tests that drive them.
    pub fn serving(&self) -> Option<&Intake> {
        self.inner.intake.as_ref()
    }

    /// The intake path, or the 503 a server without books answers.
    pub(crate) fn intake(&self) -> Result<&Intake, ApiError> {
        self.inner.intake.as_ref().ok_or_else(|| ApiError::Refused {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "not_serving",
            message: "this server has no books or market configured".to_owned(),
            field: None,
        })
    }

    /// The settlement loop, or the 503 of an exchange that does not settle.
    fn settler(&self) -> Result<&crate::settlement::Settler, ApiError> {
        self.inner
            .settler
            .as_deref()
            .ok_or_else(|| ApiError::Refused {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "not_settling",
                message: "this exchange runs no settlement (cx serve --settlement)".to_owned(),
                field: None,
            })
    }

    /// Seconds since [`AppState::new`].
    pub fn uptime_s(&self) -> u64 {
        self.inner.started_at.elapsed().as_secs()
    }
}

impl Default for AppState {
    fn default() -> Self {
        Self::new()
    }
}

/// The exchange's router. Tests drive it with `tower::ServiceExt::oneshot`, without a socket.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/metrics", get(metrics::metrics))
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
        .merge(crate::explorer::routes())
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
/// requests with their peer ([`axum::extract::ConnectInfo`]); a request without one (a test's
/// `oneshot`) is not counted.
async fn limit_by_ip(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    if let (Some(ip), Ok(intake)) = (peer, state.intake())
        && let Err(err) = intake.limits().request_from(ip)
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
