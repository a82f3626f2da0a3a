//! A regime-shifting routing replay: expected free energy against LinUCB and the best fixed arm,
//! every policy metered, on the same requests and the same draws.
//!
//! **The world.** Nine arms, three models (small, mid, large) × three provider classes:
//! - `fleet`: this exchange's providers, spot-priced — cheap when calm, dear in a surge (what
//!   the market maker's ask does across regimes), and slow in a surge (queues);
//! - `partner`: a wholesale price that does not move, latency that holds until a surge;
//! - `community`: free, slow, and slower as load rises.
//!
//! Demand regimes follow the market maker's own HMM ([`Hmm::default`], sticky, ≈ 50 periods a
//! spell); the maker observes each period's load and its filtered belief is what the EFE router
//! routes under (the belief after the previous period: the load of a period is known at its
//! end). One tenant sends `requests_per_period` requests a period with the same order terms
//! (deadline, tier T1, a price limit per million tokens), so the arm that is best changes only
//! with the regime: a mid model on the fleet when calm, on the partner when busy, a small model
//! in a surge.
//!
//! **The policies**, each with its own [`Meter`] and learning only from it:
//! - EFE: [`EfeRouter`], starting from nothing (prior counts);
//! - LinUCB: the existing bandit ([`LinUcb`]) on the request features and arm profiles, started
//!   from a ridge fit on a warm-up log of uniformly random arms (another seed), its reward the
//!   log-preference `ln C(o)` of the metered outcome — the same scale the EFE router prefers on;
//! - fixed: the arm with the best expected reward over the whole replay, in hindsight.
//!
//! **The figures.** Expected reward per round is `E[ln C(o) | arm, true regime]`, estimated once
//! per (arm, regime) by Monte Carlo on a separate seed, so regret carries no draw noise.
//! Oracle regret is the gap to the best admissible arm in the true regime (≥ 0); regret against
//! the fixed arm is the benchmark's `router_regret` definition (negative: better than it).
//! **Adaptation** after a shift is the number of rounds until the mean oracle regret over the
//! next `adaptation_window` rounds is back within 10 % of its level over the
//! `pre_shift_window` rounds before the shift (with a floor of [`ADAPTATION_FLOOR`] nats, since
//! "within 10 % of zero" is out of reach of any router that ever explores); a shift whose
//! spell ends first counts its whole spell.

use super::bandit::LinUcb;
use super::efe::{EfeConfig, EfeRouter};
use super::features::{FEATURES, Features};
use super::outcome::{OrderTerms, Outcome, Preferences};
use super::ridge::{Logged, fit_ridge};
use super::utility::{Arm, Ceilings, admissible};
use crate::error::{Result, invalid};
use crate::meter::{Meter, MeterRecord, MeterSummary};
use crate::pricing::hmm::{Hmm, REGIMES};
use crate::pricing::market::{MarketMaker, MarketParams};
use crate::rng::TraceRng;
use cx_protocol::Tier;
use serde::Serialize;

/// Absolute floor of the adaptation threshold, nats per round.
pub const ADAPTATION_FLOOR: f64 = 0.02;
/// The order's price limit, wei per million tokens.
pub const LIMIT_WEI_PER_MTOK: u128 = 1_500_000;
/// The order's deadline, seconds.
pub const DEADLINE_S: f64 = 4.0;

/// What to replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShiftConfig {
    /// Fixes regimes, requests and draws.
    pub seed: u64,
    /// Market periods (each one HMM step).
    pub periods: usize,
    /// Requests routed per period.
    pub requests_per_period: usize,
    /// The EFE router's parameters.
    pub efe: EfeConfig,
    /// LinUCB exploration α.
    pub linucb_alpha: f64,
    /// LinUCB (and the warm-up ridge) penalty λ.
    pub linucb_lambda: f64,
    /// Uniformly random rounds in LinUCB's offline warm-up log.
    pub warmup_rounds: usize,
    /// Rounds averaged for the pre-shift regret level.
    pub pre_shift_window: usize,
    /// Rounds averaged when testing whether regret is back.
    pub adaptation_window: usize,
}

impl Default for ShiftConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            periods: 1000,
            requests_per_period: 20,
            efe: EfeConfig::default(),
            linucb_alpha: 0.3,
            linucb_lambda: 1.0,
            warmup_rounds: 2000,
            pre_shift_window: 200,
            adaptation_window: 20,
        }
    }
}

