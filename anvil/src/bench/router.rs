//! `cx bench router`: routing by task on live traffic, from the meter — the exchange's router
//! policies (`efe`, `linucb`, and each arm fixed) on the same arrivals through a regime shift,
//! each on its own exchange and database, and the regret of each against the best fixed arm.
//!
//! **The market.** The exchange as `cx serve` runs it (HTTPS, its sweeps, which meter the routed
//! jobs that end and teach the router), on the example catalog; two providers run by this bench,
//! one holding the generalist (`llama-3.1-8b-instruct`), one the coder
//! (`qwen2.5-coder-32b-instruct`); no other model is served, so the others are gated.
//! **The arrivals.** An agent's `task:code` chats through the OpenAI door at `rate_per_s`, open
//! loop, deadline `deadline_s`, for three phases of `phase_s` each:
//! - *calm*: the coder answers at once, the generalist at 60 % of the deadline (on time, in its
//!   second half);
//! - *shift*: the coder's provider stalls (takes jobs and never answers: they expire at their
//!   deadline, nothing charged), and its open work piles up — its market's regime moves;
//! - *calm again*: as the first.
//!
//! So the coder is the better arm when calm and the worst in the shift: a router must leave it
//! and come back. **The figures** are the meter's: each routed job's reward is `ln C(o)` of its
//! metered outcome under its order's preferences (`cx_exchange::routing::outcome`, the reward
//! the replay in `cx bench pricing` uses), and a policy's regret is the best fixed arm's mean
//! reward minus its own (negative: it beat every fixed arm), with the share of each arm and the
//! mean reward per phase.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cx_exchange::routing::outcome::{OrderTerms, Outcome, Preferences};
use cx_exchange_server::books::Books;
use cx_exchange_server::intake::Intake;
use cx_exchange_server::task_router::RouterPolicy;
use cx_protocol::offer::{Offer, SignedOffer};
use cx_protocol::order;
use cx_protocol::pq::Identity;
use cx_protocol::wire::{Assignment, Output, Pulled, ResultSubmission};
use cx_protocol::{Bundle, DeterminismClass};
use serde::Serialize;

use super::intake::{Server, agents, bench_err, books_and_market, connect, now_s, seed_tabs};
use super::load::{open_sessions, post_json, send_raw};
use crate::error::{Error, Result};

/// The generalist arm.
pub const GENERAL: &str = "llama-3.1-8b-instruct";
/// The coder arm.
pub const CODER: &str = "qwen2.5-coder-32b-instruct";

/// The phases, in order.
const PHASES: [&str; 3] = ["calm", "shift", "calm_again"];

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct RouterBenchConfig {
    /// Door calls a second.
    pub rate_per_s: f64,
    /// Seconds of each phase.
    pub phase_s: u64,
    /// Each call's deadline, seconds.
    pub deadline_s: u64,
}

impl Default for RouterBenchConfig {
    fn default() -> Self {
        Self {
            rate_per_s: 4.0,
            phase_s: 20,
            deadline_s: 2,
        }
    }
}

/// One phase of one policy's run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseFigures {
    /// Routed jobs metered.
    pub metered: usize,
    /// Share of them per arm.
    pub arm_share: BTreeMap<String, f64>,
    /// Mean `ln C(o)`, nats.
    pub mean_reward: f64,
    /// Share answered by the deadline.
    pub deadline_hit_rate: f64,
}

/// One policy's run.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyFigures {
    /// `efe`, `linucb` or `fixed:<model>`.
    pub policy: String,
    /// Door calls sent.
    pub calls: usize,
    /// Answered 200.
    pub answered: usize,
    /// Routed jobs metered.
    pub metered: usize,
    /// Mean `ln C(o)` over every metered job, nats.
    pub mean_reward: f64,
    /// The best fixed arm's mean reward minus this one's, nats per request.
    pub regret_vs_best_fixed: f64,
    /// Share of the metered jobs answered by their deadline.
    pub deadline_hit_rate: f64,
    /// Mean charge per metered job, wei.
    pub mean_cost_wei: f64,
    /// Per phase.
    pub phases: BTreeMap<String, PhaseFigures>,
}

