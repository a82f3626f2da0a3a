//! `cx bench cluster`: the exchange as a cluster of `cx serve` processes on one database — what
//! a second node costs, and what a writer's death costs.
//!
//! - **Phases at 1 and 2 nodes**: OpenAI door calls (`POST /v1/chat/completions` under session
//!   keys) then signed intents (`POST /v1/intents`) from `clients` closed-loop clients, each on
//!   its own keep-alive HTTPS connection, the clients spread over the nodes in turn. The market's
//!   one provider is the bench's own (it answers every job at once with a fixed text and a signed
//!   receipt, so the figures are the exchange's, not a model's) and polls through a node like
//!   any provider; a phase ends when it has run every job, intents' included. With two
//!   nodes half the clients (and the provider) reach the writer through the standby, which
//!   forwards every request: on one machine that shows what the hop costs, not scale (both
//!   nodes, PostgreSQL and the clients share its cores).
//! - **Failover**: the same intake load on both nodes; when a third of it is acknowledged the
//!   writer is SIGKILLed. A client whose connection died reconnects to the next node and sends
//!   the same signed intent again (a signed order is idempotent: `order_exists` means it had
//!   been committed). Reported: the kill to the lease's next epoch (`takeover_s`), the kill to
//!   the first acknowledgement after it (`first_ack_after_kill_s`), and the orders lost — every
//!   intent acknowledged must be in the books (must be 0).
//!
//! The nodes are real `cx serve` processes on a real Anvil with the contracts (the provider is
//! staked there, as the exchange checks); the database is a throwaway one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use alloy::primitives::{B256, U256};
use bytes::Bytes;
use cx_exchange_server::books::Books;
use cx_exchange_server::intake::request_hash;
use cx_exchange_server::tls::{self, DevCa};
use cx_protocol::Tier;
use cx_protocol::order::{self, Eip712Domain};
use serde::Serialize;

use super::intake::{
    Agent, CATALOG, CHAIN, agents, bench_err, connect, intent, now_s, request, seed_tabs,
};
use super::load::{Responder, door_body, open_sessions, send_raw};
use crate::db::TempDatabase;
use crate::error::{Error, Result};
use crate::supervise::{ScratchDir, Supervised};

/// What to run.
#[derive(Clone, Debug)]
pub struct ClusterBenchConfig {
    /// Signed intents in each phase (and in the failover).
    pub intents: usize,
    /// Door calls in each phase.
    pub calls: usize,
    /// Concurrent clients, each on its own keep-alive connection and account.
    pub clients: usize,
    /// The `cx` binary whose `serve` the nodes run.
    pub exchange_bin: PathBuf,
}

/// One phase: the same loads on `nodes` nodes.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    /// Nodes serving (the writer, and standbys forwarding to it).
    pub nodes: usize,
    /// Signed intents acknowledged per second.
    pub intake_per_s: f64,
    /// Median intake latency, ms.
    pub intake_p50_ms: f64,
    /// 99th percentile intake latency, ms.
    pub intake_p99_ms: f64,
    /// Door calls answered per second (each cleared, run by the provider, answered).
    pub door_per_s: f64,
    /// Median door latency, ms.
    pub door_p50_ms: f64,
    /// 99th percentile door latency, ms.
    pub door_p99_ms: f64,
}

/// The writer killed under intake load.
#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    /// Intents acknowledged when the writer was killed.
    pub acknowledged_at_kill: usize,
    /// From the kill to the next epoch of the writer lease (a standby holds it).
    pub takeover_s: f64,
    /// From the kill to the first intent acknowledged after it.
    pub first_ack_after_kill_s: f64,
    /// Intents acknowledged in all (a resent one counted once).
    pub acknowledged: usize,
    /// Resent after a connection died with them, and found committed (`order_exists`).
    pub committed_answer_lost: usize,
    /// Acknowledged intents not in the books. Must be 0.
    pub orders_lost: usize,
}

/// Figures of one run.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterReport {
    /// The machine's CPU (`/proc/cpuinfo`), and its cores: the nodes, PostgreSQL and the
    /// clients share them.
    pub cpu: String,
    /// Cores.
    pub cores: usize,
    /// Clients.
    pub clients: usize,
    /// Intents per phase.
    pub intents: usize,
    /// Door calls per phase.
    pub calls: usize,
    /// At 1 node, then 2.
    pub phases: Vec<Phase>,
    /// 2-node over 1-node intake throughput: the forwarding hop's cost on this machine.
    pub intake_ratio_2_to_1: f64,
    /// 2-node over 1-node door throughput.
    pub door_ratio_2_to_1: f64,
    /// The writer killed.
    pub failover: Failover,
}

