//! The objective over the feasible set (SPEC §2):
//!
//! ```text
//! cost = p(b)·t_compute + λ_L·ℓ + λ_F·φ + λ_V·v(τ) + λ_D·δ + μ1·(1−β) + μ2·(1−α) + μ_P·(1−π)
//! ```
//!
//! All terms are floats in whole units of the settlement asset (the objective's price unit; the
//! bundle's integer ask converts once, through [`cx_protocol::price::to_units`]) and are
//! reported separately. Our definitions of the terms the
//! SPEC leaves open:
//! - ℓ (latency) is t̂, the estimated time until the result is back, in seconds — counting the
//!   bundle's queue ([`crate::feasibility::completion_s`]), so residency is worth the load it
//!   saves and no more.
//! - φ is the bundle's observed failure rate.
//! - v(τ) is the verification work of the tier, in units of the job's own compute, priced at the
//!   bundle's rate: `v(τ) = work(τ)·p(b)·t_compute` (T1 re-executes once, T2's Freivalds rounds
//!   cost ~5 %, T3 runs two more replicas) — see [`cx_protocol::Tier::verification_work`].
//! - δ (deadline risk) is the share of the deadline that t̂ uses, `t̂/Δ` ∈ (0, 1]: the less slack a
//!   bundle leaves, the more an estimation error turns into a missed deadline.
//! - μ1 and μ2 price a cold base load and a cold adapter load. They are the externality of
//!   churning fleet memory, on top of the time already counted in ℓ and δ; μ1 defaults to
//!   μ2·|base|/|adapter| (≈10³), which is what makes agents keep going back to the provider that
//!   holds their base.
//! - π (`prefix_resident`) says the bundle holds the KV cache of the conversation prefix the job
//!   continues (SPEC §4). A holder skips the prefix's prefill, so its t_compute (and with it
//!   the compute term, ℓ and δ) is smaller; μ_P (`mu_prefix`) prices a miss on top, as μ2 does a
//!   cold adapter: the prefix's KV is thrown away on one provider and rebuilt on another. A job
//!   that continues no prefix has π = 1. It is a cost over the feasible set, never a filter: a
//!   holder that is infeasible or far dearer loses.

use crate::candidate::View;
use crate::error::{Result, invalid};
use crate::feasibility::{adapter_present, completion_s};
use cx_protocol::Job;
pub use cx_protocol::decision::Terms;
use serde::{Deserialize, Serialize};

/// The λ and μ weights of the objective.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Weights {
    /// λ_L: units of the asset per second of latency.
    pub lambda_latency: f64,
    /// λ_F: units of the asset per unit of failure rate.
    pub lambda_failure: f64,
    /// λ_V: weight of the verification work.
    pub lambda_verification: f64,
    /// λ_D: units of the asset per unit of deadline risk.
    pub lambda_deadline: f64,
    /// μ1 (`mu_base`): cost of a cold base load; `None` means μ2·|base|/|adapter|.
    pub mu_base: Option<f64>,
    /// μ2 (`mu_adapter`): cost of a cold adapter load.
    pub mu_adapter: f64,
    /// μ_P (`mu_prefix`): cost of missing the conversation prefix a job continues.
    pub mu_prefix: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            lambda_latency: 0.0005,
            lambda_failure: 0.05,
            lambda_verification: 1.0,
            lambda_deadline: 0.01,
            mu_base: None,
            mu_adapter: 0.0001,
            // A tenth of a cold adapter: a prefix is rebuilt from the request alone, with no
            // fetch and no eviction of another tenant's state.
            mu_prefix: 0.00001,
        }
    }
}

/// μ1/μ2 when the job has no adapter to take the ratio from: a base is ~10³ adapters.
const DEFAULT_BASE_TO_ADAPTER: f64 = 1000.0;

