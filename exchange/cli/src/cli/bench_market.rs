//! `cx bench market`: the running market on loopback, measured end to end — and the seeds'
//! central claim measured on it: the same arrivals cleared `residency_aware` and
//! `cheapest_capable`, side by side in one run.
//!
//! Each policy gets its own `cx devnet --no-traffic` (separate processes: two chains, the
//! committee, the exchange, the providers on a small generated model with 50 adapters, an idle
//! agent whose session key the bench uses). The bench sends the same seeded arrivals to each —
//! OpenAI-door chats, Zipf-popular adapters, a few at a time — and reads what happened from the
//! exchange's job events (assigned → running → done) and the providers' logs (cold adapter
//! fetches and their measured time). Then it settles the tab and times the batch.
//!
//! Latency is split per job: clearing (the door, clearing and the hold: the call's time less
//! what the job's events span), dispatch (assigned → a provider took it), inference (running →
//! done, or its own result when it is replicated), verification (verifying → done: the runs on
//! other providers agreeing, T1 class D and T3; 0 for T0), and settlement
//! amortised (the tab's batch from close to on-chain, over the jobs it paid).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cx_client::{AgentKeys, Client, Credential};
use cx_exchange::clearing::Policy;
use rand::SeedableRng;
use rand::distributions::{Distribution, WeightedIndex};
use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use serde_json::json;

/// `cx bench market`'s flags.
#[derive(Debug, clap::Args)]
pub(crate) struct MarketArgs {
    /// Chats sent under each policy (the same seeded arrivals).
    #[arg(long, default_value_t = 60)]
    jobs: usize,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Providers in each market.
    #[arg(long, default_value_t = 3)]
    providers: u16,
    /// Seconds each call has to be answered (its deadline).
    #[arg(long, default_value_t = 10)]
    deadline_s: u64,
    /// Fixes the arrivals.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Added to every devnet port (the second market uses this + 100).
    #[arg(long, default_value_t = 30_000)]
    port_offset: u16,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

/// One policy's figures.
#[derive(Debug, Serialize)]
struct Run {
    policy: &'static str,
    jobs: usize,
    completed: usize,
    deadline_hit_rate: f64,
    jobs_per_s: f64,
    mean_cost_wei: f64,
    p50_ms: f64,
    p99_ms: f64,
    clearing_p50_ms: f64,
    dispatch_p50_ms: f64,
    inference_p50_ms: f64,
    verification_p50_ms: f64,
    settlement_amortised_ms: f64,
    cold_fetches: usize,
    cold_fetch_ms_total: u64,
    cold_fetch_ms_mean: f64,
}

/// Zipf exponent of adapter popularity (as the devnet's traffic).
const ZIPF_S: f64 = 1.1;

pub(crate) fn run(args: MarketArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=10_000).contains(&args.jobs),
        "--jobs must be within 1..=10000"
    );
    anyhow::ensure!(
        (1..=64).contains(&args.concurrency),
        "--concurrency must be within 1..=64"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut runs = Vec::new();
    for (i, policy) in [Policy::ResidencyAware, Policy::CheapestCapable]
        .into_iter()
        .enumerate()
    {
        let offset = args.port_offset + 100 * i as u16;
        runs.push(runtime.block_on(measure(&args, policy, offset))?);
    }
    let (ours, cheapest) = (&runs[0], &runs[1]);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let table = format!(
        "cx bench market: {} chats per policy, {} at a time, {} providers, deadline {} s\n\
         {:<18} {:>8} {:>9} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9}\n{}{}\
         residency_aware / cheapest_capable: deadline hits ×{:.2}, mean cost ×{:.2}, cold \
         fetches ×{:.2}, p50 ×{:.2}\n\
         (verification: its own result until its replicas agreed, 0 for T0; settlement is the \
         tab's batch, close to on chain, over its jobs)\n",
        args.jobs,
        args.concurrency,
        args.providers,
        args.deadline_s,
        "policy",
        "jobs/s",
        "hit rate",
        "cost wei",
        "p50 ms",
        "p99 ms",
        "clear ms",
        "disp ms",
        "infer ms",
        "settle ms",
        "cold",
        "cold ms",
        row(ours),
        row(cheapest),
        ratio(ours.deadline_hit_rate, cheapest.deadline_hit_rate),
        ratio(ours.mean_cost_wei, cheapest.mean_cost_wei),
        ratio(ours.cold_fetches as f64, cheapest.cold_fetches as f64),
        ratio(ours.p50_ms, cheapest.p50_ms),
    );
    let summary = json!({
        "runs": runs,
        "residency_over_cheapest": {
            "deadline_hit_rate": ratio(ours.deadline_hit_rate, cheapest.deadline_hit_rate),
            "mean_cost": ratio(ours.mean_cost_wei, cheapest.mean_cost_wei),
            "cold_fetches": ratio(ours.cold_fetches as f64, cheapest.cold_fetches as f64),
            "p50": ratio(ours.p50_ms, cheapest.p50_ms),
        },
    });
    super::emit(args.json, &table, &summary)
}

