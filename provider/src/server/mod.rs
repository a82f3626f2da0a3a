//! The HTTP API: OpenAI-compatible completions and chat completions (streaming by SSE or
//! not), vLLM-compatible adapter load/unload, `/v1/models` and Prometheus `/metrics`.
//!
//! * `openai` — `/v1/completions`, `/v1/chat/completions`: request checks, then the engine.
//! * `adapters` — `/v1/models`, `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, each a
//!   call to the engine (which owns the registry and the cache).
//! * `metrics` — `/metrics` in Prometheus text.
//! * [`ApiError`] — every status is chosen there, from the crate's error.
//!
//! The adapter of a request is named by `model` (an adapter alias or id, as vLLM does; the
//! base model's name means no adapter) or by an explicit `adapter` field, which wins.

mod adapters;
mod error;
mod metrics;
mod openai;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::routing::{get, post};
use serde::Deserialize;

use crate::engine::{AdapterRef, Engine};
pub use error::ApiError;

/// What the router serves.
#[derive(Clone, Debug)]
pub struct AppState {
    engine: Engine,
    model_name: String,
}

impl AppState {
    /// State over a running `engine`; the base answers to `model_name`.
    pub fn new(engine: Engine, model_name: impl Into<String>) -> Self {
        Self {
            engine,
            model_name: model_name.into(),
        }
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

/// The router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/models", get(adapters::models))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/load_lora_adapter", post(adapters::load_lora))
        .route("/v1/unload_lora_adapter", post(adapters::unload_lora))
        .route("/metrics", get(metrics::metrics))
        .route("/health", get(|| async { "ok" }))
        .with_state(state)
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
