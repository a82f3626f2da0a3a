//! The market maker: one state per resource market (model class × tier), open quotes.
//!
//! On each load report a market (1) filters its regime with the HMM's forward step, (2) resets
//! the occupancy coordinate to the reported one, and (3) advances `(occupancy, log premium)` by
//! a few damped leapfrog steps under the belief-weighted potential (see [`super::leapfrog`]).
//! The premium is then clamped to `±max_log_premium` and turned into a mid price and a half
//! spread that widens when the HMM is unsure of the regime. All of that happens in
//! [`MarketMaker::observe`]; [`MarketMaker::quote`] only reads the result, multiplies by the
//! deadline factor and rounds, so it is cheap and a pure function of (job, market state): no
//! clock, no randomness, the same bits every time.
//!
//! Guarantees every quote keeps, whatever the state:
//! - `bid < ask` (integers, at least one unit apart);
//! - a higher tier never quotes below a lower one of the same model class, on either side:
//!   the tier's own prices are raised to the running maximum over the tiers below it.
//!
//! The model counts in whole units of the asset per compute-hour; quotes are integers in wei per
//! compute-second (`*_wei_per_s`, [`cx_protocol::price`]), converted once, here (bid down, ask up,
//! so rounding never narrows the spread).

use super::hmm::{Hmm, Observation, REGIMES, Regime};
use super::leapfrog::{Anharmonic, Blend, Phase, leapfrog};
use crate::error::{Error, Result, invalid};
use cx_protocol::Tier;
use cx_protocol::price::{self, Rounding};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Tiers a market exists for (attested execution is offered by no provider here).
pub const MARKET_TIERS: [Tier; 4] = [Tier::T0, Tier::T1, Tier::T2, Tier::T3];

/// Index of a tier in per-tier arrays, or the refusal for `attested`.
pub fn tier_index(tier: Tier) -> Result<usize> {
    match tier {
        Tier::T0 => Ok(0),
        Tier::T1 => Ok(1),
        Tier::T2 => Ok(2),
        Tier::T3 => Ok(3),
        Tier::Attested => Err(Error::TierUnavailable(tier)),
    }
}

/// Parameters of every market a maker runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MarketParams {
    /// The regime model (defaults, or fitted by Baum–Welch on a recorded trace).
    pub hmm: Hmm,
    /// V_r per regime: targets fall and stiffness rises from calm to surge.
    ///
    /// Occupancy counts committed work in units of one mean job per server, so 1.0 is "every
    /// server busy, nothing queued" on average. The defaults were chosen on the regime-shift
    /// simulation ([`super::sim`], seed 42): calm aims a little above 1 to fill idle servers,
    /// surge below it to keep queues short. Lower targets trade utilisation for deadline hits:
    /// targets (0.85, 0.8, 0.75) gave 62.6 % utilisation and 99.2 % hits there, these give
    /// ≈ 72 % and ≈ 98 % (a fixed price: 70 % and 29 %).
    pub potentials: [Anharmonic; REGIMES],
    /// γ_r per regime, per second of model time.
    pub friction_per_s: [f64; REGIMES],
    /// m: inertia of the premium (larger reacts more slowly).
    pub mass: f64,
    /// Model time one observation advances, seconds.
    pub step_s: f64,
    /// Leapfrog steps per observation (the step is `step_s / substeps`).
    pub substeps: u32,
    /// Bound on |log premium|: the price stays within `e^±max` of its reference.
    pub max_log_premium: f64,
    /// Half spread when the regime is certain (fraction of mid).
    pub base_half_spread: f64,
    /// Extra half spread at full regime uncertainty (scaled by `1 − max belief`).
    pub uncertainty_half_spread: f64,
    /// Deadline factor `1 + urgency·θ²`, θ = compute time ÷ deadline in [0, 1].
    pub deadline_urgency: f64,
}