/// The report.
#[derive(Clone, Debug, Serialize)]
pub struct RouterReport {
    /// Calls a second.
    pub rate_per_s: f64,
    /// Seconds per phase.
    pub phase_s: u64,
    /// Each call's deadline.
    pub deadline_s: u64,
    /// The fixed arm with the best mean reward.
    pub best_fixed: String,
    /// Every policy.
    pub policies: Vec<PolicyFigures>,
}

impl RouterReport {
    /// The human form.
    pub fn table(&self) -> String {
        let mut out = format!(
            "router on live traffic: task:code at {}/s, deadline {} s, phases calm / shift \
             (the coder stalls) / calm, {} s each; best fixed arm: {}\n\n",
            self.rate_per_s, self.deadline_s, self.phase_s, self.best_fixed
        );
        out.push_str(&format!(
            "{:<40} {:>6} {:>8} {:>11} {:>9} {:>9}   coder share calm/shift/calm\n",
            "policy", "calls", "metered", "reward", "regret", "on time"
        ));
        for p in &self.policies {
            let shares: Vec<String> = PHASES
                .iter()
                .map(|ph| {
                    p.phases
                        .get(*ph)
                        .and_then(|f| f.arm_share.get(CODER))
                        .map_or("-".into(), |s| format!("{s:.2}"))
                })
                .collect();
            out.push_str(&format!(
                "{:<40} {:>6} {:>8} {:>11.3} {:>9.3} {:>9.3}   {}\n",
                p.policy,
                p.calls,
                p.metered,
                p.mean_reward,
                p.regret_vs_best_fixed,
                p.deadline_hit_rate,
                shares.join(" / ")
            ));
        }
        out
    }
}

/// Runs every policy on the same arrivals, one after the other.
pub async fn router_bench(config: RouterBenchConfig) -> Result<RouterReport> {
    if !(config.rate_per_s > 0.0 && config.rate_per_s <= 50.0)
        || config.phase_s == 0
        || config.deadline_s == 0
    {
        return Err(Error::BenchFailed(
            "--rate must be within (0, 50], --phase-s and --deadline-s > 0".into(),
        ));
    }
    let policies = [
        RouterPolicy::Fixed(GENERAL.into()),
        RouterPolicy::Fixed(CODER.into()),
        RouterPolicy::LinUcb,
        RouterPolicy::Efe,
    ];
    let mut runs = Vec::new();
    for policy in policies {
        runs.push(run(config, policy).await?);
    }
    let best = runs
        .iter()
        .filter(|r| r.policy.starts_with("fixed:"))
        .max_by(|a, b| a.mean_reward.total_cmp(&b.mean_reward))
        .map(|r| (r.policy.clone(), r.mean_reward))
        .ok_or_else(|| Error::BenchFailed("no fixed arm ran".into()))?;
    for r in &mut runs {
        r.regret_vs_best_fixed = best.1 - r.mean_reward;
    }
    Ok(RouterReport {
        rate_per_s: config.rate_per_s,
        phase_s: config.phase_s,
        deadline_s: config.deadline_s,
        best_fixed: best.0.trim_start_matches("fixed:").to_owned(),
        policies: runs,
    })
}

