//! `cx bench pricing`: throughput of quoting, size of tenant preferences, regret of the router's
//! bandit, expected-free-energy routing against that bandit on a regime-shifting replay, and the
//! market maker against a fixed price.
//!
//! Only the quote and EFE routing throughputs are timed (with `std::time::Instant`, here and
//! nowhere in the quoting or routing path); every other figure is a deterministic function of
//! the seed. The routing figures come from each policy's [`crate::meter::Meter`].

use super::hmm::Observation;
use super::market::{MARKET_TIERS, MarketMaker, MarketParams};
use super::sim::{MmVsFixed, SimConfig, market_maker_vs_fixed};
use super::tenant::{BaseTable, ReconstructionError, TenantDelta, reconstruction_error};
use crate::error::{Result, invalid};
use crate::meter::{Meter, MeterRecord};
use crate::pricing::hmm::REGIMES;
use crate::rng::TraceRng;
use crate::routing::bandit::LinUcb;
use crate::routing::efe::{EfeConfig, EfeRouter};
use crate::routing::features::FEATURES;
use crate::routing::outcome::{OrderTerms, Preferences};
use crate::routing::ridge::{Logged, fit_ridge};
use crate::routing::shift::{ShiftConfig, ShiftReplay, shift_replay};
use crate::routing::utility::{Arm, Ceilings, JOINT, Utility};
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PricingBenchConfig {
    /// Seed of every synthetic input.
    pub seed: u64,
    /// Quotes timed.
    pub quotes: u64,
    /// Model classes with open markets while quoting.
    pub model_classes: usize,
    /// Layers (regimes) of the tenant tables.
    pub tenant_layers: usize,
    /// Cells per layer (resources) of the tenant tables.
    pub tenant_cells: usize,
    /// Tenants whose tables are compressed and measured.
    pub tenants: usize,
    /// Rounds of the router replay.
    pub router_rounds: usize,
    /// Arms in the router replay.
    pub router_arms: usize,
    /// The regime-shift simulation.
    pub sim: SimConfig,
    /// The regime-shifting routing replay (EFE, LinUCB, best fixed arm).
    pub shift: ShiftConfig,
    /// EFE routing decisions timed (over `router_arms` arms).
    pub efe_routes: u64,
}

impl Default for PricingBenchConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            quotes: 5_000_000,
            model_classes: 16,
            tenant_layers: 3,
            tenant_cells: 1024,
            tenants: 64,
            router_rounds: 20_000,
            router_arms: 8,
            sim: SimConfig::default(),
            shift: ShiftConfig::default(),
            efe_routes: 200_000,
        }
    }
}

/// The router replay's figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RouterFigures {
    /// Rounds replayed.
    pub rounds: usize,
    /// Arms routed over.
    pub arms: usize,
    /// Index of the best fixed arm in hindsight.
    pub best_fixed_arm: usize,
    /// Mean expected reward per round of the best fixed arm.
    pub best_fixed_mean_reward: f64,
    /// Mean expected reward per round of the bandit.
    pub bandit_mean_reward: f64,
    /// Mean expected reward per round of the offline W alone (no adaptation).
    pub offline_mean_reward: f64,
    /// Mean expected reward per round of the per-request best arm (the oracle).
    pub oracle_mean_reward: f64,
}

