//! HTTPS out to the exchange: hyper's pooled HTTP/1.1 client over rustls on aws-lc-rs.
//!
//! - **Key exchange**: `X25519MLKEM768` first (the X25519 + ML-KEM-768 hybrid, FIPS 203,
//!   draft-ietf-tls-ecdhe-mlkem), then `X25519` (RFC 7748), TLS 1.3 only: the exchange's edge
//!   takes the client's order, so listing the hybrid first makes the session keys
//!   post-quantum. The same choice as the agents' client (`cx-client`), written again here
//!   because a provider must not depend on the exchange's crates.
//! - **Roots**: exactly the certificates of `--exchange-ca` (a devnet's CA), or Mozilla's roots
//!   (`webpki-roots`) for an exchange with a public certificate; never both.
//! - `http://` only when the URL says so; such a client refuses to dial `https`.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::crypto::CryptoProvider;
use rustls::crypto::aws_lc_rs::{self, kx_group};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::error::{Error, Result};

/// A JSON client of one exchange.
#[derive(Clone)]
pub(crate) struct Https {
    base: String,
    client: Client<Connector, Full<Bytes>>,
    /// The exchange's clock minus ours, seconds, from the `Date` of its latest answer.
    clock_offset_s: Arc<AtomicI64>,
}

/// Offsets smaller than this are below what `Date` (whole seconds, sent before the trip back)
/// can tell, and within every deadline's slack: they are taken as none.
const CLOCK_RESOLUTION_S: i64 = 2;

/// This machine's unix time, seconds.
fn local_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Https {
    /// A client of `url` (`https://…`, or `http://…` when the URL says so), trusting exactly the
    /// CA certificates in `ca` (PEM) or else Mozilla's roots.
    pub(crate) fn new(url: &str, ca: Option<&Path>) -> Result<Self> {
        let base = url.trim_end_matches('/').to_owned();
        let uri: Uri = base
            .parse()
            .map_err(|e| Error::Exchange(format!("--exchange {url}: not a URL: {e}")))?;
        let tls = match uri.scheme_str() {
            Some("https") => {
                let roots = match ca {
                    Some(path) => roots_from_pem_file(path)?,
                    None => RootCertStore {
                        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                    },
                };
                Some(client_config(roots)?)
            }
            Some("http") => None,
            _ => {
                return Err(Error::Exchange(format!(
                    "--exchange {url}: the URL must start with https:// (or http://)"
                )));
            }
        };
        let connector = Connector::new(tls, Duration::from_secs(10));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(50))
            .build(connector);
        Ok(Self {
            base,
            client,
            clock_offset_s: Arc::new(AtomicI64::new(0)),
        })
    }

    /// Unix time on the exchange's clock, seconds. Deadlines and the times a provider signs
    /// are the exchange's: on this machine's clock a provider running ahead would refuse jobs
    /// with time left, and one a few minutes off could not register an offer at all.
    pub(crate) fn now_s(&self) -> u64 {
        let offset = self.clock_offset_s.load(Ordering::Relaxed) as f64;
        (local_now_s() + offset).max(0.0) as u64
    }

    /// Follows the exchange's clock from an answer's `Date` header.
    fn observe_date(&self, headers: &hyper::HeaderMap) {
        let Some(stated) = headers
            .get(hyper::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        else {
            return;
        };
        // `Date` is the second the answer was made, truncated: its middle is the best guess.
        let offset = (stated.as_secs_f64() + 0.5 - local_now_s()).round() as i64;
        let offset = if offset.abs() < CLOCK_RESOLUTION_S {
            0
        } else {
            offset
        };
        let before = self.clock_offset_s.swap(offset, Ordering::Relaxed);
        if (offset - before).abs() >= CLOCK_RESOLUTION_S {
            tracing::warn!(
                "the exchange's clock is {offset:+} s from this machine's; deadlines and signed times follow the exchange's"
            );
        }
    }

    /// The exchange's base URL.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// `POST path` with a JSON body (and a bearer token), the answer's JSON; a non-2xx answer
    /// becomes an error with the exchange's code and message.
    pub(crate) async fn post<B: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        bearer: Option<&str>,
        body: &B,
        timeout: Duration,
    ) -> Result<R> {
        let body = serde_json::to_vec(body).map_err(|e| Error::Exchange(e.to_string()))?;
        self.send(hyper::Method::POST, path, bearer, body, timeout)
            .await
    }

    /// `GET path` with a bearer token, the answer's JSON.
    pub(crate) async fn get_with_token<R: DeserializeOwned>(
        &self,
        path: &str,
        bearer: &str,
        timeout: Duration,
    ) -> Result<R> {
        self.send(hyper::Method::GET, path, Some(bearer), Vec::new(), timeout)
            .await
    }

    /// `PUT path` with a JSON body and a bearer token, the answer's JSON.
    pub(crate) async fn put_with_token<B: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        bearer: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<R> {
        let body = serde_json::to_vec(body).map_err(|e| Error::Exchange(e.to_string()))?;
        self.send(hyper::Method::PUT, path, Some(bearer), body, timeout)
            .await
    }

    /// `GET path` with a bearer token, the answer's bytes as sent (for content that is checked
    /// against its content id).
    pub(crate) async fn get_bytes_with_token(
        &self,
        path: &str,
        bearer: &str,
        timeout: Duration,
    ) -> Result<Bytes> {
        self.send_raw(hyper::Method::GET, path, Some(bearer), Vec::new(), timeout)
            .await
    }

    /// `GET path`, the answer's JSON.
    pub(crate) async fn get<R: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<R> {
        self.send(hyper::Method::GET, path, None, Vec::new(), timeout)
            .await
    }

    async fn send<R: DeserializeOwned>(
        &self,
        method: hyper::Method,
        path: &str,
        bearer: Option<&str>,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<R> {
        let failed =
            |reason: String| Error::Exchange(format!("{method} {}{path}: {reason}", self.base));
        let bytes = self
            .send_raw(method.clone(), path, bearer, body, timeout)
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| failed(format!("unexpected answer: {e}")))
    }

    /// Sends one request; the answer's body when its status is 2xx, else an error with the
    /// exchange's code, message and field.
    async fn send_raw(
        &self,
        method: hyper::Method,
        path: &str,
        bearer: Option<&str>,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes> {
        let url = format!("{}{path}", self.base);
        let failed = |reason: String| Error::Exchange(format!("{method} {url}: {reason}"));
        // No answer at all (the exchange restarting, the network): worth sending again.
        let away = |reason: String| Error::ExchangeAway(format!("{method} {url}: {reason}"));
        let mut request = hyper::Request::builder()
            .method(method.clone())
            .uri(&url)
            .header(hyper::header::ACCEPT, "application/json");
        if !body.is_empty() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Some(token) = bearer {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| failed(e.to_string()))?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                // hyper-util's error says "client error (Connect)"; its causes say why.
                let mut text = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    text.push_str(": ");
                    text.push_str(&c.to_string());
                    cause = c.source();
                }
                away(text)
            })?;
            let status = response.status();
            self.observe_date(response.headers());
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| away(e.to_string()))?
                .to_bytes();
            Ok::<_, Error>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| away(format!("no answer within {} s", timeout.as_secs())))??;
        if !status.is_success() {
            let parsed: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
            let error = parsed.as_ref().and_then(|v| v.get("error"));
            let text = |key: &str| {
                error
                    .and_then(|e| e.get(key))
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            let field = text("field");
            let field = if field.is_empty() {
                String::new()
            } else {
                format!(" (field {field})")
            };
            let answer = format!(
                "{} (HTTP {}): {}{field}",
                text("code"),
                status.as_u16(),
                text("message")
            );
            // 503 is the exchange saying "not now" (its database restarting, a takeover); 502 a
            // node of its cluster whose writer died with the request: both retryable, as a
            // connection that failed is (what the provider sends is idempotent).
            return Err(
                if matches!(
                    status,
                    hyper::StatusCode::SERVICE_UNAVAILABLE | hyper::StatusCode::BAD_GATEWAY
                ) {
                    away(answer)
                } else {
                    failed(answer)
                },
            );
        }
        Ok(bytes)
    }
}

