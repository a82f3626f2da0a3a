//! The HTTP door: one router, one error shape, one JSON extractor.
//!
//! Every failure a client sees is `{"error": {"code", "message", "field"}}` with the right
//! status ([`ApiError`]); malformed bodies get the same shape because [`AppJson`] rejects with
//! it, and unknown paths because the router's fallback answers with it.

mod error;
mod extract;
mod health;

pub use error::ApiError;
pub use extract::AppJson;

use axum::Router;
use axum::routing::get;
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
}

impl AppState {
    /// A fresh state; the service's uptime counts from here.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                started_at: Instant::now(),
            }),
        }
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
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound {
        what: "route".to_owned(),
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
