//! [`Forwarder`]: how a node that does not write serves a request — it sends it to the writer
//! and relays the answer, streamed (a job's events and the door's streamed completions too).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Uri, Version, header};
use axum::response::{IntoResponse, Response};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::ClientConfig;
use sqlx::PgPool;
use tokio::sync::RwLock;

use super::peer::{FORWARD_TOKEN, FORWARDED_FOR};
use crate::api::ApiError;
use crate::books::{Books, Lease, WriterAddress};

/// How long a request waits for a writer it can reach: a takeover is the lease's period, the
/// new writer's engine rebuilt from the books, and its first answer.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// How often a waiting request reads the lease's row again.
const RETRY_PERIOD: Duration = Duration::from_millis(200);

/// A body up to this size (every order, door call and result) is held while forwarded, so it is
/// sent again when the writer cannot be reached (to the next writer, after a takeover); a larger
/// one (an adapter, a dataset) streams through once.
const HELD_BODY_BYTES: u64 = 8 << 20;

/// A connection to the writer that does not open within this is a writer away.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Headers of one connection (RFC 9110 §7.6.1), not of the request: never forwarded.
const HOP_BY_HOP: [header::HeaderName; 7] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// A forwarding node's link to the writer: the lease's row (where the writer is) and a pooled
/// HTTPS client trusting the cluster's roots.
#[derive(Debug)]
pub struct Forwarder {
    pool: PgPool,
    client: Client<HttpsConnector<HttpConnector>, Body>,
    writer: RwLock<Option<WriterAddress>>,
}

