//! The HTTPS edge: rustls on the aws-lc-rs provider, the development CA, and the accept loop that
//! serves the [`crate::api::app`] router.
//!
//! - **Key exchange.** [`crypto_provider`] offers exactly two groups, in this order:
//!   `X25519MLKEM768` (the hybrid of X25519 and ML-KEM-768, FIPS 203, as specified in
//!   draft-ietf-tls-ecdhe-mlkem and shipped by today's browsers) and `X25519` (RFC 7748) for
//!   clients that do not speak the hybrid yet. The hybrid keeps session keys secret against a
//!   future quantum computer as long as *either* half holds: a recording of today's traffic
//!   cannot be decrypted later, and a flaw in the young ML-KEM still leaves X25519's security.
//!   Among the groups both sides support, rustls 0.23 takes the client's order (RFC 8446 §4.2.7
//!   leaves the choice to the server, and rustls has no switch for it): every client that offers
//!   the hybrid — browsers, curl on OpenSSL 3.5+, rustls with `prefer-post-quantum`, our own
//!   [`client_config`] — lists it first and gets it; a client offering only X25519 gets X25519;
//!   one offering neither (P-256 only, say) is refused.
//! - **TLS 1.3 only.** The hybrid group exists only in TLS 1.3, and every client of ours (agents on
//!   rustls, providers, `curl` on OpenSSL 1.1.1+, browsers since 2018) speaks 1.3; a 1.2 fallback
//!   would only widen the attack surface (RSA key exchange, CBC suites, renegotiation) for clients
//!   we do not have. The `tls12` feature is not compiled in.
//! - **ALPN** `http/1.1`: the router is served by hyper's HTTP/1.1 connection (the workspace
//!   builds axum without `http2`); clients offering `h2` as well get `http/1.1`.
//! - **Certificates** come from PEM files ([`Identity::from_pem_files`], `--tls-cert`/`--tls-key`)
//!   or, for development, from a local certificate authority that the server makes once with
//!   rcgen and reuses on every start ([`DevCa::open_or_create`]); people trust its `ca.pem` and
//!   compare the fingerprint the server prints ([`fingerprint_sha256`]).
//! - **Serving**: [`serve_https`] accepts TCP connections up to a cap, completes each handshake
//!   within a timeout on its own task (a slow client never stalls the accept loop), serves the
//!   router over HTTP/1.1 (with upgrades, for WebSockets), and on the shutdown future stops
//!   accepting and lets open requests finish within a grace period. Plain HTTP is only
//!   [`serve_insecure_http`], which the CLI calls behind `--insecure-http`.
//!
//! ```no_run
//! use cx_exchange_server::api::{AppState, app};
//! use cx_exchange_server::tls::{self, DevCa, Limits};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let ca = DevCa::open_or_create("runtime/ca")?;
//! println!("trust {} (SHA-256 {})", ca.cert_path().display(), ca.fingerprint_sha256());
//! let config = tls::server_config(ca.server_identity()?)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8443").await?;
//! let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let shutdown = async { stopped.await.ok(); }; // cx serve: Ctrl-C
//! tls::serve_https(listener, config, app(AppState::new()), Limits::default(), shutdown).await;
//! # Ok(())
//! # }
//! ```
//!
//! One file (~700 lines) because the edge is one unit a reader checks as a whole: the crypto
//! provider and its groups, the development CA that signs the server's certificate, the configs
//! built from both, and the accept loop that applies them; about a third of it is the CA.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    NameConstraints, PublicKeyData,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::crypto::aws_lc_rs::{self, kx_group};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};
use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

/// The one application protocol we negotiate.
pub const ALPN_HTTP_1_1: &[u8] = b"http/1.1";

/// Where `cx serve` keeps its development CA unless told otherwise (`--ca-dir`).
pub const DEFAULT_CA_DIR: &str = "runtime/ca";

