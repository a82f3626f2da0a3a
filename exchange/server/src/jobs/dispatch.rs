//! Dispatch: jobs to providers and their outcomes back to whoever waits on them.
//!
//! Providers connect out (the exchange never reaches into a provider's network): they register
//! a signed offer ([`crate::intake::Intake::register_offer`]), long-poll for their jobs
//! ([`crate::intake::Intake::pull`]), each handed out with the exchange's signed assignment,
//! stream pieces of the text ([`crate::intake::Intake::progress`]) and return the output with a
//! signed receipt checked against the job ([`crate::intake::Intake::accept_result`]).
//! Every change is told to whoever waits on the job ([`crate::jobs::waiters::Waiters`]); jobs no one
//! finishes by their deadline are the sweeps' ([`crate::sweeps`]).

use crate::jobs::waiters::Progress;
use alloy::primitives::B256;
use cx_protocol::wire::Assignment;
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
