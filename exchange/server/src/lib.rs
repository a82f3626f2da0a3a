//! cx-exchange-server: the compute-exchange as a service.
//!
//! An order moves through the modules in this order (ARCHITECTURE.md, "How an order flows"):
//! - [`api`]: the HTTPS door — the router ([`api::app`]), the JSON error every failure becomes
//!   ([`api::ApiError`]) and the JSON extractor whose rejection is that error ([`api::AppJson`]);
//! - [`books`]: the exchange's durable state in PostgreSQL (orders, tabs, assignments, receipts),
//!   the only module that writes it;
//! - [`chain`]: the chain watcher — tabs opened and reclaimed, stakes, batches landed;
//! - [`dispatch`]: assignments handed to providers over their own outbound connections;
//! - [`verification`]: receipts checked by tier (T1 byte equality, T2 Freivalds, T3 majority);
//! - [`settlement`]: the loop that hands verified receipts to the committee's coordinator;
//! - [`explorer`]: the pages that show each step.
//!
//! Clearing itself is not here: it is the pure core, `cx-exchange`, which this crate calls.
//!
//! ```
//! use axum::body::Body;
//! use axum::http::{Request, StatusCode};
//! use cx_exchange_server::api::{AppState, app};
//! use tower::ServiceExt;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let response = app(AppState::new())
//!     .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
//!     .await
//!     .unwrap();
//! assert_eq!(response.status(), StatusCode::OK);
//! # });
//! ```
//!
//! No feature flags.

pub mod api;
pub mod books;
pub mod chain;
pub mod dispatch;
mod error;
pub mod explorer;
pub mod intake;
pub mod market;
pub mod settlement;
pub mod tls;
pub mod verification;

pub use error::{Error, Result};
