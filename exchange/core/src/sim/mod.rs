//! The market simulation behind `cx simulate`: one seeded fleet and arrival trace, replayed
//! through several allocators and eviction policies, so that their differences are the
//! allocators' alone.
//!
//! - [`scenario`] builds the fleet (several base models of different sizes, devices with
//!   different memory, links and prices) and the agents (each with its own adapter, Zipf
//!   popularity) and their arrivals.
//! - [`replay`] runs a trace through an [`Allocator`] with an [`EvictionPolicy`], keeping each
//!   bundle's residency (what is loaded, what it evicted) and queue, and measures the outcome.
//!
//! Drawing the comparison (SVG) is the `cx` binary's job: this module only returns data.

pub mod replay;
pub mod scenario;

pub use replay::{Allocator, Outcome, replay};
pub use scenario::{Scenario, ScenarioConfig};

use crate::pricing::market::MarketParams;
use crate::pricing::sim::{MmVsFixed, SimConfig, market_maker_vs_fixed};
use crate::routing::shift::{ShiftConfig, ShiftReplay, shift_replay};
use cx_protocol::inventory::EvictionPolicy;
use serde::Serialize;

/// Everything `cx simulate` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The seed that fixes fleet and trace.
    pub seed: u64,
    /// Bundles in the fleet.
    pub bundles: usize,
    /// Arrivals replayed.
    pub jobs: usize,
    /// One outcome per allocator (value-per-byte eviction for each).
    pub allocators: Vec<Outcome>,
    /// Residency-aware clearing under each eviction policy.
    pub eviction: Vec<Outcome>,
    /// residency_aware hit rate / cheapest_capable hit rate.
    pub hit_rate_ratio: f64,
    /// residency_aware mean cost / cheapest_capable mean cost (≤ 1 means no dearer).
    pub cost_ratio: f64,
    /// Cold base loads under LRU / under value-per-byte eviction.
    pub lru_cold_loads_ratio: f64,
    /// The market maker against a fixed price on one regime-shifting market (same seed):
    /// utilisation and deadline hit rate under each.
    pub mm_vs_fixed: MmVsFixed,
    /// Routing by expected free energy against LinUCB and the best fixed arm on a
    /// regime-shifting replay (same seed), every figure read from each policy's meter.
    pub routing: ShiftReplay,
}

/// Routed requests in the simulation's routing replay at most: its meters keep every record,
/// so a huge `jobs` must not make them huge.
pub const MAX_ROUTED: usize = 20_000;

/// Builds the scenario for `seed` and replays it through every allocator and eviction policy,
/// then runs the regime-shift market under the market maker and under a fixed price.
pub fn simulate(config: &ScenarioConfig) -> crate::Result<Report> {
    let mm_vs_fixed = market_maker_vs_fixed(
        &SimConfig {
            seed: config.seed,
            ..SimConfig::default()
        },
        &MarketParams::default(),
    )?;
    // As many routed requests as arrivals (up to MAX_ROUTED), in periods of the replay's size.
    let shift = ShiftConfig {
        seed: config.seed,
        ..ShiftConfig::default()
    };
    let periods = (config.jobs.min(MAX_ROUTED) / shift.requests_per_period).max(2);
    let routing = shift_replay(&ShiftConfig { periods, ..shift })?;
    let scenario = Scenario::generate(config);
    let allocators: Vec<Outcome> = [
        Allocator::ResidencyAware,
        Allocator::CheapestCapable,
        Allocator::RandomCapable,
    ]
    .into_iter()
    .map(|a| replay(&scenario, a, EvictionPolicy::ValuePerByte))
    .collect();
    let eviction: Vec<Outcome> = [EvictionPolicy::ValuePerByte, EvictionPolicy::Lru]
        .into_iter()
        .map(|p| replay(&scenario, Allocator::ResidencyAware, p))
        .collect();
    let ours = &allocators[0];
    let cheapest = &allocators[1];
    Ok(Report {
        seed: config.seed,
        bundles: scenario.bundles.len(),
        jobs: scenario.arrivals.len(),
        hit_rate_ratio: ratio(ours.deadline_hit_rate, cheapest.deadline_hit_rate),
        cost_ratio: ratio(ours.mean_cost, cheapest.mean_cost),
        lru_cold_loads_ratio: ratio(
            (eviction[1].cold_base_loads + eviction[1].cold_adapter_loads) as f64,
            (eviction[0].cold_base_loads + eviction[0].cold_adapter_loads) as f64,
        ),
        allocators,
        eviction,
        mm_vs_fixed,
        routing,
    })
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 { f64::INFINITY } else { a / b }
}
