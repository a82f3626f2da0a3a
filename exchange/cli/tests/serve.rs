//! `cx serve` as a person runs it: it makes a development CA, opens the books on PostgreSQL,
//! prints the URL and the CA to trust, answers `/healthz` over HTTPS with the hybrid
//! post-quantum key exchange, and stops cleanly on Ctrl-C (SIGINT).

mod common;

use common::Serve;
use cx_devnet::db::TempDatabase;
use cx_devnet::{ScratchDir, free_port};
use cx_exchange_server::tls;
use rustls::NamedGroup;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

#[test]
fn cx_serve_answers_healthz_over_https_with_the_printed_ca_and_stops_on_ctrl_c() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let database = runtime
        .block_on(TempDatabase::create())
        .expect("a throwaway database on the local PostgreSQL (DATABASE_URL)");
    let scratch = ScratchDir::new("cx-serve-test").unwrap();
    let ca_dir = scratch.path.join("ca");
    let port = free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");

    let mut serve = Serve::start(
        &["--listen", &listen, "--ca-dir", ca_dir.to_str().unwrap()],
        &database.url,
    );
    let url = serve.field("url");
    assert_eq!(url, format!("https://{listen}"));
    let ca_path = serve.field("ca");
    let fingerprint = serve.field("ca sha256");
    assert_eq!(std::path::Path::new(&ca_path), ca_dir.join("ca.pem"));

    // Trust exactly the printed CA, as `curl --cacert` would.
    let ca = CertificateDer::from_pem_file(&ca_path).expect("the printed CA is a PEM certificate");
    assert_eq!(tls::fingerprint_sha256(&ca), fingerprint);
    let (status, body, group) = runtime.block_on(async {
        let tcp = TcpStream::connect(&listen).await.unwrap();
        let config = tls::client_config([&ca]).unwrap();
        let mut stream = TlsConnector::from(config)
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .expect("the handshake succeeds with the printed CA");
        let group = stream
            .get_ref()
            .1
            .negotiated_key_exchange_group()
            .unwrap()
            .name();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = Vec::new();
        if let Err(err) = stream.read_to_end(&mut response).await {
            assert!(!response.is_empty(), "reading the response: {err}");
        }
        let text = String::from_utf8(response).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().to_owned();
        (status, body.to_owned(), group)
    });
    assert_eq!(status, "200", "{body}");
    assert_eq!(group, NamedGroup::X25519MLKEM768);
    let health: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(health["status"], "ok");

    // Ctrl-C: the process stops by itself, says so, and exits 0.
    let pid = serve.child.id().to_string();
    let killed = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = serve.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "cx serve did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "cx serve exited with {status}");
    // The reader thread ends at the child's end of output: the rest of what it printed.
    while let Ok(line) = serve.lines.recv_timeout(Duration::from_secs(5)) {
        serve.seen.push(line);
    }
    assert!(
        serve.seen.iter().any(|line| line == "cx serve: stopped"),
        "{:?}",
        serve.seen
    );

    // The CA is reused on the next start: same fingerprint.
    drop(serve);
    let mut again = Serve::start(
        &["--listen", &listen, "--ca-dir", ca_dir.to_str().unwrap()],
        &database.url,
    );
    assert_eq!(again.field("ca sha256"), fingerprint);
    drop(again);
    drop(database);
}

