//! What an arm is expected to deliver, per regime, and what the buyer would like it to deliver.
//!
//! **Outcomes** are discretised into three factors of three bands each, judged against the
//! order (so one learned model serves orders of every size):
//!
//! | factor | band 0 | band 1 | band 2 |
//! |---|---|---|---|
//! | latency vs the deadline Δ | ≤ Δ/2 | ≤ Δ | late |
//! | cost vs the price limit | ≤ limit/2 | ≤ limit | over (band 0 when there is no limit) |
//! | quality score | < 0.5 | < 0.75 | ≥ 0.75 |
//!
//! **The outcome model** ([`OutcomeModel`]) of one arm holds, for each regime of the market
//! maker's HMM and each factor, Dirichlet concentration parameters over the bands. Its
//! predictive `A_f[s] = a_f[s] / Σ a_f[s]` is the categorical the router expects; learning is
//! the conjugate update weighted by the regime belief the request was routed under,
//! `a_f[s][o_f] += q(s)` (the Dirichlet learning rule of active inference, Friston et al. 2016,
//! "Active inference and learning", Neurosci. Biobehav. Rev. 68). Every cell starts at a small
//! prior count, so a new arm starts uncertain. Within a regime the three factors are taken to
//! be independent (a mean-field factorisation): three Dirichlets of 3 cells learn far faster
//! than one of 27, and across regimes the predicted outcomes are still correlated.
//!
//! **Preferences** ([`Preferences`]) are the buyer's prior over outcomes, `ln C_f(o_f)`, built
//! from the order: the deadline makes "late" very unwelcome, the price limit makes "over"
//! unwelcome, and the tier sets how much quality matters. A tenant's one-bit table
//! ([`crate::pricing::tenant`], `FACTORS` layers × `BANDS` cells) shifts the log-preferences
//! before they are normalised.

use crate::error::{Result, invalid};
use crate::meter::MeterRecord;
use crate::pricing::hmm::REGIMES;
use crate::pricing::tenant::{BaseTable, TenantDelta};
use cx_protocol::Tier;
use serde::Serialize;

/// Outcome factors: latency, cost, quality.
pub const FACTORS: usize = 3;
/// Bands per factor.
pub const BANDS: usize = 3;
/// Joint outcomes (`BANDS ^ FACTORS`).
pub const JOINT_OUTCOMES: usize = 27;
/// Index of the latency factor.
pub const LATENCY: usize = 0;
/// Index of the cost factor.
pub const COST: usize = 1;
/// Index of the quality factor.
pub const QUALITY: usize = 2;
/// Quality scores at which the quality bands start (band 1, band 2).
pub const QUALITY_EDGES: [f64; 2] = [0.5, 0.75];

/// One discretised outcome: a band per factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// `bands[f]` in `0..BANDS`.
    pub bands: [usize; FACTORS],
}

impl Outcome {
    /// The bands of a metered answer, judged against the order's terms it carries.
    pub fn of(record: &MeterRecord) -> Self {
        let latency = if record.latency_s <= 0.5 * record.deadline_s {
            0
        } else if record.latency_s <= record.deadline_s {
            1
        } else {
            2
        };
        // Integer comparisons: 2·cost ≤ limit is "within half", exactly.
        let cost = match record.max_cost_wei {
            None => 0,
            Some(limit) if record.cost_wei.saturating_mul(2) <= limit => 0,
            Some(limit) if record.cost_wei <= limit => 1,
            Some(_) => 2,
        };
        let quality = QUALITY_EDGES
            .iter()
            .filter(|edge| record.quality >= **edge)
            .count();
        Self {
            bands: [latency, cost, quality],
        }
    }

    /// Index of the outcome among the [`JOINT_OUTCOMES`] (latency most significant).
    pub fn joint_index(&self) -> usize {
        self.bands.iter().fold(0, |acc, b| acc * BANDS + b)
    }

