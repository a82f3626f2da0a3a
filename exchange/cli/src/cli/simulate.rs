//! `cx simulate`: the market simulation, its table, report and chart.

use super::chart;
use anyhow::Context;
use cx_exchange::sim::{self, ScenarioConfig};
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Fixes fleet and trace.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Where report.json and simulation.svg go.
    #[arg(long, default_value = "out/simulate")]
    out: PathBuf,
    /// Arrivals to replay.
    #[arg(long, default_value_t = 6000)]
    jobs: usize,
    /// Print the report as one JSON object, last.
    #[arg(long)]
    json: bool,
}

/// Arrivals `cx simulate` replays at most.
const MAX_JOBS: usize = 1_000_000;

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    // Every arrival is generated up front and replayed five times: a huge value must be a
    // one-line error, not an allocation that aborts.
    anyhow::ensure!(
        (1..=MAX_JOBS).contains(&args.jobs),
        "--jobs: must be within 1..={MAX_JOBS}"
    );
    let config = ScenarioConfig {
        seed: args.seed,
        jobs: args.jobs,
        ..ScenarioConfig::default()
    };
    let report = sim::simulate(&config)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let json_path = args.out.join("report.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    let svg_path = args.out.join("simulation.svg");
    chart::write_svg(&report, &svg_path)
        .map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", svg_path.display()))?;

    let mut t = String::new();
    let _ = writeln!(
        t,
        "simulation: {} bundles, {} jobs, seed {}",
        report.bundles, report.jobs, report.seed
    );
    let _ = writeln!(
        t,
        "  {:<18}{:<16}{:>10}{:>12}{:>11}{:>13}{:>9}{:>8}",
        "allocator",
        "eviction",
        "hit_rate",
        "mean_cost",
        "cold_base",
        "cold_adapter",
        "refused",
        "busy"
    );
    for o in report.allocators.iter().chain(&report.eviction) {
        let _ = writeln!(
            t,
            "  {:<18}{:<16}{:>10.3}{:>12.5}{:>11}{:>13}{:>9}{:>8.3}",
            name(&o.allocator),
            name(&o.eviction),
            o.deadline_hit_rate,
            o.mean_cost,
            o.cold_base_loads,
            o.cold_adapter_loads,
            o.refused,
            o.accelerators_busy
        );
    }
    let _ = writeln!(
        t,
        "residency_aware vs cheapest_capable: hit rate ×{:.2}, mean cost ×{:.2}; LRU cold loads ×{:.2} of value-per-byte",
        report.hit_rate_ratio, report.cost_ratio, report.lru_cold_loads_ratio
    );
    let (m, f) = (
        &report.mm_vs_fixed.market_maker,
        &report.mm_vs_fixed.fixed_price,
    );
    let _ = writeln!(
        t,
        "regime shifts ({} periods): market maker utilisation {:.3} (on time {:.3}), deadline hit {:.3}; fixed price utilisation {:.3} (on time {:.3}), deadline hit {:.3}",
        report.mm_vs_fixed.periods,
        m.utilisation,
        m.on_time_utilisation,
        m.deadline_hit_rate,
        f.utilisation,
        f.on_time_utilisation,
        f.deadline_hit_rate
    );
    let _ = writeln!(
        t,
        "wrote {} and {}",
        json_path.display(),
        svg_path.display()
    );
    super::emit(args.json, &t, &report)
}

fn name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}
