//! Routing by expected free energy over the market maker's regime belief.
//!
//! For an arm with outcome model `A_f[s]` (see [`super::outcome`]), regime belief `q(s)` (the
//! market maker's filtered HMM posterior) and the buyer's preferences `C`:
//!
//! ```text
//! Q(o)      = Σ_s q(s) · Π_f A_f[s](o_f)                      predicted joint outcome
//! risk      = KL[ Q(o) ‖ C(o) ] = Σ_o Q(o)·(ln Q(o) − ln C(o)),  ln C(o) = Σ_f ln C_f(o_f)
//! ambiguity = Σ_s q(s) · H[ P(o | s) ] = Σ_s q(s) · Σ_f H[ A_f[s] ]
//! gain      = Σ_f (A_f·q) · (W_f·q),   W_f[s](o) = ½·(1/a_f[s](o) − 1/Σ_o' a_f[s](o'))
//! G         = risk + ambiguity − w·gain
//! ```
//!
//! Risk plus ambiguity is the expected free energy of a one-step policy,
//! `G(π) = KL[Q(o|π) ‖ P(o)] + E_{Q(s|π)} H[P(o|s)]`, as in Da Costa et al. 2020 ("Active
//! inference on discrete state-spaces: a synthesis", J. Math. Psych. 99:102447) and Parr &
//! Friston 2019 ("Generalised free energy and active inference", Biol. Cybern. 113:495); here
//! a policy is "send this request to this arm" and `Q(s)` is the market maker's belief.
//! `gain` is the expected information gain about the Dirichlet parameters of A — the
//! "novelty" term of Friston et al. 2017 ("Active inference, curiosity and insight", Neural
//! Comput. 29:2633) — in the form of Smith, Friston & Whyte 2022 ("A step-by-step tutorial on
//! active inference and its application to empirical data", J. Math. Psych. 107:102632, the
//! novelty of learning A): `(A·s)·(W·s)` with `W = ½(a^⊙−1 − a_sum^⊙−1)`, summed over our
//! independent factors. It approximates the expected KL from Dirichlet prior to posterior
//! without digamma functions; under a sharp belief it is `(BANDS − 1) / (2·Σa)` per factor, so
//! it falls as one over the counts seen. `w` is [`EfeConfig::information_gain_weight`] (1 is
//! the form above; 0 drops parameter learning).
//!
//! Each part is ≥ 0: KL and entropies are, and `1/a ≥ 1/a_sum` cell by cell. What they do:
//! - risk + ambiguity = `−E_Q[ln C] − I(s; o)`: expected preference, minus the information
//!   the outcome carries about the regime. Where the belief is sharp `I ≈ 0` and the router
//!   exploits; where the regime is unclear, arms whose outcomes tell the regimes apart win —
//!   it explores exactly where the regime is unclear.
//! - gain: arms (and regimes) with few counts are worth trying; it fades as counts grow.
//!
//! The router ([`EfeRouter`]) takes the argmin of G among the arms that pass the same hard
//! ceilings as the utility router ([`super::utility::admissible`]); fan-out takes the N
//! smallest. Its counts are updated from the [`crate::meter::Meter`] only.

use super::features::Features;
use super::outcome::{
    BANDS, FACTORS, JOINT_OUTCOMES, Likelihood, Outcome, OutcomeModel, Preferences,
};
use super::utility::{Arm, Ceilings, Utility, admissible};
use crate::error::{Result, invalid};
use crate::meter::{Meter, MeterRecord};
use crate::pricing::hmm::REGIMES;
use serde::Serialize;
use std::collections::BTreeMap;

/// G and its parts, nats.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Efe {
    /// KL of the predicted outcomes from the preferred ones (≥ 0).
    pub risk: f64,
    /// Expected entropy of outcomes given the regime (≥ 0).
    pub ambiguity: f64,
    /// Expected information gain about the arm's Dirichlet parameters (≥ 0), unweighted.
    pub information_gain: f64,
    /// `risk + ambiguity − w·information_gain`.
    pub total: f64,
}

fn entropy(p: &[f64]) -> f64 {
    -p.iter()
        .filter(|x| **x > 0.0)
        .map(|x| x * x.ln())
        .sum::<f64>()
}

