//! Where a job's verification runs go (SPEC §7, T1 and T3): the runs placed with it at intake
//! ([`Intake::plan_runs`]), each on a provider not yet running the job, a referee for a pair that
//! disagrees ([`Intake::referee`]), and a run that moves away from its group when its provider
//! leaves ([`Intake::place_apart`]). How their results are judged is [`crate::verification`]'s.

use crate::books::{NewRun, RunRecord};
use crate::error::{Error, Result};
use crate::intake::Intake;
use crate::jobs::placement::{Placed, Want, no_match};
use crate::verification::{Terms, runs_needed};
use alloy::primitives::B256;
use cx_protocol::decision::DecisionRecord;
use cx_protocol::replica::{MAX_RUNS, run_job_id};
use cx_protocol::{DeterminismClass, Job, Tier};
use std::collections::HashSet;

/// Who already runs a job: the bundles of its providers (each with every bundle of the same
/// on-chain identity), their operators, and the kernel corpus of the first bundle taken (the
/// job's own).
#[derive(Debug, Default)]
struct Taken {
    excluded: HashSet<String>,
    operators: HashSet<String>,
    corpus: Option<Option<String>>,
}

impl Intake {
    /// Places the verification runs `placed`'s tier needs (none for T0, T2 and T1 of a class
    /// other than D), each on a provider not yet running the job, within what `limit_wei` (the
    /// buyer's limit for the job and its runs together) leaves; run ids derive from `job_id`.
    /// Refuses the order when the fleet cannot place them.
    pub(crate) async fn plan_runs(
        &self,
        placed: &mut Placed,
        job_id: B256,
        limit_wei: u128,
    ) -> Result<Vec<NewRun>> {
        let tier = placed.job.tier;
        let needed = runs_needed(tier, placed.job.determinism);
        if needed == 0 {
            return Ok(Vec::new());
        }
        placed.decision.limit_wei = Some(limit_wei.to_string());
        let mut taken = Taken::default();
        self.take(&mut taken, &placed.bundle_id).await?;
        let mut left = limit_wei.saturating_sub(placed.held_wei);
        let mut runs = Vec::with_capacity(needed);
        for run in 1..=needed as u8 {
            let (bundle_id, held_wei, decision) = self
                .place_run(&placed.job, &taken, left)?
                .map_err(|detail| Error::NoReplica {
                    tier,
                    needed,
                    kind: if tier == Tier::T3 {
                        "providers of distinct operators"
                    } else {
                        "another provider"
                    },
                    detail,
                    diverse: tier == Tier::T3,
                })?;
            if usize::from(run) < needed {
                self.take(&mut taken, &bundle_id).await?;
            }
            left = left.saturating_sub(held_wei);
            runs.push(NewRun {
                id: B256::from(run_job_id(job_id.0, run)),
                run,
                bundle_id,
                held_wei,
                decision: serde_json::to_value(&decision)?,
            });
        }
        Ok(runs)
    }

    /// Adds bundle `id`, every bundle of its provider's on-chain identity, and its operator to
    /// `taken`.
    async fn take(&self, taken: &mut Taken, id: &str) -> Result<()> {
        if !taken.excluded.contains(id) {
            taken.excluded.extend(
                self.market()
                    .same_identity_bundles(self.books(), id)
                    .await?
                    .iter()
                    .cloned(),
            );
        }
        if let Some(operator) = self.market().operator_of(id) {
            taken.operators.insert(operator);
        }
        if taken.corpus.is_none() {
            taken.corpus = Some(self.market().kernel_corpus_of(id));
        }
        taken.excluded.insert(id.to_owned());
        Ok(())
    }

    /// Clears one run of `job` onto a bundle of a provider not in `taken`, charging at most
    /// `left_wei`: T3 only among other operators, T1 among them first and then among any other
    /// provider; a class-D run only on a bundle of the kernel corpus of the job's own bundle
    /// ([`cx_protocol::Bundle::kernel_corpus`]); a class-D∞ run on a bundle offering D∞, else on
    /// one offering D (bit-exact output is within any tolerance). `Ok(Err(why))` when none can
    /// take it.
    fn place_run(
        &self,
        job: &Job,
        taken: &Taken,
        left_wei: u128,
    ) -> Result<std::result::Result<(String, u128, DecisionRecord), String>> {
        let excluded = &taken.excluded;
        let job = Job {
            max_price_wei: Some(left_wei),
            ..job.clone()
        };
        // Class D is byte equality among runs of one kernel corpus: a replica on other kernels
        // (FMA, a GPU) may differ in honest bits and would outvote, and slash, the job's provider.
        let corpus = taken.corpus.clone().flatten();
        let same_corpus = |b: &cx_protocol::Bundle| {
            job.determinism != DeterminismClass::D || b.kernel_corpus == corpus
        };
        // The engine matches a bundle's offered classes exactly; a D∞ run may also go to a
        // provider that offers only D, cleared as a class-D job (any kernel corpus: the run is
        // judged within the tolerance, never by bytes).
        let mut as_classes = vec![job.clone()];
        if job.determinism == DeterminismClass::DInf {
            as_classes.push(Job {
                determinism: DeterminismClass::D,
                ..job.clone()
            });
        }
        let clear = |other_operator: bool| -> Result<_> {
            let mut first = None;
            for cleared in &as_classes {
                let (decision, charge) = self.market().clear_among(cleared, |b| {
                    !excluded.contains(&b.id)
                        && (!other_operator || !taken.operators.contains(&b.provider))
                        && same_corpus(b)
                })?;
                if decision.chosen.is_some() {
                    return Ok((decision, charge));
                }
                first.get_or_insert((decision, charge));
            }
            Ok(first.expect("the job's own class is always tried"))
        };
        let (decision, charge) = clear(true)?;
        let (decision, charge) = if decision.chosen.is_some() || job.tier == Tier::T3 {
            (decision, charge)
        } else {
            clear(false)?
        };
        match (decision.chosen.clone(), charge) {
            (Some(id), Some(charge)) => {
                // Recorded with the job's own class, so the assignment asks for D∞ (which a D
                // receipt satisfies) and a re-clearing of a stranded run keeps it.
                let record = crate::jobs::placement::decision_record(decision, &job);
                Ok(Ok((id, charge, record)))
            }
            _ => Ok(Err(match no_match(&decision) {
                Error::NoMatch { detail } => detail,
                other => other.to_string(),
            })),
        }
    }

