//! A hidden Markov model over observed load: which regime (calm, busy, surge) a market is in.
//!
//! Observations are two dimensionless numbers per market and period — the offered load ρ
//! (arrivals × mean work ÷ capacity) and the occupancy q (busy plus queued work ÷ capacity) —
//! with diagonal Gaussian emissions per regime. Online, the market maker runs the **forward
//! algorithm** one observation at a time (predict with the transition matrix, weigh by the
//! emission likelihood, normalise). Offline, [`Hmm::fit`] runs **Baum–Welch** (scaled
//! forward–backward, Rabiner 1989 §V.A) over a recorded trace; [`Hmm::default`] is the prior
//! used when no trace exists yet.
//!
//! Observations that are NaN, infinite or negative are refused with the field named, never
//! folded into the belief: one bad report must not move every quote in a market.

use crate::error::{Result, invalid};
use crate::rng::TraceRng;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Number of regimes the model distinguishes.
pub const REGIMES: usize = 3;
/// Dimensions of one observation (offered load, occupancy).
pub const OBSERVATION_DIMS: usize = 2;
/// Largest occupancy accepted: ten times capacity queued is a broken report, not a market.
pub const MAX_OCCUPANCY: f64 = 10.0;
/// Smallest emission standard deviation Baum–Welch may fit: keeps a regime seen on a flat
/// stretch of trace from collapsing to a point mass (likelihoods of 0 everywhere else).
pub const MIN_STD: f64 = 0.01;

/// A market's load regime, ordered by load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Regime {
    /// Spare capacity: prices lean down to fill it.
    Calm,
    /// Near the target occupancy.
    Busy,
    /// Demand above capacity: prices lean up to protect deadlines.
    Surge,
}

impl Regime {
    /// Every regime, in index order.
    pub const ALL: [Regime; REGIMES] = [Self::Calm, Self::Busy, Self::Surge];

    /// Index of the regime in per-regime arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The regime at `index` (clamped to the last one).
    pub fn from_index(index: usize) -> Self {
        Self::ALL[index.min(REGIMES - 1)]
    }

    /// The most likely regime of a belief (ties go to the calmer regime).
    pub fn most_likely(belief: &[f64; REGIMES]) -> Self {
        let mut best = 0;
        for (i, &b) in belief.iter().enumerate() {
            if b > belief[best] {
                best = i;
            }
        }
        Self::from_index(best)
    }
}

impl fmt::Display for Regime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Calm => "calm",
            Self::Busy => "busy",
            Self::Surge => "surge",
        })
    }
}

/// One period's load report for one market.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observation {
    /// ρ: work that arrived in the period ÷ the capacity of the period (dimensionless, ≥ 0).
    pub offered_load: f64,
    /// q: busy plus queued work ÷ capacity at the end of the period (≥ 0; above 1 is backlog).
    pub occupancy: f64,
}

impl Observation {
    /// Refuses NaN, infinite, negative or absurd values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("observation.offered_load", self.offered_load),
            ("observation.occupancy", self.occupancy),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(invalid(
                    field,
                    format!("must be a finite number >= 0, got {value}"),
                ));
            }
            if value > MAX_OCCUPANCY {
                return Err(invalid(
                    field,
                    format!("must be at most {MAX_OCCUPANCY} (times capacity), got {value}"),
                ));
            }
        }
        Ok(())
    }

    fn values(&self) -> [f64; OBSERVATION_DIMS] {
        [self.offered_load, self.occupancy]
    }
}

/// The model: initial distribution, transition matrix and diagonal Gaussian emissions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hmm {
    /// π: probability of each regime at the first observation.
    pub initial: [f64; REGIMES],
    /// A: `transition[from][to]`, rows sum to 1.
    pub transition: [[f64; REGIMES]; REGIMES],
    /// Emission means per regime: `[offered_load, occupancy]`.
    pub mean: [[f64; OBSERVATION_DIMS]; REGIMES],
    /// Emission standard deviations per regime, same layout as `mean`.
    pub std: [[f64; OBSERVATION_DIMS]; REGIMES],
}

impl Default for Hmm {
    /// Sticky regimes (expected stay 50 periods) around loads of 0.4, 0.85 and 1.4 of capacity:
    /// a prior that a Baum–Welch fit on the market's own trace replaces.
    fn default() -> Self {
        let stay = 0.98;
        let leave = (1.0 - stay) / 2.0;
        Self {
            initial: [1.0 / 3.0; REGIMES],
            transition: [
                [stay, leave, leave],
                [leave, stay, leave],
                [leave, leave, stay],
            ],
            mean: [[0.4, 0.4], [0.85, 0.85], [1.4, 1.5]],
            std: [[0.15, 0.15], [0.15, 0.15], [0.25, 0.35]],
        }
    }
}

