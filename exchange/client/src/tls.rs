//! The client's HTTPS: rustls on aws-lc-rs, and the connector hyper's pool dials through.
//!
//! - **Key exchange**: [`crypto_provider`] offers `X25519MLKEM768` first (the hybrid of X25519
//!   and ML-KEM-768, FIPS 203, draft-ietf-tls-ecdhe-mlkem), then `X25519` (RFC 7748). The
//!   exchange's server takes the client's order among the groups both support, so listing the
//!   hybrid first is what makes the session keys post-quantum: a recording of today's traffic stays
//!   secret as long as either half holds. P-256/P-384 are not offered: the exchange does not
//!   accept them either.
//! - **TLS 1.3 only**, as the server: the hybrid group exists only in 1.3.
//! - **Roots**: exactly the CA certificates of a PEM file (the devnet's `runtime/ca/ca.pem`), or
//!   Mozilla's roots (`webpki-roots`) for an exchange with a public certificate. Never both: a
//!   development CA should not widen what a production client trusts.
//! - **The connector** dials TCP with hyper-util's `HttpConnector`, then completes the TLS
//!   handshake for `https` URIs with tokio-rustls, and attaches a [`TlsInfo`] to the connection
//!   so that every response says which group and protocol its connection negotiated.

use crate::error::{Error, Result};
use hyper::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::crypto::CryptoProvider;
use rustls::crypto::aws_lc_rs::{self, kx_group};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The application protocol the exchange serves (HTTP/1.1 with keep-alive).
pub const ALPN_HTTP_1_1: &[u8] = b"http/1.1";

/// The aws-lc-rs provider narrowed to `X25519MLKEM768`, then `X25519`, in that order.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        kx_groups: vec![kx_group::X25519MLKEM768, kx_group::X25519],
        ..aws_lc_rs::default_provider()
    })
}

/// A client configuration trusting exactly `roots`: TLS 1.3, [`crypto_provider`]'s groups, ALPN
/// `http/1.1`.
pub fn client_config(roots: RootCertStore) -> Result<Arc<ClientConfig>> {
    let mut config = ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP_1_1.to_vec()];
    Ok(Arc::new(config))
}

/// The roots in a PEM file (one or more `CERTIFICATE` blocks): the CA to trust, and only it.
pub fn roots_from_pem_file(path: &Path) -> Result<RootCertStore> {
    let ca_error = |reason: String| Error::CaFile {
        path: path.to_owned(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| ca_error(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ca_error(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(ca_error("no CERTIFICATE block".to_owned()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| ca_error(format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Mozilla's root certificates (webpki-roots), for an exchange behind a public certificate.
pub fn public_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// What a connection's TLS handshake negotiated. Every response of a TLS connection carries it
/// as a response extension; [`crate::Client::connection_info`] returns it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TlsInfo {
    /// The key exchange group, e.g. `X25519MLKEM768`.
    pub key_exchange_group: String,
    /// The protocol version, e.g. `TLSv1_3`.
    pub protocol_version: String,
    /// The cipher suite, e.g. `TLS13_AES_256_GCM_SHA384`.
    pub cipher_suite: String,
    /// The application protocol the server chose, if ALPN was negotiated.
    pub alpn: Option<String>,
}

impl TlsInfo {
    fn of(connection: &rustls::ClientConnection) -> Self {
        let named = |debug: String, name: Option<&'static str>| name.map_or(debug, str::to_owned);
        Self {
            key_exchange_group: connection
                .negotiated_key_exchange_group()
                .map(|g| named(format!("{:?}", g.name()), g.name().as_str()))
                .unwrap_or_default(),
            protocol_version: connection
                .protocol_version()
                .map(|v| named(format!("{v:?}"), v.as_str()))
                .unwrap_or_default(),
            cipher_suite: connection
                .negotiated_cipher_suite()
                .map(|s| named(format!("{:?}", s.suite()), s.suite().as_str()))
                .unwrap_or_default(),
            alpn: connection
                .alpn_protocol()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Dials TCP, then TLS for `https` URIs. `tls` is `None` for a client made for an `http://`
/// URL, which then refuses to dial `https` rather than fall back to anything.
#[derive(Clone)]
pub(crate) struct Connector {
    http: HttpConnector,
    tls: Option<TlsConnector>,
}

impl Connector {
    pub(crate) fn new(tls: Option<Arc<ClientConfig>>, connect_timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        // The scheme is ours to check: https goes through TLS below.
        http.enforce_http(false);
        // Small JSON requests should leave at once, not wait on Nagle's timer.
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
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
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
            let tls = tls.ok_or("this client was made for plain http and does not dial https")?;
            let name = ServerName::try_from(host)?;
            let stream = tls.connect(name, tcp.into_inner()).await?;
            Ok(Stream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// A connection: plain TCP (only for an `http://` exchange URL) or TLS over TCP.
pub(crate) enum Stream {
    Plain(TokioIo<TcpStream>),
    // Boxed: a rustls connection is ~1 KB, and the pool moves streams around.
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(tcp) => tcp.connected(),
            Self::Tls(tls) => {
                let (tcp, connection) = tls.inner().get_ref();
                tcp.connected().extra(TlsInfo::of(connection))
            }
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

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
}
