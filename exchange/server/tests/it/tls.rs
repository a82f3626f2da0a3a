//! The HTTPS edge on a real socket: the hybrid post-quantum key exchange is what a client of ours
//! negotiates, an X25519-only client still gets in, the router answers over TLS, a client that
//! does not trust the development CA is refused, and the CA survives a restart.

use cx_exchange_server::api::{AppState, app};
use cx_exchange_server::tls::{
    self, ALPN_HTTP_1_1, DevCa, Identity, Limits, TlsError, fingerprint_sha256,
};
use rustls::crypto::CryptoProvider;
use rustls::crypto::aws_lc_rs::{self, kx_group};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, NamedGroup, ProtocolVersion, RootCertStore};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A directory of its own under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "cx-tls-test-{}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        ));
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server; dropping `stop` (or sending on it) shuts it down.
struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(identity: Identity, limits: Limits) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = tls::server_config(identity).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tls::serve_https(
            listener,
            config,
            app(AppState::new()),
            limits,
            async move {
                let _ = stopped.await;
            },
        ));
        Self { addr, stop, task }
    }

    async fn dev(ca: &DevCa) -> Self {
        Self::start(ca.server_identity().unwrap(), Limits::default()).await
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("the server stops within its grace period")
            .unwrap();
    }
}

/// A client config trusting `ca` and offering only `groups`.
fn client_offering(
    ca: &DevCa,
    groups: Vec<&'static dyn rustls::crypto::SupportedKxGroup>,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert().clone()).unwrap();
    let provider = CryptoProvider {
        kx_groups: groups,
        ..aws_lc_rs::default_provider()
    };
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP_1_1.to_vec()];
    Arc::new(config)
}

async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    name: &'static str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(config)
        .connect(ServerName::try_from(name).unwrap(), tcp)
        .await
}

fn group(stream: &TlsStream<TcpStream>) -> NamedGroup {
    stream
        .get_ref()
        .1
        .negotiated_key_exchange_group()
        .expect("a group after the handshake")
        .name()
}

/// `GET path` with `connection: close`; the status and the body.
async fn get(mut stream: TlsStream<TcpStream>, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    match stream.read_to_end(&mut response).await {
        Ok(_) => {}
        // A peer that closes without close_notify after a complete response is fine here.
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(err) => panic!("reading the response: {err}"),
    }
    parse_response(&response)
}

fn parse_response(response: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    (status, body.to_owned())
}

#[tokio::test]
async fn a_client_that_trusts_the_ca_negotiates_x25519mlkem768_over_tls13() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let server = Server::dev(&ca).await;

    for name in ["localhost", "127.0.0.1"] {
        let stream = connect(server.addr, tls::client_config([ca.cert()]).unwrap(), name)
            .await
            .unwrap_or_else(|err| panic!("handshake as {name}: {err}"));
        let (_, connection) = stream.get_ref();
        assert_eq!(group(&stream), NamedGroup::X25519MLKEM768, "as {name}");
        assert_eq!(
            connection.protocol_version(),
            Some(ProtocolVersion::TLSv1_3)
        );
        assert_eq!(connection.alpn_protocol(), Some(ALPN_HTTP_1_1));
    }
    server.stop().await;
}

#[tokio::test]
async fn a_client_offering_only_x25519_falls_back_to_x25519() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let server = Server::dev(&ca).await;

    let stream = connect(
        server.addr,
        client_offering(&ca, vec![kx_group::X25519]),
        "localhost",
    )
    .await
    .expect("an X25519-only client is served");
    assert_eq!(group(&stream), NamedGroup::X25519);
    let (status, _) = get(stream, "/healthz").await;
    assert_eq!(status, 200);

    server.stop().await;
}

#[tokio::test]
async fn a_client_offering_neither_group_is_refused() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let server = Server::dev(&ca).await;
    let refused = connect(
        server.addr,
        client_offering(&ca, vec![kx_group::SECP256R1]),
        "localhost",
    )
    .await;
    assert!(refused.is_err(), "P-256 alone is not offered by the server");
    server.stop().await;
}

