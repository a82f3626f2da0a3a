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
//! Then, on the residency-aware market, a **load step**: open-loop market orders (`cx.max_price_wei:
//! "market"`, T0, `--step-max-tokens` each, on the try agent's second tab) at `--step-rate`
//! calls/s, ×4 for `--step-s` seconds, then back; `GET /v1/market` sampled every second. It reports how many sweeps (one observation each) the market maker took to
//! leave its regime after the step began and to return after it ended, the quote's ask before,
//! at its peak and after, and whether every filled order went to a bundle asking at most the
//! quote its decision recorded.
//!
//! With `--bases 2|3` the bases are in play too (`cx devnet --bases`): each provider serves one
//! base and stores the others, with room for one beside its own; calls pick a base by Zipf
//! popularity, and each run reports the bases the providers loaded for a job (β = 0) and the
//! time the loads took, from the providers' logs, beside the adapter fetches.
//!
//! Each run also reports how its jobs spread over the bundles (the busiest bundle's share): with
//! no queueing term in t̂, residency-aware clearing sent an agent's every call to the provider
//! holding its adapter, a hot spot.
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
    /// Calls per second before and after the load step (×4 during it); 0 skips the step.
    #[arg(long, default_value_t = 1.0)]
    step_rate: f64,
    /// Seconds the load step lasts (20 s of the base rate before it, as long after it).
    #[arg(long, default_value_t = 40)]
    step_s: u64,
    /// Tokens each of the step's calls generates: long enough that a few calls a second load
    /// the fleet (a tab takes a bounded number of jobs, so the step cannot send thousands).
    #[arg(long, default_value_t = 256)]
    step_max_tokens: u32,
    /// Bases on each market (1 to 3, `cx devnet --bases`): calls pick one by Zipf popularity
    /// (the first's calls carry its adapters, the others' none); providers serve one each and
    /// load the others from their stores.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    bases: u8,
    /// The tier every call asks for (`cx.tier`) [default: the session's, T1 on the devnet:
    /// each call also runs on a second provider]. T0 leaves replicas out, and with them the
    /// loads a replica on a provider without the base causes.
    #[arg(long, value_parser = ["T0", "T1", "T3"])]
    tier: Option<String>,
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
    /// Bases the providers loaded from their stores for a job (β = 0), and the time it took.
    base_fetches: usize,
    base_fetch_ms_total: u64,
    /// Calls per base, in the order of the devnet's bases.
    calls_per_base: Vec<usize>,
    /// The calls not answered, by the exchange's error code (`transport` when none came back).
    failed: std::collections::BTreeMap<String, usize>,
    /// The share of the jobs (replicas included) that went to the busiest bundle.
    busiest_bundle_share: f64,
    /// The load step (the residency-aware market only).
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<Step>,
}

/// The market maker under a load step.
#[derive(Debug, Serialize)]
struct Step {
    /// The market sampled: the model and the tier the calls cleared at.
    model: String,
    tier: String,
    rate_per_s: f64,
    step_rate_per_s: f64,
    before_s: u64,
    step_s: u64,
    after_s: u64,
    calls: usize,
    filled: usize,
    /// The calls not filled, by the exchange's error code (`transport` when none came back).
    refused: std::collections::BTreeMap<String, usize>,
    /// Filled calls whose decision recorded a market quote and whose bundle asked at most its ask.
    filled_at_quote: usize,
    /// The regime when the step began, the highest during it, and at the end.
    regime_at_step: String,
    regime_peak: String,
    regime_at_end: String,
    /// Sweeps from the step's start until the regime rose above the one it began in.
    rose_after_sweeps: Option<u64>,
    /// Sweeps from the step's end until the regime fell back to the one it began in (or calmer).
    fell_after_sweeps: Option<u64>,
    /// The quote's ask, wei per compute-second: the median before the step, the highest during
    /// it, and the last sample.
    ask_before_wei_per_s: u64,
    ask_peak_wei_per_s: u64,
    ask_end_wei_per_s: u64,
    /// Every sample: seconds since the first, regime, ask.
    trace: Vec<(f64, String, u64)>,
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
        "cx bench market: {} chats per policy, {} at a time, {} providers, {} bases, tier {}, deadline {} s\n\
         {:<18} {:>8} {:>9} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>6} {:>9} {:>8}\n{}{}\
         residency_aware / cheapest_capable: deadline hits ×{:.2}, mean cost ×{:.2}, cold \
         fetches ×{:.2}, base fetches ×{:.2}, p50 ×{:.2}\n\
         (verification: its own result until its replicas agreed, 0 for T0; settlement is the \
         tab's batch, close to on chain, over its jobs; busiest: the busiest bundle's share of \
         the jobs)\n{}",
        args.jobs,
        args.concurrency,
        args.providers,
        args.bases,
        args.tier.as_deref().unwrap_or("the session's"),
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
        "bases",
        "bases ms",
        "busiest",
        row(ours),
        row(cheapest),
        ratio(ours.deadline_hit_rate, cheapest.deadline_hit_rate),
        ratio(ours.mean_cost_wei, cheapest.mean_cost_wei),
        ratio(ours.cold_fetches as f64, cheapest.cold_fetches as f64),
        ratio(ours.base_fetches as f64, cheapest.base_fetches as f64),
        ratio(ours.p50_ms, cheapest.p50_ms),
        ours.step.as_ref().map(step_table).unwrap_or_default(),
    );
    let summary = json!({
        "runs": runs,
        "residency_over_cheapest": {
            "deadline_hit_rate": ratio(ours.deadline_hit_rate, cheapest.deadline_hit_rate),
            "mean_cost": ratio(ours.mean_cost_wei, cheapest.mean_cost_wei),
            "cold_fetches": ratio(ours.cold_fetches as f64, cheapest.cold_fetches as f64),
            "base_fetches": ratio(ours.base_fetches as f64, cheapest.base_fetches as f64),
            "p50": ratio(ours.p50_ms, cheapest.p50_ms),
        },
    });
    super::emit(args.json, &table, &summary)
}

