//! Train orders (`cx/train/<base>`, [`cx_protocol::train`]): the provider's training bundle,
//! which offers the training market of the base it serves, and the run of one job — the dataset
//! fetched from the exchange (with the dispatch token; checked against its content id), a
//! training client trained on the order's schedule, the adapter saved (resident here at once,
//! through the serving path), stored at the exchange, and a receipt naming its content id.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use cx_protocol::class::{ClassSet, Tier, TierSet};
use cx_protocol::receipt::Receipt;
use cx_protocol::train::{Dataset, TrainRequest, Trained, dataset_id, train_market, trained_base};
use cx_protocol::{Bundle, DeterminismClass};
use serde::{Deserialize, Serialize};

use super::{Link, Serve};
use crate::error::{Error, Result};
use crate::training::{AdamWParams, LoraSpec, Trainer};
use cx_protocol::wire::{Assignment, Completed, Output};

/// The suffix of the training bundle's id (after the inference bundle's).
pub(super) const BUNDLE_SUFFIX: &str = "-train";

/// `PUT /v1/adapters`: PEFT's two files.
#[derive(Serialize)]
struct AdapterUpload<'a> {
    id: &'a str,
    adapter_config: &'a str,
    adapter_model_safetensors_base64: String,
}

/// Its answer.
#[derive(Deserialize)]
struct Stored {
    id: String,
}

impl Link {
    /// The training bundle as offered, when this provider trains: the `cx/train/<base>` market
    /// of the base it serves resident, tier T0, class S (a trained adapter is not
    /// bit-reproducible across providers), the model's ask, memory and throughput.
    pub(super) fn train_bundle(&self) -> Option<Bundle> {
        self.trainer.as_ref()?;
        let main = self.bundle();
        Some(Bundle {
            id: format!("{}{BUNDLE_SUFFIX}", self.config.bundle_id),
            determinism: [DeterminismClass::S].into_iter().collect::<ClassSet>(),
            kernel_corpus: None,
            tiers: [Tier::T0].into_iter().collect::<TierSet>(),
            resident_bases: vec![train_market(&self.config.model_name)],
            resident_adapters: Vec::new(),
            // A kernel market loads no weights.
            fetchable_bases: Some(Vec::new()),
            base_load_bps: None,
            resident_prefixes: Vec::new(),
            ..main
        })
    }

    /// Runs one training job and returns its result with a signed receipt.
    async fn serve_train(&self, job: &Assignment, request: &TrainRequest) -> Result<Completed> {
        let trainer = self
            .trainer
            .clone()
            .ok_or_else(|| Error::BadRequest("this provider does not train".into()))?;
        if trained_base(&job.model) != Some(self.config.model_name.as_str()) {
            return Err(Error::BadRequest(format!(
                "the job trains in `{}`; this provider trains on `{}`",
                job.model, self.config.model_name
            )));
        }
        request.validate()?;
        let bytes = self
            .https
            .get_bytes_with_token(
                &format!("/v1/datasets/{}", request.data),
                self.token.as_str(),
                Duration::from_secs(120),
            )
            .await?;
        let got = dataset_id(&bytes);
        if got != request.data {
            return Err(Error::Exchange(format!(
                "dataset {}: the exchange served bytes whose content id is {got}",
                request.data
            )));
        }
        let data = Dataset::parse(&bytes)?;
        let started = Instant::now();
        // The deadline on this machine's monotonic clock: the exchange's time it names may be
        // some seconds off this machine's wall clock.
        let until = Instant::now()
            + std::time::Duration::from_secs(job.deadline_s.saturating_sub(self.now_s()));
        let (trained, saved_dir) = tokio::task::spawn_blocking({
            let request = request.clone();
            move || train(&trainer, &request, &data, until)
        })
        .await
        .map_err(|_| Error::ForwardPanicked)??;
        let compute_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            "job {}: trained adapter {} in {compute_ms} ms ({} steps, loss {:.4} → {:.4})",
            job.job_id,
            trained.adapter_id,
            trained.steps,
            trained.loss_first,
            trained.loss_last
        );
        // Resident here now: the offer says so at once.
        self.residency_changed.notify_one();
        self.store_adapter(&trained.adapter_id, &saved_dir).await?;
        let data = Dataset::parse(&bytes)?;
        let receipt = Receipt {
            job_id: job.job_id.0,
            chain_id: job.chain_id,
            escrow_id: job.escrow_id,
            input_hash: job.workload.hash().0,
            output_hash: trained.output_hash()?,
            adapter_hash: [0; 32],
            tokens: request.tokens(&data),
            compute_ms,
            class: DeterminismClass::S,
            provider: self.config.payout.0.0,
            provider_key: self.identity.id().0,
            amount_owed_wei: job.price_wei,
            buyer: job.buyer.0.0,
        };
        let output = Output {
            trained: Some(trained),
            ..Output::text(String::new(), "trained", 0, 0)
        };
        self.post_result(job, output, receipt).await
    }

    /// Stores the saved adapter at `dir` in the exchange's store under `id` (the store checks
    /// the files hash to it), so the buyer's intents can name it anywhere.
    async fn store_adapter(&self, id: &str, dir: &std::path::Path) -> Result<()> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|e| Error::io(&path, e))
        };
        let config = String::from_utf8(read("adapter_config.json")?)
            .map_err(|e| Error::BadRequest(format!("adapter_config.json: {e}")))?;
        let weights = read("adapter_model.safetensors")?;
        let stored: Stored = self
            .https
            // With the dispatch token: the exchange stores what a provider trains for the
            // buyers of its running training jobs, under their quota.
            .put_with_token(
                "/v1/adapters",
                self.token.as_str(),
                &AdapterUpload {
                    id,
                    adapter_config: &config,
                    adapter_model_safetensors_base64: BASE64.encode(&weights),
                },
                Duration::from_secs(120),
            )
            .await?;
        if stored.id != id {
            return Err(Error::Exchange(format!(
                "the exchange stored adapter {id} as {}",
                stored.id
            )));
        }
        Ok(())
    }
}

