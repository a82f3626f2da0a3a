//! The provider's side of dispatch: registering an offer, pulling jobs, and signing the receipt
//! a result is returned with (what [`crate::Client::submit_result`] sends).

use crate::error::Result;
use crate::types::{Assignment, Output};
use cx_protocol::DeterminismClass;
use cx_protocol::order::{Address, request_hash};
use cx_protocol::pq::Identity;
use cx_protocol::receipt::{Receipt, SignedReceipt};
use sha2::{Digest, Sha256};

/// Signs the receipt for `output` of `job` as `identity`, paid to `payout`: it names the job,
/// its tab and buyer, the request's hash as input, the output text's SHA-256, the adapter and
/// what the provider claims (at most the job's price, or the exchange refuses it).
pub fn sign_receipt(
    job: &Assignment,
    output: &Output,
    identity: &Identity,
    payout: Address,
    amount_owed_wei: u128,
    compute_ms: u64,
    class: DeterminismClass,
) -> Result<SignedReceipt> {
    let mut adapter_hash = [0u8; 32];
    if let Some(id) = &job.adapter {
        hex::decode_to_slice(id, &mut adapter_hash).map_err(|_| {
            crate::Error::Protocol(cx_protocol::Error::InvalidField {
                field: "adapter".into(),
                reason: format!("{id:?} is not a 64-hex-digit content id"),
            })
        })?;
    }
    let receipt = Receipt {
        job_id: job.job_id.0,
        chain_id: job.chain_id,
        escrow_id: job.escrow_id,
        input_hash: request_hash(&job.request).0,
        output_hash: Sha256::digest(output.text.as_bytes()).into(),
        adapter_hash,
        tokens: u64::from(output.prompt_tokens) + u64::from(output.completion_tokens),
        compute_ms,
        class,
        provider: payout.0.0,
        provider_key: identity.id().0,
        amount_owed_wei,
        buyer: job.buyer.0.0,
    };
    Ok(SignedReceipt::sign(receipt, identity)?)
}
