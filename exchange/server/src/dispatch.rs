//! Dispatch: jobs to providers and their outcomes back to whoever waits on them.
//!
//! Providers connect out (the exchange never reaches into a provider's network): they register
//! a signed offer ([`crate::intake::Intake::register_offer`]), long-poll for their jobs
//! ([`crate::intake::Intake::pull`]), each handed out with the exchange's signed assignment,
//! stream pieces of the text ([`crate::intake::Intake::progress`]) and return the output with a
//! signed receipt checked against the job ([`crate::intake::Intake::accept_result`]).
//! Every change is told to whoever waits on the job ([`crate::waiters::Waiters`]); jobs no one
//! finishes by their deadline are the sweeps' ([`crate::sweeps`]).

use crate::books::JobStatus;
use crate::orders::{Produced, WorkloadOrder};
use crate::waiters::Progress;
use alloy::primitives::B256;
use cx_protocol::wire::{Assignment, Completed, ResultSubmission};
use std::time::Duration;

/// Longest output text a result may carry, bytes.
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// Longest piece of streamed output one progress call may carry, bytes.
pub const MAX_PROGRESS_BYTES: usize = 64 << 10;

impl crate::intake::Intake {
    /// Registers a provider's signed offer at `now_s`: the signature under the key it carries,
    /// the offer's age and fields, then the provider and its bundles (a bundle id another key
    /// holds is refused). The key's hash names the provider from then on.
    pub async fn register_offer(
        &self,
        signed: &cx_protocol::offer::SignedOffer,
        now_s: u64,
    ) -> crate::Result<crate::books::Provider> {
        let key = signed.verify(now_s)?;
        let offer = &signed.offer;
        let provider = crate::books::Provider {
            key_hash: B256::from(key.id().0),
            mldsa_key: signed.verification_key.clone(),
            operator: offer.operator.clone(),
            payout: offer.payout,
        };
        self.registries()
            .check(offer.payout, provider.key_hash)
            .await?;
        // φ is what the exchange saw of this provider, not what its offer says.
        let observed = self
            .books()
            .observed_failure_rate(provider.key_hash)
            .await?;
        // The prefixes its memory holds are the residency report's (SPEC §4): one memory under
        // all its bundles, so each bundle holds what the report names.
        let prefixes = offer
            .residency
            .as_ref()
            .map(|r| r.prefixes.clone())
            .unwrap_or_default();
        let bundles = offer
            .bundles
            .iter()
            .cloned()
            .map(|mut b| {
                b.failure_rate = observed;
                b.resident_prefixes = prefixes.clone();
                b
            })
            .collect();
        self.market()
            .register_offer(
                self.books(),
                &provider,
                offer.token_hash,
                &serde_json::to_value(signed)?,
                bundles,
            )
            .await?;
        Ok(provider)
    }

    /// The provider whose dispatch token is `token`.
    pub async fn provider(&self, token: &str) -> crate::Result<crate::books::Provider> {
        self.books()
            .provider_by_token(cx_protocol::offer::Offer::token_hash_of(token.as_bytes()))
            .await?
            .ok_or(crate::Error::UnknownProvider)
    }

    /// Up to `max_jobs` of the provider's assigned jobs, waiting up to `wait` for one when none
    /// is there yet (a long poll: providers connect out, the exchange never connects in).
    pub async fn pull(
        &self,
        provider: &crate::books::Provider,
        max_jobs: u32,
        wait: Duration,
    ) -> crate::Result<Vec<Assignment>> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let work = self.waiters().work();
            tokio::pin!(work);
            work.as_mut().enable();
            let mut jobs = self
                .books()
                .claim_jobs(provider.key_hash, max_jobs, crate::intake::now_s())
                .await?;
            if !jobs.is_empty() {
                for job in &mut jobs {
                    job.signed = Some(self.sign_assignment(provider, job)?);
                }
                for job in &jobs {
                    self.waiters().notify(job.job_id);
                }
                return Ok(jobs);
            }
            if tokio::time::timeout_at(until, work).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    /// Relays a piece of the output of the provider's job `job_id` to the buyer's stream, if the
    /// job is the provider's (a piece is a preview: the signed result is what is charged and
    /// checked).
    pub async fn progress(
        &self,
        provider: &crate::books::Provider,
        job_id: B256,
        offset: usize,
        text: String,
    ) -> crate::Result<()> {
        if text.len() > MAX_PROGRESS_BYTES || offset > MAX_OUTPUT_BYTES {
            return Err(crate::Error::ReceiptMismatch {
                field: "output_hash",
                reason: format!(
                    "covers progress beyond {MAX_OUTPUT_BYTES} bytes or a piece over {MAX_PROGRESS_BYTES}"
                ),
            });
        }
        self.books()
            .assignment(job_id, provider.key_hash)
            .await?
            .ok_or(crate::Error::UnknownJob)?;
        self.waiters().publish_text(
            job_id,
            Progress {
                offset,
                text: text.into(),
            },
        );
        Ok(())
    }

