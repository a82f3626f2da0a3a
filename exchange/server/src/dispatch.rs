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
use crate::waiters::Progress;
use alloy::primitives::B256;
use cx_protocol::wire::{Assignment, Completed, Output, ResultSubmission};
use cx_protocol::workload::Workload;
use std::time::Duration;

/// Longest base64 text of a product: that of 4 MiB (2²⁰ `f32`s, the largest product allowed).
pub const MAX_PRODUCT_BASE64_BYTES: usize =
    (cx_protocol::matmul::MAX_MATMUL_ELEMENTS as usize * 4).div_ceil(3) * 4;

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
    /// this output: job, chain, tab, buyer, input (the request's hash), output (the text's
    /// SHA-256), adapter, payout account, and an amount within the job's price. A product
    /// (`cx/matmul-f32`) is then checked by Freivalds' test before its job is done: one that fails
    /// ends the job `failed`, never charged, and is refused with [`crate::Error::ProductRejected`].
    pub async fn accept_result(
        &self,
        provider: &crate::books::Provider,
        job_id: B256,
        submission: &ResultSubmission,
        now_s: u64,
    ) -> crate::Result<Completed> {
        use crate::Error;
        use sha2::{Digest, Sha256};
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
        let receipt = &signed.receipt;
        let adapter_hash = adapter_hash(job.adapter.as_deref())?;
        let output = &submission.output;
        for (field, given, expected) in [
            (
                "product",
                output.product.is_some(),
                matches!(job.workload, Workload::Matmul(_)),
            ),
            (
                "trained",
                output.trained.is_some(),
                matches!(job.workload, Workload::Train(_)),
            ),
        ] {
            if given && !expected {
                return Err(Error::InvalidOutput {
                    field,
                    reason: format!("is not returned for a job in the {} market", job.model),
                });
            }
        }
        let (output_hash, tokens, product, trained, hashed) = match &job.workload {
            Workload::Matmul(request) => {
                let bytes = decode_product(output, request)?;
                let hash = cx_protocol::matmul::product_hash(&bytes);
                (
                    hash,
                    0,
                    Some((*request, bytes)),
                    None,
                    "the product's bytes",
                )
            }
            Workload::Train(request) => {
                let (hash, tokens, checked) = self.trained_output(&job, request, output).await?;
                (
                    hash,
                    tokens,
                    None,
                    Some(checked),
                    "the trained adapter's content id",
                )
            }
            Workload::Inference(_) => {
                let hash: [u8; 32] = Sha256::digest(output.text.as_bytes()).into();
                let tokens = u64::from(output.prompt_tokens) + u64::from(output.completion_tokens);
                (hash, tokens, None, None, "output.text")
            }
        };
        let tokens_are = if trained.is_some() {
            "the tokens the order's schedule trains on"
        } else {
            "output.prompt_tokens + output.completion_tokens"
        };
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
        if let Some((adapter_id, request, base)) = trained {
            // The adapter the receipt names must be in the store, and be the LoRA the buyer
            // signed for: else the buyer could not use what it paid for.
            let stored =
                self.books()
                    .adapter(&adapter_id)
                    .await?
                    .ok_or_else(|| Error::InvalidOutput {
                        field: "trained.adapter_id",
                        reason: "names no adapter in this exchange's store: PUT it to \
                             /v1/adapters before the result"
                            .into(),
                    })?;
            crate::train::check_trained(&stored.config, &request, &base)?;
        }
        let mut verified = None;
        if let Some((request, bytes)) = product {
            let rounds = self.freivalds_rounds();
            let verdict = crate::matmul::check(request, bytes, rounds).await?;
            let detail = serde_json::to_value(&verdict)?;
            if !verdict.passed {
                self.books()
                    .fail_verification(job_id, provider.key_hash, now_s, &detail)
                    .await?;
                self.waiters().notify(job_id);
                return Err(Error::ProductRejected { rounds });
            }
            // Recorded with the result, in its transaction: the job may have left `running`
            // while the rounds ran, and then neither is kept.
            verified = Some(detail);
        }
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

impl crate::intake::Intake {
    /// A training job's result before its receipt is checked: the output hash it must carry
    /// (the adapter id's bytes), the tokens the order's schedule trains on (from the stored
    /// dataset), and what the adapter is then checked against (id, request, base).
    async fn trained_output(
        &self,
        job: &Assignment,
        request: &cx_protocol::train::TrainRequest,
        output: &Output,
    ) -> crate::Result<(
        [u8; 32],
        u64,
        (String, cx_protocol::train::TrainRequest, String),
    )> {
        let invalid =
            |field: &'static str, reason: String| crate::Error::InvalidOutput { field, reason };
        let trained = output.trained.as_ref().ok_or_else(|| {
            invalid(
                "trained",
                "is missing: a training job returns its adapter's id".into(),
            )
        })?;
        let base =
            cx_protocol::train::trained_base(&job.model).ok_or_else(|| crate::Error::Corrupt {
                what: "a training job's market",
                value: job.model.clone(),
            })?;
        if trained.steps != request.steps {
            return Err(invalid(
                "trained.steps",
                format!("is {}, the order asked {}", trained.steps, request.steps),
            ));
        }
        let hash = trained.output_hash()?;
        let bytes = self
            .books()
            .dataset(&request.data)
            .await?
            .ok_or(crate::Error::UnknownDataset)?;
        let data = cx_protocol::train::Dataset::parse(&bytes)?;
        let tokens = request.tokens(&data);
        Ok((
            hash,
            tokens,
            (trained.adapter_id.clone(), request.clone(), base.to_owned()),
        ))
    }
}

/// The bytes of a matmul job's returned product: present, base64, and exactly `4·m·n` bytes.
fn decode_product(
    output: &Output,
    request: &cx_protocol::matmul::MatmulRequest,
) -> crate::Result<Vec<u8>> {
    use base64::Engine as _;
    let invalid = |reason: String| crate::Error::InvalidOutput {
        field: "product",
        reason,
    };
    let text = output.product.as_deref().ok_or_else(|| {
        invalid(
            "is missing: a cx/matmul-f32 job returns its product (f32 little-endian, base64)"
                .into(),
        )
    })?;
    if text.len() > MAX_PRODUCT_BASE64_BYTES {
        return Err(invalid(format!(
            "is longer than {MAX_PRODUCT_BASE64_BYTES} base64 characters"
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| invalid(format!("is not base64 (standard, padded): {e}")))?;
    if bytes.len() != request.product_bytes() {
        return Err(invalid(format!(
            "is {} bytes; C is {} × {} f32s, {} bytes",
            bytes.len(),
            request.m,
            request.n,
            request.product_bytes()
        )));
    }
    Ok(bytes)
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