    /// The outcome with joint index `index` (inverse of [`Outcome::joint_index`]).
    pub fn from_joint_index(mut index: usize) -> Self {
        let mut bands = [0; FACTORS];
        for slot in bands.iter_mut().rev() {
            *slot = index % BANDS;
            index /= BANDS;
        }
        Self { bands }
    }
}

/// Per regime and factor, a categorical over bands: `likelihood[s][f][o]` = P(o_f = o | s).
pub type Likelihood = [[[f64; BANDS]; FACTORS]; REGIMES];

/// The Dirichlet counts of one arm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutcomeModel {
    /// `counts[s][f][o]`: concentration of band o of factor f in regime s (all > 0).
    pub counts: [[[f64; BANDS]; FACTORS]; REGIMES],
}

impl OutcomeModel {
    /// A model that knows nothing: every cell at `prior_count` (> 0).
    pub fn new(prior_count: f64) -> Result<Self> {
        if !(prior_count.is_finite() && prior_count > 0.0) {
            return Err(invalid(
                "efe.prior_count",
                format!("must be finite and > 0, got {prior_count}"),
            ));
        }
        Ok(Self {
            counts: [[[prior_count; BANDS]; FACTORS]; REGIMES],
        })
    }

    /// The expected categoricals `A = a / Σa`.
    pub fn predictive(&self) -> Likelihood {
        self.counts.map(|factors| {
            factors.map(|cells| {
                let total: f64 = cells.iter().sum();
                cells.map(|c| c / total)
            })
        })
    }

    /// [`OutcomeModel::update`] after shrinking each regime's counts toward `prior_count` by
    /// `retention^q(s)` (`retention` in (0, 1]; 1 keeps everything): the model then remembers
    /// about `1 / (1 − retention)` outcomes per regime, so an arm that changes within a regime
    /// (a provider failing while its market stays calm) is seen to within that many outcomes,
    /// not within as many as it had before.
    pub fn update_retaining(
        &mut self,
        outcome: &Outcome,
        belief: &[f64; REGIMES],
        retention: f64,
        prior_count: f64,
    ) {
        if retention < 1.0 {
            for (s, q) in belief.iter().enumerate() {
                let keep = retention.powf(*q);
                for cells in self.counts[s].iter_mut() {
                    for c in cells.iter_mut() {
                        *c = prior_count + (*c - prior_count) * keep;
                    }
                }
            }
        }
        self.update(outcome, belief);
    }

    /// Every count shrunk toward `prior_count` by `keep` in [0, 1]: evidence fading with time,
    /// so an arm not tried for a while is uncertain again and worth a probe.
    pub fn fade(&mut self, keep: f64, prior_count: f64) {
        let keep = keep.clamp(0.0, 1.0);
        for c in self.counts.iter_mut().flatten().flatten() {
            *c = prior_count + (*c - prior_count) * keep;
        }
    }

    /// Folds in one outcome seen under regime belief `belief`: `a[s][f][o_f] += q(s)`.
    pub fn update(&mut self, outcome: &Outcome, belief: &[f64; REGIMES]) {
        for (s, q) in belief.iter().enumerate() {
            for (f, band) in outcome.bands.iter().enumerate() {
                self.counts[s][f][*band] += q;
            }
        }
    }

    /// The counts once `pending` requests already sent under `belief` have come back, each as
    /// the predictive expects: `a[s][f][o] += pending · q(s) · A[s][f][o]`. The prediction does
    /// not move (A is unchanged), the concentration grows: what those outcomes will teach is
    /// not worth another request (delayed feedback, the information is already on its way).
    pub fn with_pending(&self, pending: f64, belief: &[f64; REGIMES]) -> Self {
        if !(pending.is_finite() && pending > 0.0) {
            return self.clone();
        }
        let predictive = self.predictive();
        let mut counts = self.counts;
        for (s, q) in belief.iter().enumerate() {
            if !(q.is_finite() && *q > 0.0) {
                continue;
            }
            for (f, cells) in counts[s].iter_mut().enumerate() {
                for (o, c) in cells.iter_mut().enumerate() {
                    *c += pending * q * predictive[s][f][o];
                }
            }
        }
        Self { counts }
    }

