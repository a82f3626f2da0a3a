//! Clearing one job against a list of candidates, with every decision explained: the chosen
//! bundle and its cost terms, the feasible ones ranked, and every rejected one with its binding
//! constraint. This is what `cx clear` prints and the reference the engine must equal.

use crate::candidate::{Candidate, View};
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
    /// Feasible bundles, cheapest first (the first of them, for [`explain_kept`]).
    pub feasible: Vec<Ranked>,
    /// Infeasible bundles and why: every one in candidate order, or for [`explain_kept`] the
    /// nearest first.
    pub rejected: Vec<Rejection>,
    /// How many bundles were feasible (kept or not).
    pub feasible_total: usize,
    /// How many were refused (kept or not).
    pub rejected_total: usize,
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

/// The decision for `job` over `candidates`, feasible bundles ranked by `policy`, every
/// refusal in candidate order.
pub fn explain_with(
    job: &Job,
    candidates: &[Candidate],
    weights: &Weights,
    price_ceiling: &PriceCeiling,
    policy: Policy,
) -> Decision {
    let walked = walk(
        job,
        candidates.iter().map(|c| (c.id.as_str(), c.view)),
        weights,
        price_ceiling,
        policy,
    );
    walked.decide(job, price_ceiling, usize::MAX, |a, b| a.order.cmp(&b.order))
}

/// [`explain_with`] keeping only the `keep` cheapest feasible bundles and the `keep` nearest
/// refusals (smallest binding factor first, candidate order among equals), with the totals of
/// each: what a decision stored per job holds. Every bundle is judged, but only the kept
/// refusals have their violations written out (the rest cost no allocation), and the
/// candidates are borrowed (an engine passes its own ids and views).
pub fn explain_kept<'a>(
    job: &Job,
    candidates: impl IntoIterator<Item = (&'a str, View)>,
    weights: &Weights,
    price_ceiling: &PriceCeiling,
    policy: Policy,
    keep: usize,
) -> Decision {
    walk(job, candidates, weights, price_ceiling, policy).decide(
        job,
        price_ceiling,
        keep,
        |a, b| a.factor.total_cmp(&b.factor).then(a.order.cmp(&b.order)),
    )
}

/// One feasible bundle as the walk ranks it.
struct Fit<'a> {
    score: f64,
    /// Its consistent-hash distance from the job's key, computed when the ranking first needs
    /// it (only to break an exact tie of scores: hashing every bundle's ring points was most of
    /// a decision's cost).
    distance: std::cell::OnceCell<u64>,
    id: &'a str,
    terms: Terms,
}

impl Fit<'_> {
    fn distance(&self, key: u64) -> u64 {
        *self
            .distance
            .get_or_init(|| affinity_distance(key, self.id))
    }
}

/// One refused bundle as the walk found it: its binding factor (infinite when categorical)
/// and its place among the candidates.
struct Miss<'a> {
    factor: f64,
    order: usize,
    id: &'a str,
    view: View,
}

/// Every candidate judged, nothing yet written out.
struct Walked<'a> {
    /// The job's affinity key's hash.
    key: u64,
    fits: Vec<Fit<'a>>,
    misses: Vec<Miss<'a>>,
}

fn walk<'a>(
    job: &Job,
    candidates: impl IntoIterator<Item = (&'a str, View)>,
    weights: &Weights,
    price_ceiling: &PriceCeiling,
    policy: Policy,
) -> Walked<'a> {
    let key = hash64(job.affinity_key());
    let mut walked = Walked {
        key,
        fits: Vec::new(),
        misses: Vec::new(),
    };
    for (order, (id, view)) in candidates.into_iter().enumerate() {
        match feasibility::miss_factor(job, &view, price_ceiling) {
            None => {
                let terms = objective::evaluate(job, &view, weights);
                walked.fits.push(Fit {
                    score: match policy {
                        Policy::ResidencyAware => terms.total,
                        Policy::CheapestCapable => terms.compute,
                    },
                    distance: std::cell::OnceCell::new(),
                    id,
                    terms,
                });
            }
            Some(factor) => walked.misses.push(Miss {
                factor,
                order,
                id,
                view,
            }),
        }
    }
    walked
}

impl Walked<'_> {
    /// The decision, keeping `keep` of each side: feasible by [`rank`], refusals by `order`.
    fn decide(
        mut self,
        job: &Job,
        price_ceiling: &PriceCeiling,
        keep: usize,
        order: impl Fn(&Miss<'_>, &Miss<'_>) -> Ordering,
    ) -> Decision {
        let (feasible_total, rejected_total) = (self.fits.len(), self.misses.len());
        let key = self.key;
        let by_rank = |a: &Fit<'_>, b: &Fit<'_>| {
            a.score.total_cmp(&b.score).then_with(|| {
                rank(
                    (a.score, a.distance(key), a.id),
                    (b.score, b.distance(key), b.id),
                )
            })
        };
        // The choice is the first feasible bundle whatever is kept.
        keep_first(&mut self.fits, keep.max(1), by_rank);
        keep_first(&mut self.misses, keep, order);
        let rejected = self
            .misses
            .iter()
            .filter_map(|miss| {
                let mut violations = feasibility::violations(job, &miss.view);
                violations.extend(feasibility::price_violation(&miss.view, price_ceiling));
                // A miss has a violation: the same conditions found it.
                let (binding, factor) =
                    feasibility::binding(&violations).map(|bind| (bind.constraint, bind.factor))?;
                Some(Rejection {
                    id: miss.id.to_owned(),
                    binding,
                    factor,
                    violations,
                })
            })
            .collect();
        Decision {
            chosen: self.fits.first().map(|f| f.id.to_owned()),
            terms: self.fits.first().map(|f| f.terms),
            feasible: self
                .fits
                .iter()
                .take(keep)
                .map(|f| Ranked {
                    id: f.id.to_owned(),
                    total: f.terms.total,
                    completion_s: f.terms.completion_s,
                })
                .collect(),
            rejected,
            feasible_total,
            rejected_total,
        }
    }
}

/// Sorts `items` by `order` and keeps the first `keep`: a partial selection first when that
/// drops most of them.
fn keep_first<T>(items: &mut Vec<T>, keep: usize, order: impl Fn(&T, &T) -> Ordering) {
    if keep == 0 {
        items.clear();
        return;
    }
    if items.len() > keep {
        items.select_nth_unstable_by(keep - 1, &order);
        items.truncate(keep);
    }
    items.sort_by(order);
}
