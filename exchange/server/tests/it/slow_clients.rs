//! Slow clients against the real accept loop: one address opening hundreds of connections that
//! trickle their headers or bodies cannot take the exchange's connections from anyone else — a
//! provider registers, pulls and posts its result and an agent submits an intent meanwhile, each
//! at once — and the trickles are cut off within their bounds.

use crate::door::{Door, Prov, bundle, domain, now_s, output, receipt};
use cx_exchange_server::intake::{InferenceRequest, request_hash};
use cx_exchange_server::min_rate::Pace;
use cx_exchange_server::tls::{self, Limits};
use cx_protocol::order::{self, Intent};
use cx_protocol::{DeterminismClass, Tier};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Connections the attacker opens, from its own address.
const ATTACKERS: usize = 300;
/// What one address may hold open in this test.
const PER_IP: usize = 16;

/// One request on a fresh connection (`connection: close`): its status and JSON body; a call
/// not answered within 10 s fails the test (a starved exchange would leave it waiting).
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    tokio::time::timeout(
        Duration::from_secs(10),
        request_unbounded(addr, method, path, bearer, body),
    )
    .await
    .unwrap_or_else(|_| panic!("{method} {path} was not served within 10 s"))
}

async fn request_unbounded(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let auth = bearer.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n{auth}\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tcp.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// A connection from 127.0.0.2 that starts a request and then trickles: half send a partial
/// header, half a whole header announcing a large body and then a byte a second.
async fn trickler(addr: SocketAddr, body: bool) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut tcp = socket.connect(addr).await.ok()?;
    let start: &[u8] = if body {
        b"POST /v1/intents HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 1000000\r\n\r\n{"
    } else {
        b"POST /v1/intents HTTP/1.1\r\nhost: x\r\n"
    };
    tcp.write_all(start).await.ok()?;
    Some(tcp)
}

/// Whether the server has closed `tcp` (EOF, a reset, or an answer such as 408 before it).
async fn closed_by_server(tcp: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    let until = Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_with_hundreds_of_slow_connections_cannot_starve_providers_or_agents() {
    let door = Door::new().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = Limits {
        max_connections: 64,
        max_connections_per_ip: PER_IP,
        header_read_timeout: Duration::from_secs(3),
        body_pace: Pace {
            grace: Duration::from_secs(2),
            min_bytes_per_s: 1 << 10,
        },
        ..Limits::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(tls::serve_insecure_http(
        listener,
        door.router().clone(),
        limits,
        async move {
            let _ = stopped.await;
        },
    ));

    // The attack: hundreds of connections from one address, each holding a request open.
    let mut held = Vec::new();
    for i in 0..ATTACKERS {
        if let Some(tcp) = trickler(addr, i % 2 == 0).await {
            held.push(tcp);
        }
    }
    // Past the per-address cap, connections are closed at once.
    let mut refused = 0;
    for tcp in &mut held {
        if closed_by_server(tcp, Duration::from_millis(50)).await {
            refused += 1;
        }
    }
    assert!(
        refused >= ATTACKERS - PER_IP,
        "only {refused} of {ATTACKERS} closed at once"
    );

    // Meanwhile, from another address, a provider and an agent are served at once.
    let started = Instant::now();
    let prov = Prov::new(61);
    let (status, body) = request(
        addr,
        "POST",
        "/v1/providers/register",
        None,
        Some(&prov.offer(vec![bundle("warm")])),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let prompt = InferenceRequest {
        prompt: "Say hello.".into(),
        max_tokens: 8,
        ..Default::default()
    };
    let intent = Intent {
        want: "llama-8b".into(),
        adapter_id: None,
        request_hash: request_hash(&prompt),
        deadline_s: now_s() + 120,
        max_price_wei: 100_000,
        market_limit: false,
        min_tier: Tier::T0,
        determinism: DeterminismClass::D,
        tab_id: 3,
        nonce: 1,
        expiry_s: now_s() + 60,
    };
    let signed = order::sign(intent, &domain(), &door.key, &door.pq).unwrap();
    let (status, accepted) = request(
        addr,
        "POST",
        "/v1/intents",
        None,
        Some(&json!({"intent": signed, "request": prompt})),
    )
    .await;
    assert_eq!(status, 202, "{accepted}");
    let (status, pulled) = request(
        addr,
        "POST",
        "/v1/providers/jobs",
        Some(&prov.token),
        Some(&json!({"max_jobs": 1, "wait_s": 0})),
    )
    .await;
    assert_eq!(status, 200, "{pulled}");
    let job = &pulled["jobs"][0];
    let price: u128 = job["price_wei"].as_str().unwrap().parse().unwrap();
    let (status, done) = request(
        addr,
        "POST",
        &format!("/v1/jobs/{}/result", job["job_id"].as_str().unwrap()),
        Some(&prov.token),
        Some(&json!({"output": output("Hello."), "receipt": receipt(&prov, job, "Hello.", price)})),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the honest calls waited {:?}",
        started.elapsed()
    );

    // The trickles that got in are cut off within their bounds: headers after the header
    // timeout, bodies once they fall behind the pace.
    let mut open: Vec<TcpStream> = Vec::new();
    for mut tcp in held {
        if !closed_by_server(&mut tcp, Duration::from_millis(1)).await {
            open.push(tcp);
        }
    }
    assert!(open.len() <= PER_IP, "{} held open", open.len());
    for tcp in &mut open {
        // A byte now and then keeps no connection alive past its bound.
        let _ = tcp.write_all(b"x").await;
        assert!(
            closed_by_server(tcp, Duration::from_secs(6)).await,
            "a trickle outlived its bounds"
        );
    }
    let _ = stop.send(());
    server.await.unwrap();
}