/// A belief as a distribution: normalised, or uniform when it is not a usable one (no
/// knowledge of the regime is the honest reading of a broken belief).
fn normalised(belief: &[f64; REGIMES]) -> [f64; REGIMES] {
    let sum: f64 = belief.iter().sum();
    if belief.iter().all(|b| b.is_finite() && *b >= 0.0) && sum.is_finite() && sum > 0.0 {
        belief.map(|b| b / sum)
    } else {
        [1.0 / REGIMES as f64; REGIMES]
    }
}

/// Risk and ambiguity of explicit per-regime categoricals (the information gain is 0: there
/// are no parameters to learn). The outcome model's own [`OutcomeModel::predictive`] is one
/// such likelihood; tests pass certain (one-hot) ones.
pub fn risk_and_ambiguity(
    belief: &[f64; REGIMES],
    likelihood: &Likelihood,
    preferences: &Preferences,
) -> Efe {
    let q = normalised(belief);
    let mut predicted = [0.0; JOINT_OUTCOMES];
    let mut ambiguity = 0.0;
    for (s, qs) in q.iter().enumerate() {
        if *qs == 0.0 {
            continue;
        }
        ambiguity += qs * likelihood[s].iter().map(|a| entropy(a)).sum::<f64>();
        for (i, slot) in predicted.iter_mut().enumerate() {
            let o = Outcome::from_joint_index(i);
            let p: f64 = (0..FACTORS).map(|f| likelihood[s][f][o.bands[f]]).product();
            *slot += qs * p;
        }
    }
    let mut risk = 0.0;
    for (i, p) in predicted.iter().enumerate() {
        if *p > 0.0 {
            risk += p * (p.ln() - preferences.log_joint(&Outcome::from_joint_index(i)));
        }
    }
    // KL ≥ 0 exactly; summing 27 terms can leave −1e-16, which is rounding, not information.
    let risk = risk.max(0.0);
    Efe {
        risk,
        ambiguity,
        information_gain: 0.0,
        total: risk + ambiguity,
    }
}

/// Expected information gain about the Dirichlet parameters (the novelty term, see the module
/// docs): `Σ_f (A_f·q)·(W_f·q)`.
pub fn information_gain(belief: &[f64; REGIMES], model: &OutcomeModel) -> f64 {
    let q = normalised(belief);
    let mut gain = 0.0;
    for f in 0..FACTORS {
        let mut a_q = [0.0; BANDS];
        let mut w_q = [0.0; BANDS];
        for (s, qs) in q.iter().enumerate() {
            let cells = &model.counts[s][f];
            let total: f64 = cells.iter().sum();
            for o in 0..BANDS {
                a_q[o] += qs * cells[o] / total;
                w_q[o] += qs * 0.5 * (1.0 / cells[o] - 1.0 / total);
            }
        }
        gain += a_q.iter().zip(&w_q).map(|(a, w)| a * w).sum::<f64>();
    }
    gain.max(0.0)
}

/// G of one arm's outcome model under `belief` and `preferences`, with the information gain
/// weighted by `information_gain_weight`.
pub fn expected_free_energy(
    belief: &[f64; REGIMES],
    model: &OutcomeModel,
    preferences: &Preferences,
    information_gain_weight: f64,
) -> Efe {
    let base = risk_and_ambiguity(belief, &model.predictive(), preferences);
    let gain = information_gain(belief, model);
    Efe {
        information_gain: gain,
        total: base.total - information_gain_weight * gain,
        ..base
    }
}

/// Parameters of the router.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EfeConfig {
    /// Dirichlet count every band starts with (> 0). Small: a new arm is uncertain and its
    /// information gain large, so it is tried; a few outcomes then dominate the prior.
    pub prior_count: f64,
    /// Weight of the information gain in G (≥ 0; 1 is the published form).
    pub information_gain_weight: f64,
    /// Share of its counts an arm keeps per outcome folded in, in (0, 1]
    /// ([`OutcomeModel::update_retaining`]); 1 (the default) forgets nothing.
    pub retention: f64,
}

impl Default for EfeConfig {
    fn default() -> Self {
        Self {
            prior_count: 0.25,
            information_gain_weight: 1.0,
            retention: 1.0,
        }
    }
}

/// An admissible arm with its G.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EfeScored {
    /// Index into the arm list.
    pub arm: usize,
    /// Its expected free energy.
    pub efe: Efe,
}

/// Outcome models per arm (by arm name), learned from a meter.
#[derive(Debug, Clone)]
pub struct EfeRouter {
    config: EfeConfig,
    fresh: OutcomeModel,
    models: BTreeMap<String, OutcomeModel>,
    cursor: usize,
}

