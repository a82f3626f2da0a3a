//! Rate limits on the exchange's clients: per IP address on every request (the accept loop tags
//! each request with its peer), and per account on every signed order (after its signature
//! verifies, so nobody can spend another account's allowance). Over a limit is 429
//! `rate_limited` with `Retry-After`: backpressure a client can follow instead of a server that
//! slows for everyone.
//!
//! Each limit is a GCRA bucket per key (`governor`): `burst` requests at once, then `per_s` a
//! second. Memory is bounded: past [`MAX_TRACKED_KEYS`] keys, those whose bucket has refilled
//! are forgotten (they would be allowed anyway).
//!
//! Beside the rates, [`InFlight`] bounds the requests doing work at once, whoever sends them:
//! past it a request is answered 503 `overloaded` with `Retry-After` at once (shed, not queued),
//! so a crowd of clients under their own limits still meets a bounded server.

use crate::error::{Error, Result};
use alloy::primitives::Address;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;

/// Keys a limit tracks before it forgets the ones whose bucket is full again.
pub const MAX_TRACKED_KEYS: usize = 100_000;

/// How fast a client may go: requests a second per IP address and signed orders a second per
/// account, each with its burst. A rate of 0 turns that limit off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateConfig {
    /// Requests a second from one IP address.
    pub ip_per_s: u32,
    /// Requests one IP address may send at once.
    pub ip_burst: u32,
    /// Signed orders a second from one account.
    pub account_per_s: u32,
    /// Signed orders one account may send at once.
    pub account_burst: u32,
}

impl Default for RateConfig {
    /// Far above what an agent or a provider needs (the devnet's twelve processes share one
    /// loopback address), low enough that one client cannot take the server's whole capacity.
    fn default() -> Self {
        Self {
            ip_per_s: 2_000,
            ip_burst: 4_000,
            account_per_s: 100,
            account_burst: 200,
        }
    }
}

impl RateConfig {
    /// Every limit off (benches that measure what the server itself sustains).
    pub fn off() -> Self {
        Self {
            ip_per_s: 0,
            ip_burst: 0,
            account_per_s: 0,
            account_burst: 0,
        }
    }
}

/// Requests doing work at once (signature checks, database reads and writes) by default: the
/// load runs (docs/reliability.md) saw about 30 at the intake's knee on two cores, so this only
/// sheds a crowd far past what the server can answer in time, and stays under the connection
/// cap (768) so the shedding, not the accept queue, is what a crowd meets.
pub const MAX_IN_FLIGHT: usize = 256;

/// The bound on requests doing work at once ([`MAX_IN_FLIGHT`] by default).
#[derive(Debug, Clone)]
pub struct InFlight {
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl InFlight {
    /// At most `max` at once; `None` for 0 (no bound).
    pub fn new(max: usize) -> Option<Self> {
        (max > 0).then(|| Self {
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(max)),
            max,
        })
    }

    /// A slot for one request, held until it is dropped; [`Error::Overloaded`] when all are
    /// taken.
    pub fn enter(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Error::Overloaded { max: self.max })
    }
}

/// One keyed limit.
pub(crate) struct Keyed<K: Hash + Eq + Clone> {
    limiter: DefaultKeyedRateLimiter<K>,
    clock: DefaultClock,
}

impl<K: Hash + Eq + Clone> Keyed<K> {
    /// `burst` at once, then `per_s` a second, per key; None when `per_s` is 0 (no limit).
    pub(crate) fn new(per_s: u32, burst: u32) -> Option<Self> {
        let per_s = NonZeroU32::new(per_s)?;
        let burst = NonZeroU32::new(burst.max(1)).unwrap_or(NonZeroU32::MIN);
        Some(Self {
            limiter: RateLimiter::keyed(Quota::per_second(per_s).allow_burst(burst)),
            clock: DefaultClock::default(),
        })
    }

    /// Takes one request for `key`, or says how long until it would be allowed.
    pub(crate) fn take(&self, key: &K) -> std::result::Result<(), std::time::Duration> {
        if self.limiter.len() > MAX_TRACKED_KEYS {
            self.limiter.retain_recent();
        }
        self.limiter
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

/// The exchange's rate limits (one per kind of key).
pub struct RateLimits {
    config: RateConfig,
    per_ip: Option<Keyed<IpAddr>>,
    per_account: Option<Keyed<Address>>,
}

impl std::fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimits")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Default for RateLimits {
    fn default() -> Self {
        Self::new(RateConfig::default())
    }
}

fn limited(what: &'static str, wait: std::time::Duration) -> Error {
    Error::RateLimited {
        what,
        // Whole seconds, rounded up: a client that waits that long is allowed.
        retry_after_s: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
    }
}

impl RateLimits {
    /// The limits `config` describes.
    pub fn new(config: RateConfig) -> Self {
        Self {
            config,
            per_ip: Keyed::new(config.ip_per_s, config.ip_burst),
            per_account: Keyed::new(config.account_per_s, config.account_burst),
        }
    }

    /// What they are.
    pub fn config(&self) -> RateConfig {
        self.config
    }

    /// Counts a request from `ip`; [`Error::RateLimited`] past its limit.
    pub fn request_from(&self, ip: IpAddr) -> Result<()> {
        match &self.per_ip {
            Some(keyed) => keyed.take(&ip).map_err(|w| limited("IP address", w)),
            None => Ok(()),
        }
    }

    /// Counts a signed order from `account`; [`Error::RateLimited`] past its limit.
    pub fn order_from(&self, account: Address) -> Result<()> {
        match &self.per_account {
            Some(keyed) => keyed.take(&account).map_err(|w| limited("account", w)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rest_waits_and_other_keys_are_their_own() {
        let limits = RateLimits::new(RateConfig {
            ip_per_s: 1,
            ip_burst: 3,
            account_per_s: 0,
            account_burst: 0,
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            limits.request_from(a).unwrap();
        }
        match limits.request_from(a) {
            Err(Error::RateLimited {
                what,
                retry_after_s,
            }) => {
                assert_eq!(what, "IP address");
                assert!((1..=2).contains(&retry_after_s), "{retry_after_s}");
            }
            other => panic!("{other:?}"),
        }
        limits.request_from(b).unwrap();
        // A rate of 0 is no limit.
        for _ in 0..1_000 {
            limits.order_from(Address::ZERO).unwrap();
        }
    }
}
