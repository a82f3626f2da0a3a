//! A chain's JSON-RPC endpoints in order: a request goes to the endpoint that last answered
//! (the first at start); when it fails at the transport (refused, timed out, an HTTP error), the
//! same request goes to the next, and so on around the list once. A JSON-RPC error answer (a
//! revert, "nonce too low") is an answer, not a failure: it is returned as is.
//!
//! Why not alloy's `FallbackService`: with one active transport it returns the failure to the
//! caller and only ranks the next call elsewhere; with several it races requests to all of them.
//! Retrying one request on the next endpoint is safe for every call here, transactions included:
//! a transaction is sent signed, so a second endpoint receiving the same bytes can only answer
//! "already known" or include the same transaction, never a second one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use alloy::rpc::json_rpc::{RequestPacket, ResponsePacket};
use alloy::transports::http::{Http, reqwest};
use alloy::transports::{TransportError, TransportErrorKind, TransportFut};
use tower::Service;

/// Endpoints of one chain, tried in order from the one that last answered.
#[derive(Clone, Debug)]
pub struct Failover {
    endpoints: Arc<Vec<Http<reqwest::Client>>>,
    current: Arc<AtomicUsize>,
}

impl Failover {
    /// Over `endpoints`, the first tried first.
    pub fn new(endpoints: Vec<Http<reqwest::Client>>) -> Self {
        Self {
            endpoints: Arc::new(endpoints),
            current: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Service<RequestPacket> for Failover {
    type Response = ResponsePacket;
    type Error = TransportError;
    type Future = TransportFut<'static>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each endpoint's HTTP client is always ready (reqwest pools connections).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: RequestPacket) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let count = this.endpoints.len();
            let first = this.current.load(Ordering::Relaxed);
            let mut failure = None;
            for step in 0..count {
                let i = (first + step) % count;
                let mut endpoint = this.endpoints[i].clone();
                match endpoint.call(request.clone()).await {
                    Ok(answer) => {
                        if i != first {
                            this.current.store(i, Ordering::Relaxed);
                            tracing::warn!(
                                endpoint = i,
                                "JSON-RPC endpoint {first} failed; using endpoint {i}"
                            );
                        }
                        return Ok(answer);
                    }
                    Err(e) => failure = Some(e),
                }
            }
            Err(failure
                .unwrap_or_else(|| TransportErrorKind::custom_str("the chain has no RPC URL")))
        })
    }
}
