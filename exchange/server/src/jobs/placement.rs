//! Placement: what a job asks of the market ([`Want`]), what clearing made of it before it is
//! committed (`Placed`, with its verification runs and any reserve it draws on), the decision
//! the books keep, and the answer an intent gets ([`Accepted`]). Every order kind and the
//! verification that re-places jobs build on these; this module depends on none of them.

use crate::books::{JobStatus, NewJob, NewRun};
use crate::error::{Error, Result};
use alloy::primitives::B256;
use cx_exchange::clearing::Decision;
use cx_protocol::decision::DecisionRecord;
use cx_protocol::wire::{Accepted, PlacedRun};
use cx_protocol::workload::Workload;
use cx_protocol::{Job, Tier};

/// Feasible and rejected bundles a stored decision keeps: the nearest ones explain a choice; a
/// fleet of ten thousand would otherwise write ten thousand rows of JSON per intent.
pub const DECISION_KEEPS: usize = 32;

/// The tier a stored decision says its job was cleared at (every job's decision names one).
pub(crate) fn cleared_tier(decision: &DecisionRecord) -> Result<Tier> {
    decision.tier.ok_or_else(|| Error::Corrupt {
        what: "a job's decision without a tier",
        value: decision.chosen.clone().unwrap_or_default(),
    })
}

/// The clearing decision as the books keep it ([`DecisionRecord`]): the tier and class `job`
/// was cleared for, the choice and its terms, and the bundles the market kept
/// (`Market::clear`: the first [`DECISION_KEEPS`] feasible and refused, the
/// nearest first) of how many there were.
pub(crate) fn decision_record(decision: Decision, job: &Job) -> DecisionRecord {
    let Decision {
        chosen,
        terms,
        feasible,
        rejected,
        feasible_total,
        rejected_total,
    } = decision;
    DecisionRecord {
        tier: Some(job.tier),
        determinism: job.determinism,
        chosen,
        terms,
        feasible,
        feasible_total,
        rejected,
        rejected_total,
        prefix_id: job.prefix.as_ref().map(|p| p.id.clone()),
        limit_wei: None,
        quote: None,
        route: None,
    }
}

/// What a job asks of the market, whoever signed for it: an intent's own fields, or a session
/// grant's defaults with a call's overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct Want {
    /// A catalog model (name or alias).
    pub model: String,
    /// The adapter, by content id.
    pub adapter_id: Option<B256>,
    /// When the result must be back, unix seconds.
    pub deadline_s: u64,
    /// The most the buyer pays, wei.
    pub max_price_wei: u128,
    /// The weakest verification tier accepted.
    pub min_tier: Tier,
    /// The determinism class.
    pub determinism: cx_protocol::DeterminismClass,
    /// The buyer left its limit to the market: only bundles asking at most the market's quote
    /// for the job (its ask, modulated by the job's deadline and tier) are eligible, and the
    /// quote is recorded in the decision; `max_price_wei` stays the most the job may cost.
    pub market_limit: bool,
    /// How a task want was routed to `model` ([`crate::task_router`]), kept in the job's
    /// decision; `None` for a want that named its model.
    pub route: Option<std::sync::Arc<cx_protocol::decision::RouteRecord>>,
    /// For a task want: the lowest catalog quality an arm may have (0: any).
    pub min_quality: f64,
}

impl Want {
    /// The want of a job the books already hold (a stranded job placed again, a referee run):
    /// its model, its adapter by the stored hex id, its deadline, at most `max_price_wei`, at
    /// `min_tier` in class `determinism`.
    pub(crate) fn of_stored(
        model: &str,
        adapter: Option<&str>,
        deadline_s: u64,
        max_price_wei: u128,
        min_tier: Tier,
        determinism: cx_protocol::DeterminismClass,
    ) -> Result<Self> {
        let adapter_id = adapter
            .map(|id| {
                id.parse::<B256>().map_err(|_| Error::Corrupt {
                    what: "an adapter id",
                    value: id.to_owned(),
                })
            })
            .transpose()?;
        Ok(Self {
            model: model.to_owned(),
            adapter_id,
            deadline_s,
            max_price_wei,
            min_tier,
            determinism,
            // A stored job is placed again within what it holds, not re-quoted.
            market_limit: false,
            // Nor routed again: its model is the arm it was routed to.
            route: None,
            min_quality: 0.0,
        })
    }

