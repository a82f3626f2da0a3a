//! cx-exchange-server: the compute-exchange as a service.
//!
//! An order moves through the modules in this order (ARCHITECTURE.md, "How an order flows"):
//! - [`tls`]: the HTTPS edge — rustls on aws-lc-rs, TLS 1.3, X25519MLKEM768 first, a development
//!   CA, the accept loop with its limits;
//! - [`api`]: the door — the router ([`api::app`]), the JSON error every failure becomes
//!   ([`api::ApiError`]) and the JSON extractor whose rejection is that error ([`api::AppJson`]);
//! - [`intake`]: an order in — both signatures against the bound key, the request hash, the job
//!   from the catalog model's shape, clearing, and one transaction that spends the nonce, holds the
//!   charge on the tab and writes the job; [`intake::Intake`] is the state every path shares;
//! - [`jobs::placement`]: what a job asks of the market, what clearing made of it, the decision the
//!   books keep and the answer an order gets — shared by every order kind and by verification;
//! - [`market`]: the catalog and the matching engine, a cache of the books' bundles;
//! - [`orders`]: the workload kinds, a file each — where a kind's job goes and what its result
//!   must pass before the job is done ([`orders::inference`], [`orders::matmul`] with its
//!   Freivalds check at T2, [`orders::train`] with the check of the trained adapter);
//! - [`books`]: the exchange's durable state in PostgreSQL (bindings, tabs, orders, jobs and their
//!   events, bundles, adapters, the watcher's cursor), the only module that writes it;
//! - [`chain`]: the chain watcher — tabs opened and reclaimed, batches landed;
//! - [`jobs::dispatch`]: assignments handed to providers over their own outbound connections,
//!   [`jobs::results`]: what a result must pass before its job is done, and [`jobs::waiters`]:
//!   who waits on a job and who long-polls for work;
//! - [`sweeps`]: what runs every second beside the API — deadlines, reserves, rents, standing
//!   orders, silent and unstaked providers, the market maker's quote samples;
//! - [`verification`]: receipts checked by tier (T1 byte equality, T2 Freivalds, T3 majority),
//!   and `jobs::replicas`: where the T1 and T3 runs that re-execute a job go;
//! - [`settlement`]: the loop that hands verified receipts to the committee's coordinator;
//! - [`api::explorer`]: the pages that show each step, served beside the API on its state;
//! - [`service`]: all of it as one running service — the API on its listener with the sweeps,
//!   the chain watchers and the settlement loop beside it, launched and stopped as one (what
//!   `cx serve` and the benches run).
//!
//! No module imports one that imports it back (no circle between files either): shared types
//! live in the leaf a path needs ([`jobs::placement`], [`jobs::waiters`], `books::store`, `api::state`), not
//! in the module whose paths use them.
//!
//! Clearing itself is not here: it is the pure core, `cx-exchange`, which this crate calls.
//!
//! Adding an order kind (a workload an intent asks for, or a standing order) is written down step
//! by step in `docs/adding-an-order-kind.md`.
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
pub mod cluster;
mod error;
pub mod intake;
pub mod jobs;
pub mod limits;
pub mod market;
pub mod min_rate;
pub mod orders;
pub mod preferences;
pub mod service;
pub mod settlement;
pub mod stake;
pub mod sweeps;
pub mod task_router;
pub mod tls;
pub mod verification;

pub use error::{Error, Result};
