//! `cx bench intake`: signed intents accepted over HTTPS through verify → persist → clear,
//! against a throwaway database, with the two bounds it is measured against in the same run.
//!
//! - `intents_per_s`, `p50_ms`, `p99_ms`: `clients` tasks, each on its own keep-alive HTTPS
//!   connection (TLS 1.3, X25519MLKEM768), post intents signed ahead of time; every answer must be
//!   202. Latency is per request, as the client sees it. The clients run in a process of their
//!   own ([`super::intake_load`]), not on the server's runtime.
//! - `verify_only_per_s`: recovering the EIP-712 signer and checking the ML-DSA co-signature of
//!   the same intents, serially on one core — the cryptographic bound of one intake core; and
//!   `verify_all_cores_per_s`, the same split over a thread per core — the bound of the machine
//!   (the server verifies on every runtime worker, before the database).
//! - `commit_per_s`: the intake transaction alone (nonce, tab hold, the job, its verification
//!   run and their events) from `clients` tasks, no HTTP, no signatures, no clearing — the
//!   database's bound, written as intake writes it (in groups of the orders waiting together,
//!   [`Books::accept_with_runs`]). Its rows are the HTTPS phase's own: the signed order's body as intake
//!   stored it, and the decision it stored for a job and its run.
//!
//! The server, the database and the load generator share this machine's cores, so the ratios
//! to the bounds are what to read, not the absolute rates.

use std::sync::Arc;
use std::time::Instant;

use alloy::primitives::{Address, B256};
use bytes::Bytes;
use cx_exchange::objective::Weights;
use cx_exchange::routing::catalog::Catalog;
use cx_exchange_server::books::{Books, NewJob, NewOrder, NewRun, StoredBinding, TabEvent};
use cx_exchange_server::intake::{InferenceRequest, Intake, IntentSubmission, request_hash};
use cx_exchange_server::limits::RateConfig;
use cx_exchange_server::market::Market;
use cx_exchange_server::service::{Edge, Running, Service};
use cx_exchange_server::tls::{self, DevCa};
use cx_protocol::order::{self, Intent, Order, SigningKey};
use cx_protocol::pq::Identity;
use cx_protocol::{Bundle, DeterminismClass, Tier};
use http_body_util::Full;
use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};

use crate::db::TempDatabase;
use crate::error::{Error, Result};
use crate::supervise::ScratchDir;

pub(crate) const CHAIN: u64 = 31337;
pub(crate) const CATALOG: &str = include_str!("../../../exchange/core/catalog.example.toml");

/// What to run.
#[derive(Clone, Debug)]
pub struct IntakeBenchConfig {
    /// Intents posted over HTTPS.
    pub intents: usize,
    /// Concurrent client tasks (one connection and one account each).
    pub clients: usize,
    /// Bundles registered in the market.
    pub bundles: usize,
    /// The `cx` binary whose `bench intake-load` is the load generator.
    pub load_bin: std::path::PathBuf,
}

/// Figures of one run.
#[derive(Clone, Debug, Serialize)]
pub struct IntakeReport {
    /// Intents posted.
    pub intents: usize,
    /// Client tasks.
    pub clients: usize,
    /// Bundles in the market.
    pub bundles: usize,
    /// Accepted over HTTPS per second, end to end.
    pub intents_per_s: f64,
    /// Median request latency, ms.
    pub p50_ms: f64,
    /// 99th percentile request latency, ms.
    pub p99_ms: f64,
    /// Both signatures checked per second, one core.
    pub verify_only_per_s: f64,
    /// Both signatures checked per second, a thread on each core.
    pub verify_all_cores_per_s: f64,
    /// Threads that figure used.
    pub cores: usize,
    /// Intake transactions committed per second, the database alone.
    pub commit_per_s: f64,
    /// `intents_per_s / verify_only_per_s`.
    pub share_of_verify_bound: f64,
    /// `intents_per_s / commit_per_s`.
    pub share_of_commit_bound: f64,
}

