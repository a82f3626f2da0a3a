//! Inference on a provider: a completion or a chat in the job's base (loaded from the
//! provider's store when not held), with the job's adapter fetched from the exchange's store
//! when it is not resident, and a receipt over the text.

use super::{Fault, Link, Serve};
use crate::error::Result;
use cx_protocol::DeterminismClass;
use cx_protocol::order::InferenceRequest;
use cx_protocol::receipt::{JobTerms, Receipt, Work};
use cx_protocol::wire::{Assignment, Completed};
use std::time::{Duration, Instant};

impl Serve for InferenceRequest {
    async fn serve(&self, link: &Link, job: &Assignment) -> Result<Completed> {
        // The job's base: held, or loaded from the store now (the exchange chose this bundle
        // knowing it must, and priced the load into t̂).
        // A base serving other jobs may hold the room: wait for them, until the deadline.
        let wait = Duration::from_secs(job.deadline_s.saturating_sub(link.now_s()));
        let (base, load) = match link.bases.lease(&job.model, wait).await {
            Ok(leased) => leased,
            Err(e) => {
                // A failed load withdraws the base from the offer: the exchange hears it now.
                link.residency_changed.notify_one();
                return Err(e);
            }
        };
        if let Some(load) = load {
            tracing::info!(
                "job {}: base `{}` loaded in {:.2} s for it",
                job.job_id,
                job.model,
                load.seconds
            );
            link.residency_changed.notify_one();
        }
        let adapter = match &job.adapter {
            Some(id) => Some(link.ensure_adapter(&base.engine, id).await?),
            None => None,
        };
        let started = Instant::now();
        let mut output = link.generate(&base.engine, job, self, adapter).await?;
        if link.config.fault == Some(Fault::WrongOutput) {
            output.text.push_str(" [altered by --fault wrong-output]");
        }
        let compute_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let terms = JobTerms {
            job_id: job.job_id,
            chain_id: job.chain_id,
            escrow_id: job.escrow_id,
            buyer: job.buyer,
            request: self,
            adapter: job.adapter.as_deref(),
        };
        let work = Work {
            output_text: &output.text,
            tokens: u64::from(output.prompt_tokens) + u64::from(output.completion_tokens),
            compute_ms,
            // What the kernels honour, as the bundle offered it: D on a kernel corpus, else D∞.
            class: match base.engine.model().kernel_corpus() {
                Some(_) => DeterminismClass::D,
                None => DeterminismClass::DInf,
            },
            amount_owed_wei: job.price_wei,
        };
        let receipt = Receipt::for_output(&terms, &work, link.config.payout, link.identity.id().0)?;
        link.post_result(job, output, receipt).await
    }
}