#[test]
fn a_port_in_use_names_the_flag_to_change() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let scratch = ScratchDir::new("cx-serve-test").unwrap();
    let ca_dir = scratch.path.join("ca");
    let out = Command::new(env!("CARGO_BIN_EXE_cx"))
        .args(["serve", "--listen", &listen, "--ca-dir"])
        .arg(&ca_dir)
        // Never reached: the port is checked before the database is opened.
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_owned();
    assert_eq!(err.lines().count(), 1, "one line, got: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(&listen) && err.contains("--listen"), "{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout on error");
}

#[test]
fn insecure_http_cannot_be_combined_with_a_certificate() {
    let out = Command::new(env!("CARGO_BIN_EXE_cx"))
        .args([
            "serve",
            "--insecure-http",
            "--tls-cert",
            "a.pem",
            "--tls-key",
            "a.key",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--insecure-http"), "{err}");
}

/// A second `cx serve` on a database another one writes is refused in one line after its wait
/// (it would clear the same markets twice); with `--standby` it serves its own port by
/// forwarding to the writer (answers, refusals and the client's address limits as the writer's
/// own), and takes over on that port when the writer is killed.
#[test]
fn a_second_writer_on_the_same_database_is_refused_and_a_standby_forwards_then_takes_over() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let database = runtime.block_on(TempDatabase::create()).unwrap();
    let scratch = ScratchDir::new("cx-serve-writer").unwrap();
    let ca_dir = scratch.path.join("ca");
    let first = format!("127.0.0.1:{}", free_port().unwrap());
    let mut writer = Serve::start(
        &["--listen", &first, "--ca-dir", ca_dir.to_str().unwrap()],
        &database.url,
    );
    assert!(writer.field("database").ends_with("writer epoch 1)"));

    let second = format!("127.0.0.1:{}", free_port().unwrap());
    let out = Command::new(env!("CARGO_BIN_EXE_cx"))
        .args([
            "serve",
            "--listen",
            &second,
            "--writer-wait-s",
            "1",
            "--ca-dir",
        ])
        .arg(&ca_dir)
        .env("DATABASE_URL", &database.url)
        .env("CX_IDENTITY", scratch.path.join("second.key"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "{err}");
    assert!(
        last.contains("another cx serve writes this database"),
        "{err}"
    );
    assert!(
        last.contains(&format!("on {first}")),
        "names the holder: {err}"
    );

    let mut standby = Serve::start(
        &[
            "--listen",
            &second,
            "--standby",
            "--ca-dir",
            ca_dir.to_str().unwrap(),
        ],
        &database.url,
    );
    assert!(
        standby
            .field("cx serve:")
            .starts_with("a standby node, forwarding to the writer"),
        "{:?}",
        standby.seen
    );
    assert_eq!(standby.field("url"), format!("https://{second}"));
    let ca = ca_dir.join("ca.pem");
    let ask = |method: &str, path: &str, body: Option<&serde_json::Value>| {
        runtime
            .block_on(cx_devnet::harness::https_request(
                &format!("https://{second}"),
                &ca,
                method,
                path,
                body,
                Duration::from_secs(10),
            ))
            .expect("an answer")
    };
    // The writer's answers through the standby: a read, and a refusal in the API's shape.
    let (status, _, body) = ask("GET", "/v1/exchange", None);
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = ask("POST", "/v1/intents", Some(&serde_json::json!({"x": 1})));
    assert_eq!(status, 400, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["field"], "x", "{body}");
    writer.kill();
    let took = Instant::now();
    // Asked while it takes over, it holds the request until a writer answers: itself.
    let (status, _, body) = ask("GET", "/v1/exchange", None);
    assert_eq!(status, 200, "{body}");
    assert!(standby.field("database").ends_with("writer epoch 2)"));
    assert!(
        took.elapsed() < Duration::from_secs(15),
        "{:?}",
        took.elapsed()
    );
}

/// A writer that hangs (SIGSTOP: its process, socket and lock all still there, which no TCP
/// keepalive sees) stops renewing its lease; the standby still answers the explorer's reads of
/// the books itself; past `LEASE_TIMEOUT` it cuts the writer's lease connection off, takes over
/// (epoch 2) and answers what it held meanwhile. The old writer,
/// woken, finds its lease gone and stops with an error instead of writing.
#[test]
fn a_hung_writer_is_cut_off_and_a_standby_takes_over() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let database = runtime.block_on(TempDatabase::create()).unwrap();
    let scratch = ScratchDir::new("cx-serve-hung").unwrap();
    let ca_dir = scratch.path.join("ca");
    let first = format!("127.0.0.1:{}", free_port().unwrap());
    let mut writer = Serve::start(
        &["--listen", &first, "--ca-dir", ca_dir.to_str().unwrap()],
        &database.url,
    );
    assert!(writer.field("database").ends_with("writer epoch 1)"));
    let second = format!("127.0.0.1:{}", free_port().unwrap());
    let mut standby = Serve::start(
        &[
            "--listen",
            &second,
            "--standby",
            "--ca-dir",
            ca_dir.to_str().unwrap(),
        ],
        &database.url,
    );
    assert!(standby.field("cx serve:").starts_with("a standby node"));
    let signal = |sig: &str| {
        let sent = Command::new("kill")
            .args([sig, &writer.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    };
    signal("-STOP");
    let hung = Instant::now();
    // A read of the books the standby answers itself, from its own connection: at once, while
    // the writer hangs (a forwarded request would wait for the takeover).
    let ca = ca_dir.join("ca.pem");
    let (status, _, body) = runtime
        .block_on(cx_devnet::harness::https_request(
            &format!("https://{second}"),
            &ca,
            "GET",
            "/explorer/jobs",
            None,
            Duration::from_secs(5),
        ))
        .expect("an answer from the standby itself");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<html"), "{body}");
    assert!(
        hung.elapsed() < Duration::from_secs(5),
        "{:?}",
        hung.elapsed()
    );
    assert!(standby.field("database").ends_with("writer epoch 2)"));
    let took = hung.elapsed();
    let timeout = cx_exchange_server::books::LEASE_TIMEOUT;
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(10),
        "cut off after {took:?}"
    );
    let (status, _, body) = runtime
        .block_on(cx_devnet::harness::https_request(
            &format!("https://{second}"),
            &ca,
            "GET",
            "/v1/exchange",
            None,
            Duration::from_secs(10),
        ))
        .expect("an answer");
    assert_eq!(status, 200, "{body}");
    // Woken, the old writer learns it lost the lease and stops.
    signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(15);
    let exited = loop {
        if let Some(status) = writer.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the cut-off writer kept running");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!exited.success());
}

/// A writer advertising an address that leads to a standby (the balancer's, a typo) would have
/// the standby forward to itself forever: the second hop is refused, 508 `forwarding_loop`.
#[test]
fn a_writer_advertised_at_a_standby_is_a_loop_refused_at_once() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let database = runtime.block_on(TempDatabase::create()).unwrap();
    let scratch = ScratchDir::new("cx-serve-loop").unwrap();
    let ca_dir = scratch.path.join("ca");
    let first = format!("127.0.0.1:{}", free_port().unwrap());
    let second = format!("127.0.0.1:{}", free_port().unwrap());
    let advertised = format!("https://{second}");
    let mut writer = Serve::start(
        &[
            "--listen",
            &first,
            "--advertise",
            &advertised,
            "--ca-dir",
            ca_dir.to_str().unwrap(),
        ],
        &database.url,
    );
    assert!(writer.field("database").ends_with("writer epoch 1)"));
    let mut standby = Serve::start(
        &[
            "--listen",
            &second,
            "--standby",
            "--ca-dir",
            ca_dir.to_str().unwrap(),
        ],
        &database.url,
    );
    assert!(standby.field("cx serve:").starts_with("a standby node"));
    let started = Instant::now();
    let (status, _, body) = runtime
        .block_on(cx_devnet::harness::https_request(
            &advertised,
            &ca_dir.join("ca.pem"),
            "GET",
            "/v1/exchange",
            None,
            Duration::from_secs(10),
        ))
        .expect("an answer");
    assert_eq!(status, 508, "{body}");
    assert!(body.contains("forwarding_loop"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