/// One policy: a fresh exchange and database, the two providers, the arrivals, the meter read.
async fn run(config: RouterBenchConfig, policy: RouterPolicy) -> Result<PolicyFigures> {
    let (_db, books, market) = books_and_market(0).await?;
    let settlement = alloy::primitives::Address::repeat_byte(0x5e);
    let domain = order::domain(super::intake::CHAIN, settlement);
    // A tab takes at most 400 jobs (one settlement batch): one agent, tab and session per 300
    // calls, the calls dealt round robin.
    let total = (config.rate_per_s * (config.phase_s * PHASES.len() as u64) as f64) as usize;
    let agents = agents(total.div_ceil(300).max(1));
    seed_tabs(&books, &agents, now_s() + 86_400).await?;
    let intake = Intake::new(
        books.clone(),
        market,
        [(super::intake::CHAIN, settlement)],
        60,
    )
    .with_router_policy(policy.clone());
    let server = Server::start("cx-bench-router", intake).await?;
    let secrets: Vec<Arc<str>> = (0..agents.len())
        .map(|i| Arc::from(format!("cxs_router_bench_{i}")))
        .collect();
    open_sessions(
        &(server.address, server.client_config.clone()),
        &agents,
        &secrets,
        &domain,
        0,
    )
    .await?;

    let started = Instant::now();
    let phase_of = move |at: Instant| {
        ((at.saturating_duration_since(started).as_secs() / config.phase_s) as usize)
            .min(PHASES.len() - 1)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Duration::from_secs(config.deadline_s);
    let general = provider(&server, 0x71, GENERAL, stop.clone(), move |_| {
        Some(deadline.mul_f64(0.6))
    })
    .await?;
    let coder = provider(&server, 0x72, CODER, stop.clone(), move |at| {
        (PHASES[phase_of(at)] != "shift").then_some(Duration::ZERO)
    })
    .await?;

    // The arrivals: open loop, each call on its own connection, every one awaited.
    let db_start_s: f64 = sqlx::query_scalar("SELECT extract(epoch FROM now())::float8")
        .fetch_one(books.pool())
        .await
        .map_err(bench_err)?;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / config.rate_per_s);
        tokio::time::sleep_until(due.into()).await;
        let body = Bytes::from(
            serde_json::json!({
                "model": "task:code",
                "messages": [{"role": "user", "content": format!("Write a def that parses date {i}.")}],
                "max_tokens": 8,
                "cx": {"deadline_in_s": config.deadline_s},
            })
            .to_string(),
        );
        let (address, tls, secret) = (
            server.address,
            server.client_config.clone(),
            secrets[i % secrets.len()].clone(),
        );
        calls.spawn(async move {
            let mut sender = connect(address, tls).await?;
            let (status, _, _) =
                send_raw(&mut sender, "/v1/chat/completions", Some(&secret), body).await?;
            Ok::<bool, Error>(status.is_success())
        });
    }
    let mut answered = 0;
    while let Some(joined) = calls.join_next().await {
        answered +=
            usize::from(joined.map_err(|e| Error::BenchFailed(format!("a call's task: {e}")))??);
    }
    // Every job has ended by now (answered, or expired by a sweep before its call's wait
    // ended); meter what the last sweep may not have.
    stop.store(true, Ordering::Relaxed);
    general.await.map_err(bench_err)??;
    coder.await.map_err(bench_err)??;
    books.meter_ended(0).await.map_err(bench_err)?;
    let figures = figures(&books, &policy, total, answered, db_start_s, config).await?;
    server.stop().await;
    Ok(figures)
}

/// A provider serving one base: registers a bundle holding it, long-polls for jobs and answers
/// each after what `delay` says for the moment it was pulled (`None`: never).
async fn provider(
    server: &Server,
    seed: u8,
    base: &'static str,
    stop: Arc<AtomicBool>,
    delay: impl Fn(Instant) -> Option<Duration> + Send + 'static,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let id = Arc::new(Identity::from_seed([seed; 32]));
    let token: Arc<str> = format!("cx-bench-router-{seed}").into();
    let payout = alloy::primitives::Address::repeat_byte(seed);
    let (address, tls) = (server.address, server.client_config.clone());
    let mut sender = connect(address, tls.clone()).await?;
    let bundle: Bundle = serde_json::from_value(serde_json::json!({
        "id": format!("holds-{base}"), "provider": format!("op-{seed}"),
        "price_wei_per_s": "1000000", "memory_bytes": 80_000_000_000u64, "bandwidth_bps": 1e10,
        "rtt_s": 0.01, "flops_per_s": 4e14, "context_max": 32768, "determinism": ["D", "S"],
        "tiers": ["T0", "T1"], "resident_bases": [base],
    }))
    .map_err(bench_err)?;
    let offer = Offer {
        operator: format!("op-{seed}"),
        payout,
        bundles: vec![bundle],
        token_hash: Offer::token_hash_of(token.as_bytes()),
        issued_at_s: now_s(),
        residency: None,
        search_trials_per_s: None,
    };
    let signed = SignedOffer::sign(offer, &id).map_err(bench_err)?;
    let body = Bytes::from(serde_json::to_string(&signed).map_err(bench_err)?);
    let (status, _, answer) = send_raw(&mut sender, "/v1/providers/register", None, body).await?;
    if !status.is_success() {
        return Err(Error::BenchFailed(format!(
            "the {base} provider's offer was refused ({status}): {}",
            String::from_utf8_lossy(&answer)
        )));
    }
    Ok(tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let pull = serde_json::json!({"max_jobs": 32, "wait_s": 1});
            let pulled = post_json(&mut sender, "/v1/providers/jobs", &token, pull).await?;
            let pulled: Pulled = serde_json::from_value(pulled).map_err(bench_err)?;
            for job in pulled.jobs {
                let Some(wait) = delay(Instant::now()) else {
                    continue;
                };
                let (id, token, tls) = (id.clone(), token.clone(), tls.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    let (path, body) = result(&id, payout, &job)?;
                    let mut sender = connect(address, tls).await?;
                    post_json(&mut sender, &path, &token, body).await
                });
            }
        }
        Ok(())
    }))
}