impl Default for MarketParams {
    fn default() -> Self {
        Self {
            hmm: Hmm::default(),
            potentials: [
                Anharmonic {
                    target_occupancy: 1.1,
                    stiffness: 1.0,
                    quartic: 1.0,
                },
                Anharmonic {
                    target_occupancy: 1.0,
                    stiffness: 1.0,
                    quartic: 3.0,
                },
                Anharmonic {
                    target_occupancy: 0.85,
                    stiffness: 1.6,
                    quartic: 6.0,
                },
            ],
            friction_per_s: [0.5, 0.5, 0.4],
            mass: 4.0,
            step_s: 1.0,
            substeps: 4,
            max_log_premium: 1.5,
            base_half_spread: 0.02,
            uncertainty_half_spread: 0.05,
            deadline_urgency: 0.5,
        }
    }
}

impl MarketParams {
    /// Checks every parameter's domain; the error names the field.
    pub fn validate(&self) -> Result<()> {
        self.hmm.validate()?;
        for (r, v) in self.potentials.iter().enumerate() {
            let ok = v.target_occupancy.is_finite()
                && v.target_occupancy >= 0.0
                && v.stiffness.is_finite()
                && v.stiffness >= 0.0
                && v.quartic.is_finite()
                && v.quartic >= 0.0;
            if !ok {
                return Err(invalid(
                    &format!("market.potentials[{r}]"),
                    "target, stiffness and quartic must be finite and >= 0",
                ));
            }
        }
        for (r, g) in self.friction_per_s.iter().enumerate() {
            if !(g.is_finite() && *g >= 0.0) {
                return Err(invalid(
                    &format!("market.friction_per_s[{r}]"),
                    "must be >= 0",
                ));
            }
        }
        for (field, value) in [
            ("market.mass", self.mass),
            ("market.step_s", self.step_s),
            ("market.max_log_premium", self.max_log_premium),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(invalid(
                    field,
                    format!("must be finite and > 0, got {value}"),
                ));
            }
        }
        if self.substeps == 0 {
            return Err(invalid("market.substeps", "must be > 0"));
        }
        for (field, value) in [
            ("market.base_half_spread", self.base_half_spread),
            (
                "market.uncertainty_half_spread",
                self.uncertainty_half_spread,
            ),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(
                    field,
                    format!("must be finite and >= 0, got {value}"),
                ));
            }
        }
        if self.base_half_spread + self.uncertainty_half_spread >= 0.5 {
            return Err(invalid(
                "market.base_half_spread",
                "base + uncertainty half spread must stay below 0.5 (bids would go to zero)",
            ));
        }
        if !(self.deadline_urgency.is_finite() && self.deadline_urgency >= 0.0) {
            return Err(invalid(
                "market.deadline_urgency",
                "must be finite and >= 0",
            ));
        }
        Ok(())
    }
}

/// One resource market's state: open to anyone who asks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MarketState {
    /// Occupancy and log premium.
    pub phase: Phase,
    /// Filtered regime probabilities after the last observation.
    pub belief: [f64; REGIMES],
    /// Observations folded in so far.
    pub observations: u64,
    /// Mid price per compute-hour before the deadline factor, whole units of the asset.
    pub mid_per_hour: f64,
    /// Half spread as a fraction of mid.
    pub half_spread: f64,
}

impl MarketState {
    /// The most likely regime now.
    pub fn regime(&self) -> Regime {
        Regime::most_likely(&self.belief)
    }
}

/// A quote for one job in one market.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Quote {
    /// What the exchange pays a provider per compute-second, wei.
    #[serde(with = "cx_protocol::price::rate_string")]
    pub bid_wei_per_s: u64,
    /// What a buyer pays per compute-second, wei; providers whose own ask is above it are not
    /// eligible for the job.
    #[serde(with = "cx_protocol::price::rate_string")]
    pub ask_wei_per_s: u64,
    /// The regime the quote was made in.
    pub regime: Regime,
}

#[derive(Debug, Clone)]
struct ClassBook {
    reference_per_hour: f64,
    tiers: [MarketState; MARKET_TIERS.len()],
}