impl Weights {
    /// Checks every weight is finite and not negative (the engine's pruning relies on it).
    pub fn validate(&self) -> Result<()> {
        let named = [
            ("lambda_latency", self.lambda_latency),
            ("lambda_failure", self.lambda_failure),
            ("lambda_verification", self.lambda_verification),
            ("lambda_deadline", self.lambda_deadline),
            ("mu_adapter", self.mu_adapter),
            ("mu_prefix", self.mu_prefix),
            ("mu_base", self.mu_base.unwrap_or(0.0)),
        ];
        for (field, value) in named {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(
                    &format!("weights.{field}"),
                    format!("must be a finite number >= 0, got {value}"),
                ));
            }
        }
        Ok(())
    }

    /// μ1 for this job.
    pub fn mu_base_for(&self, job: &Job) -> f64 {
        self.mu_base.unwrap_or_else(|| {
            let ratio = if job.adapter_bytes > 0 {
                job.base_bytes as f64 / job.adapter_bytes as f64
            } else {
                DEFAULT_BASE_TO_ADAPTER
            };
            self.mu_adapter * ratio
        })
    }
}

/// The objective's terms for a (feasible) bundle.
pub fn terms(job: &Job, view: &View, weights: &Weights, t_hat_s: f64) -> Terms {
    let compute = view.price_units_per_s() * view.compute_s;
    let latency = weights.lambda_latency * t_hat_s;
    let failure = weights.lambda_failure * view.failure_rate;
    let verification = weights.lambda_verification * job.tier.verification_work() * compute;
    let deadline_risk = weights.lambda_deadline * (t_hat_s / job.deadline_s);
    let base_load = if view.base_resident {
        0.0
    } else {
        weights.mu_base_for(job)
    };
    let adapter_load = if adapter_present(job, view) {
        0.0
    } else {
        weights.mu_adapter
    };
    let prefix_hit = job.prefix.is_some() && view.prefix_resident;
    let prefix_miss = if job.prefix.is_some() && !prefix_hit {
        weights.mu_prefix
    } else {
        0.0
    };
    let total = compute
        + latency
        + failure
        + verification
        + deadline_risk
        + base_load
        + adapter_load
        + prefix_miss;
    Terms {
        compute,
        latency,
        failure,
        verification,
        deadline_risk,
        base_load,
        adapter_load,
        prefix_miss,
        prefix_hit,
        total,
        completion_s: t_hat_s,
        compute_s: view.compute_s,
        queue_s: view.queue_s,
    }
}

/// The job's FLOPs on a bundle: all of `compute_flops`, less the prefix's prefill on a holder (π).
pub fn compute_flops_on(job: &Job, prefix_resident: bool) -> f64 {
    match &job.prefix {
        Some(prefix) if prefix_resident => (job.compute_flops - prefix.flops).max(0.0),
        _ => job.compute_flops,
    }
}

/// Convenience: t̂ then the terms.
pub fn evaluate(job: &Job, view: &View, weights: &Weights) -> Terms {
    terms(job, view, weights, completion_s(job, view))
}

/// The deadline at which the engine's index key weighs a bundle's time as the objective does:
/// the key's time weight is λ_L + λ_D/Δ at this Δ (any positive value keeps clearing exact; it
/// only moves how far a walk goes for jobs with other deadlines).
const KEY_DEADLINE_S: f64 = 30.0;

/// A bundle's index key: its ask per FLOP plus [`key_time_weight`] × its seconds per FLOP, in
/// units of the asset per FLOP. Per FLOP of a job, the compute term costs the ask and the
/// latency and deadline-risk terms cost the time weight × the seconds: ordering by the ask alone
/// left the walks blind to a bundle's speed, which costs as much (a bundle's ask per second and
/// λ_L are both ~10⁻⁴–10⁻³ units), and they walked ~180 base holders per clear.
pub fn index_key(price_units_per_s: f64, flops_per_s: f64, weights: &Weights) -> f64 {
    (price_units_per_s + key_time_weight(weights)) / flops_per_s
}

/// The units per second the index key charges for a bundle's time: λ_L + λ_D/Δ at
/// [`KEY_DEADLINE_S`].
fn key_time_weight(weights: &Weights) -> f64 {
    weights.lambda_latency + weights.lambda_deadline / KEY_DEADLINE_S
}