/// Everything `cx bench pricing` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PricingReport {
    /// Quotes per second on one core.
    pub quotes_per_s: f64,
    /// XOR of every ask quoted (keeps the loop honest; equal across runs of one seed).
    pub quote_checksum: u64,
    /// Bytes of one tenant's preferences (sign bits + per-layer scale and bias).
    pub tenant_bytes: usize,
    /// Bytes of the same table as full f32.
    pub tenant_f32_bytes: usize,
    /// `tenant_f32_bytes / tenant_bytes`.
    pub tenant_compression: f64,
    /// Mean reconstruction error over tenants, against their full f32 tables.
    pub tenant_reconstruction: ReconstructionError,
    /// Mean per-round regret of the bandit against the best fixed arm (negative: it beat it).
    pub router_regret: f64,
    /// Details of the router replay.
    pub router: RouterFigures,
    /// EFE routing decisions (G of every arm, then the argmin) per second on one core.
    pub efe_routes_per_s: f64,
    /// Mean per-round regret of expected-free-energy routing against the best fixed arm, on the
    /// regime-shifting replay (the same definition as `router_regret`; negative: it beat it).
    pub efe_regret: f64,
    /// Share of EFE-routed requests answered by their deadline, from its meter.
    pub efe_deadline_hit: f64,
    /// LinUCB's regret against the best fixed arm on the same regime-shifting replay.
    pub linucb_shift_regret: f64,
    /// EFE's oracle regret ÷ LinUCB's on that replay (below 1: EFE regrets less).
    pub efe_to_linucb_regret: f64,
    /// EFE's mean adaptation rounds after a shift ÷ LinUCB's (below 1: EFE adapts faster).
    pub efe_to_linucb_adaptation: f64,
    /// Everything the regime-shifting routing replay measured.
    pub regime_routing: ShiftReplay,
    /// The regime-shift simulation.
    pub mm_vs_fixed: MmVsFixed,
}

impl PricingReport {
    /// The human table `cx bench pricing` prints (the JSON object follows it with `--json`).
    pub fn table(&self) -> String {
        let m = &self.mm_vs_fixed.market_maker;
        let f = &self.mm_vs_fixed.fixed_price;
        let r = &self.router;
        let e = &self.tenant_reconstruction;
        [
            format!("quotes/s (one core)        {:>14.0}", self.quotes_per_s),
            format!(
                "tenant bytes               {:>14}   (f32 table {} bytes, {:.1}x smaller)",
                self.tenant_bytes, self.tenant_f32_bytes, self.tenant_compression
            ),
            format!(
                "tenant reconstruction      rmse {:.4}, {:.1}% of the delta, max {:.4}",
                e.rmse,
                100.0 * e.relative_to_delta,
                e.max_abs
            ),
            format!(
                "router regret / round      {:>14.4}   (bandit {:.4}, best fixed arm {} {:.4}, offline W {:.4}, oracle {:.4})",
                self.router_regret,
                r.bandit_mean_reward,
                r.best_fixed_arm,
                r.best_fixed_mean_reward,
                r.offline_mean_reward,
                r.oracle_mean_reward
            ),
            format!(
                "EFE routes/s (one core)    {:>14.0}   ({} arms, G = risk + ambiguity − information gain each)",
                self.efe_routes_per_s, self.router.arms
            ),
            format!(
                "{:<26} {:>12} {:>12} {:>12} {:>12} {:>12}",
                "regime-shift routing", "regret/fixed", "oracle", "adapt rounds", "deadline hit", "cost/req wei"
            ),
            shift_row("  expected free energy", &self.regime_routing.efe),
            shift_row("  LinUCB", &self.regime_routing.linucb),
            shift_row(
                &format!("  fixed ({})", self.regime_routing.best_fixed_arm),
                &self.regime_routing.fixed,
            ),
            format!(
                "EFE / LinUCB               regret ×{:.3}, adaptation ×{:.3}   ({} rounds, {} shifts, belief right {:.1}%)",
                self.efe_to_linucb_regret,
                self.efe_to_linucb_adaptation,
                self.regime_routing.rounds,
                self.regime_routing.shifts,
                100.0 * self.regime_routing.belief_accuracy
            ),
            format!(
                "{:<26} {:>12} {:>12} {:>12} {:>12}",
                "regime-shift market", "utilisation", "on-time", "deadline hit", "taken"
            ),
            format!(
                "{:<26} {:>11.1}% {:>11.1}% {:>11.1}% {:>11.1}%",
                "  market maker",
                100.0 * m.utilisation,
                100.0 * m.on_time_utilisation,
                100.0 * m.deadline_hit_rate,
                100.0 * m.taken_share
            ),
            format!(
                "{:<26} {:>11.1}% {:>11.1}% {:>11.1}% {:>11.1}%",
                "  fixed price",
                100.0 * f.utilisation,
                100.0 * f.on_time_utilisation,
                100.0 * f.deadline_hit_rate,
                100.0 * f.taken_share
            ),
            format!(
                "regime accuracy (filter)   {:>13.1}%   over {} periods",
                100.0 * self.mm_vs_fixed.regime_accuracy,
                self.mm_vs_fixed.periods
            ),
        ]
        .join("\n")
    }
}

