//! The training side (SPEC §6, last item): LoRA adapters trained on the base this provider
//! serves, and servable the moment they are saved.
//!
//! * `forward` — the Llama forward in differentiable candle ops over the serving model's own
//!   frozen tensors; candle's autograd gives the gradients of A and B only (the base is never a
//!   variable, so it stays frozen and shared with serving).
//! * `adamw` — [`AdamWParams`] and the update, PyTorch's `AdamW` formula (decoupled weight
//!   decay, bias correction, optional global-norm clipping).
//! * `peft` — `adapter_config.json` and `adapter_model.safetensors` as PEFT 0.21 writes them.
//! * `client` — [`TrainingClient`]: one adapter in training (its parameters, accumulated
//!   gradients, optimizer moments, step and loss history) and the checks of a batch.
//! * `trainer` — [`Trainer`], the one door to the clients that the HTTP layer
//!   (`/v1/training/clients`) asks. A client's memory is a reservation in
//!   the engine's residency cache (a training client is resident state too); a save writes the
//!   PEFT files under the training directory and loads them through the serving path
//!   ([`Engine::load_adapter`](crate::engine::Engine::load_adapter)), so the adapter is in the cache under its content id at once.
//!
//! # The loss
//! `forward_backward` takes sequences of token ids and, per sequence, a loss mask of the same
//! length: `loss_mask[k]` weights the prediction of token `k` from tokens `..k` (so entry 0,
//! which nothing predicts, must be 0). The loss is the weighted mean negative log-likelihood
//! over the call's sequences; gradients of successive calls are summed until `optim_step`
//! applies them and clears them.
//!
//! # Example: three steps on a tiny model
//! ```
//! use cx_kernels::CpuConfig;
//! use cx_provider::model::{DType, GenModelOptions, Model, Projection, write_generated_model};
//! use cx_provider::training::{AdamWParams, LoraSpec, Precision, TrainingClient};
//!
//! let dir = std::env::temp_dir().join(format!("cx-provider-train-doc-{}", std::process::id()));
//! let options = GenModelOptions {
//!     hidden: 32, layers: 2, heads: 4, kv_heads: 2, intermediate: 64, vocab: 300,
//!     max_positions: 64, tie: false, dtype: DType::F32, seed: 1,
//! };
//! write_generated_model(&dir, &options)?;
//! let model = Model::load(&dir, CpuConfig::deterministic())?;
//! let spec = LoraSpec::new(4, 8.0, &[Projection::Q, Projection::V]);
//! let mut client = TrainingClient::new(&model, &spec, Precision::F32)?;
//! let batch = vec![vec![256, 104, 105]];
//! let mask = vec![vec![0.0, 0.0, 1.0]]; // learn to say 'i' after "h"
//! let first = client.forward_backward(&batch, &mask)?.loss;
//! client.optim_step(&AdamWParams { lr: 1e-2, ..AdamWParams::default() })?;
//! for _ in 0..2 {
//!     client.forward_backward(&batch, &mask)?;
//!     client.optim_step(&AdamWParams { lr: 1e-2, ..AdamWParams::default() })?;
//! }
//! assert!(client.loss(&batch, &mask)? < first);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), cx_provider::Error>(())
//! ```

mod adamw;
mod client;
mod forward;
mod peft;
mod trainer;

use std::collections::BTreeSet;

use candle_core::DType;
use cx_protocol::model_config::Projection;
use serde::Serialize;

pub use adamw::AdamWParams;
pub use client::{MAX_LOSS_HISTORY, TrainingClient, activation_bytes};
pub use trainer::{
    ClientConfig, ClientInfo, Sample, SampleRequest, Saved, Trainer, TrainingOptions,
};

/// The LoRA a client trains (PEFT's `LoraConfig` fields that change what is computed).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraSpec {
    /// Rank `r`.
    pub rank: usize,
    /// `alpha` of `s = alpha / r` (or `alpha / √r` with rsLoRA).
    pub lora_alpha: f64,
    /// Adapted projections.
    pub target_modules: BTreeSet<Projection>,
    /// rsLoRA: `s = alpha / √r`.
    pub use_rslora: bool,
    /// Seed of `A`'s initialisation (`B` starts at zero, as PEFT does).
    pub seed: u64,
}

impl LoraSpec {
    /// Rank `rank`, `alpha`, on `targets`, no rsLoRA, seed 0.
    pub fn new(rank: usize, lora_alpha: f64, targets: &[Projection]) -> Self {
        Self {
            rank,
            lora_alpha,
            target_modules: targets.iter().copied().collect(),
            use_rslora: false,
            seed: 0,
        }
    }

    /// The scale `s`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.lora_alpha / (self.rank as f64).sqrt()
        } else {
            self.lora_alpha / self.rank as f64
        }
    }

    /// The first field out of range, as (field, reason): `1 ≤ rank ≤ max_rank`, a finite
    /// scale that fits `f32`, at least one target.
    pub fn check(&self, max_rank: usize) -> Option<(&'static str, String)> {
        let checked = cx_protocol::train::check_lora(
            self.rank as u64,
            self.lora_alpha,
            self.use_rslora,
            self.target_modules.len(),
            max_rank as u64,
        );
        // The server's limit is its flag: say so, as the operator would look for it.
        checked.map(|(field, reason)| match field {
            "rank" => (field, format!("{reason} (the server's --max-lora-rank)")),
            _ => (field, reason),
        })
    }
}

/// The dtype a client computes in: `F32` (served clients; shares the base's storage) or `F64`
/// (gradient checks; widens a copy of the base).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 32-bit floats.
    F32,
    /// 64-bit floats.
    F64,
}

impl Precision {
    pub(crate) fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F64 => DType::F64,
        }
    }
    pub(crate) fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F64 => 8,
        }
    }
}

/// A trainable tensor's PEFT name and its values (row-major, `f64`).
pub type NamedValues = (String, Vec<f64>);

/// What one `forward_backward` did.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ForwardBackward {
    /// Weighted mean negative log-likelihood of the call's targets.
    pub loss: f64,
    /// Sum of the loss mask (the targets' weight).
    pub loss_weight: f64,
    /// Tokens in the call (all positions).
    pub tokens: usize,
    /// Calls whose gradients are summed now (this one included).
    pub accumulated: usize,
}

/// What one `optim_step` did.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OptimStep {
    /// Steps taken so far (this one included).
    pub step: u64,
    /// The gradients' global L2 norm before clipping.
    pub grad_norm: f64,
    /// Whether clipping scaled them.
    pub clipped: bool,
    /// Calls whose gradients it applied.
    pub applied: usize,
}

/// One entry of a client's loss history.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LossEntry {
    /// The optimizer step the loss was measured at (steps taken before the call).
    pub step: u64,
    /// The call's loss.
    pub loss: f64,
    /// The call's loss weight.
    pub loss_weight: f64,
}