fn step_table(s: &Step) -> String {
    let sweeps = |n: Option<u64>| n.map_or("never".to_owned(), |n| format!("{n} sweeps"));
    format!(
        "load step on {}/{}: {:.1} calls/s, ×4 for {} s, then {:.1}/s for {} s: {} market orders, \
         {} filled ({} at or under their quote), refused {:?}\n\
         regime {} at the step, {} at its peak (rose after {}), {} at the end (fell back after \
         {}); ask {} → peak {} → {} wei/s\n",
        s.model,
        s.tier,
        s.rate_per_s,
        s.step_s,
        s.rate_per_s,
        s.after_s,
        s.calls,
        s.filled,
        s.filled_at_quote,
        s.refused,
        s.regime_at_step,
        s.regime_peak,
        sweeps(s.rose_after_sweeps),
        s.regime_at_end,
        sweeps(s.fell_after_sweeps),
        s.ask_before_wei_per_s,
        s.ask_peak_wei_per_s,
        s.ask_end_wei_per_s,
    )
}

fn row(r: &Run) -> String {
    format!(
        "{:<18} {:>8.2} {:>9.3} {:>10.0} {:>8.1} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6} {:>9} {:>6} {:>9} {:>8.2}\n",
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
        r.cold_fetch_ms_total,
        r.base_fetches,
        r.base_fetch_ms_total,
        r.busiest_bundle_share
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
        .args(["--bases", &args.bases.to_string()])
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
    let model = cx_devnet::harness::MODEL;
    let bases: Vec<&str> = std::iter::once(model)
        .chain(cx_devnet::devnet::EXTRA_BASES.iter().map(|(name, _)| *name))
        .take(usize::from(args.bases))
        .collect();

    // The same arrivals under each policy: bases and adapters by Zipf popularity, short
    // prompts. The adapters are the first base's; the other bases' calls carry none.
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let zipf = |n: usize| -> Vec<f64> { (1..=n).map(|k| 1.0 / (k as f64).powf(ZIPF_S)).collect() };
    let popularity = WeightedIndex::new(zipf(adapters.len())).context("adapter popularity")?;
    let base_popularity = WeightedIndex::new(zipf(bases.len())).context("base popularity")?;
    let mut calls_per_base = vec![0; bases.len()];
    let arrivals: Vec<serde_json::Value> = (0..args.jobs)
        .map(|i| {
            let base = base_popularity.sample(&mut rng);
            calls_per_base[base] += 1;
            let adapter = popularity.sample(&mut rng);
            let mut cx = json!({"deadline_in_s": args.deadline_s});
            if let Some(tier) = &args.tier {
                cx["tier"] = json!(tier);
            }
            if base == 0 {
                cx["adapter_id"] = json!(format!("0x{}", adapters[adapter]));
            }
            json!({
                "model": bases[base],
                "messages": [{"role": "user", "content": format!("Request {i}: say hello.")}],
                "max_tokens": 8,
                "cx": cx,
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
    let mut failed: std::collections::BTreeMap<String, usize> = Default::default();
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
            Err(e) => {
                missed += 1;
                *failed
                    .entry(e.code().unwrap_or("transport").to_owned())
                    .or_default() += 1;
                eprintln!("cx bench market: a {} call failed: {e}", policy.as_str());
            }
        }
    }
    let wall = started.elapsed();

    // The split, from each job's events.
    let mut total = Vec::new();
    let (mut clearing, mut dispatch, mut inference) = (Vec::new(), Vec::new(), Vec::new());
    let mut verification = Vec::new();
    let mut cost = 0f64;
    let mut tab = None;
    let mut per_bundle: std::collections::BTreeMap<String, usize> = Default::default();
    // The chats' jobs are the session's account's: read them with its key.
    let reader =
        Client::clone(&client).with_credential(Credential::Session(api_key.trim().to_owned()));
    for (took, id) in &done {
        let job = reader.job(*id).await?;
        tab = Some((job.chain_id, job.escrow_id));
        if let Some(bundle) = &job.bundle_id {
            *per_bundle.entry(bundle.clone()).or_default() += 1;
        }
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

    let busiest_bundle_share =
        per_bundle.values().max().copied().unwrap_or(0) as f64 / done.len().max(1) as f64;
    let logs = dir.join("providers");
    let (cold_fetches, cold_fetch_ms_total) = logged_ms(&logs, "fetched and loaded in ");
    let (base_fetches, base_fetch_ms_total) = logged_ms(&logs, "): loaded in ");

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

    // The load step after the tab's settlement was timed: it takes minutes, and the tab is
    // not to sit idle meanwhile.
    let step = if policy == Policy::ResidencyAware && args.step_rate > 0.0 {
        // Its own tab (a tab takes a bounded number of jobs): the second chain's, if there is one.
        let step_key = std::fs::read_to_string(dir.join("try-session-2.key"))
            .unwrap_or_else(|_| api_key.clone());
        let step_reader =
            Client::clone(&client).with_credential(Credential::Session(step_key.trim().to_owned()));
        Some(
            load_step(
                args,
                &client,
                &step_reader,
                step_key.trim(),
                model,
                &adapters,
            )
            .await?,
        )
    } else {
        None
    };

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
        base_fetches,
        base_fetch_ms_total,
        calls_per_base,
        failed,
        busiest_bundle_share,
        step,
    })
}

/// The load step: open-loop market orders at the base rate, ×4 for `--step-s`, then the base
/// rate again; the market sampled every second.
async fn load_step(
    args: &MarketArgs,
    client: &Arc<Client>,
    reader: &Client,
    api_key: &str,
    model: &str,
    adapters: &[String],
) -> anyhow::Result<Step> {
    anyhow::ensure!(
        args.step_rate.is_finite() && args.step_rate <= 50.0,
        "--step-rate must be within 0..=50 calls/s"
    );
    anyhow::ensure!(!adapters.is_empty(), "the devnet has no adapters to call");
    let before_s = 20u64;
    let (step_s, after_s) = (args.step_s, args.step_s.max(20));
    let total_s = before_s + step_s + after_s;
    // Exponential gaps (a Poisson stream), seeded: the same schedule every run.
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed ^ 0x5eed);
    let mut schedule = Vec::new();
    let mut t = 0.0f64;
    loop {
        let in_step = t >= before_s as f64 && t < (before_s + step_s) as f64;
        let rate = if in_step {
            4.0 * args.step_rate
        } else {
            args.step_rate
        };
        let u: f64 = rand::Rng::r#gen(&mut rng);
        t += -(1.0 - u).ln() / rate;
        if t >= total_s as f64 {
            break;
        }
        schedule.push(t);
    }
    let started = tokio::time::Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for (i, at) in schedule.iter().enumerate() {
        let (client, key) = (client.clone(), api_key.to_owned());
        let body = json!({
            "model": model,
            "messages": [{"role": "user", "content": format!("Step {i}: say hello.")}],
            "max_tokens": args.step_max_tokens,
            "cx": {
                "adapter_id": format!("0x{}", adapters[i % adapters.len().clamp(1, 8)]),
                "deadline_in_s": args.deadline_s,
                "max_price_wei": "market",
                "tier": "T0",
            },
        });
        let at = started + Duration::from_secs_f64(*at);
        calls.spawn(async move {
            tokio::time::sleep_until(at).await;
            client.chat(&key, &body).await
        });
    }
    // One sample a second, until the schedule is over.
    let mut samples: Vec<(f64, Vec<cx_client::MarketQuote>)> = Vec::new();
    while started.elapsed() < Duration::from_secs(total_s) {
        let at = started.elapsed().as_secs_f64();
        if let Ok(quotes) = client.market().await {
            samples.push((at, quotes));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut filled_ids = Vec::new();
    let mut refused: std::collections::BTreeMap<String, usize> = Default::default();
    while let Some(joined) = calls.join_next().await {
        match joined? {
            Ok(completion) => {
                if let Some(id) = completion["cx"]["job_id"]
                    .as_str()
                    .and_then(|id| id.parse::<cx_protocol::order::B256>().ok())
                {
                    filled_ids.push(id);
                }
            }
            Err(e) => {
                *refused
                    .entry(e.code().unwrap_or("transport").to_owned())
                    .or_default() += 1
            }
        }
    }
    // The market the calls cleared in, and whether each went to a bundle within its quote.
    let asks: std::collections::HashMap<String, u64> = client
        .providers()
        .await?
        .into_iter()
        .map(|b| (b.id, b.price_wei_per_s))
        .collect();
    let mut tiers: std::collections::BTreeMap<String, usize> = Default::default();
    let mut filled_at_quote = 0;
    for id in &filled_ids {
        let job = reader.job(*id).await?;
        if let Some(tier) = job.decision.tier {
            *tiers.entry(tier.to_string()).or_default() += 1;
        }
        let within = match (&job.decision.quote, &job.bundle_id) {
            (Some(quote), Some(bundle)) => asks
                .get(bundle)
                .is_some_and(|ask| *ask <= quote.ask_wei_per_s),
            _ => false,
        };
        filled_at_quote += usize::from(within);
    }
    let tier = tiers
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(t, _)| t)
        .unwrap_or_else(|| "T0".to_owned());
    let trace: Vec<(f64, String, u64, u64)> = samples
        .iter()
        .filter_map(|(at, quotes)| {
            let q = quotes
                .iter()
                .find(|q| q.model == model && q.tier.to_string() == tier)?;
            Some((*at, q.regime.clone(), q.ask_wei_per_s, q.observations))
        })
        .collect();
    let rank = |r: &str| match r {
        "calm" => 0,
        "busy" => 1,
        _ => 2,
    };
    let (step_at, end_at) = (before_s as f64, (before_s + step_s) as f64);
    let at_step = trace.iter().rfind(|s| s.0 <= step_at).or(trace.first());
    let regime_at_step = at_step.map_or("calm".to_owned(), |s| s.1.clone());
    let start_rank = rank(&regime_at_step);
    let during = || trace.iter().filter(|s| s.0 > step_at && s.0 <= end_at);
    let peak = during().max_by_key(|s| rank(&s.1));
    let rose_after_sweeps = during()
        .find(|s| rank(&s.1) > start_rank)
        .zip(at_step)
        .map(|(s, a)| s.3.saturating_sub(a.3));
    let at_end = trace.iter().rfind(|s| s.0 <= end_at);
    let fell_after_sweeps = trace
        .iter()
        .filter(|s| s.0 > end_at)
        .find(|s| rank(&s.1) <= start_rank)
        .zip(at_end)
        .map(|(s, a)| s.3.saturating_sub(a.3));
    let mut before: Vec<u64> = trace
        .iter()
        .filter(|s| s.0 <= step_at)
        .map(|s| s.2)
        .collect();
    before.sort_unstable();
    Ok(Step {
        model: model.to_owned(),
        tier,
        rate_per_s: args.step_rate,
        step_rate_per_s: 4.0 * args.step_rate,
        before_s,
        step_s,
        after_s,
        calls: schedule.len(),
        filled: filled_ids.len(),
        refused,
        filled_at_quote,
        regime_at_step,
        regime_peak: peak.map_or("calm".to_owned(), |s| s.1.clone()),
        regime_at_end: trace.last().map_or("calm".to_owned(), |s| s.1.clone()),
        rose_after_sweeps,
        fell_after_sweeps,
        ask_before_wei_per_s: before.get(before.len() / 2).copied().unwrap_or(0),
        ask_peak_wei_per_s: during().map(|s| s.2).max().unwrap_or(0),
        ask_end_wei_per_s: trace.last().map_or(0, |s| s.2),
        trace: trace
            .into_iter()
            .map(|(at, regime, ask, _)| (at, regime, ask))
            .collect(),
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

/// Loads the providers logged and their total time, from the lines `… <marker>N ms`: cold
/// adapter fetches (`adapter …: fetched and loaded in N ms`), bases loaded from a store (`base
/// … (id): loaded in N ms`).
fn logged_ms(providers: &Path, marker: &str) -> (usize, u64) {
    let mut count = 0;
    let mut ms = 0;
    for entry in std::fs::read_dir(providers).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            if let Some(rest) = line.split(marker).nth(1)
                && let Some(n) = rest.split(' ').next().and_then(|n| n.parse::<u64>().ok())
            {
                count += 1;
                ms += n;
            }
        }
    }
    (count, ms)
}