#[tokio::test]
async fn healthz_over_https_answers_200_with_json() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let server = Server::dev(&ca).await;

    let stream = connect(
        server.addr,
        tls::client_config([ca.cert()]).unwrap(),
        "localhost",
    )
    .await
    .unwrap();
    let (status, body) = get(stream, "/healthz").await;
    assert_eq!(status, 200, "{body}");
    let health: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(health["status"], "ok");

    // The router's own JSON errors come through TLS unchanged.
    let stream = connect(
        server.addr,
        tls::client_config([ca.cert()]).unwrap(),
        "localhost",
    )
    .await
    .unwrap();
    let (status, body) = get(stream, "/no-such-route").await;
    assert_eq!(status, 404);
    let error: Value = serde_json::from_str(&body).expect("JSON");
    assert!(error["error"]["code"].is_string(), "{error}");
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_is_refused() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let server = Server::dev(&ca).await;
    let other_dir = TempDir::new();
    let other = DevCa::open_or_create(other_dir.path()).unwrap();
    assert_ne!(ca.fingerprint_sha256(), other.fingerprint_sha256());

    let err = connect(
        server.addr,
        tls::client_config([other.cert()]).unwrap(),
        "localhost",
    )
    .await
    .expect_err("another CA's client must not accept this server");
    assert!(
        err.to_string().contains("UnknownIssuer") || err.to_string().contains("unknown issuer"),
        "{err}"
    );
    // Nor does a client that trusts the right CA accept a name the certificate does not carry.
    let err = connect(
        server.addr,
        tls::client_config([ca.cert()]).unwrap(),
        "example.com",
    )
    .await
    .expect_err("example.com is not localhost");
    assert!(
        err.to_string()
            .to_lowercase()
            .contains("not valid for name"),
        "{err}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_ca_is_reused_on_restart_and_old_clients_still_trust_the_new_server() {
    let dir = TempDir::new();
    let first = DevCa::open_or_create(dir.path()).unwrap();
    let server = Server::dev(&first).await;
    server.stop().await;

    let again = DevCa::open_or_create(dir.path()).unwrap();
    assert_eq!(first.fingerprint_sha256(), again.fingerprint_sha256());
    assert_eq!(first.cert(), again.cert());
    // A client made from the first run's CA accepts the second run's freshly issued certificate.
    let server = Server::dev(&again).await;
    let stream = connect(
        server.addr,
        tls::client_config([first.cert()]).unwrap(),
        "localhost",
    )
    .await
    .unwrap();
    assert_eq!(get(stream, "/healthz").await.0, 200);
    server.stop().await;
}

#[test]
fn the_fingerprint_is_colon_separated_upper_case_sha256_of_the_ca_pem() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let fingerprint = ca.fingerprint_sha256();
    assert_eq!(fingerprint.len(), 32 * 3 - 1, "{fingerprint}");
    assert!(
        fingerprint.split(':').all(|pair| pair.len() == 2
            && pair
                .chars()
                .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c))),
        "{fingerprint}"
    );
    // It is the fingerprint of what `ca.pem` holds, the file people trust.
    let pem = std::fs::read(ca.cert_path()).unwrap();
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let on_disk = CertificateDer::from_pem_slice(&pem).unwrap();
    assert_eq!(fingerprint_sha256(&on_disk), fingerprint);
}

#[cfg(unix)]
#[test]
fn key_files_are_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    ca.server_identity().unwrap();
    let mode = |name: &str| {
        std::fs::metadata(dir.path().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("ca.key"), 0o600);
    assert_eq!(mode("server.key"), 0o600);
    assert_eq!(mode("ca.pem"), 0o644);
    assert_eq!(mode("server.pem"), 0o644);
}

