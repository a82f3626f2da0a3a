//! Results: a provider's output and its signed receipt, checked against the job before it is
//! `done` — the receipt signed by the provider's registered key and describing exactly this job
//! and this output, then the kind's own check (`crate::orders::WorkloadOrder::confirm`) — and
//! a job of a verification group judged with its group ([`crate::verification`]).

use super::dispatch::{MAX_OUTPUT_BYTES, adapter_hash};
use crate::books::JobStatus;
use crate::orders::{Produced, WorkloadOrder};
use alloy::primitives::B256;
use cx_protocol::wire::{Assignment, Completed, ResultSubmission};

impl crate::intake::Intake {
    /// Accepts the provider's result for job `job_id` at `now_s` after checking that the
    /// receipt is signed by the provider's registered key and describes exactly this job and
    /// this output: job, chain, tab, buyer, input (the request's hash), output (as its kind
    /// hashes it: `WorkloadOrder::produced`), adapter, payout account, and an amount within
    /// the job's price. The kind's own check follows before its job is done
    /// (`WorkloadOrder::confirm`: Freivalds' test of a product, the stored adapter of a
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
    /// produced (`WorkloadOrder::produced`), the receipt compared with the job field by
    /// field, the kind's own check (`WorkloadOrder::confirm`), then the job `done` (or
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