fn row(r: &Run) -> String {
    format!(
        "{:<18} {:>8.2} {:>9.3} {:>10.0} {:>8.1} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6} {:>9}\n",
        r.policy,
        r.jobs_per_s,
        r.deadline_hit_rate,
        r.mean_cost_wei,
        r.p50_ms,
        r.p99_ms,
        r.clearing_p50_ms,
        r.dispatch_p50_ms,
        r.inference_p50_ms,
        r.settlement_amortised_ms,
        r.cold_fetches,
        r.cold_fetch_ms_total
    )
}

/// A devnet child, stopped (SIGINT, then killed) on drop.
struct Devnet(Child);

impl Drop for Devnet {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        for _ in 0..100 {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One policy: its own devnet, the arrivals, the figures.
async fn measure(args: &MarketArgs, policy: Policy, offset: u16) -> anyhow::Result<Run> {
    let dir = std::env::temp_dir().join(format!(
        "cx-bench-market-{}-{}",
        std::process::id(),
        policy.as_str()
    ));
    let database = format!(
        "{}_bench_{}",
        cx_exchange_server::books::database_url(),
        policy.as_str()
    );
    let exe = std::env::current_exe().context("the running cx")?;
    let mut child = Command::new(&exe)
        .args(["devnet", "--no-traffic", "--agents", "1"])
        .args(["--providers", &args.providers.to_string()])
        .args(["--port-offset", &offset.to_string()])
        .args(["--clearing", policy.as_str()])
        .arg("--dir")
        .arg(&dir)
        .env("DATABASE_URL", &database)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting cx devnet")?;
    let stdout = child.stdout.take().context("the devnet's output")?;
    let devnet = Devnet(child);
    let (up_send, up) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut up_send = Some(up_send);
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("the market is up")
                && let Some(s) = up_send.take()
            {
                let _ = s.send(());
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(240), up)
        .await
        .context("the devnet did not come up in 240 s")?
        .context("the devnet exited while starting")?;

    let url = format!("https://127.0.0.1:{}", 8443 + offset);
    let client = Arc::new(
        Client::new(&url, Some(&dir.join("ca/ca.pem")))?.with_timeout(Duration::from_secs(60)),
    );
    let api_key = std::fs::read_to_string(dir.join("try-session.key"))?;
    let adapters = adapter_ids(&dir.join("adapters"))?;
    let model = "tiny-llama";

    // The same arrivals under each policy: adapters by Zipf popularity, short prompts.
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let weights: Vec<f64> = (1..=adapters.len())
        .map(|k| 1.0 / (k as f64).powf(ZIPF_S))
        .collect();
    let popularity = WeightedIndex::new(&weights).context("adapter popularity")?;
    let arrivals: Vec<serde_json::Value> = (0..args.jobs)
        .map(|i| {
            json!({
                "model": model,
                "messages": [{"role": "user", "content": format!("Request {i}: say hello.")}],
                "max_tokens": 8,
                "cx": {
                    "adapter_id": format!("0x{}", adapters[popularity.sample(&mut rng)]),
                    "deadline_in_s": args.deadline_s,
                },
            })
        })
        .collect();

    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(args.concurrency));
    let mut calls = tokio::task::JoinSet::new();
    for body in arrivals {
        let (client, api_key, gate) = (client.clone(), api_key.clone(), gate.clone());
        calls.spawn(async move {
            let _slot = gate.acquire_owned().await;
            let sent = Instant::now();
            let answer = client.chat(api_key.trim(), &body).await;
            (sent.elapsed(), answer)
        });
    }
    let mut done = Vec::new();
    let mut missed = 0usize;
    while let Some(joined) = calls.join_next().await {
        let (took, answer) = joined?;
        match answer {
            Ok(completion) => {
                let id = completion["cx"]["job_id"]
                    .as_str()
                    .and_then(|id| id.parse().ok())
                    .context("a completion without cx.job_id")?;
                done.push((took, id));
            }
            Err(_) => missed += 1,
        }
    }
    let wall = started.elapsed();