fn shift_row(name: &str, p: &crate::routing::shift::ShiftPolicy) -> String {
    format!(
        "{:<26} {:>12.4} {:>12.4} {:>12.1} {:>11.1}% {:>12.0}",
        name,
        p.regret_vs_fixed,
        p.oracle_regret,
        p.adaptation_rounds,
        100.0 * p.deadline_hit,
        p.mean_cost_wei
    )
}

/// Times EFE routing over `router_arms` arms whose outcome models have seen a few metered answers,
/// under beliefs drawn before the clock starts.
fn time_efe(config: &PricingBenchConfig) -> Result<f64> {
    let mut rng = TraceRng::new(config.seed ^ 0xefe);
    let arms: Vec<Arm> = (0..config.router_arms.max(2))
        .map(|i| Arm {
            name: format!("arm-{i}"),
            quality: 0.5,
            latency_s: 1.0,
            cost_wei_per_mtok: 100_000,
            code: 0.5,
            vision: 0.0,
            context_tokens: 131_072,
        })
        .collect();
    let order = OrderTerms {
        deadline_s: 4.0,
        tier: cx_protocol::Tier::T1,
        max_cost_wei: Some(1_000),
    };
    let prefs = Preferences::from_order(&order)?;
    let mut meter = Meter::new();
    for (k, arm) in arms.iter().enumerate() {
        for j in 0..50u64 {
            let r = rng.next_f64();
            meter.record(MeterRecord {
                request: (k as u64) * 50 + j,
                tenant: "bench".into(),
                arm: arm.name.clone(),
                cost_wei: rng.below(2_000).into(),
                latency_s: 8.0 * rng.next_f64(),
                quality: rng.next_f64(),
                deadline_s: order.deadline_s,
                max_cost_wei: order.max_cost_wei,
                tier: order.tier,
                belief: [r, (1.0 - r) / 2.0, (1.0 - r) / 2.0],
            })?;
        }
    }
    let mut router = EfeRouter::new(EfeConfig::default())?;
    router.learn(&meter);
    let beliefs: Vec<[f64; REGIMES]> = (0..1024)
        .map(|_| {
            let b = [rng.next_f64(), rng.next_f64(), rng.next_f64()];
            let sum: f64 = b.iter().sum::<f64>().max(1e-9);
            b.map(|v| v / sum)
        })
        .collect();
    let x = random_x(&mut rng);
    let ceilings = Ceilings::default();
    let mut checksum = 0usize;
    let n = config.efe_routes.max(1);
    let start = Instant::now();
    for i in 0..n {
        let belief = &beliefs[(i % beliefs.len() as u64) as usize];
        checksum ^= router
            .choose(
                &arms,
                &ceilings,
                black_box(&x),
                100,
                black_box(belief),
                &prefs,
            )
            .unwrap_or(0);
    }
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    black_box(checksum);
    Ok(n as f64 / elapsed)
}