    /// The exchange's signed word that `job` goes to `provider` at most at its price by its
    /// deadline: what the provider, and later the committee, check a receipt's claim against.
    fn sign_assignment(
        &self,
        provider: &crate::books::Provider,
        job: &Assignment,
    ) -> crate::Result<cx_protocol::assignment::SignedAssignment> {
        let adapter_hash = adapter_hash(job.adapter.as_deref())?;
        let terms = cx_protocol::assignment::Assignment {
            job_id: job.job_id.0,
            chain_id: job.chain_id,
            escrow_id: job.escrow_id,
            buyer: job.buyer.0.0,
            provider_key: provider.key_hash.0,
            price_wei: job.price_wei,
            deadline_s: job.deadline_s,
            input_hash: job.workload.hash().0,
            adapter_hash,
        };
        Ok(cx_protocol::assignment::SignedAssignment::sign(
            terms,
            self.identity(),
        )?)
    }

    /// Accepts the provider's result for job `job_id` at `now_s` after checking that the
    /// receipt is signed by the provider's registered key and describes exactly this job and
    /// this output: job, chain, tab, buyer, input (the request's hash), output (as its kind
    /// hashes it: [`WorkloadOrder::produced`]), adapter, payout account, and an amount within
    /// the job's price. The kind's own check follows before its job is done
    /// ([`WorkloadOrder::confirm`]: Freivalds' test of a product, the stored adapter of a
    /// training).
    pub async fn accept_result(
        &self,
        provider: &crate::books::Provider,
        job_id: B256,
        submission: &ResultSubmission,
        now_s: u64,
    ) -> crate::Result<Completed> {
        use crate::Error;
        if submission.output.text.len() > MAX_OUTPUT_BYTES {
            return Err(Error::ReceiptMismatch {
                field: "output_hash",
                reason: format!("covers an output longer than {MAX_OUTPUT_BYTES} bytes"),
            });
        }
        let key = cx_protocol::pq::PublicIdentity::from_bytes(&provider.mldsa_key)?;
        let signed = &submission.receipt;
        signed.verify(&key).map_err(|e| e.within("receipt"))?;
        let job = self
            .books()
            .assignment(job_id, provider.key_hash)
            .await?
            .ok_or(Error::UnknownJob)?;
        // A result the job can no longer take (finished, failed, expired, late) is refused
        // before any work is spent on it: a product's Freivalds rounds cost a pass over its
        // operands, and a verdict for a result that is then refused must never be written.
        self.books()
            .check_result_open(job_id, provider.key_hash, now_s)
            .await?;
        cx_protocol::each_workload!(&job.workload, request => {
            self.completed(request, provider, &job, submission, now_s).await
        })
    }