impl Hmm {
    /// Checks that probabilities are probabilities and spreads are positive.
    pub fn validate(&self) -> Result<()> {
        let stochastic = |field: &str, row: &[f64; REGIMES]| {
            let sum: f64 = row.iter().sum();
            if row.iter().any(|p| !p.is_finite() || *p < 0.0) || (sum - 1.0).abs() > 1e-6 {
                Err(invalid(
                    field,
                    format!("must be probabilities summing to 1, got {row:?}"),
                ))
            } else {
                Ok(())
            }
        };
        stochastic("hmm.initial", &self.initial)?;
        for (i, row) in self.transition.iter().enumerate() {
            stochastic(&format!("hmm.transition[{i}]"), row)?;
        }
        for r in 0..REGIMES {
            for d in 0..OBSERVATION_DIMS {
                if !self.mean[r][d].is_finite() {
                    return Err(invalid(&format!("hmm.mean[{r}][{d}]"), "must be finite"));
                }
                if !(self.std[r][d].is_finite() && self.std[r][d] > 0.0) {
                    return Err(invalid(
                        &format!("hmm.std[{r}][{d}]"),
                        "must be finite and > 0",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Emission likelihoods of `obs` under each regime, scaled so that the largest is 1.
    ///
    /// The common scale cancels when a belief is normalised, and keeps an observation far from
    /// every mean from underflowing all three likelihoods to 0.
    fn emissions(&self, obs: &[f64; OBSERVATION_DIMS]) -> [f64; REGIMES] {
        let mut log = [0.0; REGIMES];
        for (r, l) in log.iter_mut().enumerate() {
            for (d, x) in obs.iter().enumerate() {
                let z = (x - self.mean[r][d]) / self.std[r][d];
                *l += -0.5 * z * z - self.std[r][d].ln();
            }
        }
        let max = log.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        log.map(|l| (l - max).exp())
    }

    /// The belief before any observation.
    pub fn prior(&self) -> [f64; REGIMES] {
        self.initial
    }

    /// One step of the forward algorithm: predict with A, weigh by the emission, normalise.
    ///
    /// `belief` is the filtered distribution after the previous observation (use
    /// [`Hmm::prior`] before the first one and pass `first = true`).
    pub fn filter_step(
        &self,
        belief: &[f64; REGIMES],
        obs: &Observation,
        first: bool,
    ) -> Result<[f64; REGIMES]> {
        obs.validate()?;
        let predicted = if first {
            *belief
        } else {
            let mut p = [0.0; REGIMES];
            for (from, b) in belief.iter().enumerate() {
                for (to, slot) in p.iter_mut().enumerate() {
                    *slot += b * self.transition[from][to];
                }
            }
            p
        };
        let e = self.emissions(&obs.values());
        let mut next = [0.0; REGIMES];
        for r in 0..REGIMES {
            next[r] = predicted[r] * e[r];
        }
        let sum: f64 = next.iter().sum();
        if !(sum.is_finite() && sum > 0.0) {
            // Every regime found the observation impossible after the prediction: restart
            // from the emission alone rather than divide by zero.
            let sum_e: f64 = e.iter().sum();
            return Ok(e.map(|x| x / sum_e));
        }
        Ok(next.map(|x| x / sum))
    }

    /// Filtered beliefs after each observation of a trace.
    pub fn filter(&self, trace: &[Observation]) -> Result<Vec<[f64; REGIMES]>> {
        let mut belief = self.prior();
        let mut out = Vec::with_capacity(trace.len());
        for (t, obs) in trace.iter().enumerate() {
            belief = self.filter_step(&belief, obs, t == 0)?;
            out.push(belief);
        }
        Ok(out)
    }

    /// Draws a synthetic trace of `periods` observations and the regimes that made them.
    pub fn sample(&self, rng: &mut TraceRng, periods: usize) -> (Vec<Regime>, Vec<Observation>) {
        let pick = |rng: &mut TraceRng, probs: &[f64; REGIMES]| {
            let u = rng.next_f64();
            let mut acc = 0.0;
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if u < acc {
                    return i;
                }
            }
            REGIMES - 1
        };
        let mut regimes = Vec::with_capacity(periods);
        let mut trace = Vec::with_capacity(periods);
        let mut r = pick(rng, &self.initial);
        for t in 0..periods {
            if t > 0 {
                r = pick(rng, &self.transition[r]);
            }
            let draw = |rng: &mut TraceRng, d: usize| {
                (self.mean[r][d] + self.std[r][d] * rng.normal()).clamp(0.0, MAX_OCCUPANCY)
            };
            let offered_load = draw(rng, 0);
            let occupancy = draw(rng, 1);
            regimes.push(Regime::from_index(r));
            trace.push(Observation {
                offered_load,
                occupancy,
            });
        }
        (regimes, trace)
    }

    /// Baum–Welch: `iterations` EM rounds from `self` over `trace`, regimes then relabelled in
    /// order of mean offered load (so `Calm` stays the calmest whatever EM converged to).
    ///
    /// Every observation is validated first; a trace shorter than 2 periods is refused.
    pub fn fit(&self, trace: &[Observation], iterations: usize) -> Result<Hmm> {
        self.validate()?;
        if trace.len() < 2 {
            return Err(invalid("trace", "Baum–Welch needs at least 2 observations"));
        }
        for obs in trace {
            obs.validate()?;
        }
        let n = trace.len();
        let obs: Vec<[f64; OBSERVATION_DIMS]> = trace.iter().map(Observation::values).collect();
        let mut model = self.clone();
        let mut alpha = vec![[0.0; REGIMES]; n];
        let mut beta = vec![[0.0; REGIMES]; n];
        let mut scale = vec![0.0; n];
        let mut emission = vec![[0.0; REGIMES]; n];
        for _ in 0..iterations {
            for (t, o) in obs.iter().enumerate() {
                emission[t] = model.emissions(o);
            }
            // Scaled forward pass.
            for t in 0..n {
                let mut a = [0.0; REGIMES];
                for j in 0..REGIMES {
                    let prior = if t == 0 {
                        model.initial[j]
                    } else {
                        (0..REGIMES)
                            .map(|i| alpha[t - 1][i] * model.transition[i][j])
                            .sum()
                    };
                    a[j] = prior * emission[t][j];
                }
                let c: f64 = a.iter().sum::<f64>().max(f64::MIN_POSITIVE);
                scale[t] = c;
                alpha[t] = a.map(|x| x / c);
            }
            // Scaled backward pass with the forward scales.
            beta[n - 1] = [1.0; REGIMES];
            for t in (0..n - 1).rev() {
                let mut b = [0.0; REGIMES];
                for (i, slot) in b.iter_mut().enumerate() {
                    *slot = (0..REGIMES)
                        .map(|j| model.transition[i][j] * emission[t + 1][j] * beta[t + 1][j])
                        .sum::<f64>()
                        / scale[t + 1];
                }
                beta[t] = b;
            }
            // Expected counts.
            let mut gamma_sum = [0.0; REGIMES];
            let mut gamma_sum_head = [0.0; REGIMES]; // over t < n-1, for transitions
            let mut xi_sum = [[0.0; REGIMES]; REGIMES];
            let mut weighted = [[0.0; OBSERVATION_DIMS]; REGIMES];
            let mut weighted_sq = [[0.0; OBSERVATION_DIMS]; REGIMES];
            let mut first_gamma = [0.0; REGIMES];
            for t in 0..n {
                let mut g = [0.0; REGIMES];
                for r in 0..REGIMES {
                    g[r] = alpha[t][r] * beta[t][r];
                }
                let gs: f64 = g.iter().sum::<f64>().max(f64::MIN_POSITIVE);
                let g = g.map(|x| x / gs);
                if t == 0 {
                    first_gamma = g;
                }
                for r in 0..REGIMES {
                    gamma_sum[r] += g[r];
                    if t + 1 < n {
                        gamma_sum_head[r] += g[r];
                    }
                    for d in 0..OBSERVATION_DIMS {
                        weighted[r][d] += g[r] * obs[t][d];
                        weighted_sq[r][d] += g[r] * obs[t][d] * obs[t][d];
                    }
                }
                if t + 1 < n {
                    let mut xi = [[0.0; REGIMES]; REGIMES];
                    let mut total = 0.0;
                    for i in 0..REGIMES {
                        for j in 0..REGIMES {
                            xi[i][j] = alpha[t][i]
                                * model.transition[i][j]
                                * emission[t + 1][j]
                                * beta[t + 1][j];
                            total += xi[i][j];
                        }
                    }
                    let total = total.max(f64::MIN_POSITIVE);
                    for i in 0..REGIMES {
                        for j in 0..REGIMES {
                            xi_sum[i][j] += xi[i][j] / total;
                        }
                    }
                }
            }
            // M step; a regime that no period visits keeps its old parameters.
            model.initial = first_gamma;
            for i in 0..REGIMES {
                if gamma_sum_head[i] > 1e-9 {
                    let row: [f64; REGIMES] = xi_sum[i].map(|x| x / gamma_sum_head[i]);
                    let s: f64 = row.iter().sum();
                    model.transition[i] = row.map(|x| x / s);
                }
                if gamma_sum[i] > 1e-9 {
                    for d in 0..OBSERVATION_DIMS {
                        let mean = weighted[i][d] / gamma_sum[i];
                        let var = (weighted_sq[i][d] / gamma_sum[i] - mean * mean).max(0.0);
                        model.mean[i][d] = mean;
                        model.std[i][d] = var.sqrt().max(MIN_STD);
                    }
                }
            }
        }
        Ok(model.relabelled())
    }

    /// The same model with regimes ordered by mean offered load.
    fn relabelled(&self) -> Hmm {
        let mut order: [usize; REGIMES] = std::array::from_fn(|i| i);
        order.sort_by(|&a, &b| self.mean[a][0].total_cmp(&self.mean[b][0]));
        let mut out = self.clone();
        for (new, &old) in order.iter().enumerate() {
            out.initial[new] = self.initial[old];
            out.mean[new] = self.mean[old];
            out.std[new] = self.std[old];
            for (new_to, &old_to) in order.iter().enumerate() {
                out.transition[new][new_to] = self.transition[old][old_to];
            }
        }
        out
    }
}

/// Share of periods whose most likely filtered regime equals the true one.
pub fn regime_accuracy(truth: &[Regime], beliefs: &[[f64; REGIMES]]) -> f64 {
    if truth.is_empty() {
        return 0.0;
    }
    let hits = truth
        .iter()
        .zip(beliefs)
        .filter(|(r, b)| Regime::most_likely(b) == **r)
        .count();
    hits as f64 / truth.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_filter_recovers_the_regimes_of_its_own_trace() {
        let hmm = Hmm::default();
        let (truth, trace) = hmm.sample(&mut TraceRng::new(11), 4000);
        let beliefs = hmm.filter(&trace).unwrap();
        let accuracy = regime_accuracy(&truth, &beliefs);
        assert!(accuracy > 0.9, "accuracy {accuracy}");
    }

    #[test]
    fn baum_welch_from_a_wrong_start_finds_the_generating_means() {
        let truth_model = Hmm::default();
        let (truth, trace) = truth_model.sample(&mut TraceRng::new(5), 3000);
        let start = Hmm {
            mean: [[0.2, 0.3], [1.0, 0.7], [1.8, 1.2]],
            std: [[0.4; 2]; REGIMES],
            ..Hmm::default()
        };
        let fitted = start.fit(&trace, 30).unwrap();
        fitted.validate().unwrap();
        for r in 0..REGIMES {
            for d in 0..OBSERVATION_DIMS {
                let err = (fitted.mean[r][d] - truth_model.mean[r][d]).abs();
                assert!(err < 0.08, "mean[{r}][{d}] off by {err}: {:?}", fitted.mean);
            }
        }
        let accuracy = regime_accuracy(&truth, &fitted.filter(&trace).unwrap());
        assert!(accuracy > 0.9, "accuracy {accuracy}");
    }

    #[test]
    fn bad_observations_are_refused_and_name_the_field() {
        let hmm = Hmm::default();
        let belief = hmm.prior();
        for (obs, field) in [
            (
                Observation {
                    offered_load: f64::NAN,
                    occupancy: 0.5,
                },
                "observation.offered_load",
            ),
            (
                Observation {
                    offered_load: 0.5,
                    occupancy: -0.1,
                },
                "observation.occupancy",
            ),
            (
                Observation {
                    offered_load: f64::INFINITY,
                    occupancy: 0.5,
                },
                "observation.offered_load",
            ),
        ] {
            let err = hmm.filter_step(&belief, &obs, true).unwrap_err();
            assert!(err.to_string().starts_with(field), "{err}");
        }
    }

    #[test]
    fn an_observation_far_from_every_regime_does_not_poison_the_belief() {
        let hmm = Hmm::default();
        let obs = Observation {
            offered_load: 9.9,
            occupancy: 9.9,
        };
        let b = hmm.filter_step(&hmm.prior(), &obs, false).unwrap();
        assert!(b.iter().all(|x| x.is_finite()));
        assert!((b.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(Regime::most_likely(&b), Regime::Surge);
    }
}