    /// Refuses a deadline that is not after `now_s`, naming `deadline_s`.
    pub(crate) fn check_deadline(&self, now_s: u64) -> Result<()> {
        if self.deadline_s <= now_s {
            return Err(cx_protocol::Error::DeadlinePassed {
                field: "deadline_s".to_owned(),
                deadline_s: self.deadline_s,
                now_s,
            }
            .into());
        }
        Ok(())
    }
}

/// A cleared job before it is committed.
pub(crate) struct Placed {
    pub(crate) job: Job,
    pub(crate) bundle_id: String,
    pub(crate) terms: cx_exchange::objective::Terms,
    pub(crate) held_wei: u128,
    pub(crate) deadline_s: u64,
    pub(crate) decision: DecisionRecord,
    /// The reserve it draws on, if it does (then it is priced zero).
    pub(crate) drawn: Option<Drawn>,
}

impl Placed {
    pub(crate) fn new_job(
        &self,
        id: B256,
        tab_id: u64,
        workload: &Workload,
        settle_margin_s: u64,
    ) -> Result<NewJob> {
        let mut decision = serde_json::to_value(&self.decision)?;
        if let (Some(drawn), Some(fields)) = (self.drawn, decision.as_object_mut()) {
            fields.insert("reserve".into(), drawn.reserve.to_string().into());
            fields.insert("drawn_ms".into(), drawn.compute_ms.into());
        }
        Ok(NewJob {
            id,
            escrow_id: tab_id,
            model: self.job.base_model.clone(),
            status: JobStatus::Assigned,
            bundle_id: Some(self.bundle_id.clone()),
            held_wei: self.held_wei,
            needed_until_s: self.deadline_s.saturating_add(settle_margin_s),
            decision,
            deadline_s: self.deadline_s,
            adapter: self.job.adapter.clone(),
            workload: workload.clone(),
        })
    }

    /// What the buyer is told of the job placed with `runs`.
    pub(crate) fn accepted(self, job_id: B256, runs: &[NewRun]) -> Accepted {
        Accepted {
            job_id,
            status: JobStatus::Assigned,
            bundle_id: self.bundle_id,
            held_wei: runs
                .iter()
                .fold(self.held_wei, |sum, r| sum.saturating_add(r.held_wei)),
            tier: self.job.tier,
            terms: self.terms,
            verification_runs: runs
                .iter()
                .map(|r| PlacedRun {
                    job_id: r.id,
                    run: r.run,
                    bundle_id: r.bundle_id.clone(),
                    held_wei: r.held_wei,
                })
                .collect(),
            routed_to: self.decision.route.as_ref().map(|r| r.arm.clone()),
        }
    }
}

/// Refused bundles by how near they came: the smallest binding factor first, categorical
/// refusals (no factor: no amount of a resource fixes them) last.
fn nearest_first(
    a: &cx_exchange::clearing::Rejection,
    b: &cx_exchange::clearing::Rejection,
) -> std::cmp::Ordering {
    a.factor
        .unwrap_or(f64::INFINITY)
        .total_cmp(&b.factor.unwrap_or(f64::INFINITY))
}

/// No bundle can take the job: say which came nearest and what it missed by.
pub(crate) fn no_match(decision: &Decision) -> Error {
    let nearest = decision.rejected.iter().min_by(|a, b| nearest_first(a, b));
    match nearest {
        None => Error::NoMatch {
            detail: "no provider bundle is registered for this market".to_owned(),
        },
        Some(r) => Error::NoMatch {
            detail: format!(
                "nearest: bundle {} misses {}{} ({})",
                r.id,
                r.binding,
                r.factor.map_or(String::new(), |f| format!(" by {f:.3}×")),
                r.violations
                    .iter()
                    .map(|v| v.detail.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        },
    }
}

/// A draw an intent makes on a reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drawn {
    /// The reserve.
    pub(crate) reserve: B256,
    /// Its estimated compute on the committed bundle, milliseconds.
    pub(crate) compute_ms: u64,
}