/// The market maker of every (model class × tier) market.
#[derive(Debug, Clone)]
pub struct MarketMaker {
    params: MarketParams,
    books: BTreeMap<String, ClassBook>,
}

impl MarketMaker {
    /// A maker with validated parameters and no markets.
    pub fn new(params: MarketParams) -> Result<Self> {
        params.validate()?;
        Ok(Self {
            params,
            books: BTreeMap::new(),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &MarketParams {
        &self.params
    }

    /// Opens the four tier markets of a model class at a reference price per compute-hour
    /// (idempotent: reopening keeps the state and updates the reference).
    ///
    /// Tier t starts at `reference × (1 + v(t))` (v = the tier's verification work, SPEC §2),
    /// so verification is priced in from the first quote.
    pub fn open(&mut self, model_class: &str, reference_per_hour: f64) -> Result<()> {
        if model_class.is_empty() {
            return Err(invalid("market.model_class", "must not be empty"));
        }
        if !(reference_per_hour.is_finite() && reference_per_hour > 0.0) {
            return Err(invalid(
                "market.reference_per_hour",
                format!("must be finite and > 0, got {reference_per_hour}"),
            ));
        }
        let params = &self.params;
        let book = self
            .books
            .entry(model_class.to_owned())
            .or_insert_with(|| ClassBook {
                reference_per_hour,
                tiers: [MarketState {
                    phase: Phase {
                        occupancy: params.potentials[1].target_occupancy,
                        log_premium: 0.0,
                    },
                    belief: params.hmm.prior(),
                    observations: 0,
                    mid_per_hour: 0.0,
                    half_spread: 0.0,
                }; MARKET_TIERS.len()],
            });
        book.reference_per_hour = reference_per_hour;
        for t in 0..MARKET_TIERS.len() {
            let mut state = book.tiers[t];
            Self::reprice(params, reference_per_hour, t, &mut state);
            book.tiers[t] = state;
        }
        Ok(())
    }

    fn reprice(
        params: &MarketParams,
        reference_per_hour: f64,
        tier: usize,
        state: &mut MarketState,
    ) {
        let verification = 1.0 + MARKET_TIERS[tier].verification_work();
        state.mid_per_hour = reference_per_hour * verification * state.phase.log_premium.exp();
        let certainty = state.belief.iter().copied().fold(0.0, f64::max);
        state.half_spread =
            params.base_half_spread + params.uncertainty_half_spread * (1.0 - certainty);
    }

    /// Folds one load report into a market and re-prices it; returns the regime now believed.
    ///
    /// A NaN, infinite or negative observation is refused and the state is left untouched.
    pub fn observe(&mut self, model_class: &str, tier: Tier, obs: &Observation) -> Result<Regime> {
        let t = tier_index(tier)?;
        obs.validate()?;
        let params = &self.params;
        let book = self
            .books
            .get_mut(model_class)
            .ok_or_else(|| Error::UnknownMarket(format!("{model_class}/{tier}")))?;
        let state = &mut book.tiers[t];
        let belief = params
            .hmm
            .filter_step(&state.belief, obs, state.observations == 0)?;
        let friction: f64 = (0..REGIMES)
            .map(|r| belief[r] * params.friction_per_s[r])
            .sum();
        let blend = Blend {
            parts: &params.potentials,
            weights: &belief,
        };
        let dt = params.step_s / f64::from(params.substeps);
        let mut phase = Phase {
            occupancy: obs.occupancy,
            log_premium: state.phase.log_premium,
        };
        for _ in 0..params.substeps {
            phase = leapfrog(phase, &blend, params.mass, friction, dt);
        }
        phase.log_premium = phase
            .log_premium
            .clamp(-params.max_log_premium, params.max_log_premium);
        state.phase = phase;
        state.belief = belief;
        state.observations += 1;
        Self::reprice(params, book.reference_per_hour, t, state);
        Ok(state.regime())
    }

    /// The state of one market, if it is open.
    pub fn state(&self, model_class: &str, tier: Tier) -> Option<&MarketState> {
        let t = tier_index(tier).ok()?;
        self.books.get(model_class).map(|b| &b.tiers[t])
    }

    /// Every open market in (class, tier) order: quotes are open, and so is what makes them.
    pub fn markets(&self) -> impl Iterator<Item = (&str, Tier, &MarketState)> {
        self.books.iter().flat_map(|(class, book)| {
            MARKET_TIERS
                .iter()
                .zip(book.tiers.iter())
                .map(move |(tier, state)| (class.as_str(), *tier, state))
        })
    }

    /// The deadline factor `1 + urgency·θ²` with θ = `compute_s / deadline_s` clamped to [0, 1].
    pub fn deadline_factor(&self, deadline_s: f64, compute_s: f64) -> f64 {
        let theta = (compute_s / deadline_s).clamp(0.0, 1.0);
        1.0 + self.params.deadline_urgency * theta * theta
    }

    /// Quotes a job of `compute_s` seconds of work due in `deadline_s` at `tier`.
    ///
    /// Pure: reads the market state only. Errors name the bad input.
    pub fn quote(
        &self,
        model_class: &str,
        tier: Tier,
        deadline_s: f64,
        compute_s: f64,
    ) -> Result<Quote> {
        let t = tier_index(tier)?;
        if !(deadline_s.is_finite() && deadline_s > 0.0) {
            return Err(invalid(
                "quote.deadline_s",
                format!("must be finite and > 0, got {deadline_s}"),
            ));
        }
        if !(compute_s.is_finite() && compute_s >= 0.0) {
            return Err(invalid(
                "quote.compute_s",
                format!("must be finite and >= 0, got {compute_s}"),
            ));
        }
        let book = self
            .books
            .get(model_class)
            .ok_or_else(|| Error::UnknownMarket(format!("{model_class}/{tier}")))?;
        let factor = self.deadline_factor(deadline_s, compute_s);
        let mut bid = 0u64;
        let mut ask = 0u64;
        // Running maximum over the tiers at or below this one: tiers never cross.
        for state in &book.tiers[..=t] {
            let mid = state.mid_per_hour * factor;
            // Finite and non-negative by construction (the premium is clamped); a `None` here
            // would be a bug in the model, priced as the dearest quote rather than a free one.
            let side = |units: f64, rounding| {
                price::wei_per_s_from_units_per_hour(units, rounding).unwrap_or(u64::MAX)
            };
            bid = bid.max(side(mid * (1.0 - state.half_spread), Rounding::Down));
            ask = ask.max(side(mid * (1.0 + state.half_spread), Rounding::Up));
        }
        Ok(Quote {
            bid_wei_per_s: bid,
            ask_wei_per_s: ask.max(bid.saturating_add(1)),
            regime: book.tiers[t].regime(),
        })
    }
}

/// A quote seen through a tenant's preference: both sides scaled by `exp(log_multiplier)`
/// (the tenant's cell of its [`super::tenant`] table), bid rounded down and ask up.
///
/// Rounding is monotone, so `bid < ask` still holds and, when every tier of a class gets the
/// same multiplier, tiers still never cross. A non-finite multiplier is refused.
pub fn with_preference(quote: &Quote, log_multiplier: f64) -> Result<Quote> {
    if !log_multiplier.is_finite() {
        return Err(invalid(
            "preference.log_multiplier",
            format!("must be finite, got {log_multiplier}"),
        ));
    }
    let factor = log_multiplier.exp();
    // exp of a finite number is finite and > 0 unless it overflows to +∞, which saturates.
    let bid = price::scale_wei(quote.bid_wei_per_s, factor, Rounding::Down).unwrap_or(u64::MAX);
    let ask = price::scale_wei(quote.ask_wei_per_s, factor, Rounding::Up).unwrap_or(u64::MAX);
    Ok(Quote {
        bid_wei_per_s: bid,
        ask_wei_per_s: ask.max(bid.saturating_add(1)),
        regime: quote.regime,
    })
}

/// A provider's ask is its reservation price: its bundle is eligible for a job only if that
/// ask (wei per compute-second) is at most the quote's ask (the most the buyer pays at this
/// quote). Integers, compared exactly.
pub fn eligible(provider_ask_wei_per_s: u64, quote: &Quote) -> bool {
    provider_ask_wei_per_s <= quote.ask_wei_per_s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maker() -> MarketMaker {
        let mut mm = MarketMaker::new(MarketParams::default()).unwrap();
        mm.open("llama-8b", 4.0).unwrap();
        mm
    }

    fn obs(load: f64) -> Observation {
        Observation {
            offered_load: load,
            occupancy: load,
        }
    }

    #[test]
    fn surge_raises_the_quote_and_calm_lowers_it() {
        let mut mm = maker();
        let before = mm.quote("llama-8b", Tier::T0, 60.0, 1.0).unwrap();
        for _ in 0..30 {
            mm.observe("llama-8b", Tier::T0, &obs(1.5)).unwrap();
        }
        let surge = mm.quote("llama-8b", Tier::T0, 60.0, 1.0).unwrap();
        assert_eq!(surge.regime, Regime::Surge);
        assert!(surge.ask_wei_per_s > before.ask_wei_per_s);
        for _ in 0..80 {
            mm.observe("llama-8b", Tier::T0, &obs(0.3)).unwrap();
        }
        let calm = mm.quote("llama-8b", Tier::T0, 60.0, 1.0).unwrap();
        assert_eq!(calm.regime, Regime::Calm);
        assert!(
            calm.ask_wei_per_s < before.ask_wei_per_s,
            "{calm:?} {before:?}"
        );
    }

    #[test]
    fn tight_deadlines_cost_more() {
        let mm = maker();
        let loose = mm.quote("llama-8b", Tier::T1, 100.0, 1.0).unwrap();
        let tight = mm.quote("llama-8b", Tier::T1, 1.2, 1.0).unwrap();
        assert!(tight.bid_wei_per_s > loose.bid_wei_per_s);
        assert!(tight.ask_wei_per_s > loose.ask_wei_per_s);
    }

    #[test]
    fn a_bad_observation_leaves_the_market_untouched() {
        let mut mm = maker();
        mm.observe("llama-8b", Tier::T0, &obs(0.9)).unwrap();
        let before = *mm.state("llama-8b", Tier::T0).unwrap();
        let nan = Observation {
            offered_load: 0.5,
            occupancy: f64::NAN,
        };
        let err = mm.observe("llama-8b", Tier::T0, &nan).unwrap_err();
        assert!(err.to_string().contains("observation.occupancy"), "{err}");
        let negative = Observation {
            offered_load: -1.0,
            occupancy: 0.5,
        };
        assert!(mm.observe("llama-8b", Tier::T0, &negative).is_err());
        assert_eq!(*mm.state("llama-8b", Tier::T0).unwrap(), before);
    }

    #[test]
    fn attested_and_unknown_markets_are_refused() {
        let mm = maker();
        assert!(matches!(
            mm.quote("llama-8b", Tier::Attested, 1.0, 0.1),
            Err(Error::TierUnavailable(Tier::Attested))
        ));
        assert!(matches!(
            mm.quote("nope", Tier::T0, 1.0, 0.1),
            Err(Error::UnknownMarket(_))
        ));
        assert!(mm.quote("llama-8b", Tier::T0, f64::NAN, 0.1).is_err());
    }

    #[test]
    fn eligibility_is_ask_at_most_the_quote() {
        let q = Quote {
            bid_wei_per_s: 1_083,
            ask_wei_per_s: 1_139,
            regime: Regime::Busy,
        };
        assert!(eligible(1_139, &q));
        assert!(eligible(0, &q));
        // One wei over the quote is over it: no float rounding admits it.
        assert!(!eligible(1_140, &q));
    }
}
