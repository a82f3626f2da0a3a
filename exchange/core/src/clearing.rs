//! Clearing one job against a list of candidates, with every decision explained: the chosen
//! bundle and its cost terms, the feasible ones ranked, and every rejected one with its binding
//! constraint. This is what `cx clear` prints and the reference the engine must equal.

use crate::candidate::Candidate;
use crate::feasibility::{self, PriceCeiling};
use crate::objective::{self, Terms, Weights};
use crate::ring::{affinity_distance, hash64};
use cx_protocol::Job;
pub use cx_protocol::decision::{Ranked, Rejection};
use serde::Serialize;
use std::cmp::Ordering;

/// The decision for one job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Id of the chosen bundle, `None` when nothing is feasible.
    pub chosen: Option<String>,
    /// The chosen bundle's cost terms.
    pub terms: Option<Terms>,
    /// Feasible bundles, cheapest first.
    pub feasible: Vec<Ranked>,
    /// Every infeasible bundle and why.
    pub rejected: Vec<Rejection>,
}

/// The order clearing ranks feasible bundles by: cost, then consistent-hash distance from the
/// job's affinity key (so ties go back where the agent went before), then id.
pub fn rank(a: (f64, u64, &str), b: (f64, u64, &str)) -> Ordering {
    a.0.total_cmp(&b.0)
        .then(a.1.cmp(&b.1))
        .then_with(|| a.2.cmp(b.2))
}

/// Evaluates every candidate against the five constraints and the price ceiling
/// ([`feasibility::price_ceiling`]). Candidates must be valid ([`crate::candidate::View::validate`]).
/// How the feasible bundles are ranked: the seeds' claim is that pricing residency beats the
/// plain cheapest capable bundle, and the switch lets the running market measure it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// The objective's total: compute, latency, failure, verification, deadline risk and the
    /// cost of loading what is not resident (SPEC §2).
    #[default]
    ResidencyAware,
    /// The compute term alone (the ask for the compute time): residency, latency and risk
    /// ignored, as a market that prices only accelerator time would.
    CheapestCapable,
}

impl Policy {
    /// Its name, as flags and reports spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ResidencyAware => "residency_aware",
            Self::CheapestCapable => "cheapest_capable",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "residency_aware" => Ok(Self::ResidencyAware),
            "cheapest_capable" => Ok(Self::CheapestCapable),
            other => Err(format!("{other:?}: residency_aware or cheapest_capable")),
        }
    }
}

/// [`explain_with`] under [`Policy::ResidencyAware`].
pub fn explain(
    job: &Job,
    candidates: &[Candidate],
    weights: &Weights,
    price_ceiling: &PriceCeiling,
) -> Decision {
    explain_with(
        job,
        candidates,
        weights,
        price_ceiling,
        Policy::ResidencyAware,
    )
}

/// The decision for `job` over `candidates`, feasible bundles ranked by `policy`.
pub fn explain_with(
    job: &Job,
    candidates: &[Candidate],
    weights: &Weights,
    price_ceiling: &PriceCeiling,
    policy: Policy,
) -> Decision {
    let key = hash64(job.affinity_key());
    let mut feasible: Vec<(Terms, u64, &Candidate)> = Vec::new();
    let mut rejected = Vec::new();
    for candidate in candidates {
        let view = &candidate.view;
        let mut violations = feasibility::violations(job, view);
        violations.extend(feasibility::price_violation(view, price_ceiling));
        match feasibility::binding(&violations) {
            None => feasible.push((
                objective::evaluate(job, view, weights),
                affinity_distance(key, &candidate.id),
                candidate,
            )),
            Some(bind) => {
                let (binding, factor) = (bind.constraint, bind.factor);
                rejected.push(Rejection {
                    id: candidate.id.clone(),
                    binding,
                    factor,
                    violations,
                });
            }
        }
    }
    let score = |t: &Terms| match policy {
        Policy::ResidencyAware => t.total,
        Policy::CheapestCapable => t.compute,
    };
    feasible.sort_by(|a, b| rank((score(&a.0), a.1, &a.2.id), (score(&b.0), b.1, &b.2.id)));
    Decision {
        chosen: feasible.first().map(|f| f.2.id.clone()),
        terms: feasible.first().map(|f| f.0),
        feasible: feasible
            .iter()
            .map(|(t, _, c)| Ranked {
                id: c.id.clone(),
                total: t.total,
                completion_s: t.completion_s,
            })
            .collect(),
        rejected,
    }
}
