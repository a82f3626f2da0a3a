//! `GET /healthz`: the process is up and answering.

use super::AppState;
use axum::Json;
use axum::extract::State;
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