/// The result of one job and its receipt, the whole price owed.
fn result(
    id: &Identity,
    payout: alloy::primitives::Address,
    job: &Assignment,
) -> Result<(String, serde_json::Value)> {
    let output = Output::text("def parse(s): ...".to_owned(), "length", 9, 8);
    let receipt = cx_client::provider::sign_receipt(
        job,
        &output,
        id,
        payout,
        job.price_wei,
        1,
        DeterminismClass::D,
    )
    .map_err(bench_err)?;
    let body = serde_json::to_value(ResultSubmission { output, receipt }).map_err(bench_err)?;
    Ok((format!("/v1/jobs/{}/result", job.job_id), body))
}

/// The run's figures, from its meter.
async fn figures(
    books: &Books,
    policy: &RouterPolicy,
    calls: usize,
    answered: usize,
    start_s: f64,
    config: RouterBenchConfig,
) -> Result<PolicyFigures> {
    let metered = books.meter_since(0).await.map_err(bench_err)?;
    let created: BTreeMap<i64, f64> = sqlx::query_as::<_, (i64, f64)>(
        "SELECT m.seq, extract(epoch FROM j.created_at)::float8 \
         FROM exchange_meter m JOIN exchange_jobs j ON j.id = m.job_id",
    )
    .fetch_all(books.pool())
    .await
    .map_err(bench_err)?
    .into_iter()
    .collect();
    #[derive(Default)]
    struct Sums {
        n: usize,
        reward: f64,
        on_time: usize,
        cost: f64,
        arms: BTreeMap<String, usize>,
    }
    let mut all = Sums::default();
    let mut phases: BTreeMap<&str, Sums> = BTreeMap::new();
    for m in &metered {
        let r = &m.record;
        let prefs = Preferences::from_order(&OrderTerms {
            deadline_s: r.deadline_s,
            tier: r.tier,
            max_cost_wei: r.max_cost_wei,
        })
        .map_err(bench_err)?;
        let reward = prefs.log_joint(&Outcome::of(r));
        let at = created.get(&m.seq).copied().unwrap_or(start_s) - start_s;
        let phase = PHASES[((at.max(0.0) as u64 / config.phase_s) as usize).min(PHASES.len() - 1)];
        for s in [&mut all, phases.entry(phase).or_default()] {
            s.n += 1;
            s.reward += reward;
            s.on_time += usize::from(r.deadline_hit() && r.quality > 0.0);
            s.cost += r.cost_wei as f64;
            *s.arms.entry(r.arm.clone()).or_default() += 1;
        }
    }
    let mean = |sum: f64, n: usize| if n == 0 { 0.0 } else { sum / n as f64 };
    Ok(PolicyFigures {
        policy: policy.to_string(),
        calls,
        answered,
        metered: all.n,
        mean_reward: mean(all.reward, all.n),
        regret_vs_best_fixed: 0.0,
        deadline_hit_rate: mean(all.on_time as f64, all.n),
        mean_cost_wei: mean(all.cost, all.n),
        phases: phases
            .into_iter()
            .map(|(phase, s)| {
                (
                    phase.to_owned(),
                    PhaseFigures {
                        metered: s.n,
                        arm_share: s
                            .arms
                            .iter()
                            .map(|(arm, k)| (arm.clone(), *k as f64 / s.n as f64))
                            .collect(),
                        mean_reward: mean(s.reward, s.n),
                        deadline_hit_rate: mean(s.on_time as f64, s.n),
                    },
                )
            })
            .collect(),
    })
}