#[cfg(unix)]
#[test]
fn a_ca_key_others_can_read_is_refused_with_what_to_do() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new();
    DevCa::open_or_create(dir.path()).unwrap();
    let key = dir.path().join("ca.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = DevCa::open_or_create(dir.path()).unwrap_err();
    assert!(
        matches!(err, TlsError::KeyPermissions { mode: 0o644, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

#[test]
fn a_ca_directory_missing_its_key_or_holding_a_foreign_key_is_refused() {
    let dir = TempDir::new();
    DevCa::open_or_create(dir.path()).unwrap();
    let other = TempDir::new();
    DevCa::open_or_create(other.path()).unwrap();

    // A key from another CA beside this certificate: caught at open, not in a client's handshake.
    std::fs::copy(other.path().join("ca.key"), dir.path().join("ca.key")).unwrap();
    let err = DevCa::open_or_create(dir.path()).unwrap_err();
    assert!(matches!(err, TlsError::CaMismatch { .. }), "{err}");
    assert!(err.to_string().contains("remove the directory"), "{err}");

    std::fs::remove_file(dir.path().join("ca.key")).unwrap();
    let err = DevCa::open_or_create(dir.path()).unwrap_err();
    assert!(err.to_string().contains("ca.key"), "{err}");
}

#[tokio::test]
async fn certificates_from_pem_files_are_served() {
    // The dev CA's server files stand in for a certificate from elsewhere (`--tls-cert`/`--tls-key`).
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    ca.server_identity().unwrap();
    let identity =
        Identity::from_pem_files(dir.path().join("server.pem"), dir.path().join("server.key"))
            .unwrap();
    let server = Server::start(identity, Limits::default()).await;
    let stream = connect(
        server.addr,
        tls::client_config([ca.cert()]).unwrap(),
        "localhost",
    )
    .await
    .unwrap();
    assert_eq!(group(&stream), NamedGroup::X25519MLKEM768);
    assert_eq!(get(stream, "/healthz").await.0, 200);
    server.stop().await;

    let missing =
        Identity::from_pem_files(dir.path().join("nope.pem"), dir.path().join("server.key"))
            .unwrap_err();
    assert!(missing.to_string().contains("nope.pem"), "{missing}");
    let not_pem =
        Identity::from_pem_files(dir.path().join("server.key"), dir.path().join("server.key"))
            .unwrap_err();
    assert!(not_pem.to_string().contains("no CERTIFICATE"), "{not_pem}");
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_is_dropped() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let limits = Limits {
        handshake_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let server = Server::start(ca.server_identity().unwrap(), limits).await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("the server closes a silent connection after its handshake timeout");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    server.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let server = Server::start(ca.server_identity().unwrap(), limits).await;
    let config = tls::client_config([ca.cert()]).unwrap();

    let first = connect(server.addr, Arc::clone(&config), "localhost")
        .await
        .unwrap();
    // The second waits in the accept queue: its handshake cannot complete while the first is open.
    let second = tokio::spawn(connect(server.addr, Arc::clone(&config), "localhost"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "a second connection was served past the cap of one"
    );
    // The first one's request finishes and it closes: the second gets the slot.
    assert_eq!(get(first, "/healthz").await.0, 200);
    let second = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the freed slot goes to the waiting client")
        .unwrap()
        .unwrap();
    assert_eq!(get(second, "/healthz").await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn handshakes_past_the_per_ip_rate_are_closed_before_any_cryptography() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let limits = Limits {
        handshakes_per_ip_per_s: 2,
        handshake_burst_per_ip: 3,
        ..Limits::default()
    };
    let server = Server::start(ca.server_identity().unwrap(), limits).await;
    let config = tls::client_config([ca.cert()]).unwrap();
    let mut done = 0;
    let mut refused = 0;
    for _ in 0..8 {
        match connect(server.addr, Arc::clone(&config), "localhost").await {
            Ok(stream) => {
                assert_eq!(get(stream, "/healthz").await.0, 200);
                done += 1;
            }
            Err(_) => refused += 1,
        }
    }
    assert!(
        (3..=4).contains(&done),
        "the burst, and at most one refilled: {done}"
    );
    assert_eq!(done + refused, 8);
    // The bucket refills at 2 a second: the same address gets in again.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let stream = connect(server.addr, Arc::clone(&config), "localhost")
        .await
        .expect("allowed again once the bucket refilled");
    assert_eq!(get(stream, "/healthz").await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn shutdown_stops_accepting_and_closes_idle_connections() {
    let dir = TempDir::new();
    let ca = DevCa::open_or_create(dir.path()).unwrap();
    let server = Server::dev(&ca).await;
    let addr = server.addr;
    // An idle keep-alive connection must not hold the shutdown for the whole grace period.
    let mut idle = connect(addr, tls::client_config([ca.cert()]).unwrap(), "localhost")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    server.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown waited {:?} on an idle connection",
        started.elapsed()
    );
    let mut buf = [0u8; 16];
    assert!(matches!(idle.read(&mut buf).await, Ok(0) | Err(_)));
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn insecure_http_serves_plain_http_only_when_asked() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(tls::serve_insecure_http(
        listener,
        app(AppState::new()),
        Limits::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    tcp.read_to_end(&mut response).await.unwrap();
    let (status, body) = parse_response(&response);
    assert_eq!(status, 200, "{body}");
    let _ = stop.send(());
    task.await.unwrap();
}