/// The names the development server certificate is valid for (and the only names the development
/// CA may ever sign: its name constraints say so).
pub const DEV_SERVER_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// What setting up TLS can fail with. Each message names the file and what to do.
///
/// A variant that wraps another error exposes it as its `source` and does not repeat it in its
/// own message, so a chain printed whole (anyhow's `{:#}`, the CLI's one line) says it once.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read, written or created.
    #[error("{}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// A PEM file is malformed or holds no certificate / private key.
    #[error("{}: {message}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A private key file of the development CA can be read by other users.
    #[error(
        "{}: readable by other users (mode {mode:o}); run `chmod 600` on it or remove the directory to make a new CA",
        path.display()
    )]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The development CA's files do not belong together (or were made by an incompatible version).
    #[error(
        "{}: the CA certificate and key there do not sign a valid server certificate ({reason}); remove the directory to make a new CA",
        dir.display()
    )]
    CaMismatch {
        /// The CA directory.
        dir: PathBuf,
        /// Why the issued certificate did not verify.
        reason: String,
    },
    /// rcgen failed to make a key or a certificate.
    #[error("certificate generation")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the configuration (a key that does not match its certificate, say).
    #[error("TLS configuration")]
    Config(#[from] rustls::Error),
}

/// This module's result.
pub type Result<T, E = TlsError> = std::result::Result<T, E>;

/// The aws-lc-rs provider with the key exchange groups narrowed to `X25519MLKEM768`, then
/// `X25519` — the order our clients offer them in (the server accepts exactly these two).
///
/// Set explicitly rather than left to the provider's defaults, so that the order is a decision in
/// this file and not a property of a crate feature; P-256 and P-384 are left out because no client
/// of ours lacks X25519.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        kx_groups: vec![kx_group::X25519MLKEM768, kx_group::X25519],
        ..aws_lc_rs::default_provider()
    })
}

/// A server's certificate chain (leaf first) and its private key.
pub struct Identity {
    /// The certificates to send, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PrivateKeyDer<'static>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.debug_struct("Identity")
            .field("chain_len", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Reads a certificate chain (`--tls-cert`, one or more PEM `CERTIFICATE` blocks, leaf first)
    /// and its private key (`--tls-key`, PEM).
    pub fn from_pem_files(cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<Self> {
        let (cert, key) = (cert.as_ref(), key.as_ref());
        let cert_pem = read(cert)?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|err| pem_error(cert, &err))?;
        if chain.is_empty() {
            return Err(TlsError::Pem {
                path: cert.to_owned(),
                message: "no CERTIFICATE block".to_owned(),
            });
        }
        let key_pem = read(key)?;
        let key_der =
            PrivateKeyDer::from_pem_slice(&key_pem).map_err(|err| pem_error(key, &err))?;
        Ok(Self {
            chain,
            key: key_der,
        })
    }
}

/// The certificates of a PEM file (one or more `CERTIFICATE` blocks): roots to trust, such as
/// the certificate authority of a cluster's nodes (`cx serve --peer-ca`).
pub fn certificates_from_pem_file(path: impl AsRef<Path>) -> Result<Vec<CertificateDer<'static>>> {
    let path = path.as_ref();
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|err| pem_error(path, &err))?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            message: "no CERTIFICATE block".to_owned(),
        });
    }
    Ok(certs)
}

/// A rustls server configuration for `identity`: TLS 1.3, the [`crypto_provider`] groups,
/// ALPN `http/1.1`, no client certificates (agents authenticate by signature, not by TLS).
pub fn server_config(identity: Identity) -> Result<Arc<ServerConfig>> {
    let mut config = ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(identity.chain, identity.key)?;
    config.alpn_protocols = vec![ALPN_HTTP_1_1.to_vec()];
    Ok(Arc::new(config))
}

