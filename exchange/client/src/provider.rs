//! The provider's side of dispatch: registering an offer, pulling jobs, and signing the receipt
//! a result is returned with (what [`crate::Client::submit_result`] sends).

use crate::error::Result;
use crate::types::{Assignment, Output};
use cx_protocol::DeterminismClass;
use cx_protocol::order::Address;
use cx_protocol::pq::Identity;
use cx_protocol::receipt::{JobTerms, Receipt, SignedReceipt, Work};

/// Signs the receipt for `output` of `job` as `identity`, paid to `payout`: it names the job,
/// its tab and buyer, the request's hash as input, the output text's SHA-256, the adapter and
/// what the provider claims (at most the job's price, or the exchange refuses it). The receipt is
/// built by [`Receipt::for_output`], the one construction `cx-provider` uses too. An inference
/// job's only: a product's or a training run's receipt hashes what they return instead.
pub fn sign_receipt(
    job: &Assignment,
    output: &Output,
    identity: &Identity,
    payout: Address,
    amount_owed_wei: u128,
    compute_ms: u64,
    class: DeterminismClass,
) -> Result<SignedReceipt> {
    let request = job
        .workload
        .inference()
        .ok_or_else(|| cx_protocol::Error::InvalidField {
            field: job.workload.kind().key().into(),
            reason: format!(
                "is a {} job's: a receipt for text signs an inference",
                job.workload.kind().as_str()
            ),
        })?;
    let terms = JobTerms {
        job_id: job.job_id,
        chain_id: job.chain_id,
        escrow_id: job.escrow_id,
        buyer: job.buyer,
        request,
        adapter: job.adapter.as_deref(),
    };
    let work = Work {
        output_text: &output.text,
        tokens: u64::from(output.prompt_tokens) + u64::from(output.completion_tokens),
        compute_ms,
        class,
        amount_owed_wei,
    };
    let receipt = Receipt::for_output(&terms, &work, payout, identity.id().0)?;
    Ok(SignedReceipt::sign(receipt, identity)?)
}