/// The aws-lc-rs provider narrowed to `X25519MLKEM768`, then `X25519`.
fn client_config(roots: RootCertStore) -> Result<Arc<ClientConfig>> {
    let provider = Arc::new(CryptoProvider {
        kx_groups: vec![kx_group::X25519MLKEM768, kx_group::X25519],
        ..aws_lc_rs::default_provider()
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Exchange(format!("TLS configuration: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The CA certificates of a PEM file, and only they.
fn roots_from_pem_file(path: &Path) -> Result<RootCertStore> {
    let bad =
        |reason: String| Error::Exchange(format!("--exchange-ca {}: {reason}", path.display()));
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE block".to_owned()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Dials TCP, then TLS for `https` URIs.
#[derive(Clone)]
pub(crate) struct Connector {
    http: HttpConnector,
    tls: Option<TlsConnector>,
}

impl Connector {
    fn new(tls: Option<Arc<ClientConfig>>, connect_timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        // The scheme is checked below: https goes through TLS.
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_keepalive(Some(Duration::from_secs(60)));
        http.set_connect_timeout(Some(connect_timeout));
        Self {
            http,
            tls: tls.map(TlsConnector::from),
        }
    }
}

impl tower::Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut http = self.http.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let https = match uri.scheme_str() {
                Some("https") => true,
                Some("http") => false,
                other => return Err(format!("unsupported scheme {other:?}").into()),
            };
            let host = uri
                .host()
                .ok_or("the URL has no host")?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let tcp = http.call(uri).await?;
            if !https {
                return Ok(Stream::Plain(tcp));
            }
            let tls = tls.ok_or("a client made for an http:// exchange does not dial https")?;
            let stream = tls
                .connect(ServerName::try_from(host)?, tcp.into_inner())
                .await?;
            Ok(Stream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// A connection: plain TCP (an `http://` exchange only) or TLS over TCP.
pub(crate) enum Stream {
    Plain(TokioIo<TcpStream>),
    // Boxed: a rustls connection is ~1 KB, and the pool moves streams around.
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(tcp) => tcp.connected(),
            Self::Tls(tls) => tls.inner().get_ref().0.connected(),
        }
    }
}

impl Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