/// A rustls client configuration that trusts exactly `roots` (the development CA's certificate,
/// say) and negotiates like the server: TLS 1.3, `X25519MLKEM768` then `X25519`, ALPN `http/1.1`.
pub fn client_config<'a>(
    roots: impl IntoIterator<Item = &'a CertificateDer<'static>>,
) -> Result<Arc<ClientConfig>> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root.clone())?;
    }
    let mut config = ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP_1_1.to_vec()];
    Ok(Arc::new(config))
}

/// The SHA-256 fingerprint of a certificate's DER bytes, as browsers and
/// `openssl x509 -fingerprint -sha256` show it: upper-case hex pairs joined by colons.
pub fn fingerprint_sha256(cert: &CertificateDer<'_>) -> String {
    Sha256::digest(cert.as_ref())
        .iter()
        .map(|byte| format!("{byte:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The development certificate authority: made once in a directory, reused on every start.
///
/// Files (`dir` is [`DEFAULT_CA_DIR`] for `cx serve`):
/// - `ca.pem` — the CA certificate, the file people trust (`curl --cacert`, a browser's
///   authorities); ECDSA P-256, valid ten years.
/// - `ca.key` — its private key, mode 0600; a key that others can read is refused.
/// - `server.pem`, `server.key` (0600) — the server certificate for [`DEV_SERVER_NAMES`], issued
///   afresh at every start ([`DevCa::server_identity`]), valid 397 days (the longest any
///   browser accepts for a leaf).
///
/// The CA is **name-constrained** to `localhost`, `127.0.0.0/8` and `::1`: a person who trusts it
/// in a browser trusts it for this machine only, so even a leaked `ca.key` cannot impersonate any
/// other site.
pub struct DevCa {
    dir: PathBuf,
    cert: CertificateDer<'static>,
    key: KeyPair,
}

impl fmt::Debug for DevCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevCa")
            .field("dir", &self.dir)
            .field("fingerprint_sha256", &self.fingerprint_sha256())
            .finish_non_exhaustive()
    }
}

const CA_CERT_FILE: &str = "ca.pem";
const CA_KEY_FILE: &str = "ca.key";
const SERVER_CERT_FILE: &str = "server.pem";
const SERVER_KEY_FILE: &str = "server.key";

impl DevCa {
    /// Loads the CA in `dir`, or makes one there (creating the directory) if `ca.pem` and `ca.key`
    /// are both absent. Checks that the pair still issues a certificate that verifies, so a
    /// half-replaced directory is reported here rather than as a handshake failure in a client.
    pub fn open_or_create(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_owned();
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let ca = match (cert_path.exists(), key_path.exists()) {
            (true, true) => Self::load(dir, &cert_path, &key_path)?,
            (false, false) => Self::create(dir, &cert_path, &key_path)?,
            (has_cert, _) => {
                let (present, missing) = if has_cert {
                    (&cert_path, &key_path)
                } else {
                    (&key_path, &cert_path)
                };
                return Err(TlsError::Pem {
                    path: missing.clone(),
                    message: format!(
                        "missing while {} exists; restore it or remove the directory to make a new CA",
                        present.display()
                    ),
                });
            }
        };
        // Issue (and discard) one leaf to prove that certificate and key belong together.
        ca.issue_server_identity()?;
        Ok(ca)
    }

    fn load(dir: PathBuf, cert_path: &Path, key_path: &Path) -> Result<Self> {
        check_private(key_path)?;
        let cert = CertificateDer::from_pem_slice(&read(cert_path)?)
            .map_err(|err| pem_error(cert_path, &err))?;
        let key_pem = String::from_utf8(read(key_path)?).map_err(|_| TlsError::Pem {
            path: key_path.to_owned(),
            message: "not a PEM text file".to_owned(),
        })?;
        let key = KeyPair::from_pem(&key_pem).map_err(|err| TlsError::Pem {
            path: key_path.to_owned(),
            message: err.to_string(),
        })?;
        Ok(Self { dir, cert, key })
    }

    fn create(dir: PathBuf, cert_path: &Path, key_path: &Path) -> Result<Self> {
        std::fs::create_dir_all(&dir).map_err(|source| TlsError::Io {
            path: dir.clone(),
            source,
        })?;
        let key = KeyPair::generate()?;
        let mut params = ca_params(&key);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(3650);
        let cert = params.self_signed(&key)?;
        // The key first: a directory with a certificate but no key is the state we refuse.
        write_file(key_path, key.serialize_pem().as_bytes(), true)?;
        write_file(cert_path, cert.pem().as_bytes(), false)?;
        Ok(Self {
            dir,
            cert: cert.der().clone(),
            key,
        })
    }

    /// The directory the CA lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `ca.pem`: the file to trust.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CA_CERT_FILE)
    }

    /// The CA certificate (DER), for a client's root store ([`client_config`]).
    pub fn cert(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// The CA certificate's SHA-256 fingerprint, colon-separated hex as browsers show it.
    pub fn fingerprint_sha256(&self) -> String {
        fingerprint_sha256(&self.cert)
    }

    /// Issues a fresh server certificate for [`DEV_SERVER_NAMES`] with a fresh key, writes it to
    /// `server.pem` / `server.key` (0600) for other tools, and returns it with the CA certificate
    /// as the chain. Fresh at every start so that the leaf's 397 days never run out on a machine
    /// that keeps its CA for years.
    pub fn server_identity(&self) -> Result<Identity> {
        let (identity, cert_pem, key_pem) = self.issue_server_identity()?;
        write_file(&self.dir.join(SERVER_KEY_FILE), key_pem.as_bytes(), true)?;
        write_file(&self.dir.join(SERVER_CERT_FILE), cert_pem.as_bytes(), false)?;
        Ok(identity)
    }

    /// A leaf signed by this CA, verified against it as a client would before it is handed out.
    fn issue_server_identity(&self) -> Result<(Identity, String, String)> {
        let mut params = CertificateParams::new(DEV_SERVER_NAMES.map(str::to_owned).to_vec())?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "compute-exchange development server");
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(397);
        let key = KeyPair::generate()?;
        // The issuer is rebuilt from the same parameters the CA was made with: its subject name and
        // key identifier method are what a leaf's issuer fields must match. The verification below
        // catches a CA on disk whose subject differs.
        let issuer = Issuer::new(ca_params(&self.key), &self.key);
        let leaf = params.signed_by(&key, &issuer)?;
        self.verify(leaf.der())?;
        let identity = Identity {
            chain: vec![leaf.der().clone(), self.cert.clone()],
            key: PrivateKeyDer::try_from(key.serialize_der()).map_err(|message| TlsError::Pem {
                path: self.dir.join(SERVER_KEY_FILE),
                message: message.to_owned(),
            })?,
        };
        Ok((identity, leaf.pem(), key.serialize_pem()))
    }

    fn verify(&self, leaf: &CertificateDer<'_>) -> Result<()> {
        let mismatch = |reason: String| TlsError::CaMismatch {
            dir: self.dir.clone(),
            reason,
        };
        let mut roots = RootCertStore::empty();
        roots
            .add(self.cert.clone())
            .map_err(|err| mismatch(err.to_string()))?;
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), crypto_provider())
                .build()
                .map_err(|err| mismatch(err.to_string()))?;
        for name in DEV_SERVER_NAMES {
            let name = ServerName::try_from(name).map_err(|err| mismatch(err.to_string()))?;
            verifier
                .verify_server_cert(leaf, &[], &name, &[], UnixTime::now())
                .map_err(|err| mismatch(err.to_string()))?;
        }
        Ok(())
    }
}

