//! Inference on a provider: a completion or a chat in the model it serves, with the job's
//! adapter fetched from the exchange's store when it is not resident, and a receipt over the
//! text.

use super::{Fault, Link, Serve};
use crate::error::{Error, Result};
use cx_protocol::DeterminismClass;
use cx_protocol::order::InferenceRequest;
use cx_protocol::receipt::{JobTerms, Receipt, Work};
use cx_protocol::wire::{Assignment, Completed};
use std::time::Instant;

impl Serve for InferenceRequest {
    async fn serve(&self, link: &Link, job: &Assignment) -> Result<Completed> {
        if job.model != link.config.model_name {
            return Err(Error::BadRequest(format!(
                "the job is for model `{}`, this provider serves `{}`",
                job.model, link.config.model_name
            )));
        }
        let adapter = match &job.adapter {
            Some(id) => Some(link.ensure_adapter(id).await?),
            None => None,
        };
        let started = Instant::now();
        let mut output = link.generate(job, self, adapter).await?;
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
            class: match link.engine.model().kernel_corpus() {
                Some(_) => DeterminismClass::D,
                None => DeterminismClass::DInf,
            },
            amount_owed_wei: job.price_wei,
        };
        let receipt = Receipt::for_output(&terms, &work, link.config.payout, link.identity.id().0)?;
        link.post_result(job, output, receipt).await
    }
}