/// One policy's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShiftPolicy {
    /// Mean expected reward per round (`E[ln C(o)]`, nats).
    pub mean_reward: f64,
    /// Mean per-round regret against the best fixed arm (negative: it beat it).
    pub regret_vs_fixed: f64,
    /// Mean per-round regret against the best arm of the true regime (≥ 0).
    pub oracle_regret: f64,
    /// Mean rounds to adapt after a regime shift (see the module docs).
    pub adaptation_rounds: f64,
    /// Shifts after which regret was not back before the next shift.
    pub unrecovered_shifts: usize,
    /// Deadline hit rate, from the policy's meter.
    pub deadline_hit: f64,
    /// Mean charged per request, wei, from the policy's meter.
    pub mean_cost_wei: f64,
    /// The policy's meter, totalled.
    pub meter: MeterSummary,
}

/// Everything the replay measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShiftReplay {
    /// Requests routed (per policy).
    pub rounds: usize,
    /// Regime shifts in the replay.
    pub shifts: usize,
    /// Arm names, index order.
    pub arms: Vec<String>,
    /// Arms the ceilings admit.
    pub admissible_arms: usize,
    /// The best fixed arm in hindsight.
    pub best_fixed_arm: String,
    /// Mean expected reward per round of the per-regime best arm.
    pub oracle_mean_reward: f64,
    /// Share of rounds whose regime the market maker's belief (at routing time) ranked first.
    pub belief_accuracy: f64,
    /// Routing by expected free energy.
    pub efe: ShiftPolicy,
    /// Routing by LinUCB.
    pub linucb: ShiftPolicy,
    /// Always the best fixed arm.
    pub fixed: ShiftPolicy,
    /// `efe.oracle_regret / linucb.oracle_regret` (below 1: EFE regrets less).
    pub efe_to_linucb_regret: f64,
    /// `efe.adaptation_rounds / linucb.adaptation_rounds` (below 1: EFE adapts faster).
    pub efe_to_linucb_adaptation: f64,
}

struct Model {
    name: &'static str,
    quality: f64,
    latency_s: f64,
    price_wei_per_mtok: f64,
}

struct Class {
    name: &'static str,
    price: [f64; REGIMES],
    latency: [f64; REGIMES],
    quality: f64,
}

const MODELS: [Model; 3] = [
    Model {
        name: "small",
        quality: 0.45,
        latency_s: 0.6,
        price_wei_per_mtok: 60_000.0,
    },
    Model {
        name: "mid",
        quality: 0.68,
        latency_s: 1.2,
        price_wei_per_mtok: 300_000.0,
    },
    Model {
        name: "large",
        quality: 0.85,
        latency_s: 2.4,
        price_wei_per_mtok: 1_200_000.0,
    },
];

const CLASSES: [Class; 3] = [
    Class {
        name: "fleet",
        price: [0.6, 1.0, 2.5],
        latency: [1.0, 1.6, 4.0],
        quality: 0.0,
    },
    Class {
        name: "partner",
        price: [1.6, 1.6, 1.6],
        latency: [1.3, 1.3, 2.5],
        quality: 0.0,
    },
    Class {
        name: "community",
        price: [0.0, 0.0, 0.0],
        latency: [1.5, 3.0, 6.0],
        quality: -0.05,
    },
];

const ARMS: usize = MODELS.len() * CLASSES.len();