impl IntakeReport {
    /// The human table, each figure beside its target or bound.
    pub fn table(&self) -> String {
        let mut out = format!(
            "intake: {} intents from {} clients over HTTPS, {} bundles\n",
            self.intents, self.clients, self.bundles
        );
        for (name, value, note) in [
            ("intents_per_s", self.intents_per_s, ">= 5000".to_owned()),
            ("p50_ms", self.p50_ms, String::new()),
            ("p99_ms", self.p99_ms, "<= 50".to_owned()),
            (
                "verify_only_per_s",
                self.verify_only_per_s,
                format!("bound; {:.2} of it reached", self.share_of_verify_bound),
            ),
            (
                "verify_all_cores_per_s",
                self.verify_all_cores_per_s,
                format!("bound on {} cores", self.cores),
            ),
            (
                "commit_per_s",
                self.commit_per_s,
                format!("bound; {:.2} of it reached", self.share_of_commit_bound),
            ),
        ] {
            out += &format!("  {name:<20}{value:>12.1}  {note}\n");
        }
        out
    }
}

pub(crate) struct Agent {
    pub(crate) key: SigningKey,
    pub(crate) pq: Identity,
    pub(crate) account: Address,
}

pub(crate) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn bundle(i: usize) -> Result<Bundle> {
    // Every fourth bundle holds the base: the rest are cheaper but too slow to fetch it in time,
    // so clearing has both feasible and refused bundles to explain.
    let holds = i.is_multiple_of(4);
    serde_json::from_value(serde_json::json!({
        "id": format!("bundle-{i:04}"), "provider": format!("op-{}", i % 7),
        "price_wei_per_s": if holds { 1_000 + i as u64 } else { 100 + i as u64 },
        "memory_bytes": 80_000_000_000u64, "bandwidth_bps": 1e9, "rtt_s": 0.01,
        "flops_per_s": 4e14, "context_max": 32768, "determinism": ["D", "S"],
        "tiers": ["T0", "T1"],
        "resident_bases": if holds { vec!["llama-3.1-8b-instruct"] } else { vec![] },
    }))
    .map_err(|e| Error::BenchFailed(format!("bundle fixture: {e}")))
}

/// The benches' intent: the request of `request_hash` ([`request`]'s) on `llama-8b` within
/// 10 000 000 wei, at `min_tier`, on tab `tab_id` with `nonce`, due (and expiring) at
/// `deadline_s`.
pub(crate) fn intent(
    request_hash: B256,
    tab_id: u64,
    nonce: u64,
    deadline_s: u64,
    min_tier: Tier,
) -> Intent {
    Intent {
        want: "llama-8b".into(),
        adapter_id: None,
        request_hash,
        deadline_s,
        max_price_wei: 10_000_000,
        market_limit: false,
        min_tier,
        determinism: DeterminismClass::D,
        tab_id,
        nonce,
        expiry_s: deadline_s,
    }
}

pub(crate) fn request() -> InferenceRequest {
    InferenceRequest {
        prompt: "Summarise the residency rule in one sentence.".into(),
        max_tokens: 32,
        ..Default::default()
    }
}