/// Trains `request` on `data` with a fresh client of `trainer`: step `s` runs one
/// `forward_backward` over the sequences [`TrainRequest::batch`] names, then one AdamW step.
/// Saves the adapter (resident at once) and deletes the client whatever happens. Stops with an
/// error if `until` passes first (the result would be refused). Blocking.
fn train(
    trainer: &Arc<Trainer>,
    request: &TrainRequest,
    data: &Dataset,
    until: Instant,
) -> Result<(Trained, std::path::PathBuf)> {
    let lora = &request.lora;
    let targets = lora.projections()?;
    let spec = LoraSpec {
        use_rslora: lora.use_rslora,
        seed: lora.seed,
        ..LoraSpec::new(lora.rank as usize, lora.lora_alpha, &targets)
    };
    let o = &request.optimizer;
    let params = AdamWParams {
        lr: o.lr,
        betas: (o.betas[0], o.betas[1]),
        eps: o.eps,
        weight_decay: o.weight_decay,
        max_grad_norm: o.max_grad_norm,
    };
    let client = trainer.create(&spec)?.id;
    let run = || -> Result<(Trained, std::path::PathBuf)> {
        let (mut first, mut last) = (f64::NAN, f64::NAN);
        let n = data.sequences.len();
        for step in 0..request.steps {
            if Instant::now() >= until {
                return Err(Error::BadRequest(format!(
                    "the deadline passed after {step} of {} steps",
                    request.steps
                )));
            }
            let (sequences, mask): (Vec<Vec<u32>>, Vec<Vec<f32>>) = request
                .batch(step, n)
                .map(|i| (data.sequences[i].clone(), data.loss_mask[i].clone()))
                .unzip();
            let loss = trainer.forward_backward(&client, &sequences, &mask)?.loss;
            if step == 0 {
                first = loss;
            }
            last = loss;
            trainer.optim_step(&client, &params)?;
        }
        let saved = trainer.save(&client, None, false)?;
        Ok((
            Trained {
                adapter_id: saved.id,
                steps: request.steps,
                loss_first: first,
                loss_last: last,
            },
            saved.path,
        ))
    };
    let outcome = run();
    // Its memory goes back to the cache; the saved adapter stays resident.
    trainer.delete(&client)?;
    outcome
}

impl Serve for TrainRequest {
    async fn serve(&self, link: &Link, job: &Assignment) -> Result<Completed> {
        link.serve_train(job, self).await
    }
}