/// The arms as the router sees them: listed (calm, nominal) numbers that the ceilings check.
fn arms() -> Vec<Arm> {
    (0..ARMS)
        .map(|i| {
            let (m, c) = (&MODELS[i / CLASSES.len()], &CLASSES[i % CLASSES.len()]);
            Arm {
                name: format!("{}@{}", m.name, c.name),
                quality: m.quality + c.quality,
                latency_s: m.latency_s * c.latency[0],
                // The nominal price: the busy regime's multiplier (the reference the spot moves around).
                cost_wei_per_mtok: (m.price_wei_per_mtok * c.price[1]) as u64,
                code: 0.5,
                vision: 0.0,
                context_tokens: 131_072,
            }
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct Draw {
    latency_s: f64,
    quality: f64,
    cost_wei: u128,
}

fn draw(arm: usize, regime: usize, tokens: u32, rng: &mut TraceRng) -> Draw {
    let (m, c) = (&MODELS[arm / CLASSES.len()], &CLASSES[arm % CLASSES.len()]);
    let latency_s = m.latency_s * c.latency[regime] * (0.25 * rng.normal()).exp();
    let quality = (m.quality + c.quality + 0.08 * rng.normal()).clamp(0.0, 1.0);
    let rate = m.price_wei_per_mtok * c.price[regime] * (1.0 + 0.1 * rng.normal()).max(0.0);
    Draw {
        latency_s,
        quality,
        cost_wei: (f64::from(tokens) * rate / 1e6).round() as u128,
    }
}

fn order(tokens: u32) -> OrderTerms {
    OrderTerms {
        deadline_s: DEADLINE_S,
        tier: Tier::T1,
        max_cost_wei: Some(u128::from(tokens) * LIMIT_WEI_PER_MTOK / 1_000_000),
    }
}

fn features(tokens: u32) -> Features {
    let mut x = [0.0; FEATURES];
    x[0] = 1.0;
    x[1] = f64::from(tokens).ln_1p() / 131_072f64.ln_1p();
    x
}

fn record(request: u64, arm: &Arm, d: Draw, o: &OrderTerms, belief: [f64; REGIMES]) -> MeterRecord {
    MeterRecord {
        request,
        tenant: "replay".into(),
        arm: arm.name.clone(),
        cost_wei: d.cost_wei,
        latency_s: d.latency_s,
        quality: d.quality,
        deadline_s: o.deadline_s,
        max_cost_wei: o.max_cost_wei,
        tier: o.tier,
        belief,
    }
}

/// `E[ln C(o) | arm, regime]` by Monte Carlo (the order's bands do not depend on its size).
fn expected_rewards(seed: u64, prefs: &Preferences) -> [[f64; REGIMES]; ARMS] {
    let mut rng = TraceRng::new(seed ^ 0xe0e0);
    let samples = 4000;
    let mut out = [[0.0; REGIMES]; ARMS];
    let o = order(1000);
    let arms = arms();
    for (a, row) in out.iter_mut().enumerate() {
        for (s, slot) in row.iter_mut().enumerate() {
            let mut total = 0.0;
            let mut r = record(0, &arms[a], draw(a, s, 1000, &mut rng), &o, [1.0, 0.0, 0.0]);
            for _ in 0..samples {
                let d = draw(a, s, 1000, &mut rng);
                (r.latency_s, r.quality, r.cost_wei) = (d.latency_s, d.quality, d.cost_wei);
                total += prefs.log_joint(&Outcome::of(&r));
            }
            *slot = total / f64::from(samples);
        }
    }
    out
}

fn tokens(rng: &mut TraceRng) -> u32 {
    500 + rng.below(2500) as u32
}

/// LinUCB's offline start: ridge on uniformly random admissible arms over a warm-up run.
fn warm_start(config: &ShiftConfig, arms: &[Arm], open: &[usize]) -> Result<LinUcb> {
    let mut rng = TraceRng::new(config.seed ^ 0x5eed);
    let rounds = config.warmup_rounds.max(1);
    let periods = rounds.div_ceil(config.requests_per_period).max(2);
    let (regimes, _) = Hmm::default().sample(&mut rng, periods);
    let mut logs = Vec::with_capacity(rounds);
    for t in 0..rounds {
        let s = regimes[t / config.requests_per_period].index();
        let n = tokens(&mut rng);
        let o = order(n);
        let a = open[rng.below(open.len() as u64) as usize];
        let r = record(0, &arms[a], draw(a, s, n, &mut rng), &o, [1.0, 0.0, 0.0]);
        logs.push(Logged {
            features: features(n),
            profile: arms[a].profile(),
            reward: Preferences::from_order(&o)?.log_joint(&Outcome::of(&r)),
        });
    }
    let offline = fit_ridge(&logs, config.linucb_lambda)?;
    LinUcb::new(&offline, config.linucb_lambda, config.linucb_alpha)
}

/// Rounds to return within tolerance after each shift; (mean, unrecovered).
fn adaptation(regret: &[f64], shifts: &[usize], pre_window: usize, window: usize) -> (f64, usize) {
    if shifts.is_empty() {
        return (0.0, 0);
    }
    let mean = |a: usize, b: usize| regret[a..b].iter().sum::<f64>() / (b - a).max(1) as f64;
    let (mut total, mut unrecovered) = (0usize, 0usize);
    for (i, &t0) in shifts.iter().enumerate() {
        let previous = if i == 0 { 0 } else { shifts[i - 1] };
        let end = shifts.get(i + 1).copied().unwrap_or(regret.len());
        let pre = mean(t0.saturating_sub(pre_window).max(previous), t0);
        let threshold = pre + (0.1 * pre).max(ADAPTATION_FLOOR);
        match (t0..end).find(|&t| mean(t, (t + window).min(end)) <= threshold) {
            Some(t) => total += t - t0,
            None => {
                total += end - t0;
                unrecovered += 1;
            }
        }
    }
    (total as f64 / shifts.len() as f64, unrecovered)
}

struct Track {
    meter: Meter,
    reward: Vec<f64>,
    regret: Vec<f64>,
}

impl Track {
    fn new(rounds: usize) -> Self {
        Self {
            meter: Meter::new(),
            reward: Vec::with_capacity(rounds),
            regret: Vec::with_capacity(rounds),
        }
    }

    fn finish(&self, fixed_mean: f64, shifts: &[usize], config: &ShiftConfig) -> ShiftPolicy {
        let n = self.reward.len().max(1) as f64;
        let mean_reward = self.reward.iter().sum::<f64>() / n;
        let (adaptation_rounds, unrecovered_shifts) = adaptation(
            &self.regret,
            shifts,
            config.pre_shift_window,
            config.adaptation_window.max(1),
        );
        let meter = self.meter.summary();
        ShiftPolicy {
            mean_reward,
            regret_vs_fixed: fixed_mean - mean_reward,
            oracle_regret: self.regret.iter().sum::<f64>() / n,
            adaptation_rounds,
            unrecovered_shifts,
            deadline_hit: meter.deadline_hit_rate,
            mean_cost_wei: meter.cost_wei as f64 / meter.requests.max(1) as f64,
            meter,
        }
    }
}

/// Runs the replay (deterministic in `config`).
pub fn shift_replay(config: &ShiftConfig) -> Result<ShiftReplay> {
    if config.periods < 2 || config.requests_per_period == 0 {
        return Err(invalid(
            "shift.periods",
            "needs at least 2 periods and 1 request per period",
        ));
    }
    let arms = arms();
    let ceilings = Ceilings {
        max_cost_wei_per_mtok: LIMIT_WEI_PER_MTOK as u64,
        ..Ceilings::default()
    };
    let x0 = features(1000);
    let open: Vec<usize> = (0..ARMS)
        .filter(|a| admissible(&arms[*a], &ceilings, &x0, 4000))
        .collect();
    let prefs = Preferences::from_order(&order(1000))?;
    let expected = expected_rewards(config.seed, &prefs);
    let best_in = |s: usize| {
        open.iter()
            .map(|a| expected[*a][s])
            .fold(f64::NEG_INFINITY, f64::max)
    };

    let mut rng = TraceRng::new(config.seed);
    let (regimes, trace) = Hmm::default().sample(&mut rng, config.periods);
    let rounds = config.periods * config.requests_per_period;
    let true_regime = |t: usize| regimes[t / config.requests_per_period].index();
    let fixed = *open
        .iter()
        .max_by(|a, b| {
            let total = |a: usize| {
                (0..rounds)
                    .map(|t| expected[a][true_regime(t)])
                    .sum::<f64>()
            };
            total(**a).total_cmp(&total(**b)).then(b.cmp(a))
        })
        .expect("the ceilings admit arms");

    let mut mm = MarketMaker::new(MarketParams::default())?;
    mm.open("replay", 4.0)?;
    let mut belief = Hmm::default().prior();
    let mut efe = EfeRouter::new(config.efe)?;
    let mut bandit = warm_start(config, &arms, &open)?;
    let (mut t_efe, mut t_lin, mut t_fix) =
        (Track::new(rounds), Track::new(rounds), Track::new(rounds));
    let mut shifts = Vec::new();
    let mut believed_right = 0usize;
    let mut oracle_total = 0.0;
    let mut draws = vec![
        Draw {
            latency_s: 0.0,
            quality: 0.0,
            cost_wei: 0
        };
        ARMS
    ];
    for (p, obs) in trace.iter().enumerate() {
        let s = regimes[p].index();
        if p > 0 && regimes[p] != regimes[p - 1] {
            shifts.push(p * config.requests_per_period);
        }
        for k in 0..config.requests_per_period {
            let request = (p * config.requests_per_period + k) as u64;
            let n = tokens(&mut rng);
            let o = order(n);
            let x = features(n);
            // Common random numbers: an arm's answer to this request is the same whichever
            // policy sends it there.
            for (a, slot) in draws.iter_mut().enumerate() {
                *slot = draw(a, s, n, &mut rng);
            }
            let best = best_in(s);
            oracle_total += best;
            believed_right +=
                usize::from(crate::pricing::hmm::Regime::most_likely(&belief) == regimes[p]);

            let a = efe
                .choose(&arms, &ceilings, &x, n, &belief, &prefs)
                .ok_or_else(|| invalid("shift", "no admissible arm"))?;
            t_efe
                .meter
                .record(record(request, &arms[a], draws[a], &o, belief))?;
            efe.learn(&t_efe.meter);
            t_efe.reward.push(expected[a][s]);
            t_efe.regret.push(best - expected[a][s]);

            let a = bandit
                .choose(&arms, &ceilings, &x, n)
                .ok_or_else(|| invalid("shift", "no admissible arm"))?;
            let at = t_lin
                .meter
                .record(record(request, &arms[a], draws[a], &o, belief))?;
            // The bandit's reward is read back from its meter record, as the EFE router's is.
            let r = &t_lin.meter.records()[at];
            bandit.update(&x, &arms[a].profile(), prefs.log_joint(&Outcome::of(r)))?;
            t_lin.reward.push(expected[a][s]);
            t_lin.regret.push(best - expected[a][s]);

            t_fix
                .meter
                .record(record(request, &arms[fixed], draws[fixed], &o, belief))?;
            t_fix.reward.push(expected[fixed][s]);
            t_fix.regret.push(best - expected[fixed][s]);
        }
        mm.observe("replay", Tier::T0, obs)?;
        belief = mm
            .state("replay", Tier::T0)
            .expect("the market was opened")
            .belief;
    }
    let fixed_mean = t_fix.reward.iter().sum::<f64>() / rounds as f64;
    let efe_fig = t_efe.finish(fixed_mean, &shifts, config);
    let lin_fig = t_lin.finish(fixed_mean, &shifts, config);
    let fix_fig = t_fix.finish(fixed_mean, &shifts, config);
    let ratio = |a: f64, b: f64| if b == 0.0 { f64::INFINITY } else { a / b };
    Ok(ShiftReplay {
        rounds,
        shifts: shifts.len(),
        arms: arms.iter().map(|a| a.name.clone()).collect(),
        admissible_arms: open.len(),
        best_fixed_arm: arms[fixed].name.clone(),
        oracle_mean_reward: oracle_total / rounds as f64,
        belief_accuracy: believed_right as f64 / rounds as f64,
        efe_to_linucb_regret: ratio(efe_fig.oracle_regret, lin_fig.oracle_regret),
        efe_to_linucb_adaptation: ratio(efe_fig.adaptation_rounds, lin_fig.adaptation_rounds),
        efe: efe_fig,
        linucb: lin_fig,
        fixed: fix_fig,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efe_regrets_less_and_adapts_faster_than_linucb_on_regime_shifts() {
        for seed in [1, 2] {
            let r = shift_replay(&ShiftConfig {
                seed,
                periods: 250,
                ..ShiftConfig::default()
            })
            .unwrap();
            assert!(r.shifts > 0, "{r:#?}");
            assert!(r.efe.oracle_regret < r.linucb.oracle_regret, "{r:#?}");
            assert!(
                r.efe.adaptation_rounds < r.linucb.adaptation_rounds,
                "{r:#?}"
            );
            assert!(
                r.efe.regret_vs_fixed < 0.0,
                "EFE beats the best fixed arm: {r:#?}"
            );
            // The ceilings still gate: the partner's large model is dearer than the limit.
            assert_eq!(r.admissible_arms, ARMS - 1);
            // What is reported is what was metered: one record per routed request.
            for p in [&r.efe, &r.linucb, &r.fixed] {
                assert_eq!(p.meter.requests as usize, r.rounds);
                assert_eq!(p.meter.served as usize, r.rounds);
                assert_eq!(p.deadline_hit, p.meter.deadline_hit_rate);
            }
        }
        let small = ShiftConfig {
            periods: 40,
            ..ShiftConfig::default()
        };
        assert_eq!(shift_replay(&small).unwrap(), shift_replay(&small).unwrap());
        assert!(
            shift_replay(&ShiftConfig {
                periods: 1,
                ..ShiftConfig::default()
            })
            .is_err()
        );
    }

    #[test]
    fn adaptation_counts_rounds_until_regret_is_back() {
        // Level 0 before the shift at 10, regret 1 for 5 rounds, then 0 again.
        let mut regret = vec![0.0; 30];
        regret[10..15].iter_mut().for_each(|r| *r = 1.0);
        assert_eq!(adaptation(&regret, &[10], 10, 1), (5.0, 0));
        // Never back before the end: the whole spell, unrecovered.
        regret[10..].iter_mut().for_each(|r| *r = 1.0);
        assert_eq!(adaptation(&regret, &[10], 10, 1), (20.0, 1));
    }
}