/// The development CA's parameters, a function of its key alone. Its subject and key identifier
/// method must not change between versions: [`DevCa::issue_server_identity`] rebuilds the issuer
/// from them.
///
/// The common name carries the first 8 bytes of the SHA-256 of the CA's public key, so that each
/// machine's CA has a name of its own (as mkcert's do): two CAs with one name confuse verifiers
/// that look issuers up by name (webpki reports a bad signature instead of an unknown issuer) and
/// browsers that cache them.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let key_tag = hex::encode_upper(&Sha256::digest(key.subject_public_key_info())[..8]);
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "compute-exchange");
    params.distinguished_name.push(
        DnType::CommonName,
        format!("compute-exchange development CA {key_tag}"),
    );
    // Path length 0: it signs servers, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![
            GeneralSubtree::DnsName("localhost".to_owned()),
            GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
                IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
                8,
            )),
            GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
                IpAddr::V6(Ipv6Addr::LOCALHOST),
                128,
            )),
        ],
        excluded_subtrees: Vec::new(),
    });
    params
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })
}

fn pem_error(path: &Path, err: &rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Pem {
        path: path.to_owned(),
        message: err.to_string(),
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a
/// crash never leaves half a key; `private` files are created with mode 0600 from the start (not
/// chmod-ed after, which would leave a window where others could read them).
fn write_file(path: &Path, bytes: &[u8], private: bool) -> Result<()> {
    let io_error = |source| TlsError::Io {
        path: path.to_owned(),
        source,
    };
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    let mut file = options.open(&tmp).map_err(io_error)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(io_error)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io_error)
}

/// Refuses a private key file that users other than its owner can read.
fn check_private(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|source| TlsError::Io {
                path: path.to_owned(),
                source,
            })?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            return Err(TlsError::KeyPermissions {
                path: path.to_owned(),
                mode,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// The accept loop's limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A TLS handshake not finished within this is dropped (a client that connects and sends
    /// nothing must not hold a connection slot).
    pub handshake_timeout: Duration,
    /// Connections open at once; further clients wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Connections one IP address may hold open at once (0: no limit); past it a new one is
    /// closed at once, so one address cannot take every slot of [`Limits::max_connections`].
    pub max_connections_per_ip: usize,
    /// The pace every request body must keep (a body trickled in holds a connection and a shed
    /// slot while its handler waits for it).
    pub body_pace: crate::min_rate::Pace,
    /// A request whose headers do not arrive within this is answered 408 and closed; it also
    /// bounds how long a kept-alive connection may sit idle between requests.
    pub header_read_timeout: Duration,
    /// After the shutdown signal, how long open connections get to finish their requests.
    pub shutdown_grace: Duration,
    /// TLS handshakes a second one IP address may start (0: no limit). A handshake costs the
    /// server a key exchange and a signature before the client has shown anything, so it is
    /// counted before any cryptography runs; past the limit the connection is closed at once.
    pub handshakes_per_ip_per_s: u32,
    /// Handshakes one IP address may start at once.
    pub handshake_burst_per_ip: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            // Under the common 1024 open-file soft limit, with room for the database pool and logs.
            max_connections: 768,
            // The devnet's processes and `cx bench load` (64 connections) share one loopback
            // address; a sixth of the slots leaves the rest to everyone else.
            max_connections_per_ip: 128,
            // An honest client sends a 160 MB adapter at over 64 KiB/s; a trickle is cut off.
            body_pace: crate::min_rate::Pace {
                grace: Duration::from_secs(10),
                min_bytes_per_s: 64 << 10,
            },
            header_read_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            // Keep-alive clients handshake once per connection: the devnet's twelve processes
            // on one loopback address open a few dozen in all.
            handshakes_per_ip_per_s: 200,
            handshake_burst_per_ip: 400,
        }
    }
}

