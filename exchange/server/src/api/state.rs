//! [`AppState`]: what every handler of the API and the explorer shares — the intake (none on a
//! state that answers health checks only), the settler, the metrics and the explorer's settings
//! ([`ExplorerConfig`]).

use super::error::ApiError;
use crate::intake::Intake;
use axum::http::StatusCode;
use std::collections::BTreeMap;
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
    metrics: super::metrics::Metrics,
    explorer: ExplorerConfig,
    /// The writer epoch's forwarding token ([`crate::cluster`]): requests carrying it name
    /// their client's address.
    forward_token: Option<String>,
    /// A node that does not write: the books it reads and its own per-address limits.
    reads: Option<Reads>,
}

/// What a node that does not write serves reads with ([`AppState::reading`]).
#[derive(Debug)]
struct Reads {
    books: crate::books::Books,
    limits: crate::limits::RateLimits,
    /// The exchange's identity id, which an account's read credential names.
    exchange: alloy::primitives::B256,
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
                metrics: super::metrics::Metrics::default(),
                explorer: ExplorerConfig::default(),
                forward_token: None,
                reads: None,
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
                metrics: super::metrics::Metrics::default(),
                explorer: ExplorerConfig::default(),
                forward_token: None,
                reads: None,
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
                metrics: super::metrics::Metrics::default(),
                explorer: ExplorerConfig::default(),
                forward_token: None,
                reads: None,
            }),
        }
    }

    /// The state of a node that does not write (a standby): it serves the reads of the books
    /// alone ([`super::reads`]) from `books`, limiting each client address by `limits` as the
    /// writer does, and checks read credentials naming `exchange` (the exchange's identity id,
    /// the same on every node); everything else it forwards.
    pub fn reading(
        books: crate::books::Books,
        limits: crate::limits::RateConfig,
        exchange: alloy::primitives::B256,
    ) -> Self {
        let mut state = Self::new();
        if let Some(inner) = Arc::get_mut(&mut state.inner) {
            inner.reads = Some(Reads {
                books,
                limits: crate::limits::RateLimits::new(limits),
                exchange,
            });
        }
        state
    }

    /// The background sweeps of a serving exchange ([`crate::sweeps::run_sweeps`]); pending
    /// forever on a state without books.
    pub(crate) async fn run_sweeps(self) {
        match &self.inner.intake {
            Some(intake) => crate::sweeps::run_sweeps(intake).await,
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

    /// The same state taking forwarded requests that carry `token` ([`crate::cluster`]). Call
    /// it before the state is cloned (it sets nothing on a state already shared).
    pub fn with_forward_token(mut self, token: Option<String>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.forward_token = token;
        }
        self
    }

    /// The forwarding token requests must carry to name their client's address.
    pub(super) fn forward_token(&self) -> Option<&str> {
        self.inner.forward_token.as_deref()
    }

    /// What the explorer is configured with.
    pub(crate) fn explorer(&self) -> &ExplorerConfig {
        &self.inner.explorer
    }

    pub(super) fn metrics(&self) -> &super::metrics::Metrics {
        &self.inner.metrics
    }

    /// The intake of a serving state (`None` for one that answers health checks only): for the
    /// sweeps and for tests that drive them.
    pub fn serving(&self) -> Option<&Intake> {
        self.inner.intake.as_ref()
    }

    /// The books: the intake's, or those of a node serving reads; else the 503 of a server
    /// without books.
    pub(crate) fn books(&self) -> Result<&crate::books::Books, ApiError> {
        match (&self.inner.intake, &self.inner.reads) {
            (Some(intake), _) => Ok(intake.books()),
            (None, Some(reads)) => Ok(&reads.books),
            (None, None) => self.intake().map(|intake| intake.books()),
        }
    }

    /// The exchange's identity id (what an account's read or store credential names): the
    /// intake's, or that of a node serving reads.
    pub(super) fn exchange_id(&self) -> Result<alloy::primitives::B256, ApiError> {
        match (&self.inner.intake, &self.inner.reads) {
            (None, Some(reads)) => Ok(reads.exchange),
            _ => Ok(self.intake()?.identity().public().id().0.into()),
        }
    }

    /// The per-address request limits: the intake's, or those of a node serving reads.
    pub(super) fn rate_limits(&self) -> Option<&crate::limits::RateLimits> {
        match (&self.inner.intake, &self.inner.reads) {
            (Some(intake), _) => Some(intake.limits()),
            (None, Some(reads)) => Some(&reads.limits),
            (None, None) => None,
        }
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
    pub(super) fn settler(&self) -> Result<&crate::settlement::Settler, ApiError> {
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

/// What the explorer is configured with beyond the books: each chain's block explorer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExplorerConfig {
    /// Block-explorer base URL per chain id (EIP-3091: `{url}/tx/{hash}` shows a transaction).
    pub(crate) chain_explorers: BTreeMap<u64, String>,
}

impl ExplorerConfig {
    /// The EIP-3091 link to transaction `tx_hash` on `chain_id`, if that chain has an explorer.
    pub(crate) fn tx_url(&self, chain_id: i64, tx_hash: &str) -> Option<String> {
        let url = self.chain_explorers.get(&u64::try_from(chain_id).ok()?)?;
        Some(format!("{}/tx/{tx_hash}", url.trim_end_matches('/')))
    }
}
