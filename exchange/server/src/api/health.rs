//! `GET /healthz`: the process is up and answering; `GET /metrics`: what it has counted.

use super::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;

/// The body of `GET /healthz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Health {
    status: &'static str,
    version: &'static str,
    uptime_s: u64,
}

#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200, body = Health)))]
pub(super) async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
        uptime_s: state.uptime_s(),
    })
}

#[utoipa::path(get, path = "/metrics", tag = "service", responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain")))]
pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let text = state.metrics().render(state.uptime_s());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
