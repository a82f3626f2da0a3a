//! The door of the HTTP server: what a request must pass before its route runs or its body is
//! read.
//!
//! * A rate per client IP address: a GCRA bucket per address (`governor`), `burst` requests at
//!   once, then `per_s` a second. Over it: 429 `rate_limited` with `Retry-After` (whole seconds,
//!   rounded up), backpressure a client can follow instead of a server that slows for everyone.
//!   Memory is bounded: past [`MAX_TRACKED_KEYS`] addresses, those whose bucket has refilled are
//!   forgotten (they would be allowed anyway). The accept loop tags each request with its peer
//!   ([`ConnectInfo`]); a request without one (a test's `oneshot`) is not counted, as on the
//!   exchange.
//! * A bound on requests in flight: past it, 503 `overloaded` with `Retry-After: 1` at once.
//!   Load shedding, not queueing: a request over the bound costs nothing, and the ones admitted
//!   keep their latency. A request is in flight until its response body is done (a stream's
//!   last event, or the client leaving). `/health` and `/metrics` are exempt, so an overloaded
//!   server can still be watched.
//!
//! The exchange has the same per-IP limit (`exchange/server/src/limits.rs`); the provider does
//! not depend on the exchange's crates (ARCHITECTURE.md's walls), so the small keyed limiter is
//! written here again.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiError;

/// Addresses the rate limit tracks before it forgets the ones whose bucket is full again.
pub const MAX_TRACKED_KEYS: usize = 100_000;

/// The door's limits (`cx-provider serve --rate-per-ip`, `--rate-burst-ip`, `--max-in-flight`).
/// A value of 0 turns that limit off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Requests a second from one IP address.
    pub rate_per_ip_s: u32,
    /// Requests one IP address may send at once.
    pub rate_burst_ip: u32,
    /// Requests in flight at most (all clients together).
    pub max_in_flight: usize,
}

impl Default for HttpLimits {
    /// The rate is the exchange's: far above what an exchange link, an operator or a benchmark
    /// sends from one address, low enough that one client cannot take the whole server. 256 in
    /// flight holds four full batches of the default `--max-batch` 64 with their streams.
    fn default() -> Self {
        Self {
            rate_per_ip_s: 2_000,
            rate_burst_ip: 4_000,
            max_in_flight: 256,
        }
    }
}

impl HttpLimits {
    /// Every limit off.
    pub fn off() -> Self {
        Self {
            rate_per_ip_s: 0,
            rate_burst_ip: 0,
            max_in_flight: 0,
        }
    }
}

/// A rate limit per IP address.
struct PerIp {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    clock: DefaultClock,
}

impl PerIp {
    /// `burst` at once, then `per_s` a second; `None` when `per_s` is 0 (no limit).
    fn new(per_s: u32, burst: u32) -> Option<Self> {
        let per_s = NonZeroU32::new(per_s)?;
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        Some(Self {
            limiter: RateLimiter::keyed(Quota::per_second(per_s).allow_burst(burst)),
            clock: DefaultClock::default(),
        })
    }

    /// Takes one request for `ip`, or says how long until it would be allowed.
    fn take(&self, ip: IpAddr) -> Result<(), Duration> {
        if self.limiter.len() > MAX_TRACKED_KEYS {
            self.limiter.retain_recent();
        }
        self.limiter
            .check_key(&ip)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

/// The door's state, shared by every request.
pub(super) struct Door {
    limits: HttpLimits,
    per_ip: Option<PerIp>,
    in_flight: Option<Arc<Semaphore>>,
}

impl std::fmt::Debug for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Door")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Door {
    pub(super) fn new(limits: HttpLimits) -> Self {
        Self {
            limits,
            per_ip: PerIp::new(limits.rate_per_ip_s, limits.rate_burst_ip),
            in_flight: (limits.max_in_flight > 0)
                .then(|| Arc::new(Semaphore::new(limits.max_in_flight))),
        }
    }
}

/// Whole seconds, rounded up (a client that waits that long is allowed), at least 1.
fn whole_seconds(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// Routes that answer even when the server is overloaded: watching it must keep working.
pub(super) fn exempt_from_in_flight(path: &str) -> bool {
    matches!(path, "/health" | "/metrics")
}

/// The door as a middleware: the rate, then the bound, then the route.
pub(super) async fn admit(State(door): State<Arc<Door>>, request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    if let (Some(per_ip), Some(ip)) = (&door.per_ip, peer)
        && let Err(wait) = per_ip.take(ip)
    {
        let seconds = whole_seconds(wait);
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "more than {} requests a second (burst {}) from this IP address; try again in \
                 {seconds} s",
                door.limits.rate_per_ip_s, door.limits.rate_burst_ip
            ),
        )
        .retry_after(seconds)
        .into_response();
    }
    let permit = match &door.in_flight {
        Some(slots) if !exempt_from_in_flight(request.uri().path()) => {
            match slots.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    return ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "overloaded",
                        format!(
                            "{} requests are in flight, this server's --max-in-flight; try \
                             again in 1 s",
                            door.limits.max_in_flight
                        ),
                    )
                    .retry_after(1)
                    .into_response();
                }
            }
        }
        _ => None,
    };
    let response = next.run(request).await;
    match permit {
        None => response,
        Some(permit) => response.map(|body| {
            Body::new(Held {
                body,
                _permit: permit,
            })
        }),
    }
}

/// A response body that holds its request's slot until it is done or dropped: a stream is in
/// flight as long as it runs, not only until its handler returned.
struct Held {
    body: Body,
    _permit: OwnedSemaphorePermit,
}

impl HttpBody for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rest_waits_and_other_addresses_are_their_own() {
        let per_ip = PerIp::new(1, 3).unwrap();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            per_ip.take(a).unwrap();
        }
        let wait = per_ip.take(a).unwrap_err();
        assert!((1..=2).contains(&whole_seconds(wait)), "{wait:?}");
        per_ip.take(b).unwrap();
        assert!(PerIp::new(0, 10).is_none(), "a rate of 0 is no limit");
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1001)), 2);
    }
}