    /// Total concentration of regime s, factor f (prior plus the belief mass of what was seen).
    pub fn concentration(&self, regime: usize, factor: usize) -> f64 {
        self.counts[regime][factor].iter().sum()
    }
}

/// The buyer's order terms that shape its preferences.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OrderTerms {
    /// Deadline, seconds.
    pub deadline_s: f64,
    /// Verification tier (how much quality matters to the buyer).
    pub tier: Tier,
    /// Price limit for the request, wei (`None`: no limit).
    pub max_cost_wei: Option<u128>,
}

/// Log-preference (nats) of answering in the second half of the deadline: slightly worse than
/// early (less slack for a retry), far better than late.
pub const PREFER_LATENCY: [f64; BANDS] = [0.0, -0.5, -4.0];
/// Log-preference of the cost bands when there is a limit: paying more than the limit is what
/// the limit says the buyer does not want.
pub const PREFER_COST: [f64; BANDS] = [0.0, -0.5, -3.0];
/// Log-preference of the quality bands at tier T0; stronger tiers scale it (see
/// [`quality_weight`]).
pub const PREFER_QUALITY: [f64; BANDS] = [-1.0, -0.5, 0.0];

/// How much more quality matters at a tier than at T0: a buyer who pays for verification cares
/// about the answer being right.
pub fn quality_weight(tier: Tier) -> f64 {
    match tier {
        Tier::T0 => 1.0,
        Tier::T1 => 1.5,
        Tier::T2 => 2.0,
        Tier::T3 | Tier::Attested => 2.5,
    }
}

/// The buyer's prior over outcomes: `log_c[f][o] = ln C_f(o)`, each factor normalised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Preferences {
    /// Log-probabilities per factor (each row's exponentials sum to 1).
    pub log_c: [[f64; BANDS]; FACTORS],
}

fn log_softmax(row: [f64; BANDS]) -> [f64; BANDS] {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let log_z = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    row.map(|v| v - log_z)
}

impl Preferences {
    /// Preferences from unnormalised log-preferences (any finite numbers); normalised per factor.
    pub fn from_log(raw: [[f64; BANDS]; FACTORS]) -> Result<Self> {
        if raw.iter().flatten().any(|v| !v.is_finite()) {
            return Err(invalid("preferences", "log-preferences must be finite"));
        }
        Ok(Self {
            log_c: raw.map(log_softmax),
        })
    }

    /// The preferences an order implies (deadline, tier, price limit).
    pub fn from_order(order: &OrderTerms) -> Result<Self> {
        Self::from_log(Self::raw(order)?)
    }

    fn raw(order: &OrderTerms) -> Result<[[f64; BANDS]; FACTORS]> {
        if !(order.deadline_s.is_finite() && order.deadline_s > 0.0) {
            return Err(invalid("order.deadline_s", "must be finite and > 0"));
        }
        let cost = if order.max_cost_wei.is_some() {
            PREFER_COST
        } else {
            [0.0; BANDS]
        };
        let weight = quality_weight(order.tier);
        Ok([PREFER_LATENCY, cost, PREFER_QUALITY.map(|v| v * weight)])
    }

