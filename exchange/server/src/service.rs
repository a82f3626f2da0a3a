//! The exchange's writer as one running service: the API on a listener ([`Front`]) and the
//! sweeps ([`crate::sweeps::run_sweeps`]) beside it, which act on its matching engine — started
//! by one [`Service::launch`] (or [`Service::launch_behind`] a front that forwarded to another
//! node until now) and stopped by one [`Running::stop`]. The chain watchers and the settlement
//! loop are duties of their own, run by whichever node holds each one's lease
//! ([`crate::cluster::Campaign`]).
//!
//! `cx serve` and the benches launch the exchange through here, so what a bench measures is the
//! service `cx serve` runs.

use crate::api::{AppState, app};
use crate::intake::Intake;
use crate::settlement::Settler;
use crate::tls::{self, Limits};
use axum::Router;
use axum::extract::Request;
use rustls::ServerConfig;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceExt;

/// How the API speaks on its listener.
#[derive(Clone, Debug)]
pub enum Edge {
    /// HTTPS (TLS 1.3, X25519MLKEM768 first) under this configuration ([`tls::server_config`]).
    Https(Arc<ServerConfig>),
    /// Plain HTTP: for a TLS-terminating proxy in front or a local test only.
    InsecureHttp,
}

/// An exchange ready to launch: its intake (books, market, chains) and what runs beside the API.
pub struct Service {
    intake: Intake,
    settler: Option<Arc<Settler>>,
    chain_explorers: Vec<(u64, String)>,
    limits: Limits,
    forward_token: Option<String>,
}

impl Service {
    /// The service over `intake`, with the default connection limits and no settlement.
    pub fn new(intake: Intake) -> Self {
        Self {
            intake,
            settler: None,
            chain_explorers: Vec::new(),
            limits: Limits::default(),
            forward_token: None,
        }
    }

    /// Settles through `settler`: the API serves its claims and takes tabs' closing (its loop is
    /// the settlement duty's, [`crate::cluster::Campaign`]).
    pub fn with_settler(mut self, settler: Arc<Settler>) -> Self {
        self.settler = Some(settler);
        self
    }

    /// Each chain's block explorer (`chain id → base URL`) for the explorer's links.
    pub fn with_chain_explorers(mut self, urls: impl IntoIterator<Item = (u64, String)>) -> Self {
        self.chain_explorers.extend(urls);
        self
    }

    /// The edge's connection limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Answers forwarded requests carrying `token` ([`crate::cluster`]; the writer lease's).
    pub fn with_forward_token(mut self, token: Option<String>) -> Self {
        self.forward_token = token;
        self
    }

    /// Serves the API on `listener` through `edge` and starts the sweeps beside it; they run
    /// until [`Running::stop`].
    pub fn launch(self, listener: TcpListener, edge: Edge) -> std::io::Result<Running> {
        let limits = self.limits;
        let (router, duties) = self.start();
        let front = Front::open(listener, edge, limits, router)?;
        Ok(duties.beside(front))
    }

    /// Takes over `front`'s port (a node that forwarded to the writer until it became the
    /// writer): its router is swapped for this service's and the sweeps start beside it; the
    /// port stays open throughout.
    pub fn launch_behind(self, front: Front) -> Running {
        let (router, duties) = self.start();
        front.serve(router);
        duties.beside(front)
    }

    /// The API's router and the sweeps, started.
    fn start(self) -> (Router, Sweeps) {
        let state = match self.settler {
            Some(settler) => AppState::with_settlement(self.intake, settler),
            None => AppState::with_intake(self.intake),
        }
        .with_chain_explorers(self.chain_explorers)
        .with_forward_token(self.forward_token);
        // The sweeps hold no work a stop must finish (each pass is one transaction per job):
        // they are aborted, not awaited.
        let sweeps = tokio::spawn(state.clone().run_sweeps());
        (app(state), Sweeps(sweeps))
    }
}

/// The sweeps of a started service, waiting for the front they run beside.
struct Sweeps(JoinHandle<()>);

impl Sweeps {
    fn beside(self, front: Front) -> Running {
        Running {
            front,
            sweeps: self.0,
        }
    }
}

/// The API's listener, serving a router that may be swapped while it runs: a node forwarding to
/// the writer ([`crate::cluster::Forwarder`]) becomes the writer without closing its port
/// ([`Service::launch_behind`]). A request is served by the router current when it arrives.
#[derive(Debug)]
pub struct Front {
    address: SocketAddr,
    stop: watch::Sender<bool>,
    api: JoinHandle<()>,
    router: watch::Sender<Router>,
}

impl Front {
    /// Serves `router` on `listener` through `edge` under `limits`.
    pub fn open(
        listener: TcpListener,
        edge: Edge,
        limits: Limits,
        router: Router,
    ) -> std::io::Result<Self> {
        let address = listener.local_addr()?;
        let (stop, mut stopped) = watch::channel(false);
        let (swap, current) = watch::channel(router);
        let switch = Router::new().fallback_service(tower::service_fn(move |request: Request| {
            let router = current.borrow().clone();
            router.oneshot(request)
        }));
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let api = match edge {
            Edge::Https(config) => {
                tokio::spawn(tls::serve_https(listener, config, switch, limits, shutdown))
            }
            Edge::InsecureHttp => {
                tokio::spawn(tls::serve_insecure_http(listener, switch, limits, shutdown))
            }
        };
        Ok(Self {
            address,
            stop,
            api,
            router: swap,
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves `router` from the next request on.
    fn serve(&self, router: Router) {
        // The router replaced (a forwarder) lives on in requests it is still serving.
        drop(self.router.send_replace(router));
    }

    /// Stops taking connections and waits for open ones (within the edge's grace).
    pub async fn close(self) {
        let _ = self.stop.send(true);
        let _ = self.api.await;
    }
}

/// A launched exchange.
#[derive(Debug)]
pub struct Running {
    front: Front,
    sweeps: JoinHandle<()>,
}

impl Running {
    /// Where the API listens.
    pub fn address(&self) -> SocketAddr {
        self.front.address()
    }

    /// Runs until `signal` completes (Ctrl-C, a test's end), then stops.
    pub async fn until(self, signal: impl Future<Output = ()>) {
        signal.await;
        self.stop().await;
    }

    /// Stops taking connections and waits for open ones (within the edge's grace), then stops
    /// the sweeps.
    pub async fn stop(self) {
        self.front.close().await;
        self.sweeps.abort();
    }
}