/// Runs the benchmark: server, database and load generator on this machine.
pub async fn intake_bench(config: IntakeBenchConfig) -> Result<IntakeReport> {
    if config.intents == 0 || config.clients == 0 || config.bundles == 0 {
        return Err(Error::BenchFailed(
            "--intents, --clients and --bundles must be > 0".into(),
        ));
    }
    let (_db, books, market) = books_and_market(config.bundles).await?;
    let settlement = Address::repeat_byte(0x5e);
    let domain = order::domain(CHAIN, settlement);

    // One account, binding and tab per client, for the HTTPS phase; as many again for the
    // commit-only phase, so the two never contend for one tab row.
    let agents = agents(2 * config.clients);
    let deadline = now_s() + 3_600;
    seed_tabs(&books, &agents, deadline + 86_400).await?;

    // Signed ahead: the load generator only sends.
    let hash = request_hash(&request());
    let signed: Vec<(usize, IntentSubmission)> = (0..config.intents)
        .map(|n| {
            let client = n % config.clients;
            let agent = &agents[client];
            let intent = intent(
                hash,
                client as u64,
                (n / config.clients) as u64,
                deadline,
                Tier::T1,
            );
            let signed = order::sign(intent, &domain, &agent.key, &agent.pq).map_err(bench_err)?;
            Ok((client, IntentSubmission::new(signed, request().into())))
        })
        .collect::<Result<_>>()?;

    let verify_only_per_s = verify_bound(&signed, &domain, &agents)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let verify_all_cores_per_s = std::thread::scope(|scope| {
        let share = signed.len().div_ceil(cores);
        let threads: Vec<_> = signed
            .chunks(share)
            .map(|chunk| scope.spawn(|| verify_bound(chunk, &domain, &agents)))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(bench_err("a verify thread panicked")))
            })
            .sum::<Result<f64>>()
    })?;
    // No rate limits: the bench measures what intake itself sustains from a few accounts on
    // one address, which the default limits are there to stop.
    let intake = Intake::new(books.clone(), market, [(CHAIN, settlement)], 60)
        .with_rate_limits(RateConfig::off());
    let server = Server::start("cx-bench-intake", intake).await?;
    let mut per_client: Vec<Vec<String>> = vec![Vec::new(); config.clients];
    for (client, submission) in &signed {
        per_client[*client].push(serde_json::to_string(submission).map_err(bench_err)?);
    }
    let bodies = server.scratch.path.join("intents.tsv");
    super::intake_load::write_bodies(&bodies, &per_client)?;
    let load = super::intake_load::run_load_process(
        &config.load_bin,
        server.address,
        &server.ca_cert,
        &bodies,
    )
    .await;
    server.stop().await;
    let load = load?;
    let mut latencies = load.latencies_ms;
    if latencies.len() != config.intents {
        return Err(bench_err(format!(
            "the load process answered for {} of {} intents",
            latencies.len(),
            config.intents
        )));
    }
    let elapsed = load.elapsed_s;
    let sample = books
        .job(signed[0].1.intent.digest(&domain))
        .await
        .map_err(bench_err)?
        .ok_or_else(|| bench_err("the first intent's job is not in the books"))?;
    let (bare, cosignature) = NewOrder::split_cosignature(&signed[0].1.intent);
    let body = serde_json::json!({ "intent": bare, "request": request() });
    let commit_per_s = commit_bound(
        &books,
        &agents[config.clients..],
        &config,
        (&body, &cosignature),
        &sample,
    )
    .await?;

    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    let intents_per_s = config.intents as f64 / elapsed;
    Ok(IntakeReport {
        intents: config.intents,
        clients: config.clients,
        bundles: config.bundles,
        intents_per_s,
        p50_ms: quantile(0.5),
        p99_ms: quantile(0.99),
        verify_only_per_s,
        verify_all_cores_per_s,
        cores,
        commit_per_s,
        share_of_verify_bound: intents_per_s / verify_only_per_s,
        share_of_commit_bound: intents_per_s / commit_per_s,
    })
}

/// Both signatures of (up to 2 000 of) the intents, serially on this core.
fn verify_bound(
    signed: &[(usize, IntentSubmission)],
    domain: &order::Eip712Domain,
    agents: &[Agent],
) -> Result<f64> {
    let sample = &signed[..signed.len().min(2_000)];
    let keys: Vec<_> = agents.iter().map(|a| a.pq.public()).collect();
    let started = Instant::now();
    for (client, submission) in sample {
        let verified = submission.intent.recover(domain).map_err(bench_err)?;
        submission
            .intent
            .check_cosignature(&verified, &keys[*client])
            .map_err(bench_err)?;
        submission
            .intent
            .order
            .check_times(now_s())
            .map_err(bench_err)?;
    }
    Ok(sample.len() as f64 / started.elapsed().as_secs_f64())
}