    /// Places `want` for job `id` again (it is stranded) like any job, except that a job of a
    /// verification group goes only to a provider the rest of its group does not use.
    pub(crate) async fn place_apart(
        &self,
        id: B256,
        want: &Want,
        request: &crate::intake::InferenceRequest,
        account: alloy::primitives::Address,
        now_s: u64,
    ) -> Result<Placed> {
        let job = self.job_of(want, request, account, now_s).await?;
        let others: Vec<RunRecord> = match self.books().verification_group(id).await? {
            Some((_, runs)) => runs.into_iter().filter(|r| r.id != id).collect(),
            None => Vec::new(),
        };
        if others.is_empty() {
            return self.clear(job, want);
        }
        let job = Job {
            tier: want.min_tier,
            ..job
        };
        let mut taken = Taken::default();
        for run in &others {
            if let Some(bundle) = &run.bundle_id {
                self.take(&mut taken, bundle).await?;
            }
        }
        let (bundle_id, held_wei, decision) = self
            .place_run(&job, &taken, want.max_price_wei)?
            .map_err(|detail| Error::NoMatch { detail })?;
        let terms = decision.terms.ok_or_else(|| Error::NoMatch {
            detail: "the chosen bundle has no cost terms".into(),
        })?;
        Ok(Placed {
            job,
            bundle_id,
            terms,
            held_wei,
            deadline_s: want.deadline_s,
            decision,
            drawn: None,
        })
    }

    /// Places one more run (a referee, or a replacement of a run that never answered) on a
    /// provider not yet in the group, within what the limit leaves. False when none can take it.
    pub(crate) async fn referee(
        &self,
        head: &crate::books::GroupHead,
        runs: &[RunRecord],
        terms: &Terms,
    ) -> Result<bool> {
        let Some(original) = runs.iter().find(|r| r.run == 0) else {
            return Ok(false);
        };
        let next = runs.iter().map(|r| r.run).max().unwrap_or(0) + 1;
        if next > MAX_RUNS {
            return Ok(false);
        }
        let spent: u128 = runs
            .iter()
            .filter(|r| r.status.is_pending())
            .map(|r| r.held_wei)
            .sum();
        let left = terms.limit_wei.saturating_sub(spent);
        // Replication verifies inference (T1, T3); a product is checked by Freivalds' test.
        let Some(request) = head.workload.inference() else {
            return Ok(false);
        };
        let want = Want::of_stored(
            &head.model,
            head.adapter.as_deref(),
            head.deadline_s,
            left,
            terms.tier,
            terms.determinism,
        )?;
        let now = crate::intake::now_s();
        let job = match self.job_of(&want, request, head.account, now).await {
            Ok(job) => job,
            Err(err) => {
                tracing::info!(job = %original.id, %err, "no referee run: the job cannot be placed again");
                return Ok(false);
            }
        };
        let mut taken = Taken::default();
        for run in runs {
            if let Some(bundle) = &run.bundle_id {
                self.take(&mut taken, bundle).await?;
            }
        }
        let placed = match self.place_run(&job, &taken, left)? {
            Ok(placed) => placed,
            Err(why) => {
                tracing::info!(job = %original.id, %why, "no referee run: no other provider can take it");
                return Ok(false);
            }
        };
        let (bundle_id, held_wei, decision) = placed;
        let run = NewRun {
            id: B256::from(run_job_id(original.id.0, next)),
            run: next,
            bundle_id,
            held_wei,
            decision: serde_json::to_value(&decision)?,
        };
        let added = self.books().add_run(original.id, head, &run).await?;
        if added {
            tracing::info!(job = %original.id, run = next, bundle = %run.bundle_id, "referee run placed");
        }
        Ok(added)
    }
}