/// Serves `router` over HTTPS on `listener` until `shutdown` completes, then stops accepting and
/// waits up to [`Limits::shutdown_grace`] for open connections to finish.
///
/// Accept errors (a client that resets before `accept`, running out of file descriptors) are
/// logged and the loop goes on: a busy server must not exit because one connection failed.
pub async fn serve_https(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    serve(
        listener,
        Some(TlsAcceptor::from(config)),
        router,
        limits,
        shutdown,
    )
    .await;
}

/// Serves `router` over **plain HTTP**, with the same limits and shutdown as [`serve_https`].
///
/// Nothing is encrypted or authenticated: for a TLS-terminating proxy in front or a local test.
/// The CLI reaches it only through the explicit `--insecure-http` flag.
pub async fn serve_insecure_http(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    serve(listener, None, router, limits, shutdown).await;
}

async fn serve(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Every connection task holds a receiver: `send` tells them to finish, `closed` waits until
    // all of them have (hyper-util's `GracefulShutdown` does the same, but not for connections
    // that keep HTTP upgrades, which WebSockets need).
    let (stop, _) = watch::channel(());
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    let handshakes = crate::limits::Keyed::<std::net::IpAddr>::new(
        limits.handshakes_per_ip_per_s,
        limits.handshake_burst_per_ip,
    );
    let per_ip = PerIp::default();
    loop {
        // A slot first, then the accept: at the cap we stop taking connections off the queue.
        let slot = tokio::select! {
            biased;
            () = &mut shutdown => break,
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let (tcp, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    if !is_per_connection(&err) {
                        // EMFILE and the like: back off instead of spinning.
                        tracing::warn!("accept failed: {err}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
        };
        let Some(peer_slot) = per_ip.enter(peer.ip(), limits.max_connections_per_ip) else {
            tracing::debug!(%peer, "connection closed: past the per-IP connection cap");
            continue;
        };
        if acceptor.is_some()
            && let Some(handshakes) = &handshakes
            && handshakes.take(&peer.ip()).is_err()
        {
            tracing::debug!(%peer, "TLS handshake refused: past the per-IP handshake rate");
            continue;
        }
        // Small JSON answers should leave at once rather than wait for Nagle's timer.
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let stopping = stop.subscribe();
        // Each request carries its peer, for the per-IP rate limit, and its body a pace.
        let pace = limits.body_pace;
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            router.clone(),
            move |request: hyper::Request<hyper::body::Incoming>| {
                let mut request = request
                    .map(|body| axum::body::Body::new(crate::min_rate::MinRate::new(body, pace)));
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                request
            },
        ));
        let http = http.clone();
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            match acceptor {
                None => serve_connection(tcp, &http, service, stopping).await,
                Some(acceptor) => {
                    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await
                    {
                        Ok(Ok(tls)) => serve_connection(tls, &http, service, stopping).await,
                        Ok(Err(err)) => tracing::debug!(%peer, "TLS handshake failed: {err}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop.send(());
    if tokio::time::timeout(limits.shutdown_grace, stop.closed())
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open {:?} after shutdown; closing them",
            limits.shutdown_grace
        );
    }
}

async fn serve_connection<IO, S>(
    io: IO,
    http: &http1::Builder,
    service: TowerToHyperService<S>,
    mut stopping: watch::Receiver<()>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let connection = http
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        _ = stopping.changed() => {
            // Finish the request in flight, answer it with `connection: close`, then stop.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(err) = ended {
        tracing::debug!("connection ended with an error: {err}");
    }
}

/// Connections open per IP address.
#[derive(Clone, Default)]
struct PerIp(Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>);

/// One open connection of an address; dropping it frees its place.
struct PeerSlot {
    per_ip: PerIp,
    ip: IpAddr,
}

impl PerIp {
    /// A place for one more connection from `ip`, if it holds fewer than `max` (0: no limit).
    fn enter(&self, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(ip).or_default();
        if max > 0 && *count >= max {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            per_ip: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.per_ip.0.lock().unwrap_or_else(|p| p.into_inner());
        // An address with nothing open is forgotten, so the map holds only live peers.
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Errors that concern one connection only (the client gave up before we accepted it).
fn is_per_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