/// The intake transaction alone, from `clients` tasks on their own tabs: each an order with
/// `body`, a job with `sample`'s decision and request, and one verification run (T1) with the
/// same decision.
async fn commit_bound(
    books: &Books,
    agents: &[Agent],
    config: &IntakeBenchConfig,
    (body, cosignature): (&serde_json::Value, &Option<alloy::primitives::Bytes>),
    sample: &cx_protocol::wire::JobRecord,
) -> Result<f64> {
    let per_client = (config.intents / config.clients).clamp(1, 200);
    let decision = serde_json::to_value(&sample.decision).map_err(bench_err)?;
    let started = Instant::now();
    let tasks: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| {
            let books = books.clone();
            let account = agent.account;
            let escrow_id = (config.clients + i) as u64;
            let (body, cosignature, decision) =
                (body.clone(), cosignature.clone(), decision.clone());
            tokio::spawn(async move {
                for n in 0..per_client {
                    let mut digest = [0xc0u8; 32];
                    digest[..8].copy_from_slice(&escrow_id.to_be_bytes());
                    digest[8..16].copy_from_slice(&(n as u64).to_be_bytes());
                    let order = NewOrder {
                        digest: B256::from(digest),
                        kind: "intent",
                        account,
                        chain_id: CHAIN,
                        nonce: n as u64,
                        body: body.clone(),
                        mldsa_signature: cosignature.clone(),
                        limit_wei: Some(10_000_000),
                    };
                    let job = NewJob {
                        id: order.digest,
                        escrow_id,
                        model: "llama-3.1-8b-instruct".into(),
                        status: cx_exchange_server::books::JobStatus::Assigned,
                        bundle_id: Some("bundle-0000".into()),
                        held_wei: 1_000,
                        needed_until_s: 0,
                        decision: decision.clone(),
                        deadline_s: u64::from(u32::MAX),
                        adapter: None,
                        workload: cx_protocol::workload::Workload::Inference(request()),
                    };
                    let run = NewRun {
                        id: B256::from(cx_protocol::replica::run_job_id(digest, 1)),
                        run: 1,
                        bundle_id: "bundle-0004".into(),
                        held_wei: 1_000,
                        decision: decision.clone(),
                    };
                    books
                        .accept_with_runs(&order, &job, std::slice::from_ref(&run))
                        .await
                        .map_err(bench_err)?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await
            .map_err(|e| Error::BenchFailed(format!("commit task: {e}")))??;
    }
    Ok((per_client * agents.len()) as f64 / started.elapsed().as_secs_f64())
}

/// A throwaway database, its books, and the catalog's market with `bundles` of [`bundle`]
/// registered.
pub(crate) async fn books_and_market(bundles: usize) -> Result<(TempDatabase, Books, Market)> {
    let db = TempDatabase::create().await?;
    let books = Books::open(&db.url).await.map_err(bench_err)?;
    let catalog = Catalog::from_toml_str(CATALOG).map_err(bench_err)?;
    let market = Market::new(catalog, Weights::default()).map_err(bench_err)?;
    for i in 0..bundles {
        market
            .register(&books, bundle(i)?)
            .await
            .map_err(bench_err)?;
    }
    Ok((db, books, market))
}

/// `n` agents, each its own account and ML-DSA identity (fixed seeds: runs are comparable).
pub(crate) fn agents(n: usize) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            let mut seed = [0u8; 32];
            seed[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
            let key = SigningKey::from_slice(&seed).expect("a small nonzero scalar is a key");
            Agent {
                account: order::account_of(&key),
                pq: Identity::from_seed(seed),
                key,
            }
        })
        .collect()
}

/// Binds every agent and opens agent `i`'s tab `i` on [`CHAIN`], as the chain watcher would
/// have, funded far beyond any run.
pub(crate) async fn seed_tabs(books: &Books, agents: &[Agent], deadline_s: u64) -> Result<()> {
    for agent in agents {
        books
            .bind(&StoredBinding {
                account: agent.account,
                chain_id: CHAIN,
                mldsa_key: agent.pq.public().to_bytes().to_vec(),
                mldsa_key_hash: B256::from(agent.pq.public().id().0),
                binding: serde_json::json!({}),
            })
            .await
            .map_err(bench_err)?;
    }
    open_tabs(books, agents, 0, deadline_s).await
}

/// Opens one more tab per agent, agent `i`'s escrow id `first + i`.
pub(crate) async fn open_tabs(
    books: &Books,
    agents: &[Agent],
    first: u64,
    deadline_s: u64,
) -> Result<()> {
    let events: Vec<TabEvent> = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| TabEvent::Opened {
            escrow_id: first + i as u64,
            buyer: agent.account,
            amount_wei: u128::MAX / 4,
            deadline_s,
            reference: B256::repeat_byte(1),
            block: 1,
        })
        .collect();
    books
        .apply_chain(CHAIN, &events, &[], 2, None)
        .await
        .map_err(bench_err)
}