/// A lower bound on `total` for one job on a bundle with a given residency, from the bundle's
/// [`index_key`] alone: the engine walks bundles in key order and stops once the bound passes
/// the best cost found. With F the least FLOPs the job costs any bundle (on a holder of its
/// prefix), p the ask per FLOP and s the seconds per FLOP, a bundle costs at least
/// `a·p + b·s` — the compute with its verification, `a = F·(1 + λ_V·v(τ))`, and the latency and
/// deadline risk of t̂ ≥ F·s, `b = F·(λ_L + λ_D/Δ)` — every other term being ≥ 0; and with the
/// key `k = p + c·s`, `a·p + b·s ≥ min(a, b/c)·k`. What depends on the job alone is computed
/// once per clear ([`LowerBound::new`]), not per bundle.
#[derive(Debug, Clone, Copy)]
pub struct LowerBound {
    /// `min(a, b/c)`: what a unit of key costs the job at least.
    per_key: f64,
    /// λ_L + λ_D/Δ: what a second of t̂ costs the job.
    per_second: f64,
    lambda_failure: f64,
    mu_base: f64,
    mu_adapter: f64,
}

impl LowerBound {
    /// The bound's job-dependent part.
    pub fn new(job: &Job, weights: &Weights) -> Self {
        let least_flops = compute_flops_on(job, true);
        let per_price =
            least_flops + weights.lambda_verification * job.tier.verification_work() * least_flops;
        let per_second = weights.lambda_latency + weights.lambda_deadline / job.deadline_s;
        let c = key_time_weight(weights);
        Self {
            per_key: if c > 0.0 {
                per_price.min(least_flops * per_second / c)
            } else {
                per_price
            },
            per_second,
            lambda_failure: weights.lambda_failure,
            mu_base: weights.mu_base_for(job),
            mu_adapter: weights.mu_adapter,
        }
    }

    /// The bound on a bundle of index key `key` with the given residency (`adapter_present`:
    /// resident, or the job needs none). Shaved by a relative 1e-9 so float rounding in the
    /// key and the real sum can never put a bundle below its bound; it grows with `key`.
    pub fn at(&self, key: f64, base_resident: bool, adapter_present: bool) -> f64 {
        self.with(self.per_key * key, base_resident, adapter_present)
    }

    /// [`LowerBound::at`] for one bundle, tighter by what its own numbers add without a
    /// division: the latency and deadline risk of its round trip and queue (t̂ counts both) and
    /// its failure term. The engine skips a bundle whose bound passes the best cost before it
    /// computes t̂ and the terms.
    pub fn at_bundle(
        &self,
        key: f64,
        (base_resident, adapter_present): (bool, bool),
        rtt_and_queue_s: f64,
        failure_rate: f64,
    ) -> f64 {
        let own = self.per_key * key
            + self.per_second * rtt_and_queue_s
            + self.lambda_failure * failure_rate;
        self.with(own, base_resident, adapter_present)
    }

    fn with(&self, mut bound: f64, base_resident: bool, adapter_present: bool) -> f64 {
        if !base_resident {
            bound += self.mu_base;
        }
        if !adapter_present {
            bound += self.mu_adapter;
        }
        bound * (1.0 - 1e-9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cx_protocol::{DeterminismClass, Tier};

    #[test]
    fn mu_base_defaults_to_the_size_ratio() {
        let job = Job {
            agent: String::new(),
            base_model: "m".into(),
            adapter: Some("a".into()),
            base_bytes: 16_000_000_000,
            adapter_bytes: 16_000_000,
            kv_bytes: 0,
            context_tokens: 1,
            deadline_s: 1.0,
            determinism: DeterminismClass::S,
            tier: Tier::T0,
            compute_flops: 0.0,
            value_wei: 0,
            max_price_wei: None,
            prefix: None,
        };
        let w = Weights::default();
        assert!((w.mu_base_for(&job) / w.mu_adapter - 1000.0).abs() < 1e-9);
        let negative = Weights {
            lambda_failure: -1.0,
            ..w
        };
        assert!(negative.validate().is_err());
    }
}