impl Forwarder {
    /// Forwards to the writer the lease's row in `books` names, over HTTPS trusting
    /// `tls`'s roots (the nodes' certificate authority), or plain HTTP with `None` (nodes behind
    /// `--insecure-http`).
    pub fn new(books: &Books, tls: Option<Arc<ClientConfig>>) -> crate::tls::Result<Self> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // No roots without `tls`: an `https://` writer is refused, as it should be for nodes told
        // to speak plain HTTP to each other.
        let (config, https_only) = match tls {
            Some(config) => (config, true),
            None => (crate::tls::client_config([])?, false),
        };
        // hyper-rustls sets ALPN itself (`http/1.1`, what `enable_http1` offers).
        let mut config = Arc::unwrap_or_clone(config);
        config.alpn_protocols.clear();
        let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config);
        let builder = if https_only {
            builder.https_only()
        } else {
            builder.https_or_http()
        };
        let connector = builder.enable_http1().wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            pool: books.pool().clone(),
            client,
            writer: RwLock::new(None),
        })
    }

    /// The router of a forwarding node: every path, every method, to the writer.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new().fallback(forward).with_state(self)
    }

    /// Sends `request` to the writer and relays its answer. A writer that cannot be reached is
    /// looked up again and retried for up to [`PATIENCE`]; a writer that fails once it has the
    /// request is a 502 (it may have done it).
    async fn send(&self, request: Request) -> Result<Response, ApiError> {
        let (parts, body) = request.into_parts();
        // Forwarded once already: the row's URL leads back to a standby (a writer advertising
        // the balancer's address, say). Sending it on would loop until the patience ran out.
        if parts.headers.contains_key(&FORWARD_TOKEN) {
            return Err(ApiError::Refused {
                status: axum::http::StatusCode::LOOP_DETECTED,
                code: "forwarding_loop",
                message: "a standby node was sent a request another node forwarded: the writer's \
                          advertised URL (cx serve --advertise) must reach the writer itself, \
                          not a balancer or another node"
                    .into(),
                field: None,
            });
        }
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        let mut headers = parts.headers;
        let mut body = match held_length(&headers) {
            Some(0) => Held::Bytes(Bytes::new()),
            Some(n) => Held::Bytes(
                axum::body::to_bytes(body, n as usize)
                    .await
                    .map_err(|_| ApiError::invalid("body", "the body ended before its length"))?,
            ),
            None => Held::Stream(Some(body)),
        };
        strip_hop_by_hop(&mut headers);
        headers.remove(header::HOST);
        headers.remove(&FORWARD_TOKEN);
        headers.remove(&FORWARDED_FOR);
        if let Some(ip) = peer
            && let Ok(value) = HeaderValue::from_str(&ip.to_string())
        {
            headers.insert(&FORWARDED_FOR, value);
        }
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let deadline = Instant::now() + PATIENCE;
        let mut read_again = false;
        loop {
            let Some(writer) = self.writer().await? else {
                if Instant::now() >= deadline {
                    return Err(ApiError::NoWriter);
                }
                tokio::time::sleep(RETRY_PERIOD).await;
                continue;
            };
            let uri: Uri = format!("{}{path}", writer.url.trim_end_matches('/'))
                .parse()
                .map_err(|e| ApiError::Internal(Box::new(e)))?;
            let Some(outgoing) = body.next() else {
                // A streamed body was sent once already: it cannot be sent again.
                return Err(ApiError::NoWriter);
            };
            let mut forwarded = axum::http::Request::new(outgoing);
            *forwarded.method_mut() = parts.method.clone();
            *forwarded.uri_mut() = uri;
            *forwarded.version_mut() = Version::HTTP_11;
            *forwarded.headers_mut() = headers.clone();
            if let Ok(token) = HeaderValue::from_str(&writer.forward_token) {
                forwarded.headers_mut().insert(&FORWARD_TOKEN, token);
            }
            match self.client.request(forwarded).await {
                // The node the cache names is no longer the writer (it restarted as a standby on
                // the same address): read the row once more before saying it loops.
                Ok(answer)
                    if answer.status() == axum::http::StatusCode::LOOP_DETECTED && !read_again =>
                {
                    self.forget(writer.epoch).await;
                    read_again = true;
                }
                Ok(answer) => {
                    let mut answer = answer.map(Body::new);
                    strip_hop_by_hop(answer.headers_mut());
                    return Ok(answer);
                }
                Err(err) if err.is_connect() => {
                    // Nothing was sent: the writer is away (dead, or not yet listening). Read
                    // the row again, which a takeover rewrites.
                    self.forget(writer.epoch).await;
                    if Instant::now() >= deadline {
                        return Err(ApiError::NoWriter);
                    }
                    tokio::time::sleep(RETRY_PERIOD).await;
                }
                Err(err) => {
                    tracing::warn!(error = %err, epoch = writer.epoch, "the writer failed a forwarded request");
                    self.forget(writer.epoch).await;
                    return Err(ApiError::BadGateway);
                }
            }
        }
    }

    /// The writer as last read, or read now.
    async fn writer(&self) -> Result<Option<WriterAddress>, ApiError> {
        if let Some(writer) = self.writer.read().await.clone() {
            return Ok(Some(writer));
        }
        let read = Lease::writer_address(&self.pool).await?;
        *self.writer.write().await = read.clone();
        Ok(read)
    }

    /// Drops the cached writer of `epoch` (another epoch read since stays).
    async fn forget(&self, epoch: i64) {
        let mut writer = self.writer.write().await;
        if writer.as_ref().is_some_and(|w| w.epoch == epoch) {
            *writer = None;
        }
    }
}

async fn forward(State(forwarder): State<Arc<Forwarder>>, request: Request) -> Response {
    match forwarder.send(request).await {
        Ok(answer) => answer,
        Err(err) => err.into_response(),
    }
}

/// A body held in memory (sent as often as needed) or streamed (sent once).
enum Held {
    Bytes(Bytes),
    Stream(Option<Body>),
}

impl Held {
    fn next(&mut self) -> Option<Body> {
        match self {
            Self::Bytes(bytes) => Some(Body::from(bytes.clone())),
            Self::Stream(body) => body.take(),
        }
    }
}

/// The length of a body to hold: a `Content-Length` up to [`HELD_BODY_BYTES`], or 0 for a
/// request that announces no body at all; `None` streams it.
fn held_length(headers: &HeaderMap) -> Option<u64> {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return None;
    }
    match headers.get(header::CONTENT_LENGTH) {
        None => Some(0),
        Some(value) => value
            .to_str()
            .ok()?
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= HELD_BODY_BYTES),
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers a `Connection` header names are the connection's too.
    let named: Vec<header::HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| name.trim().parse().ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}