/// The exchange on loopback (the service `cx serve` runs, HTTPS with a development CA) until
/// [`Server::stop`].
pub(crate) struct Server {
    pub(crate) address: std::net::SocketAddr,
    pub(crate) client_config: Arc<rustls::ClientConfig>,
    /// The development CA's certificate (PEM), for a client in another process.
    pub(crate) ca_cert: std::path::PathBuf,
    running: Running,
    pub(crate) scratch: ScratchDir,
}

impl Server {
    pub(crate) async fn start(tag: &str, intake: Intake) -> Result<Self> {
        let scratch = ScratchDir::new(tag)?;
        let ca = DevCa::open_or_create(scratch.path.join("ca")).map_err(bench_err)?;
        let server_config =
            tls::server_config(ca.server_identity().map_err(bench_err)?).map_err(bench_err)?;
        let client_config = tls::client_config([ca.cert()]).map_err(bench_err)?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::BenchFailed(format!("bind: {e}")))?;
        // With its sweeps (expiries, the pruning of waiters whose calls ended): without them a
        // soak measures a server that never forgets a waiter.
        let running = Service::new(intake)
            .launch(listener, Edge::Https(server_config))
            .map_err(|e| Error::BenchFailed(format!("launch: {e}")))?;
        Ok(Self {
            address: running.address(),
            client_config,
            ca_cert: ca.cert_path(),
            running,
            scratch,
        })
    }

    pub(crate) async fn stop(self) {
        self.running.stop().await;
    }
}

/// One keep-alive HTTPS connection to `address` (TLS 1.3, X25519MLKEM768), ready to send.
pub(crate) async fn connect(
    address: std::net::SocketAddr,
    client_config: Arc<rustls::ClientConfig>,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let io = |e: std::io::Error| Error::BenchFailed(format!("connection: {e}"));
    let tcp = TcpStream::connect(address).await.map_err(io)?;
    tcp.set_nodelay(true).map_err(io)?;
    let name = rustls::pki_types::ServerName::try_from("localhost")
        .map_err(|e| Error::BenchFailed(format!("server name: {e}")))?;
    let stream = tokio_rustls::TlsConnector::from(client_config)
        .connect(name, tcp)
        .await
        .map_err(io)?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| Error::BenchFailed(format!("http handshake: {e}")))?;
    tokio::spawn(connection);
    Ok(sender)
}

pub(crate) fn bench_err(err: impl std::fmt::Display) -> Error {
    Error::BenchFailed(err.to_string())
}
