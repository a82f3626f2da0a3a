//! After the market is up: the agents' traffic runs, the children are watched (an essential one
//! that exits stops the devnet; a provider that exits is named once and the market goes on),
//! the tally counts what settled, and `exit_after_settled` ends it with a summary.

use super::children::Children;
use super::tally::{Summary, Tally};
use super::traffic::{Agent, Market, OpenTab};
use super::{CHAIN_IDS, Config};
use crate::Usage;
use anyhow::bail;
use cx_client::Client;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the traffic of `agents` on `market` (unless `no_traffic`) and watches until stopped,
/// failed or done; `ready` is how long the start took.
#[allow(clippy::too_many_arguments)]
pub(super) async fn watch(
    config: &Config,
    children: &mut Children,
    client: &Client,
    market: Arc<Market>,
    agents: Vec<(Agent, Vec<OpenTab>)>,
    ready: Duration,
    dir: &Path,
    providers_dir: &Path,
) -> anyhow::Result<()> {
    let started = Instant::now() - ready;
    let (closed_send, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    if !config.no_traffic {
        for (seed, (agent, tabs)) in agents.into_iter().enumerate() {
            tasks.spawn(agent.run(market.clone(), tabs, closed_send.clone(), seed as u64));
        }
    }
    drop(closed_send);
    let mut tally = Tally::new(started);
    let mut reported = 0u64;
    let mut announced = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(config.timeout_s);
    let mut lost = std::collections::BTreeSet::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some(name) = children.exited() {
            bail!(
                "{name} exited; its log is under {} — stopping the devnet",
                dir.display()
            );
        }
        for name in children.lost_providers(&mut lost) {
            eprintln!(
                "cx devnet: {name} exited (its log: {}); the market goes on without it",
                providers_dir.join(format!("{name}.log")).display()
            );
        }
        while let Ok(tab) = closed.try_recv() {
            tally.closed(tab);
        }
        tally.poll(client).await;
        for chain in CHAIN_IDS {
            if let Some(s) = tally.first_batch_s(chain)
                && announced.insert(chain)
            {
                eprintln!("cx devnet: first batch on chain {chain} settled {s:.1} s after start");
            }
        }
        if tally.jobs > reported {
            reported = tally.jobs;
            eprintln!("cx devnet: {} jobs settled on chain", tally.jobs);
        }
        if let Some(n) = config.exit_after_settled {
            if tally.jobs >= n && CHAIN_IDS.iter().all(|c| tally.first_batch_s(*c).is_some()) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "--exit-after-settled {n}: only {} settled in {} s (--timeout-s); see {}",
                    tally.jobs,
                    config.timeout_s,
                    dir.display()
                );
            }
        }
    }
    tasks.abort_all();
    let usage = children.usage();
    let (batches, batch_parts_per_chain, first_batch_s) = tally.summary_base();
    let stats = &market.stats;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let summary = Summary {
        settled_jobs: tally.jobs,
        batches,
        batch_parts_per_chain,
        first_batch_s,
        ready_s: (ready.as_secs_f64() * 10.0).round() / 10.0,
        chats: load(&stats.chats),
        intents: load(&stats.intents),
        searches: load(&stats.searches),
        matmuls: load(&stats.matmuls),
        trains: load(&stats.trains),
        reserves: load(&stats.reserves),
        rents: load(&stats.rents),
        tabs_closed: load(&stats.tabs_closed),
        errors: load(&stats.errors),
        processes: usage.len(),
        peak_rss_bytes_sum: usage.iter().map(|u| u.peak_rss_bytes).sum(),
        cpu_s: usage.iter().map(|u| u.cpu_ticks).sum::<u64>() as f64 / Usage::TICKS_PER_S as f64,
    };
    println!(
        "cx devnet: {} jobs settled on chain in {} batches",
        summary.settled_jobs, summary.batches
    );
    for (chain, s) in &summary.first_batch_s {
        println!("  first batch on chain {chain}: {s:.1} s after start");
    }
    println!(
        "  traffic    {} chats, {} intents, {} searches, {} matmuls, {} train orders, {} reserves, \
         {} rents, {} tabs closed, {} errors (traffic.log)",
        summary.chats,
        summary.intents,
        summary.searches,
        summary.matmuls,
        summary.trains,
        summary.reserves,
        summary.rents,
        summary.tabs_closed,
        summary.errors
    );
    println!(
        "  processes  {}: peak memory {:.0} MiB (sum of each one's peak), {:.1} CPU-s",
        summary.processes,
        summary.peak_rss_bytes_sum as f64 / (1 << 20) as f64,
        summary.cpu_s
    );
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