    /// The rest of [`Self::accept_result`] for job `job` of `request`'s kind: what its output
    /// produced ([`WorkloadOrder::produced`]), the receipt compared with the job field by
    /// field, the kind's own check ([`WorkloadOrder::confirm`]), then the job `done` (or
    /// `verifying`, judged with its group).
    async fn completed<W: WorkloadOrder>(
        &self,
        request: &W,
        provider: &crate::books::Provider,
        job: &Assignment,
        submission: &ResultSubmission,
        now_s: u64,
    ) -> crate::Result<Completed> {
        use crate::Error;
        let job_id = job.job_id;
        let signed = &submission.receipt;
        let receipt = &signed.receipt;
        let adapter_hash = adapter_hash(job.adapter.as_deref())?;
        let output = &submission.output;
        if let Some(field) = crate::orders::returned(output).find(|f| !W::RETURNS.contains(f)) {
            return Err(Error::InvalidOutput {
                field,
                reason: format!("is not returned for a job in the {} market", job.model),
            });
        }
        let Produced {
            output_hash,
            hashed,
            tokens,
            tokens_are,
            then,
        } = request.produced(self, job, output).await?;
        let checks: [(&'static str, bool, String); 10] = [
            (
                "class",
                satisfies(receipt.class, job.determinism),
                format!(
                    "is not the job's class {:?} or a stricter one",
                    job.determinism
                ),
            ),
            (
                "tokens",
                receipt.tokens == tokens,
                format!("is not {tokens_are} ({tokens})"),
            ),
            (
                "job_id",
                receipt.job_id == job_id.0,
                "is not this job".into(),
            ),
            (
                "chain_id",
                receipt.chain_id == job.chain_id,
                format!("is not the tab's chain {}", job.chain_id),
            ),
            (
                "escrow_id",
                receipt.escrow_id == job.escrow_id,
                format!("is not the job's tab {}", job.escrow_id),
            ),
            (
                "buyer",
                receipt.buyer == job.buyer.0.0,
                format!("is not the job's buyer {}", job.buyer),
            ),
            (
                "input_hash",
                receipt.input_hash == job.workload.hash().0,
                "is not the SHA-256 of the job's request (canonical JSON)".into(),
            ),
            (
                "output_hash",
                receipt.output_hash == output_hash,
                format!("is not the SHA-256 of {hashed}"),
            ),
            (
                "adapter_hash",
                receipt.adapter_hash == adapter_hash,
                "is not the job's adapter id (zero for none)".into(),
            ),
            (
                "provider",
                receipt.provider == provider.payout.0.0,
                format!("is not the registered payout account {}", provider.payout),
            ),
        ];
        if let Some((field, _, reason)) = checks.into_iter().find(|(_, ok, _)| !ok) {
            return Err(Error::ReceiptMismatch { field, reason });
        }
        let verified = request.confirm(self, job_id, provider, then, now_s).await?;
        let completed = self
            .books()
            .complete_job(
                job_id,
                provider.key_hash,
                now_s,
                &crate::books::JobResult {
                    output: &serde_json::to_value(&submission.output)?,
                    receipt: &serde_json::to_value(signed)?,
                    charged_wei: receipt.amount_owed_wei,
                    verified: verified.as_ref(),
                },
            )
            .await?;
        self.waiters().notify(job_id);
        if completed.status == JobStatus::Verifying {
            // The result is kept whatever the verdict: a verification that fails to run now is
            // judged again at the group's next result, or refunded at its deadline.
            if let Err(err) = self.verify_group(job_id).await {
                tracing::warn!(job = %job_id, error = %format!("{err:#}"), "verification not judged");
            }
        }
        Ok(completed)
    }
}

/// Whether work done in class `done` answers a job of class `asked`: bit-exact work (D) answers
/// any job, D∞ answers D∞ and S, S only S.
fn satisfies(done: cx_protocol::DeterminismClass, asked: cx_protocol::DeterminismClass) -> bool {
    use cx_protocol::DeterminismClass::{D, DInf, S};
    matches!((done, asked), (D, _) | (DInf, DInf | S) | (S, S))
}

/// A job's adapter as the assignment and the receipt name it: its content id's 32 bytes, or
/// zero for none.
pub(crate) fn adapter_hash(adapter: Option<&str>) -> crate::Result<[u8; 32]> {
    let mut bytes = [0u8; 32];
    if let Some(id) = adapter {
        hex::decode_to_slice(id, &mut bytes).map_err(|_| crate::Error::Corrupt {
            what: "an adapter id",
            value: id.to_owned(),
        })?;
    }
    Ok(bytes)
}