    /// The order's preferences shifted by a tenant's one-bit table over `base` (which must be
    /// `FACTORS` layers × `BANDS` cells): `ln C_f(o) += T[f][o]`, then renormalised.
    pub fn from_order_for_tenant(
        order: &OrderTerms,
        base: &BaseTable,
        delta: &TenantDelta,
    ) -> Result<Self> {
        if base.layers() != FACTORS || base.cells() != BANDS {
            return Err(invalid(
                "preferences.tenant_table",
                format!(
                    "must be {FACTORS} layers (outcome factors) × {BANDS} cells (bands), got {}×{}",
                    base.layers(),
                    base.cells()
                ),
            ));
        }
        let mut raw = Self::raw(order)?;
        for (f, row) in raw.iter_mut().enumerate() {
            for (o, v) in row.iter_mut().enumerate() {
                *v += f64::from(delta.value(base, f, o));
            }
        }
        Self::from_log(raw)
    }

    /// `ln C(o)` of a joint outcome: the sum over factors.
    pub fn log_joint(&self, outcome: &Outcome) -> f64 {
        outcome
            .bands
            .iter()
            .enumerate()
            .map(|(f, b)| self.log_c[f][*b])
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::tests::record;

    #[test]
    fn bands_follow_the_order_terms_exactly() {
        let mut r = record(1, "a", 1.0, 500);
        // deadline 2 s, limit 1000 wei: 1 s is within half; 500 wei is exactly half the limit.
        assert_eq!(Outcome::of(&r).bands, [0, 0, 2]);
        r.latency_s = 2.0;
        r.cost_wei = 501;
        r.quality = 0.5;
        assert_eq!(Outcome::of(&r).bands, [1, 1, 1]);
        r.latency_s = 2.01;
        r.cost_wei = 1001;
        r.quality = 0.49;
        assert_eq!(Outcome::of(&r).bands, [2, 2, 0]);
        r.max_cost_wei = None;
        assert_eq!(Outcome::of(&r).bands[COST], 0);
        for i in 0..JOINT_OUTCOMES {
            assert_eq!(Outcome::from_joint_index(i).joint_index(), i);
        }
    }

    #[test]
    fn preferences_are_distributions_and_the_tenant_table_shifts_them() {
        let order = OrderTerms {
            deadline_s: 2.0,
            tier: Tier::T2,
            max_cost_wei: Some(10),
        };
        let p = Preferences::from_order(&order).unwrap();
        for row in p.log_c {
            assert!((row.iter().map(|v| v.exp()).sum::<f64>() - 1.0).abs() < 1e-12);
        }
        assert!(p.log_c[LATENCY][0] > p.log_c[LATENCY][2]);
        // A tenant that does not mind cost at all: its table cancels the cost preference.
        let base = BaseTable::new(FACTORS, BANDS, vec![0.0; FACTORS * BANDS]).unwrap();
        let mut full = vec![0.0f32; FACTORS * BANDS];
        full[COST * BANDS + 2] = 2.0;
        full[COST * BANDS] = -2.0;
        let delta = TenantDelta::fit(&base, &full).unwrap();
        let t = Preferences::from_order_for_tenant(&order, &base, &delta).unwrap();
        assert!(t.log_c[COST][2] - t.log_c[COST][0] > p.log_c[COST][2] - p.log_c[COST][0]);
        let wrong = BaseTable::new(2, 3, vec![0.0; 6]).unwrap();
        let wrong_delta = TenantDelta::fit(&wrong, &[0.0; 6]).unwrap();
        assert!(Preferences::from_order_for_tenant(&order, &wrong, &wrong_delta).is_err());
    }

    #[test]
    fn learning_puts_belief_mass_where_the_outcome_fell() {
        let mut m = OutcomeModel::new(0.5).unwrap();
        let o = Outcome { bands: [2, 0, 1] };
        m.update(&o, &[0.0, 0.25, 0.75]);
        assert_eq!(m.counts[0][LATENCY][2], 0.5);
        assert_eq!(m.counts[1][LATENCY][2], 0.75);
        assert_eq!(m.counts[2][QUALITY][1], 1.25);
        assert!((m.concentration(2, COST) - 2.25).abs() < 1e-12);
        let a = m.predictive();
        assert!((a[2][LATENCY].iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(OutcomeModel::new(0.0).is_err());
    }
}