impl EfeRouter {
    /// A router that knows nothing yet.
    pub fn new(config: EfeConfig) -> Result<Self> {
        let w = config.information_gain_weight;
        if !(w.is_finite() && w >= 0.0) {
            return Err(invalid(
                "efe.information_gain_weight",
                format!("must be finite and >= 0, got {w}"),
            ));
        }
        let r = config.retention;
        if !(r > 0.0 && r <= 1.0) {
            return Err(invalid(
                "efe.retention",
                format!("must be within (0, 1], got {r}"),
            ));
        }
        Ok(Self {
            fresh: OutcomeModel::new(config.prior_count)?,
            config,
            models: BTreeMap::new(),
            cursor: 0,
        })
    }

    /// The parameters.
    pub fn config(&self) -> &EfeConfig {
        &self.config
    }

    /// The arm's outcome model (the prior for an arm never metered: a new arm starts
    /// uncertain, and needs no new parameters until it has served).
    pub fn model(&self, arm: &str) -> &OutcomeModel {
        self.models.get(arm).unwrap_or(&self.fresh)
    }

    /// Meter records folded in so far.
    pub fn cursor(&self) -> usize {
        self.cursor
    }

    /// G of one arm.
    pub fn evaluate(&self, arm: &str, belief: &[f64; REGIMES], preferences: &Preferences) -> Efe {
        self.evaluate_pending(arm, belief, preferences, 0.0)
    }

    /// G of one arm with `pending` requests sent to it whose outcomes are not metered yet: risk
    /// and ambiguity as [`EfeRouter::evaluate`], the information gain of one more request
    /// after those come back ([`OutcomeModel::with_pending`]). Live, feedback lags by a
    /// deadline: without this, every request in that lag would be sent for the same
    /// information — an arm in a regime never seen would get a whole deadline's arrivals.
    pub fn evaluate_pending(
        &self,
        arm: &str,
        belief: &[f64; REGIMES],
        preferences: &Preferences,
        pending: f64,
    ) -> Efe {
        let model = self.model(arm);
        let base = risk_and_ambiguity(belief, &model.predictive(), preferences);
        let gain = information_gain(belief, &model.with_pending(pending, &normalised(belief)));
        Efe {
            information_gain: gain,
            total: base.total - self.config.information_gain_weight * gain,
            ..base
        }
    }

    /// Admissible arms by ascending G, ties by arm index (deterministic).
    pub fn rank(
        &self,
        arms: &[Arm],
        ceilings: &Ceilings,
        x: &Features,
        context_tokens: u32,
        belief: &[f64; REGIMES],
        preferences: &Preferences,
    ) -> Vec<EfeScored> {
        let mut out: Vec<EfeScored> = arms
            .iter()
            .enumerate()
            .filter(|(_, a)| admissible(a, ceilings, x, context_tokens))
            .map(|(i, a)| EfeScored {
                arm: i,
                efe: self.evaluate(&a.name, belief, preferences),
            })
            .collect();
        out.sort_by(|a, b| a.efe.total.total_cmp(&b.efe.total).then(a.arm.cmp(&b.arm)));
        out
    }

    /// The argmin of G among admissible arms.
    pub fn choose(
        &self,
        arms: &[Arm],
        ceilings: &Ceilings,
        x: &Features,
        context_tokens: u32,
        belief: &[f64; REGIMES],
        preferences: &Preferences,
    ) -> Option<usize> {
        self.rank(arms, ceilings, x, context_tokens, belief, preferences)
            .first()
            .map(|s| s.arm)
    }

    /// Fan-out: the `n` admissible arms of smallest G, smallest first.
    #[allow(clippy::too_many_arguments)] // the inputs of `rank` plus n; a struct would hide which
    pub fn fan_out(
        &self,
        arms: &[Arm],
        ceilings: &Ceilings,
        x: &Features,
        context_tokens: u32,
        belief: &[f64; REGIMES],
        preferences: &Preferences,
        n: usize,
    ) -> Vec<usize> {
        self.rank(arms, ceilings, x, context_tokens, belief, preferences)
            .into_iter()
            .take(n)
            .map(|s| s.arm)
            .collect()
    }

    /// Folds in every meter record not seen yet (each into its arm's counts, weighted by the
    /// belief it was routed under); returns how many. The meter is the only input: what the
    /// router learns is exactly what was metered.
    pub fn learn(&mut self, meter: &Meter) -> usize {
        let new = meter.since(self.cursor);
        self.fold(new);
        self.cursor += new.len();
        new.len()
    }

