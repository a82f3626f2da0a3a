//! A clearing decision as every party reads it: the chosen bundle and each term of its cost, the
//! cheapest feasible bundles and the nearest refused ones, each with the constraint that binds
//! and by how much (SPEC §2). The exchange's clearing core (`cx-exchange`) computes with these
//! types, its books keep [`DecisionRecord`] in a job's `decision`, and `GET /v1/jobs/{id}`, the
//! explorer and `cx-client` read that same record.
//!
//! Reading is lenient (every field of a record has a default), so a decision of an older shape,
//! or a job that cleared nothing of its own (a search's fill, a rent's term), still reads.

use crate::class::{DeterminismClass, Tier};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One of the hard constraints a bundle must meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Constraint {
    /// Free memory against what must be loaded plus the KV cache.
    Memory,
    /// Context length against the device's maximum.
    Context,
    /// Determinism class honoured by the device.
    Determinism,
    /// Verification tier offered by the bundle.
    Tier,
    /// Estimated completion time against the deadline.
    Deadline,
    /// The bundle's ask against the price ceiling (the market's quote, the buyer's maximum).
    Price,
    /// A job kind the exchange defines (a `cx/…` market such as `cx/matmul-f32`) that the bundle
    /// does not offer: it is not among the bundle's resident bases, and there are no weights
    /// to fetch instead.
    Kind,
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Memory => "memory",
            Self::Context => "context",
            Self::Determinism => "determinism",
            Self::Tier => "tier",
            Self::Deadline => "deadline",
            Self::Price => "price",
            Self::Kind => "kind",
        })
    }
}

/// A violated constraint and by how much.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Violation {
    /// Which constraint.
    pub constraint: Constraint,
    /// needed / available (memory, context) or t̂ / Δ (deadline); `None` for the categorical
    /// constraints (determinism, tier), which no amount of a resource can fix.
    #[serde(default)]
    pub factor: Option<f64>,
    /// What was needed against what was there, in words with units.
    pub detail: String,
}

/// Each term of the objective, in whole units of the asset, and their sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Terms {
    /// p(b)·t_compute.
    pub compute: f64,
    /// λ_L·ℓ.
    pub latency: f64,
    /// λ_F·φ.
    pub failure: f64,
    /// λ_V·v(τ).
    pub verification: f64,
    /// λ_D·δ.
    pub deadline_risk: f64,
    /// μ1·(1−β): the base model is not resident.
    pub base_load: f64,
    /// μ2·(1−α): the adapter is not resident.
    pub adapter_load: f64,
    /// μ_P·(1−π): the job continues a prefix this bundle does not hold.
    pub prefix_miss: f64,
    /// π: the bundle holds the prefix the job continues (false when it continues none).
    pub prefix_hit: bool,
    /// The sum, which clearing minimises.
    pub total: f64,
    /// t̂ in seconds (not a cost; reported beside them).
    pub completion_s: f64,
    /// t_compute on the bundle, seconds (part of t̂): the work the job adds to its queue.
    pub compute_s: f64,
    /// The work queued on the bundle ahead of the job when it was cleared, seconds (part of t̂).
    pub queue_s: f64,
}

/// A feasible bundle and its total cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Ranked {
    /// Bundle id.
    pub id: String,
    /// Objective value.
    pub total: f64,
    /// t̂, seconds.
    pub completion_s: f64,
}

/// A refused bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rejection {
    /// Bundle id.
    pub id: String,
    /// The constraint that binds (categorical first, else the largest factor).
    pub binding: Constraint,
    /// Its factor (`None` for a categorical constraint).
    #[serde(default)]
    pub factor: Option<f64>,
    /// Every violated constraint.
    #[serde(default)]
    pub violations: Vec<Violation>,
}

/// The clearing decision as the books keep it in a job's `decision` and the API shows it: the
/// choice and every cost term, the cheapest feasible bundles and the nearest refused ones (each
/// with its binding constraint and factor), and how many of each there were.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DecisionRecord {
    /// The tier the job was cleared (and will be verified) at; absent where nothing was
    /// cleared for the job itself (a search's fill, a rent's term).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub tier: Option<Tier>,
    /// The determinism class the job was cleared for (what a re-clearing keeps).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub determinism: DeterminismClass,
    /// The chosen bundle.
    pub chosen: Option<String>,
    /// Its cost terms.
    pub terms: Option<Terms>,
    /// Feasible bundles, cheapest first (the exchange keeps the first few).
    pub feasible: Vec<Ranked>,
    /// How many bundles were feasible.
    pub feasible_total: usize,
    /// Refused bundles, nearest first (smallest factor; categorical last; the exchange keeps
    /// the first few), each with its binding constraint and factor.
    pub rejected: Vec<Rejection>,
    /// How many bundles were refused.
    pub rejected_total: usize,
    /// The conversation prefix the job continues ([`crate::prefix`]), if any; whether the
    /// chosen bundle held it is the terms' `prefix_hit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_id: Option<String>,
    /// The buyer's limit for the job and all its verification runs together, wei (decimal);
    /// kept where the job is verified by replication, so a referee run is priced within it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_wei: Option<String>,
    /// The market quote a market order was cleared under (the buyer left its limit to the
    /// market): only bundles asking at most its ask were eligible.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quote: Option<QuotedLimit>,
    /// How a want that named a task rather than a model (`task:<name>`, the door's `cx/auto`
    /// and `cx/fanout:N`) was routed to this job's model: the arm and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteRecord>,
}