    // The split, from each job's events.
    let mut total = Vec::new();
    let (mut clearing, mut dispatch, mut inference) = (Vec::new(), Vec::new(), Vec::new());
    let mut verification = Vec::new();
    let mut cost = 0f64;
    let mut tab = None;
    // The chats' jobs are the session's account's: read them with its key.
    let reader =
        Client::clone(&client).with_credential(Credential::Session(api_key.trim().to_owned()));
    for (took, id) in &done {
        let job = reader.job(*id).await?;
        tab = Some((job.chain_id, job.escrow_id));
        let at = |status: &str| {
            job.events
                .iter()
                .find(|e| e.status == status)
                .map(|e| e.at_ms)
        };
        // A job ends with its `done` event (T0), or with `verified` once its replicas agreed
        // (T1, T3: verifying → verified, with no `done` event of its own).
        let (Some(assigned), Some(running), Some(finished)) = (
            at("assigned"),
            at("running"),
            at("done").or_else(|| at("verified")),
        ) else {
            continue;
        };
        let took_ms = took.as_secs_f64() * 1e3;
        total.push(took_ms);
        clearing.push((took_ms - (finished - assigned) as f64).max(0.0));
        dispatch.push((running - assigned) as f64);
        // A replicated job (T1 class D, T3) waits in `verifying` for its runs to agree.
        let answered = at("verifying").unwrap_or(finished);
        inference.push((answered - running) as f64);
        verification.push((finished - answered) as f64);
        cost += job.held_wei as f64;
    }

    // Settlement: the tab closes now; its batch lands.
    let keys = AgentKeys::load(&dir.join("agents/try.json"))?;
    let mut settlement_ms = 0.0;
    if let Some((chain_id, tab_id)) = tab {
        let chain = client
            .chains()
            .await?
            .into_iter()
            .find(|c| c.chain_id == chain_id)
            .context("the tab's chain")?;
        let closed = Instant::now();
        client
            .close_tab(&keys, chain.chain_id, chain.verifying_contract, tab_id)
            .await?;
        loop {
            let tab = client.tab(chain.chain_id, tab_id).await?;
            if tab.status == "settled" {
                break;
            }
            if closed.elapsed() > Duration::from_secs(120) {
                bail!("tab {tab_id} did not settle in 120 s ({})", tab.status);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        settlement_ms = closed.elapsed().as_secs_f64() * 1e3 / done.len().max(1) as f64;
    }

    let (cold_fetches, cold_fetch_ms_total) = cold_fetches(&dir.join("providers"));
    drop(devnet);
    let _ = std::fs::remove_dir_all(&dir);
    let completed = done.len();
    Ok(Run {
        policy: policy.as_str(),
        jobs: args.jobs,
        completed,
        deadline_hit_rate: completed as f64 / (completed + missed).max(1) as f64,
        jobs_per_s: completed as f64 / wall.as_secs_f64(),
        mean_cost_wei: cost / total.len().max(1) as f64,
        p50_ms: percentile(&mut total.clone(), 0.50),
        p99_ms: percentile(&mut total, 0.99),
        clearing_p50_ms: percentile(&mut clearing, 0.50),
        dispatch_p50_ms: percentile(&mut dispatch, 0.50),
        inference_p50_ms: percentile(&mut inference, 0.50),
        verification_p50_ms: percentile(&mut verification, 0.50),
        settlement_amortised_ms: settlement_ms,
        cold_fetches,
        cold_fetch_ms_total,
        cold_fetch_ms_mean: cold_fetch_ms_total as f64 / cold_fetches.max(1) as f64,
    })
}

fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

/// The content ids of the devnet's adapters (as the exchange stores them).
fn adapter_ids(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("{}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|d| {
            let config = std::fs::read(d.join("adapter_config.json"))?;
            let weights = std::fs::read(d.join("adapter_model.safetensors"))?;
            Ok(cx_protocol::content_id(&[
                ("adapter_config.json", &config),
                ("adapter_model.safetensors", &weights),
            ]))
        })
        .collect()
}

/// Cold adapter fetches the providers logged (`adapter …: fetched and loaded in N ms`) and
/// their total time.
fn cold_fetches(providers: &Path) -> (usize, u64) {
    let mut count = 0;
    let mut ms = 0;
    for entry in std::fs::read_dir(providers).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            if let Some(rest) = line.split("fetched and loaded in ").nth(1)
                && let Some(n) = rest.split(' ').next().and_then(|n| n.parse::<u64>().ok())
            {
                count += 1;
                ms += n;
            }
        }
    }
    (count, ms)
}