    /// Folds in `records` read from a meter kept elsewhere (the exchange's books, read by
    /// sequence): the same update as [`EfeRouter::learn`], with the reader keeping its own
    /// cursor, so the router holds counts and never the records.
    pub fn fold(&mut self, records: &[MeterRecord]) {
        for record in records {
            let model = self
                .models
                .entry(record.arm.clone())
                .or_insert_with(|| self.fresh.clone());
            model.update_retaining(
                &Outcome::of(record),
                &record.belief,
                self.config.retention,
                self.config.prior_count,
            );
        }
    }

    /// Fades every arm's evidence by `keep` (in [0, 1]; [`OutcomeModel::fade`]): what the
    /// outcomes of long ago say counts for less, and an arm left alone regains its information
    /// gain. Arms back at the prior are dropped (they read as the prior anyway).
    pub fn fade(&mut self, keep: f64) {
        let prior = self.config.prior_count;
        for model in self.models.values_mut() {
            model.fade(keep, prior);
        }
        self.models.retain(|_, m| {
            m.counts
                .iter()
                .flatten()
                .flatten()
                .any(|c| *c > prior * 1.0001)
        });
    }

    /// Admissible arms by descending `u(x, p) − G`, ties by arm index: the request's utility
    /// under `utility` is the prior over policies and G what the outcomes learned say, as in
    /// active inference's `q(π) = σ(ln E(π) − G(π))` (Parr & Friston 2019, the "habit" prior
    /// E): a code request leans to the coder before anything is learned, and what the meter
    /// teaches moves it from there. Each arm is judged under its own market's regime belief
    /// (`beliefs`, index-aligned with `arms`): an arm whose market is in a surge is predicted
    /// from what it did in surges. `pending` (index-aligned, missing = 0) counts each arm's
    /// requests not metered yet ([`EfeRouter::evaluate_pending`]).
    #[allow(clippy::too_many_arguments)] // the inputs of `rank` plus the prior; a struct would hide which
    pub fn rank_with_prior(
        &self,
        arms: &[Arm],
        ceilings: &Ceilings,
        utility: &Utility,
        x: &Features,
        context_tokens: u32,
        beliefs: &[[f64; REGIMES]],
        preferences: &Preferences,
        pending: &[f64],
    ) -> Vec<PriorScored> {
        let mut out: Vec<PriorScored> = arms
            .iter()
            .enumerate()
            .filter(|(_, a)| admissible(a, ceilings, x, context_tokens))
            .map(|(i, a)| {
                let belief = beliefs
                    .get(i)
                    .copied()
                    .unwrap_or([1.0 / REGIMES as f64; REGIMES]);
                let efe = self.evaluate_pending(
                    &a.name,
                    &belief,
                    preferences,
                    pending.get(i).copied().unwrap_or(0.0),
                );
                let prior = utility.score(x, &a.profile());
                PriorScored {
                    arm: i,
                    utility: prior,
                    efe,
                    score: prior - efe.total,
                }
            })
            .collect();
        out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.arm.cmp(&b.arm)));
        out
    }
}

