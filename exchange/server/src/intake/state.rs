//! The intake's state: the books, the market, the chains' domains, the exchange's identity and
//! its limits, built once by [`Intake::new`] and its `with_*` settings. The paths through it —
//! orders of each kind, dispatch, verification — are `impl Intake` blocks of their own modules.

use crate::books::Books;
use crate::jobs::waiters::Waiters;
use crate::market::Market;
use alloy::primitives::Address;
use cx_protocol::order::{self, Eip712Domain};
use cx_protocol::pq::PublicIdentity;
use std::collections::HashMap;
use std::sync::RwLock;

/// What the intake path needs: the books, the market and the domains of the chains it serves.
#[derive(Debug)]
pub struct Intake {
    pub(super) books: Books,
    pub(super) market: Market,
    pub(super) domains: HashMap<u64, Eip712Domain>,
    pub(super) settle_margin_s: u64,
    pub(super) waiters: Waiters,
    pub(super) bound: RwLock<HashMap<Address, PublicIdentity>>,
    pub(super) identity: std::sync::Arc<cx_protocol::pq::Identity>,
    pub(super) registries: crate::stake::Registries,
    pub(super) provider_silence_s: u64,
    pub(super) freivalds_rounds: usize,
    pub(super) limits: crate::limits::RateLimits,
    pub(super) in_flight: Option<crate::limits::InFlight>,
    pub(super) store_quota_bytes: u64,
    pub(super) router: crate::task_router::TaskRouter,
    pub(super) reserve_tabs: super::reserve_tabs::ReserveTabs,
}

/// A provider that has not re-registered its offer for this long leaves the engine (offers are
/// re-signed every couple of minutes; an offer is refused when older than five).
pub const PROVIDER_SILENCE_S: u64 = 360;

/// Bound ML-DSA keys kept in memory at most (each ~2 KB).
pub(super) const BOUND_KEYS_CACHED: usize = 100_000;

impl Intake {
    /// The intake over `books` and `market`, serving the chains whose Settlement contracts are
    /// given as `(chain_id, settlement)`.
    pub fn new(
        books: Books,
        market: Market,
        chains: impl IntoIterator<Item = (u64, Address)>,
        settle_margin_s: u64,
    ) -> Self {
        Self {
            books,
            market,
            domains: chains
                .into_iter()
                .map(|(id, settlement)| (id, order::domain(id, settlement)))
                .collect(),
            settle_margin_s,
            waiters: Waiters::default(),
            bound: RwLock::new(HashMap::new()),
            identity: std::sync::Arc::new(cx_protocol::pq::Identity::generate()),
            registries: Default::default(),
            provider_silence_s: PROVIDER_SILENCE_S,
            freivalds_rounds: cx_kernels::matmul::DEFAULT_FREIVALDS_ROUNDS,
            limits: crate::limits::RateLimits::default(),
            in_flight: crate::limits::InFlight::new(crate::limits::MAX_IN_FLIGHT),
            store_quota_bytes: crate::books::DEFAULT_STORE_QUOTA_BYTES,
            router: Default::default(),
            reserve_tabs: Default::default(),
        }
    }

    /// The same intake checking returned products with `rounds` Freivalds rounds (soundness
    /// 2⁻ʳᵒᵘⁿᵈˢ; [`cx_kernels::matmul::DEFAULT_FREIVALDS_ROUNDS`] by default), clamped to
    /// 1..=[`cx_kernels::matmul::MAX_FREIVALDS_ROUNDS`].
    pub fn with_freivalds_rounds(mut self, rounds: usize) -> Self {
        self.freivalds_rounds = rounds.clamp(1, cx_kernels::matmul::MAX_FREIVALDS_ROUNDS);
        self
    }

    /// Freivalds rounds per product check.
    pub fn freivalds_rounds(&self) -> usize {
        self.freivalds_rounds
    }

    /// The same intake signing assignments as `identity` (the exchange's ML-DSA-65 key, which
    /// providers and signers pin); [`Intake::new`] makes a fresh one.
    pub fn with_identity(mut self, identity: std::sync::Arc<cx_protocol::pq::Identity>) -> Self {
        self.identity = identity;
        self
    }

    /// The same intake admitting only providers staked in `registries` (see [`crate::stake`]);
    /// without, any provider whose offer verifies is admitted (tests without chains).
    pub fn with_registries(mut self, registries: crate::stake::Registries) -> Self {
        self.registries = registries;
        self
    }

    /// The same intake taking providers silent for `seconds` (no fresh offer) out of the engine
    /// ([`PROVIDER_SILENCE_S`] by default; keep it above the providers'
    /// re-registration period, 30 s for `cx-provider`).
    pub fn with_provider_silence_s(mut self, seconds: u64) -> Self {
        self.provider_silence_s = seconds;
        self
    }

    /// How long a provider may go without a fresh offer before it leaves the engine.
    pub fn provider_silence_s(&self) -> u64 {
        self.provider_silence_s
    }

    /// The registries providers must be staked in.
    pub fn registries(&self) -> &crate::stake::Registries {
        &self.registries
    }

    /// The exchange's ML-DSA-65 identity (it signs assignments).
    pub fn identity(&self) -> &cx_protocol::pq::Identity {
        &self.identity
    }

    /// Rate limits per IP address and per account ([`crate::limits`]); the defaults otherwise.
    pub fn with_rate_limits(mut self, config: crate::limits::RateConfig) -> Self {
        self.limits = crate::limits::RateLimits::new(config);
        self
    }

    /// The rate limits.
    pub fn limits(&self) -> &crate::limits::RateLimits {
        &self.limits
    }

    /// At most `max` requests doing work at once ([`crate::limits::InFlight`]; 0: no bound).
    pub fn with_max_in_flight(mut self, max: usize) -> Self {
        self.in_flight = crate::limits::InFlight::new(max);
        self
    }

    /// Bytes of adapters and datasets one account may keep stored ([`Books::store`]).
    pub fn with_store_quota_bytes(mut self, bytes: u64) -> Self {
        self.store_quota_bytes = bytes;
        self
    }

    /// Bytes of adapters and datasets one account may keep stored.
    pub fn store_quota_bytes(&self) -> u64 {
        self.store_quota_bytes
    }

    /// The bound on requests doing work at once, if any.
    pub fn in_flight(&self) -> Option<&crate::limits::InFlight> {
        self.in_flight.as_ref()
    }

    /// The books.
    pub fn books(&self) -> &Books {
        &self.books
    }

    /// The market.
    pub fn market(&self) -> &Market {
        &self.market
    }

    /// The same intake routing tasks by `policy` ([`crate::task_router::RouterPolicy`]).
    pub fn with_router_policy(mut self, policy: crate::task_router::RouterPolicy) -> Self {
        self.router = crate::task_router::TaskRouter::new(policy);
        self
    }

    /// The task router (wants that name a task, not a model).
    pub fn router(&self) -> &crate::task_router::TaskRouter {
        &self.router
    }

    /// The chains this exchange serves.
    pub fn chain_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.domains.keys().copied()
    }

    /// The EIP-712 domain of `chain_id`, if this exchange serves it.
    pub fn domain(&self, chain_id: u64) -> Option<&Eip712Domain> {
        self.domains.get(&chain_id)
    }

    /// Who waits on which job.
    pub fn waiters(&self) -> &Waiters {
        &self.waiters
    }
}