/// The router's choice of a model for a task (SPEC §10): the request's features, every arm it
/// scored with its utility and expected free energy, the arms the ceilings or the fleet left out
/// and why, and which arm this job went to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RouteRecord {
    /// What the buyer named: `task:<name>`, `cx/auto` or `cx/fanout:N`.
    pub target: String,
    /// The catalog model this job was sent to.
    pub arm: String,
    /// Its place among the arms dispatched (0: the best; a fan-out's jobs are 0..N).
    pub rank: usize,
    /// Arms dispatched for the request (1, or N of a fan-out).
    pub fan_out: usize,
    /// The request's id, shared by a fan-out's jobs (16 hex digits): the meter's request.
    pub request: String,
    /// x: `[bias, log tokens, long context, vision, audio, code, reasoning, extraction]`.
    pub features: Vec<f64>,
    /// p of the chosen arm as it was sounded: `[bias, quality, cheapness, speed, code, vision,
    /// long context]` (what a contextual bandit learns the outcome against).
    #[serde(default)]
    pub profile: Vec<f64>,
    /// The context the request needs, estimated tokens.
    pub context_tokens: u32,
    /// The regime belief (calm, busy, surge) of the chosen arm's market it was judged under.
    pub belief: [f64; 3],
    /// Seconds from the order to its deadline (what the meter judges latency against).
    pub deadline_s: f64,
    /// The most the job may cost, wei (decimal).
    pub max_cost_wei: String,
    /// Arms scored, best first.
    pub candidates: Vec<RouteCandidate>,
    /// Arms left out before scoring, with why (no bundle able to run it, a ceiling).
    pub gated: Vec<RouteGate>,
    /// Better-ranked arms that no bundle took when cleared (the job went to the next).
    #[serde(default)]
    pub passed_over: Vec<String>,
}

/// One arm as the router scored it for a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RouteCandidate {
    /// The catalog model.
    pub arm: String,
    /// `u(x, p)`: what the request's features make of the arm's profile (the prior; under the
    /// LinUCB policy, its optimistic score).
    pub utility: f64,
    /// KL of the predicted outcomes from the buyer's preferred ones, nats.
    pub risk: f64,
    /// Expected entropy of outcomes given the regime, nats.
    pub ambiguity: f64,
    /// Expected information gain about the arm's outcome model, nats.
    pub information_gain: f64,
    /// G = risk + ambiguity − information gain.
    pub efe: f64,
    /// The rank order, larger first: `utility − efe` (LinUCB: its optimistic score).
    pub score: f64,
    /// What the job would cost on the bundle it would clear to now, wei (decimal).
    pub cost_wei: String,
    /// That bundle's completion estimate t̂, seconds.
    pub completion_s: f64,
}

/// An arm left out of a route, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RouteGate {
    /// The catalog model.
    pub arm: String,
    /// Why, in words.
    pub reason: String,
}

/// The market maker's quote for one job (its model, tier, deadline and work), as a market
/// order's decision records it: what gated the bundles it could go to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotedLimit {
    /// What the exchange pays a provider, wei per compute-second.
    #[serde(with = "crate::price::rate_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,19}$"))]
    pub bid_wei_per_s: u64,
    /// The most a bundle could ask and take the job, wei per compute-second: the market's ask
    /// for this job, modulated by its deadline and tier.
    #[serde(with = "crate::price::rate_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,19}$"))]
    pub ask_wei_per_s: u64,
    /// The market's regime when the job was cleared: `calm`, `busy` or `surge`.
    pub regime: String,
    /// The buyer's preference applied to the market's quote, a log multiplier (0: none; SPEC §10:
    /// learned from the buyer's own market orders).
    #[serde(default)]
    pub tenant_log_multiplier: f64,
}

impl Default for DecisionRecord {
    /// Nothing chosen, nothing ranked; class D, which a decision older than the field was
    /// cleared for.
    fn default() -> Self {
        Self {
            tier: None,
            determinism: DeterminismClass::D,
            chosen: None,
            terms: None,
            feasible: Vec::new(),
            feasible_total: 0,
            rejected: Vec::new(),
            rejected_total: 0,
            prefix_id: None,
            limit_wei: None,
            quote: None,
            route: None,
        }
    }
}

impl DecisionRecord {
    /// β and α of the chosen bundle when the job was cleared: the residency terms are μ1·(1−β)
    /// and μ2·(1−α), so a zero term means the base (the adapter) was resident; a job without an
    /// adapter has α = 1. `None` when nothing was chosen.
    pub fn residency(&self) -> Option<(bool, bool)> {
        let terms = self.terms?;
        Some((terms.base_load == 0.0, terms.adapter_load == 0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_another_shape_still_reads() {
        let fill: DecisionRecord =
            serde_json::from_str(r#"{"kind": "search", "witness": 3}"#).unwrap();
        assert_eq!(fill, DecisionRecord::default());
        let record = DecisionRecord {
            tier: Some(Tier::T1),
            chosen: Some("b".into()),
            rejected: vec![Rejection {
                id: "c".into(),
                binding: Constraint::Memory,
                factor: Some(2.0),
                violations: Vec::new(),
            }],
            rejected_total: 1,
            ..DecisionRecord::default()
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["rejected"][0]["binding"], "memory");
        assert_eq!(json["determinism"], "D");
        assert_eq!(
            serde_json::from_value::<DecisionRecord>(json).unwrap(),
            record
        );
    }
}