fn time_quotes(config: &PricingBenchConfig) -> Result<(f64, u64)> {
    let mut rng = TraceRng::new(config.seed);
    let mut mm = MarketMaker::new(MarketParams::default())?;
    let classes: Vec<String> = (0..config.model_classes.max(1))
        .map(|i| format!("class-{i}"))
        .collect();
    for class in &classes {
        mm.open(class, 1.0 + 9.0 * rng.next_f64())?;
        for tier in MARKET_TIERS {
            for _ in 0..20 {
                let load = 0.2 + 1.5 * rng.next_f64();
                mm.observe(
                    class,
                    tier,
                    &Observation {
                        offered_load: load,
                        occupancy: load,
                    },
                )?;
            }
        }
    }
    // Inputs drawn before the clock starts, cycled through.
    let inputs: Vec<(usize, usize, f64, f64)> = (0..4096)
        .map(|_| {
            let deadline = 1.0 + 100.0 * rng.next_f64();
            (
                rng.below(classes.len() as u64) as usize,
                rng.below(MARKET_TIERS.len() as u64) as usize,
                deadline,
                deadline * rng.next_f64(),
            )
        })
        .collect();
    let mut checksum = 0u64;
    let start = Instant::now();
    for i in 0..config.quotes {
        let (c, t, deadline, compute) = inputs[(i % inputs.len() as u64) as usize];
        let q = mm.quote(
            black_box(&classes[c]),
            MARKET_TIERS[t],
            black_box(deadline),
            compute,
        )?;
        checksum ^= q.ask_wei_per_s.rotate_left((i % 64) as u32);
    }
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    Ok((config.quotes as f64 / elapsed, black_box(checksum)))
}

fn tenants(config: &PricingBenchConfig) -> Result<(usize, usize, ReconstructionError)> {
    let (layers, cells) = (config.tenant_layers, config.tenant_cells);
    let mut rng = TraceRng::new(config.seed ^ 0x7e4a);
    let base_values: Vec<f32> = (0..layers * cells)
        .map(|_| (0.3 * rng.normal()) as f32)
        .collect();
    let base = BaseTable::new(layers, cells, base_values)?;
    let mut delta_bytes = 0;
    let mut sum = ReconstructionError {
        rmse: 0.0,
        relative_to_delta: 0.0,
        max_abs: 0.0,
    };
    let n = config.tenants.max(1);
    for _ in 0..n {
        // A tenant: a per-layer shift, ± preferences per cell of a per-layer size, and noise.
        let full: Vec<f32> = (0..layers * cells)
            .map(|i| {
                let l = i / cells;
                let shift = 0.05 * (l as f64 + 1.0);
                let like = if rng.next_f64() < 0.5 { 0.1 } else { -0.1 };
                (f64::from(base.value(l, i % cells)) + shift + like + 0.02 * rng.normal()) as f32
            })
            .collect();
        let delta = TenantDelta::fit(&base, &full)?;
        delta_bytes = delta.bytes();
        let e = reconstruction_error(&base, &full, &delta.reconstruct(&base));
        sum.rmse += e.rmse / n as f64;
        sum.relative_to_delta += e.relative_to_delta / n as f64;
        sum.max_abs = sum.max_abs.max(e.max_abs);
    }
    Ok((delta_bytes, base.f32_bytes(), sum))
}

fn random_x(rng: &mut TraceRng) -> [f64; FEATURES] {
    let mut x = [0.0; FEATURES];
    x[0] = 1.0;
    x[1] = rng.next_f64();
    x[2] = f64::from(u8::from(x[1] > 0.7));
    for slot in &mut x[5..] {
        *slot = f64::from(u8::from(rng.next_f64() < 0.3));
    }
    x
}