/// An admissible arm scored by the request's utility (the prior) and its G.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PriorScored {
    /// Index into the arm list.
    pub arm: usize,
    /// `u(x, p)`: what the request's features make of the arm's profile.
    pub utility: f64,
    /// Its expected free energy.
    pub efe: Efe,
    /// `utility − efe.total`: larger ranks first.
    pub score: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::MeterRecord;
    use crate::routing::outcome::{COST, LATENCY, OrderTerms, QUALITY};
    use cx_protocol::Tier;
    use proptest::prelude::*;

    const X: Features = [1.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];

    fn order() -> OrderTerms {
        OrderTerms {
            deadline_s: 2.0,
            tier: Tier::T1,
            max_cost_wei: Some(1_000),
        }
    }

    fn arm(name: &str, latency_s: f64) -> Arm {
        Arm {
            name: name.into(),
            quality: 0.7,
            latency_s,
            cost_wei_per_mtok: 100_000,
            code: 0.5,
            vision: 0.0,
            context_tokens: 32_768,
        }
    }

    /// A metered answer that falls in `bands` for [`order`].
    fn answer(request: u64, arm: &str, bands: [usize; FACTORS], belief: [f64; 3]) -> MeterRecord {
        let o = order();
        MeterRecord {
            request,
            tenant: "t".into(),
            arm: arm.into(),
            cost_wei: [400, 800, 1_500][bands[COST]],
            latency_s: [0.5, 1.5, 3.0][bands[LATENCY]],
            quality: [0.3, 0.6, 0.9][bands[QUALITY]],
            deadline_s: o.deadline_s,
            max_cost_wei: o.max_cost_wei,
            tier: o.tier,
            belief,
        }
    }

    fn one_hot(band: usize) -> [f64; BANDS] {
        let mut v = [0.0; BANDS];
        v[band] = 1.0;
        v
    }

    fn belief() -> impl Strategy<Value = [f64; 3]> {
        prop::array::uniform3(0.0f64..1.0).prop_map(|b| {
            let s: f64 = b.iter().sum::<f64>() + 1e-9;
            b.map(|x| (x + 1e-9 / 3.0) / s)
        })
    }

    fn raw_preferences() -> impl Strategy<Value = [[f64; BANDS]; FACTORS]> {
        prop::array::uniform3(prop::array::uniform3(-6.0f64..2.0))
    }

    proptest! {
        #[test]
        fn every_part_of_g_is_non_negative(
            counts in prop::array::uniform3(prop::array::uniform3(prop::array::uniform3(0.01f64..100.0))),
            q in belief(),
            raw in raw_preferences(),
        ) {
            let model = OutcomeModel { counts };
            let prefs = Preferences::from_log(raw).unwrap();
            let g = expected_free_energy(&q, &model, &prefs, 1.0);
            prop_assert!(g.risk >= 0.0, "{g:?}");
            prop_assert!(g.ambiguity >= 0.0, "{g:?}");
            prop_assert!(g.information_gain >= 0.0, "{g:?}");
            prop_assert!((g.total - (g.risk + g.ambiguity - g.information_gain)).abs() < 1e-9);
        }

        /// With a certain outcome model (every arm's outcome known: zero ambiguity, a one-hot
        /// prediction) G is `−ln C(o_arm)`, so the argmin of G is the arm a greedy router that
        /// maximises the preference of the predicted outcome would take.
        #[test]
        fn a_certain_outcome_model_makes_g_the_greedy_preference_choice(
            outcomes in prop::collection::vec(prop::array::uniform3(0usize..BANDS), 2..8),
            q in belief(),
            raw in raw_preferences(),
        ) {
            let prefs = Preferences::from_log(raw).unwrap();
            let gs: Vec<f64> = outcomes.iter().map(|bands| {
                let lik: Likelihood = [[0; FACTORS]; REGIMES].map(|_| bands.map(one_hot));
                let g = risk_and_ambiguity(&q, &lik, &prefs);
                assert!(g.ambiguity.abs() < 1e-12);
                g.total
            }).collect();
            let greedy: Vec<f64> = outcomes
                .iter()
                .map(|bands| prefs.log_joint(&Outcome { bands: *bands }))
                .collect();
            let argmin = (0..gs.len()).min_by(|a, b| gs[*a].total_cmp(&gs[*b]).then(a.cmp(b))).unwrap();
            let argmax = (0..greedy.len()).min_by(|a, b| greedy[*b].total_cmp(&greedy[*a]).then(a.cmp(b))).unwrap();
            prop_assert!((greedy[argmin] - greedy[argmax]).abs() < 1e-9, "{gs:?} {greedy:?}");
            for (g, u) in gs.iter().zip(&greedy) {
                prop_assert!((g + u).abs() < 1e-9);
            }
        }
    }

    /// The same with a certain belief and outcomes that differ by regime: only the believed
    /// regime's outcome counts, and the router built on concentrated counts agrees.
    #[test]
    fn with_a_certain_regime_the_router_is_greedy_on_concentrated_counts() {
        let prefs = Preferences::from_order(&order()).unwrap();
        let arms = [arm("late", 1.0), arm("dear", 1.0), arm("good", 1.0)];
        let per_regime = [
            [[2, 0, 2], [0, 0, 2], [0, 0, 2]], // late in calm, fine otherwise
            [[0, 2, 2], [2, 2, 0], [0, 2, 2]],
            [[0, 0, 2], [2, 2, 2], [2, 2, 2]], // good in calm only
        ];
        let mut router = EfeRouter::new(EfeConfig {
            prior_count: 1e-9,
            information_gain_weight: 1.0,
            retention: 1.0,
        })
        .unwrap();
        let mut meter = Meter::new();
        for (a, regimes) in per_regime.iter().enumerate() {
            for (s, bands) in regimes.iter().enumerate() {
                let mut b = [0.0; 3];
                b[s] = 1.0;
                for k in 0..200 {
                    meter.record(answer(k, &arms[a].name, *bands, b)).unwrap();
                }
            }
        }
        assert_eq!(router.learn(&meter), meter.len());
        for s in 0..REGIMES {
            let mut b = [0.0; 3];
            b[s] = 1.0;
            let greedy = (0..arms.len())
                .max_by(|x, y| {
                    let u = |a: usize| {
                        prefs.log_joint(&Outcome {
                            bands: per_regime[a][s],
                        })
                    };
                    u(*x).total_cmp(&u(*y)).then(y.cmp(x))
                })
                .unwrap();
            let chosen = router
                .choose(&arms, &Ceilings::default(), &X, 100, &b, &prefs)
                .unwrap();
            assert_eq!(chosen, greedy, "regime {s}");
        }
    }

    /// Two arms predict the same outcomes (equal expected value); the one with fewer counts is
    /// chosen for what it would teach, and keeps being chosen exactly until its counts pass
    /// the other's.
    #[test]
    fn of_two_equal_arms_the_more_uncertain_is_chosen_until_its_counts_grow() {
        let prefs = Preferences::from_order(&order()).unwrap();
        let arms = [arm("known", 1.0), arm("new", 1.0)];
        let calm = [1.0, 0.0, 0.0];
        // Band frequencies 2 : 1 : 1 in every factor, in batches of four outcomes.
        let batch = [[0, 0, 0], [0, 0, 0], [1, 1, 1], [2, 2, 2]];
        let mut meter = Meter::new();
        let mut id = 0;
        let mut feed = |meter: &mut Meter, arm: &str, batches: usize| {
            for _ in 0..batches {
                for bands in batch {
                    id += 1;
                    meter.record(answer(id, arm, bands, calm)).unwrap();
                }
            }
        };
        let prior = 0.25;
        let mut router = EfeRouter::new(EfeConfig {
            prior_count: prior,
            information_gain_weight: 1.0,
            retention: 1.0,
        })
        .unwrap();
        // "known" has 5 batches (20 outcomes); "new" none. Priors are equal, so both predict
        // 2 : 1 : 1 once "new" has one batch.
        feed(&mut meter, "known", 5);
        feed(&mut meter, "new", 1);
        router.learn(&meter);
        let mut chosen_new = 0;
        loop {
            let g_known = router.evaluate("known", &calm, &prefs);
            let g_new = router.evaluate("new", &calm, &prefs);
            // Equal predictions up to the prior's pull: risk and ambiguity nearly equal.
            assert!((g_known.risk + g_known.ambiguity - g_new.risk - g_new.ambiguity).abs() < 0.15);
            let pick = router
                .choose(&arms, &Ceilings::default(), &X, 100, &calm, &prefs)
                .unwrap();
            let counts_new = router.model("new").concentration(0, LATENCY);
            let counts_known = router.model("known").concentration(0, LATENCY);
            if pick == 0 {
                assert!(counts_new >= counts_known, "{counts_new} < {counts_known}");
                break;
            }
            assert!(g_new.information_gain > g_known.information_gain);
            chosen_new += 1;
            feed(&mut meter, "new", 1);
            assert_eq!(router.learn(&meter), 4);
        }
        assert_eq!(chosen_new, 4, "new is tried while it has fewer counts");
    }

    #[test]
    fn under_a_sharp_belief_the_information_gain_falls_as_one_over_the_counts() {
        let mut m = OutcomeModel::new(1.0).unwrap();
        m.counts[0][LATENCY] = [5.0, 2.0, 1.0];
        // Latency: (3 − 1) / (2 · 8); cost and quality still at the prior: (3 − 1) / (2 · 3).
        let g = information_gain(&[1.0, 0.0, 0.0], &m);
        assert!((g - (1.0 / 8.0 + 2.0 / 3.0)).abs() < 1e-12, "{g}");
    }

    #[test]
    fn ceilings_gate_before_g_and_fan_out_takes_the_smallest() {
        let prefs = Preferences::from_order(&order()).unwrap();
        let calm = [1.0, 0.0, 0.0];
        let arms = [
            arm("best-but-slow", 30.0),
            arm("ok", 1.0),
            arm("worse", 1.0),
            arm("worst", 1.0),
        ];
        let mut meter = Meter::new();
        for k in 0..50 {
            meter
                .record(answer(k, "best-but-slow", [0, 0, 2], calm))
                .unwrap();
            meter.record(answer(k, "ok", [1, 0, 2], calm)).unwrap();
            meter.record(answer(k, "worse", [1, 1, 1], calm)).unwrap();
            meter.record(answer(k, "worst", [2, 2, 0], calm)).unwrap();
        }
        let mut router = EfeRouter::new(EfeConfig::default()).unwrap();
        router.learn(&meter);
        let open = router.rank(&arms, &Ceilings::default(), &X, 100, &calm, &prefs);
        assert_eq!(
            open.iter().map(|s| s.arm).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        let ceilings = Ceilings {
            max_latency_s: 5.0,
            ..Ceilings::default()
        };
        let ranked = router.rank(&arms, &ceilings, &X, 100, &calm, &prefs);
        assert_eq!(
            ranked.iter().map(|s| s.arm).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(
            router.fan_out(&arms, &ceilings, &X, 100, &calm, &prefs, 2),
            vec![1, 2]
        );
        // Context that fits no arm admits nothing, whatever G says.
        assert!(
            router
                .choose(&arms, &ceilings, &X, 40_000, &calm, &prefs)
                .is_none()
        );
    }

    /// Where the regime is unclear, of two arms with the same expected preference the one whose
    /// outcome tells the regimes apart has the lower G (risk + ambiguity = −E[ln C] − I(s; o)).
    #[test]
    fn an_unclear_regime_favours_the_arm_that_reveals_it() {
        let prefs = Preferences::from_log([[0.0, 0.0, 0.0]; FACTORS]).unwrap();
        let unclear = [0.5, 0.5, 0.0];
        let sharp = [1.0, 0.0, 0.0];
        // Flat preferences: every arm has the same expected preference.
        let uniform = [[1.0 / 3.0; BANDS]; FACTORS];
        let blind: Likelihood = [uniform; REGIMES];
        let mut revealing: Likelihood = [uniform; REGIMES];
        revealing[0][LATENCY] = [0.9, 0.05, 0.05];
        revealing[1][LATENCY] = [0.05, 0.05, 0.9];
        let g = |q: &[f64; 3], l: &Likelihood| risk_and_ambiguity(q, l, &prefs).total;
        assert!(g(&unclear, &revealing) < g(&unclear, &blind) - 0.1);
        // Under a sharp belief the revealing arm has nothing to reveal: no such edge.
        assert!(g(&sharp, &revealing) > g(&unclear, &revealing));
        assert!(OutcomeModel::new(-1.0).is_err());
        assert!(
            EfeRouter::new(EfeConfig {
                prior_count: 1.0,
                information_gain_weight: f64::NAN,
                retention: 1.0,
            })
            .is_err()
        );
    }

    /// The utility prior leans a code request to the coder before anything is metered; a coder
    /// that then keeps missing the deadline (in the regime its market is in) loses it to the
    /// generalist, and only under that regime's belief.
    #[test]
    fn the_prior_picks_the_coder_first_and_the_meter_overrules_it() {
        let mut coder = arm("coder", 1.0);
        coder.code = 0.95;
        let mut general = arm("general", 1.0);
        general.code = 0.2;
        let arms = [general, coder];
        let mut x = X;
        x[5] = 1.0; // a code request
        let prefs = Preferences::from_order(&order()).unwrap();
        let calm = [[1.0, 0.0, 0.0]; 2];
        let mut router = EfeRouter::new(EfeConfig::default()).unwrap();
        let rank = |r: &EfeRouter, beliefs: &[[f64; 3]]| {
            r.rank_with_prior(
                &arms,
                &Ceilings::default(),
                &Utility::default(),
                &x,
                100,
                beliefs,
                &prefs,
                &[],
            )
        };
        let first = rank(&router, &calm);
        assert_eq!(first[0].arm, 1, "{first:?}");
        assert!(first[0].utility > first[1].utility);
        assert_eq!(first[0].score, first[0].utility - first[0].efe.total);
        // Twenty calm answers each: the coder late and dear, the generalist on time and cheap.
        let mut records = Vec::new();
        for i in 0..20 {
            records.push(answer(i, "coder", [2, 2, 2], [1.0, 0.0, 0.0]));
            records.push(answer(i, "general", [0, 0, 2], [1.0, 0.0, 0.0]));
        }
        router.fold(&records);
        let learned = rank(&router, &calm);
        assert_eq!(learned[0].arm, 0, "{learned:?}");
        // Under a surge belief nothing was learned for either arm: the prior decides again.
        let surge = rank(&router, &[[0.0, 0.0, 1.0]; 2]);
        assert_eq!(surge[0].arm, 1, "{surge:?}");
    }

    /// Requests sent and not metered yet carry the information another one would: with them
    /// counted, the gain of an arm in a regime never seen falls, its risk and ambiguity stay,
    /// and an arm whose outcomes are known wins instead of a whole lag's worth of probes.
    #[test]
    fn pending_requests_spend_the_information_gain_not_the_prediction() {
        let router = EfeRouter::new(EfeConfig::default()).unwrap();
        let prefs = Preferences::from_order(&order()).unwrap();
        let surge = [0.0, 0.0, 1.0];
        let fresh = router.evaluate("a", &surge, &prefs);
        let waiting = router.evaluate_pending("a", &surge, &prefs, 8.0);
        assert_eq!(
            (fresh.risk, fresh.ambiguity),
            (waiting.risk, waiting.ambiguity)
        );
        assert!(
            waiting.information_gain < fresh.information_gain / 5.0,
            "{fresh:?} {waiting:?}"
        );
        assert_eq!(router.evaluate_pending("a", &surge, &prefs, 0.0), fresh);

        // "known" answered on time twenty times in a surge; "new" was never seen there.
        let mut router = router;
        let records: Vec<_> = (0..20)
            .map(|i| answer(i, "known", [1, 0, 2], surge))
            .collect();
        router.fold(&records);
        let arms = [arm("known", 1.0), arm("new", 1.0)];
        let rank = |pending: &[f64]| {
            router.rank_with_prior(
                &arms,
                &Ceilings::default(),
                &Utility::default(),
                &X,
                100,
                &[surge; 2],
                &prefs,
                pending,
            )[0]
            .arm
        };
        assert_eq!(rank(&[]), 1, "an unseen arm is worth a probe");
        assert_eq!(rank(&[0.0, 8.0]), 0, "not eight more while eight are out");
    }

    /// With retention below 1 an arm that turns bad within one regime is seen within about
    /// `1 / (1 − retention)` outcomes; with 1 (the default) eighty good outcomes outvote ten bad.
    #[test]
    fn retention_lets_recent_outcomes_outweigh_old_ones_within_a_regime() {
        let calm = [1.0, 0.0, 0.0];
        let p_late = |retention: f64| {
            let mut router = EfeRouter::new(EfeConfig {
                retention,
                ..EfeConfig::default()
            })
            .unwrap();
            let good: Vec<_> = (0..80).map(|i| answer(i, "a", [0, 0, 2], calm)).collect();
            let bad: Vec<_> = (80..90).map(|i| answer(i, "a", [2, 0, 0], calm)).collect();
            router.fold(&good);
            router.fold(&bad);
            router.model("a").predictive()[0][LATENCY][2]
        };
        assert!(p_late(1.0) < 0.12, "{}", p_late(1.0));
        assert!(p_late(0.95) > 0.35, "{}", p_late(0.95));
        assert!(
            EfeRouter::new(EfeConfig {
                retention: 0.0,
                ..EfeConfig::default()
            })
            .is_err()
        );
    }

    /// Evidence fades with time: an arm left alone regains its information gain, and one
    /// faded back to the prior is the prior.
    #[test]
    fn faded_evidence_makes_an_arm_left_alone_worth_a_probe_again() {
        let calm = [1.0, 0.0, 0.0];
        let prefs = Preferences::from_order(&order()).unwrap();
        let mut router = EfeRouter::new(EfeConfig::default()).unwrap();
        let seen: Vec<_> = (0..30).map(|i| answer(i, "a", [2, 0, 0], calm)).collect();
        router.fold(&seen);
        let before = router.evaluate("a", &calm, &prefs);
        router.fade(0.25);
        let after = router.evaluate("a", &calm, &prefs);
        assert!(
            after.information_gain > 3.0 * before.information_gain,
            "{before:?} {after:?}"
        );
        router.fade(0.0);
        let fresh = EfeRouter::new(EfeConfig::default()).unwrap();
        assert_eq!(router.model("a"), fresh.model("a"));
        assert_eq!(
            router.evaluate("a", &calm, &prefs),
            fresh.evaluate("a", &calm, &prefs)
        );
    }
}
