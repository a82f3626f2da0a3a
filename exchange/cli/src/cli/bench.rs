//! `cx bench …`: benchmarks that print a table and, with `--json`, one JSON object last.

use anyhow::Context;
use cx_exchange::bench::{ClearingBenchConfig, run_clearing};
use cx_exchange::pricing::bench::{PricingBenchConfig, run_pricing_bench};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// The indexed engine against a full scan, same fleet and intents, one core.
    Clearing(ClearingArgs),
    /// Quotes per second, tenant tables, router regret, and the market maker against a fixed
    /// price under regime shifts.
    Pricing(PricingArgs),
    /// Gas of FROST verification, settlement per job and a claim, with real transactions on a
    /// fresh Anvil.
    Gas(GasArgs),
    /// Handshake, DKG and signing latency of a committee of real `cx-signer` processes on
    /// loopback, the batch posted to a fresh Anvil.
    Sign(SignArgs),
    /// Signed intents over HTTPS through verify → persist → clear on a throwaway database,
    /// beside the signature and database bounds.
    Intake(IntakeArgs),
    /// `cx bench intake`'s load generator, which it runs as a process of its own.
    #[command(hide = true)]
    IntakeLoad(IntakeLoadArgs),
    /// The exchange as a cluster of `cx serve` nodes on one database: intake and door at 1 and
    /// 2 nodes side by side, then the writer SIGKILLed under load (takeover time, orders lost).
    Cluster(ClusterArgs),
    /// Open-loop load on intake or the OpenAI-compatible door, default rate limits on: the
    /// rate where p99 first exceeds the target, 1×, 2× and 4× past it, and an optional soak.
    Load(LoadArgs),
    /// Routing by task on live traffic: `task:code` door calls through a regime shift (the
    /// coder's provider stalls, then recovers), each router policy (efe, linucb, each arm fixed)
    /// on its own exchange, regret against the best fixed arm from the meter.
    Router(RouterArgs),
    /// The running market (a `cx devnet` per policy) end to end: jobs/s and latency split into
    /// clearing, dispatch, inference, verification and settlement, and the same arrivals
    /// cleared residency-aware and cheapest-capable side by side.
    Market(super::bench_market::MarketArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct RouterArgs {
    /// Door calls a second (open loop).
    #[arg(long, default_value_t = 4.0)]
    rate: f64,
    /// Seconds of each phase (calm, shift, calm).
    #[arg(long, default_value_t = 20)]
    phase_s: u64,
    /// Each call's deadline, seconds.
    #[arg(long, default_value_t = 2)]
    deadline_s: u64,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct IntakeArgs {
    /// Intents posted over HTTPS.
    #[arg(long, default_value_t = 4_000)]
    intents: usize,
    /// Concurrent clients, each on its own keep-alive connection.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Bundles in the market.
    #[arg(long, default_value_t = 200)]
    bundles: usize,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct IntakeLoadArgs {
    /// The exchange's address.
    #[arg(long)]
    address: std::net::SocketAddr,
    /// The certificate authority to trust (PEM).
    #[arg(long)]
    ca: std::path::PathBuf,
    /// The signed bodies, one a line as `CLIENT<TAB>BODY`.
    #[arg(long)]
    bodies: std::path::PathBuf,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ClusterArgs {
    /// Signed intents in each phase and in the failover.
    #[arg(long, default_value_t = 2_000)]
    intents: usize,
    /// Door calls in each phase.
    #[arg(long, default_value_t = 600)]
    calls: usize,
    /// Concurrent clients, each on its own keep-alive connection and account, spread over
    /// the nodes.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct LoadArgs {
    /// What is loaded.
    #[arg(long, value_enum, default_value = "intake")]
    target: cx_devnet::bench::load::Target,
    /// Agents, each its own account and tab (and session key for the door).
    #[arg(long, default_value_t = 64)]
    agents: usize,
    /// Keep-alive HTTPS connections the requests share.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Seconds at each rate.
    #[arg(long, default_value_t = 5.0)]
    step_s: f64,
    /// The first rate of the ladder, requests a second (each step ×√2).
    #[arg(long, default_value_t = 50.0)]
    start_rate: f64,
    /// The highest rate the ladder tries.
    #[arg(long, default_value_t = 20_000.0)]
    max_rate: f64,
    /// The p99 whose first excess is the knee, ms.
    #[arg(long, default_value_t = 50.0)]
    p99_ms: f64,
    /// Seconds held at half the knee afterwards, sampling memory and database size.
    #[arg(long, default_value_t = 0)]
    soak_s: u64,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct GasArgs {
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct SignArgs {
    /// Signers.
    #[arg(long, default_value_t = 5)]
    n: u16,
    /// Threshold.
    #[arg(long, default_value_t = 3)]
    t: u16,
    /// Signing rounds to measure of each kind (vouchers checked ahead, and not), each a fresh
    /// batch posted on chain.
    #[arg(long, default_value_t = 50)]
    rounds: usize,
    /// Receipts in the signed batch.
    #[arg(long, default_value_t = 8)]
    receipts: usize,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct PricingArgs {
    /// Fixes every synthetic trace.
    #[arg(long, default_value_t = PricingBenchConfig::default().seed)]
    seed: u64,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ClearingArgs {
    /// Live bundles.
    #[arg(long, default_value_t = 10_000)]
    bundles: usize,
    /// Intents through the engine.
    #[arg(long, default_value_t = 200_000)]
    intents: usize,
    /// Of those, how many also go through the full scan.
    #[arg(long, default_value_t = 2_000)]
    scan_intents: usize,
    /// Fixes fleet and intents.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Market(a) => super::bench_market::run(a),
        Command::Intake(a) => {
            anyhow::ensure!(
                (1..=1_000_000).contains(&a.intents),
                "--intents: must be within 1..=1000000"
            );
            anyhow::ensure!(
                (1..=512).contains(&a.clients),
                "--clients: must be within 1..=512"
            );
            anyhow::ensure!(
                (1..=100_000).contains(&a.bundles),
                "--bundles: must be within 1..=100000"
            );
            // Each client posts on one tab; a tab takes 400 jobs (one settlement batch) and each
            // T1 intent holds two (its run and a replica).
            anyhow::ensure!(
                a.intents <= 200 * a.clients,
                "--intents: at most {} with --clients {} (200 a client: each T1 intent holds a \
                 replica run, and a client's tab takes 400 jobs)",
                200 * a.clients,
                a.clients
            );
            let load_bin =
                std::env::current_exe().context("the cx binary the load runs (its own path)")?;
            let report = multi_thread_runtime()?
                .block_on(cx_devnet::bench::intake_bench(
                    cx_devnet::bench::IntakeBenchConfig {
                        intents: a.intents,
                        clients: a.clients,
                        bundles: a.bundles,
                        load_bin,
                    },
                ))
                .context("intake bench")?;
            super::emit(a.json, &report.table(), &report)
        }
        Command::IntakeLoad(a) => {
            let outcome = multi_thread_runtime()?
                .block_on(cx_devnet::bench::intake_load(a.address, &a.ca, &a.bodies))
                .context("intake load")?;
            println!("{}", serde_json::to_string(&outcome)?);
            Ok(())
        }
        Command::Cluster(a) => {
            // A tab holds at most 400 jobs (one settlement batch): each client's share of a
            // phase must fit one.
            anyhow::ensure!(
                (1..=64).contains(&a.clients),
                "--clients: must be within 1..=64"
            );
            anyhow::ensure!(
                (1..=400 * a.clients).contains(&a.intents),
                "--intents: must be within 1..={} (400 a client)",
                400 * a.clients
            );
            anyhow::ensure!(
                (1..=200 * a.clients).contains(&a.calls),
                "--calls: must be within 1..={} (200 a client)",
                200 * a.clients
            );
            let exchange_bin =
                std::env::current_exe().context("the cx binary the nodes run (its own path)")?;
            let report = multi_thread_runtime()?
                .block_on(cx_devnet::bench::cluster_bench(
                    cx_devnet::bench::ClusterBenchConfig {
                        intents: a.intents,
                        calls: a.calls,
                        clients: a.clients,
                        exchange_bin,
                    },
                ))
                .context("cluster bench")?;
            super::emit(a.json, &report.table(), &report)
        }
        Command::Load(a) => {
            // Bounded so a typo is a one-line error, not a run that floods the machine: the
            // generator signs every intent of a step ahead and holds its latencies.
            anyhow::ensure!(
                (1..=4_096).contains(&a.agents),
                "--agents: must be within 1..=4096"
            );
            anyhow::ensure!(
                (1..=512).contains(&a.connections),
                "--connections: must be within 1..=512"
            );
            anyhow::ensure!(
                (0.1..=600.0).contains(&a.step_s),
                "--step-s: must be within 0.1..=600"
            );
            anyhow::ensure!(
                a.start_rate >= 1.0 && a.start_rate <= a.max_rate && a.max_rate <= 100_000.0,
                "--start-rate, --max-rate: need 1 <= start <= max <= 100000"
            );
            anyhow::ensure!(a.p99_ms > 0.0, "--p99-ms: must be > 0");
            anyhow::ensure!(a.soak_s <= 86_400, "--soak-s: must be at most 86400");
            // The server's own warnings and internal errors (each one a finding of the run)
            // go to stderr; stdout stays the table and the JSON line.
            let _ = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_writer(std::io::stderr)
                .try_init();
            let report = multi_thread_runtime()?
                .block_on(cx_devnet::bench::load_bench(cx_devnet::bench::LoadConfig {
                    target: a.target,
                    agents: a.agents,
                    connections: a.connections,
                    step_s: a.step_s,
                    start_rate: a.start_rate,
                    max_rate: a.max_rate,
                    p99_target_ms: a.p99_ms,
                    soak_s: a.soak_s,
                    ..cx_devnet::bench::LoadConfig::default()
                }))
                .context("load bench")?;
            super::emit(a.json, &report.table(), &report)
        }
        Command::Router(a) => {
            anyhow::ensure!(
                a.rate > 0.0 && a.rate <= 50.0,
                "--rate: must be within (0, 50]"
            );
            anyhow::ensure!(
                (1..=3_600).contains(&a.phase_s),
                "--phase-s: must be within 1..=3600"
            );
            anyhow::ensure!(
                (1..=60).contains(&a.deadline_s),
                "--deadline-s: must be within 1..=60"
            );
            let _ = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_writer(std::io::stderr)
                .try_init();
            let report = multi_thread_runtime()?
                .block_on(cx_devnet::bench::router_bench(
                    cx_devnet::bench::RouterBenchConfig {
                        rate_per_s: a.rate,
                        phase_s: a.phase_s,
                        deadline_s: a.deadline_s,
                    },
                ))
                .context("router bench")?;
            super::emit(a.json, &report.table(), &report)
        }
        Command::Gas(a) => {
            let report = runtime()?
                .block_on(cx_devnet::bench::gas_bench())
                .context("gas bench")?;
            super::emit(a.json, &report.table(), &report)
        }
        Command::Sign(a) => {
            anyhow::ensure!(a.t >= 1 && a.t <= a.n, "--t: must be within 1..=--n");
            anyhow::ensure!(a.rounds > 0, "--rounds: must be > 0");
            let binary = cx_devnet::signer_binary()?;
            let report = runtime()?
                .block_on(cx_devnet::bench::sign_bench(
                    &binary, a.n, a.t, a.rounds, a.receipts,
                ))
                .context("sign bench")?;
            super::emit(a.json, &report.table(), &report)
        }
        Command::Pricing(a) => {
            let report = run_pricing_bench(&PricingBenchConfig {
                seed: a.seed,
                ..PricingBenchConfig::default()
            })?;
            super::emit(a.json, &report.table(), &report)
        }
        Command::Clearing(a) => {
            // Bounded so a huge value is a one-line error, not an allocation that aborts: the
            // bench holds the fleet, every intent and every latency in memory.
            anyhow::ensure!(
                (1..=1_000_000).contains(&a.bundles),
                "--bundles: must be within 1..=1000000"
            );
            anyhow::ensure!(
                (1..=10_000_000).contains(&a.intents),
                "--intents: must be within 1..=10000000"
            );
            anyhow::ensure!(
                a.scan_intents <= a.intents,
                "--scan-intents: must be at most --intents ({})",
                a.intents
            );
            let r = run_clearing(&ClearingBenchConfig {
                bundles: a.bundles,
                intents: a.intents,
                scan_intents: a.scan_intents.max(1),
                seed: a.seed,
            });
            let table = format!(
                "clearing: {} bundles, {} intents (scan on {})\n  {:<22}{:>14.0}\n  {:<22}{:>14.2}\n  {:<22}{:>14.2}\n  {:<22}{:>14.0}\n  {:<22}{:>14.1}\n  {:<22}{:>14.0}\n  {:<22}{:>14.1}  bound: 1 (the chosen bundle judged)\n  {:<22}{:>14}\n  {:<22}{:>14}\n",
                r.bundles,
                r.intents,
                r.scan_intents,
                "intents_per_s",
                r.intents_per_s,
                "p50_us",
                r.p50_us,
                "p99_us",
                r.p99_us,
                "scan_intents_per_s",
                r.scan_intents_per_s,
                "speedup_vs_scan",
                r.speedup_vs_scan,
                "scan_bundles_per_s",
                r.scan_bundles_per_s,
                "clear_cost_in_bundles",
                r.clear_cost_in_bundles,
                "disagreements",
                r.disagreements,
                "unfilled",
                r.unfilled,
            );
            super::emit(a.json, &table, &r)
        }
    }
}

/// The benches over real processes and chains are asynchronous; the rest of `cx` is not, so
/// they get a runtime of their own.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The intake and load benches run a server and its load generator: they want every core.
fn multi_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}