fn router(config: &PricingBenchConfig) -> Result<RouterFigures> {
    let mut rng = TraceRng::new(config.seed ^ 0xb4d1);
    let arms: Vec<Arm> = (0..config.router_arms.max(2))
        .map(|i| {
            // Trade-offs, as real model menus have: quality costs money and time.
            let quality = rng.next_f64();
            Arm {
                name: format!("arm-{i}"),
                quality,
                latency_s: 0.2 + 5.0 * quality * quality,
                cost_wei_per_mtok: (3_000_000.0 * quality * quality) as u64,
                code: rng.next_f64(),
                vision: 0.0,
                context_tokens: 131_072,
            }
        })
        .collect();
    let profiles: Vec<_> = arms.iter().map(Arm::profile).collect();
    // The population's W (what the logs reflect) and this tenant's (what the bandit must find).
    let mut population = Utility::default().flat();
    for w in &mut population {
        *w += 0.3 * rng.normal();
    }
    // The tenant differs most in what it wants per task (rows of the task features), which a
    // fixed arm cannot follow and a contextual policy can.
    let mut tenant = population;
    for (i, w) in tenant.iter_mut().enumerate() {
        let task_row = i / crate::routing::utility::PROFILE >= 5;
        *w += if task_row { 1.0 } else { 0.3 } * rng.normal();
    }
    let (population, tenant) = (Utility::from_flat(&population), Utility::from_flat(&tenant));
    let noise = 0.1;
    // Offline logs: uniformly random arms on the population.
    let logs: Vec<Logged> = (0..2000)
        .map(|_| {
            let x = random_x(&mut rng);
            let p = profiles[rng.below(profiles.len() as u64) as usize];
            Logged {
                features: x,
                profile: p,
                reward: population.score(&x, &p) + noise * rng.normal(),
            }
        })
        .collect();
    let offline = fit_ridge(&logs, 1.0)?;
    let mut bandit = LinUcb::new(&offline, 1.0, 0.3)?;
    let ceilings = Ceilings::default();
    let rounds = config.router_rounds.max(1);
    let mut fixed_totals = vec![0.0; arms.len()];
    let (mut bandit_total, mut offline_total, mut oracle_total) = (0.0, 0.0, 0.0);
    for _ in 0..rounds {
        let x = random_x(&mut rng);
        let expected: Vec<f64> = profiles.iter().map(|p| tenant.score(&x, p)).collect();
        for (total, e) in fixed_totals.iter_mut().zip(&expected) {
            *total += e;
        }
        oracle_total += expected.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let off = crate::routing::utility::rank(&arms, &ceilings, &offline, &x, 0)[0].arm;
        offline_total += expected[off];
        let arm = bandit
            .choose(&arms, &ceilings, &x, 0)
            .ok_or_else(|| invalid("router", "no admissible arm"))?;
        bandit_total += expected[arm];
        bandit.update(&x, &profiles[arm], expected[arm] + noise * rng.normal())?;
    }
    let (best_fixed_arm, best_total) =
        fixed_totals
            .iter()
            .copied()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (i, t)| {
                if t > best.1 { (i, t) } else { best }
            });
    let n = rounds as f64;
    debug_assert_eq!(JOINT, FEATURES * crate::routing::utility::PROFILE);
    Ok(RouterFigures {
        rounds,
        arms: arms.len(),
        best_fixed_arm,
        best_fixed_mean_reward: best_total / n,
        bandit_mean_reward: bandit_total / n,
        offline_mean_reward: offline_total / n,
        oracle_mean_reward: oracle_total / n,
    })
}

/// Runs every part of the pricing benchmark.
pub fn run_pricing_bench(config: &PricingBenchConfig) -> Result<PricingReport> {
    if config.quotes == 0 || config.tenant_layers == 0 || config.tenant_cells == 0 {
        return Err(invalid(
            "bench",
            "quotes, tenant_layers and tenant_cells must be > 0",
        ));
    }
    let (quotes_per_s, quote_checksum) = time_quotes(config)?;
    let (tenant_bytes, tenant_f32_bytes, tenant_reconstruction) = tenants(config)?;
    let router = router(config)?;
    let efe_routes_per_s = time_efe(config)?;
    let regime_routing = shift_replay(&ShiftConfig {
        seed: config.seed,
        ..config.shift.clone()
    })?;
    let mm_vs_fixed = market_maker_vs_fixed(&config.sim, &MarketParams::default())?;
    Ok(PricingReport {
        quotes_per_s,
        quote_checksum,
        tenant_bytes,
        tenant_f32_bytes,
        tenant_compression: tenant_f32_bytes as f64 / tenant_bytes as f64,
        tenant_reconstruction,
        router_regret: router.best_fixed_mean_reward - router.bandit_mean_reward,
        router,
        efe_routes_per_s,
        efe_regret: regime_routing.efe.regret_vs_fixed,
        efe_deadline_hit: regime_routing.efe.deadline_hit,
        linucb_shift_regret: regime_routing.linucb.regret_vs_fixed,
        efe_to_linucb_regret: regime_routing.efe_to_linucb_regret,
        efe_to_linucb_adaptation: regime_routing.efe_to_linucb_adaptation,
        regime_routing,
        mm_vs_fixed,
    })
}
