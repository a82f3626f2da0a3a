//! The HTTP API: OpenAI-compatible completions and chat completions (streaming by SSE or
//! not), vLLM-compatible adapter load/unload, `/v1/models` and Prometheus `/metrics`.
//!
//! * `openai` — `/v1/completions`, `/v1/chat/completions`: request checks, then the engine.
//! * `adapters` — `/v1/models`, `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, each a
//!   call to the engine (which owns the registry and the cache).
//! * `metrics` — `/metrics` in Prometheus text.
//! * `body` — the one door of request bodies: JSON into the route's request type, unknown
//!   fields and wrong types refused by name.
//! * `openapi` — `/openapi.json`, the OpenAPI 3.1 document of all of it, its request schemas
//!   from the same request types.
//! * `limits` — the door every request passes first: a rate per client IP address (429
//!   `rate_limited`) and a bound on requests in flight (503 `overloaded`), see [`HttpLimits`].
//! * `training` — `/v1/training/clients`: create, inspect, `forward_backward`, `optim_step`,
//!   `sample`, `save_weights`, delete, each a call to the [`Trainer`].
//! * [`ApiError`] — every status is chosen there, from the crate's error.
//!
//! The adapter of a request is named by `model` (an adapter alias or id, as vLLM does; the
//! base model's name means no adapter) or by an explicit `adapter` field, which wins.

mod adapters;
mod ask;
mod body;
mod error;
mod limits;
mod metrics;
mod openai;
mod openapi;
mod training;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::engine::{AdapterRef, Engine};
use crate::training::Trainer;
pub use error::ApiError;
pub use limits::{HttpLimits, MAX_TRACKED_KEYS};

/// What the router serves.
#[derive(Clone, Debug)]
pub struct AppState {
    engine: Engine,
    model_name: String,
    /// `/v1/training/clients`; `None` answers 503.
    training: Option<Arc<Trainer>>,
    /// The ask on the exchange (`/v1/exchange/ask`); `None` when serving no exchange.
    ask: Option<crate::exchange_link::Ask>,
    /// The rate and in-flight limits, shared by every clone.
    door: Arc<limits::Door>,
}

impl AppState {
    /// State over a running `engine`; the base answers to `model_name`.
    pub fn new(engine: Engine, model_name: impl Into<String>) -> Self {
        Self {
            engine,
            model_name: model_name.into(),
            training: None,
            ask: None,
            door: Arc::new(limits::Door::new(HttpLimits::default())),
        }
    }

    /// Serves with the door's `limits` (the default: [`HttpLimits::default`]).
    pub fn with_limits(mut self, limits: HttpLimits) -> Self {
        self.door = Arc::new(limits::Door::new(limits));
        self
    }

    /// Serves `/v1/exchange/ask` with the exchange link's live `ask`.
    pub fn with_ask(mut self, ask: crate::exchange_link::Ask) -> Self {
        self.ask = Some(ask);
        self
    }

    /// Serves `/v1/training/clients` with `trainer` (which must be over the same engine).
    pub fn with_training(mut self, trainer: Arc<Trainer>) -> Self {
        self.training = Some(trainer);
        self
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The adapter named `name` (alias or id); `None` for the base model's name.
    fn resolve(&self, name: &str) -> Result<Option<AdapterRef>, ApiError> {
        if name == self.model_name {
            return Ok(None);
        }
        Ok(Some(self.engine.resolve(name)?))
    }
}

/// Request bodies at most (axum's default, named here so the 413 can say it).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// The router. Its peer addresses come from the accept loop
/// (`into_make_service_with_connect_info::<SocketAddr>()`); without them the per-IP rate is not
/// counted.
pub fn app(state: AppState) -> Router {
    let door = state.door.clone();
    Router::new()
        .route("/v1/models", get(adapters::models))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/load_lora_adapter", post(adapters::load_lora))
        .route("/v1/unload_lora_adapter", post(adapters::unload_lora))
        .route(
            "/v1/training/clients",
            post(training::create).get(training::list),
        )
        .route(
            "/v1/training/clients/{id}",
            get(training::get).delete(training::delete),
        )
        .route(
            "/v1/training/clients/{id}/forward_backward",
            post(training::forward_backward),
        )
        .route(
            "/v1/training/clients/{id}/optim_step",
            post(training::optim_step),
        )
        .route("/v1/training/clients/{id}/sample", post(training::sample))
        .route(
            "/v1/training/clients/{id}/save_weights",
            post(training::save_weights),
        )
        .route("/v1/exchange/ask", get(ask::get).put(ask::put))
        .route("/metrics", get(metrics::metrics))
        .route("/health", get(openapi::health))
        .route("/openapi.json", get(openapi::document))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route: the API is /v1/models, /v1/completions, /v1/chat/completions, \
                 /v1/load_lora_adapter, /v1/unload_lora_adapter, /v1/training/clients, \
                 /v1/exchange/ask, /metrics, /health, /openapi.json",
            )
        })
        .with_state(state)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(json_errors))
        // Outermost: a request over a limit is refused before anything else runs.
        .layer(axum::middleware::from_fn_with_state(door, limits::admit))
}

/// Errors that axum itself answers (a wrong method, a body over the limit, …) come as plain
/// text; every error of this API has the JSON shape, so they are rewritten here, in one place.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    status_error(status).into_response()
}

/// The error of a status that axum chose, in our shape.
fn status_error(status: StatusCode) -> ApiError {
    let (code, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "method not allowed on this route (the /v1 endpoints take POST, except GET \
             /v1/models and GET/DELETE /v1/training/clients/{id})"
                .to_string(),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "payload_too_large",
            format!("the request body is over {MAX_BODY_BYTES} bytes"),
        ),
        StatusCode::NOT_FOUND => ("not_found", "no such route".to_string()),
        other => (
            "http_error",
            other.canonical_reason().unwrap_or("error").to_string(),
        ),
    };
    ApiError::new(status, code, message)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