impl ClusterReport {
    /// The human form.
    pub fn table(&self) -> String {
        let mut out = format!(
            "cx bench cluster: {} ({} cores), {} clients, {} intents and {} door calls a phase\n\
             nodes  intake/s  p50 ms  p99 ms  door/s  p50 ms  p99 ms\n",
            self.cpu, self.cores, self.clients, self.intents, self.calls
        );
        for p in &self.phases {
            out.push_str(&format!(
                "{:>5}  {:>8.0}  {:>6.1}  {:>6.1}  {:>6.0}  {:>6.1}  {:>6.1}\n",
                p.nodes,
                p.intake_per_s,
                p.intake_p50_ms,
                p.intake_p99_ms,
                p.door_per_s,
                p.door_p50_ms,
                p.door_p99_ms
            ));
        }
        let f = &self.failover;
        out.push_str(&format!(
            "2 nodes / 1: intake {:.2}x, door {:.2}x (one machine: the hop's cost, not scale)\n\
             writer killed at {} acknowledged: lease taken {:.2} s after, first acknowledgement \
             {:.2} s after; {} acknowledged, {} committed with the answer lost, {} orders lost\n",
            self.intake_ratio_2_to_1,
            self.door_ratio_2_to_1,
            f.acknowledged_at_kill,
            f.takeover_s,
            f.first_ack_after_kill_s,
            f.acknowledged,
            f.committed_answer_lost,
            f.orders_lost
        ));
        out
    }
}

/// A `cx serve` node (SIGKILLed on drop).
struct Node {
    address: SocketAddr,
    process: Supervised,
}

/// What the nodes share.
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    deployments: PathBuf,
    database_url: String,
    books: Books,
    client: Arc<rustls::ClientConfig>,
}

impl Cluster {
    /// Starts a node; the first (`standby` false) takes the lease, the others forward to it.
    async fn node(&self, standby: bool) -> Result<Node> {
        let address = SocketAddr::from(([127, 0, 0, 1], crate::free_port()?));
        let mut command = Command::new(&self.bin);
        command
            .arg("serve")
            .args(["--listen", &address.to_string()])
            .arg("--ca-dir")
            .arg(self.dir.join("ca"))
            .arg("--deployments")
            .arg(&self.deployments)
            .arg("--identity")
            .arg(self.dir.join("exchange.key"))
            .arg("--catalog")
            .arg(self.dir.join("catalog.toml"))
            // The bench measures what the nodes sustain from a few accounts on one address,
            // which the default limits are there to stop.
            .args(["--rate-per-ip", "0", "--rate-per-account", "0"])
            .env("DATABASE_URL", &self.database_url);
        if standby {
            command.arg("--standby");
        }
        let log = self.dir.join(format!("node-{}.log", address.port()));
        let mut process =
            Supervised::spawn_logged(format!("cx serve on {address}"), command, &log, "")?;
        let books = self.books.clone();
        let handle = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| {
            process.wait_ready(
                address,
                Duration::from_secs(60),
                Duration::from_millis(50),
                // A writer is ready once the lease names it; a standby once it listens.
                || standby || handle.block_on(writer_url(&books)).is_some(),
            )
        })?;
        Ok(Node { address, process })
    }

    /// Waits until no job is waiting for or held by the provider (at most a minute).
    async fn drained(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM exchange_jobs WHERE status IN ('assigned', 'running')",
            )
            .fetch_one(self.books.pool())
            .await
            .map_err(bench_err)?;
            if open == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::BenchFailed(format!(
                    "{open} jobs still open a minute after the load"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The writer lease's epoch (0 before any).
    async fn writer_epoch(&self) -> Result<i64> {
        let epoch: Option<i64> = sqlx::query_scalar("SELECT epoch FROM exchange_writer")
            .fetch_optional(self.books.pool())
            .await
            .map_err(bench_err)?;
        Ok(epoch.unwrap_or(0))
    }

    fn server(&self, node: &Node) -> (SocketAddr, Arc<rustls::ClientConfig>) {
        (node.address, self.client.clone())
    }
}

/// The URL the writer lease's row names (`None`: no writer yet, or the database is away).
async fn writer_url(books: &Books) -> Option<String> {
    sqlx::query_scalar::<_, Option<String>>("SELECT url FROM exchange_writer")
        .fetch_optional(books.pool())
        .await
        .ok()
        .flatten()
        .flatten()
}

/// Runs the benchmark: nodes, database, chain, provider and clients on this machine.
pub async fn cluster_bench(config: ClusterBenchConfig) -> Result<ClusterReport> {
    if config.intents == 0 || config.calls == 0 || config.clients == 0 {
        return Err(Error::BenchFailed(
            "--intents, --calls and --clients must be > 0".into(),
        ));
    }
    let scratch = ScratchDir::new("cx-bench-cluster")?;
    let dir = scratch.path.clone();
    let db = TempDatabase::create().await?;
    let books = Books::open(&db.url).await.map_err(bench_err)?;
    let catalog = dir.join("catalog.toml");
    std::fs::write(&catalog, CATALOG).map_err(Error::io(&catalog))?;

    // The chain the nodes watch and check stakes on: Anvil with the contracts; the bench's
    // provider staked and its key registered as `cx-provider stake` does.
    let crate::harness::market::Chain {
        anvil,
        deployment,
        deployments,
    } = crate::harness::market::try_deploy_chain(&dir, 4, crate::harness::group_key(), 1_200)
        .await?;
    let provider_key = anvil.keys[1].clone();
    let payout = provider_key.address();
    let evm = cx_settlement::evm::EvmClient::connect(&anvil.rpc_url(), provider_key, deployment)
        .map_err(bench_err)?;
    let key_hash = B256::from(Responder::identity().public().id().0);
    evm.set_metadata("", key_hash).await.map_err(bench_err)?;
    evm.stake(U256::from(1_000u64)).await.map_err(bench_err)?;
    let domain = order::domain(CHAIN, deployment.settlement);

    // Accounts: the intake clients of each phase and of the failover, then the door's, each
    // on its own tab (agent i, tab i).
    let clients = config.clients;
    let all = agents(4 * clients);
    seed_tabs(&books, &all, now_s() + 86_400).await?;
    let (intake_agents, door_agents) = all.split_at(3 * clients);

    let ca = DevCa::open_or_create(dir.join("ca")).map_err(bench_err)?;
    let client = tls::client_config([ca.cert()]).map_err(bench_err)?;
    let cluster = Cluster {
        bin: config.exchange_bin.clone(),
        dir: dir.clone(),
        deployments,
        database_url: db.url.clone(),
        books: books.clone(),
        client,
    };

    let writer = cluster.node(false).await?;
    let secrets: Vec<Arc<str>> = (0..clients)
        .map(|i| Arc::from(format!("cxs_cluster_{i}")))
        .collect();
    open_sessions(
        &cluster.server(&writer),
        door_agents,
        &secrets,
        &domain,
        3 * clients as u64,
    )
    .await?;

    let mut phases = Vec::new();
    let mut nodes = vec![writer];
    for (n, phase) in [1usize, 2].into_iter().zip(0u64..) {
        while nodes.len() < n {
            nodes.push(cluster.node(true).await?);
        }
        let servers: Vec<_> = nodes.iter().map(|n| cluster.server(n)).collect();
        // The market's one provider, polling through the last node (the standby at 2 nodes):
        // intents clear onto its bundles and door calls are answered by it.
        let responder = Responder::start(servers[n - 1].clone(), payout, 4).await?;
        let calls = (0..config.calls)
            .map(|i| Call {
                path: "/v1/chat/completions",
                bearer: Some(secrets[i % clients].clone()),
                body: Bytes::from(door_body().to_string()),
                client: i % clients,
                nonce: 0,
            })
            .collect();
        let door = closed_loop(&servers, calls, None).await?;
        let first_tab = phase * clients as u64;
        let phase_agents = &intake_agents[first_tab as usize..][..clients];
        let bodies = signed_intents(phase_agents, first_tab, config.intents, &domain)?;
        let intake = closed_loop(&servers, bodies, None).await?;
        // The provider runs the intents' jobs too: the next phase starts with none left, so its
        // door calls do not queue behind this phase's intents.
        cluster.drained().await?;
        responder.stop().await?;
        phases.push(Phase {
            nodes: n,
            intake_per_s: intake.per_s,
            intake_p50_ms: intake.p50_ms,
            intake_p99_ms: intake.p99_ms,
            door_per_s: door.per_s,
            door_p50_ms: door.p50_ms,
            door_p99_ms: door.p99_ms,
        });
    }

    // The writer killed under load.
    let servers: Vec<_> = nodes.iter().map(|n| cluster.server(n)).collect();
    let first_tab = 2 * clients as u64;
    let bodies = signed_intents(
        &intake_agents[2 * clients..],
        first_tab,
        config.intents,
        &domain,
    )?;
    let epoch_before = cluster.writer_epoch().await?;
    let acked = Arc::new(AtomicUsize::new(0));
    let load = tokio::spawn({
        let acked = acked.clone();
        async move { closed_loop(&servers, bodies, Some(acked)).await }
    });
    while acked.load(Ordering::SeqCst) < config.intents / 3 {
        if load.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let acknowledged_at_kill = acked.load(Ordering::SeqCst);
    let mut killed_writer = nodes.remove(0);
    killed_writer.process.kill();
    let killed = Instant::now();
    let takeover_s = loop {
        if cluster.writer_epoch().await? > epoch_before {
            break killed.elapsed().as_secs_f64();
        }
        if killed.elapsed() > Duration::from_secs(60) {
            return Err(Error::BenchFailed(
                "no standby took the writer lease".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let run = load
        .await
        .map_err(|e| Error::BenchFailed(format!("the failover's load: {e}")))??;
    let first_ack_after_kill_s = run
        .acked_at
        .iter()
        .filter(|at| **at > killed)
        .min()
        .map_or(f64::NAN, |at| (*at - killed).as_secs_f64());
    let mut orders_lost = 0;
    for (agent, nonce) in &run.acknowledged {
        let found: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT digest FROM exchange_orders WHERE account = $1 AND nonce = $2::numeric",
        )
        .bind(intake_agents[2 * clients + agent].account.as_slice())
        .bind(nonce.to_string())
        .fetch_optional(books.pool())
        .await
        .map_err(bench_err)?;
        if found.is_none() {
            orders_lost += 1;
        }
    }
    drop(nodes);
    drop(killed_writer);

    let ratio = |f: fn(&Phase) -> f64| f(&phases[1]) / f(&phases[0]);
    Ok(ClusterReport {
        cpu: cpu_name(),
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        clients,
        intents: config.intents,
        calls: config.calls,
        intake_ratio_2_to_1: ratio(|p| p.intake_per_s),
        door_ratio_2_to_1: ratio(|p| p.door_per_s),
        phases,
        failover: Failover {
            acknowledged_at_kill,
            takeover_s,
            first_ack_after_kill_s,
            acknowledged: run.acknowledged.len(),
            committed_answer_lost: run.committed_answer_lost,
            orders_lost,
        },
    })
}

/// The CPU's model name as `/proc/cpuinfo` gives it.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// One request of a closed loop: to `path`, sent by client `client` (an intent's `nonce`).
#[derive(Clone)]
struct Call {
    path: &'static str,
    bearer: Option<Arc<str>>,
    body: Bytes,
    client: usize,
    nonce: u64,
}

/// `count` intents from `agents` in turn (agent k on tab `first_tab + k`), signed ahead.
fn signed_intents(
    agents: &[Agent],
    first_tab: u64,
    count: usize,
    domain: &Eip712Domain,
) -> Result<Vec<Call>> {
    let hash = request_hash(&request());
    let deadline = now_s() + 3_000;
    (0..count)
        .map(|n| {
            let client = n % agents.len();
            let nonce = (n / agents.len()) as u64;
            let tab_id = first_tab + client as u64;
            let intent = intent(hash, tab_id, nonce, deadline, Tier::T0);
            let agent = &agents[client];
            let signed = order::sign(intent, domain, &agent.key, &agent.pq).map_err(bench_err)?;
            let body = serde_json::json!({"intent": signed, "request": request()});
            Ok(Call {
                path: "/v1/intents",
                bearer: None,
                body: Bytes::from(body.to_string()),
                client,
                nonce,
            })
        })
        .collect()
}

/// What a closed loop saw.
struct Run {
    per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// (client, nonce) of each intent acknowledged (`/v1/intents` only).
    acknowledged: Vec<(usize, u64)>,
    acked_at: Vec<Instant>,
    committed_answer_lost: usize,
}

/// Each client sends its calls in order on a keep-alive connection to node `client mod nodes`;
/// a connection that fails is replaced by one to the next node and the call sent again. Every
/// answer must be a success (or, for a resent intent, `order_exists`).
async fn closed_loop(
    servers: &[(SocketAddr, Arc<rustls::ClientConfig>)],
    calls: Vec<Call>,
    acked: Option<Arc<AtomicUsize>>,
) -> Result<Run> {
    let clients = calls.iter().map(|c| c.client + 1).max().unwrap_or(0);
    let mut per_client: Vec<Vec<Call>> = vec![Vec::new(); clients];
    for call in calls {
        per_client[call.client].push(call);
    }
    let total: usize = per_client.iter().map(Vec::len).sum();
    let started = Instant::now();
    let tasks: Vec<_> = per_client
        .into_iter()
        .enumerate()
        .map(|(client, calls)| {
            let servers = servers.to_vec();
            let acked = acked.clone();
            tokio::spawn(async move { client_loop(client, &servers, calls, acked).await })
        })
        .collect();
    let mut latencies = Vec::with_capacity(total);
    let mut run = Run {
        per_s: 0.0,
        p50_ms: 0.0,
        p99_ms: 0.0,
        acknowledged: Vec::new(),
        acked_at: Vec::new(),
        committed_answer_lost: 0,
    };
    for task in tasks {
        let done = task
            .await
            .map_err(|e| Error::BenchFailed(format!("client task: {e}")))??;
        latencies.extend(done.latencies);
        run.acknowledged.extend(done.acknowledged);
        run.acked_at.extend(done.acked_at);
        run.committed_answer_lost += done.committed_answer_lost;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    run.per_s = total as f64 / elapsed;
    run.p50_ms = quantile(0.5);
    run.p99_ms = quantile(0.99);
    Ok(run)
}

/// One client's part of [`closed_loop`].
struct ClientRun {
    latencies: Vec<f64>,
    acknowledged: Vec<(usize, u64)>,
    acked_at: Vec<Instant>,
    committed_answer_lost: usize,
}

async fn client_loop(
    client: usize,
    servers: &[(SocketAddr, Arc<rustls::ClientConfig>)],
    calls: Vec<Call>,
    acked: Option<Arc<AtomicUsize>>,
) -> Result<ClientRun> {
    let mut node = client % servers.len();
    let mut sender = None;
    let mut run = ClientRun {
        latencies: Vec::with_capacity(calls.len()),
        acknowledged: Vec::new(),
        acked_at: Vec::new(),
        committed_answer_lost: 0,
    };
    for call in calls {
        let began = Instant::now();
        let mut resent = false;
        let mut tries = 0;
        let (status, body) = loop {
            tries += 1;
            if tries > 20 {
                return Err(Error::BenchFailed(format!(
                    "client {client}: no node answered {} after 20 tries",
                    call.path
                )));
            }
            if sender.is_none() {
                match connect(servers[node].0, servers[node].1.clone()).await {
                    Ok(s) => sender = Some(s),
                    Err(_) => {
                        node = (node + 1) % servers.len();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
            let Some(s) = sender.as_mut() else { continue };
            match send_raw(s, call.path, call.bearer.as_deref(), call.body.clone()).await {
                // The writer died with it behind a forwarding node: it may have been done.
                Ok((hyper::StatusCode::BAD_GATEWAY, _, _)) => resent = true,
                // No writer yet (a takeover), or a bound reached: as its Retry-After says.
                Ok((hyper::StatusCode::SERVICE_UNAVAILABLE, _, _)) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok((status, _, body)) => break (status, body),
                Err(_) => {
                    // The node died: the next one, and the same call again.
                    sender = None;
                    node = (node + 1) % servers.len();
                    resent = true;
                }
            }
        };
        let ms = began.elapsed().as_secs_f64() * 1e3;
        let lost_answer = resent
            && status == hyper::StatusCode::CONFLICT
            && String::from_utf8_lossy(&body).contains("order_exists");
        if !status.is_success() && !lost_answer {
            return Err(Error::BenchFailed(format!(
                "client {client}: {} answered {status}: {}",
                call.path,
                String::from_utf8_lossy(&body[..body.len().min(300)])
            )));
        }
        run.latencies.push(ms);
        if call.path == "/v1/intents" {
            run.acknowledged.push((client, call.nonce));
            run.acked_at.push(Instant::now());
            run.committed_answer_lost += usize::from(lost_answer);
            if let Some(acked) = &acked {
                acked.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    Ok(run)
}
