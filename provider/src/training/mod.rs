//! The training side (SPEC §6, last item): LoRA adapters trained on the base this provider
//! serves, and servable the moment they are saved.
//!
//! * `forward` — the Llama forward in differentiable candle ops over the serving model's own
//!   frozen tensors; candle's autograd gives the gradients of A and B only (the base is never a
//!   variable, so it stays frozen and shared with serving).
//! * `adamw` — [`AdamWParams`] and the update, PyTorch's `AdamW` formula (decoupled weight
//!   decay, bias correction, optional global-norm clipping).
//! * `peft` — `adapter_config.json` and `adapter_model.safetensors` as PEFT 0.21 writes them.
//! * here — [`TrainingClient`] (one adapter in training: its parameters, accumulated gradients,
//!   optimizer moments, step and loss history) and [`Trainer`], the one door to the clients
//!   that the HTTP layer (`/v1/training/clients`) asks. A client's memory is a reservation in
//!   the engine's residency cache (a training client is resident state too); a save writes the
//!   PEFT files under the training directory and loads them through the serving path
//!   ([`Engine::load_adapter`]), so the adapter is in the cache under its content id at once.
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
mod forward;
mod peft;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use candle_core::{DType, Device, Tensor, Var};
use cx_kernels::LoraAdapter;
use cx_kernels::rng::{ChaCha20Rng, UniformVec, seeded};
use cx_protocol::model_config::{ModelConfig, Projection};
use serde::Serialize;

pub use adamw::AdamWParams;
use adamw::Moments;
use forward::{Base, Batch, Delta, LoraPair};

use crate::engine::{Engine, Sampling};
use crate::error::{Error, Result};
use crate::lora::{ADAPTER_CONFIG, Adapter, adapter_id};
use crate::model::{KvCache, Model, SeqInput};

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
        if self.rank == 0 || self.rank > max_rank {
            return Some((
                "rank",
                format!(
                    "rank must be in 1..={max_rank} (the server's --max-lora-rank), got {}",
                    self.rank
                ),
            ));
        }
        let scale = self.scale();
        if !(self.lora_alpha.is_finite() && scale.is_finite() && scale.abs() < 1e30) {
            return Some((
                "lora_alpha",
                format!(
                    "lora_alpha must be a finite number of moderate size, got {}",
                    self.lora_alpha
                ),
            ));
        }
        if self.target_modules.is_empty() {
            return Some((
                "target_modules",
                format!("target_modules needs at least one of {}", Projection::NAMES),
            ));
        }
        None
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
    fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F64 => DType::F64,
        }
    }
    fn bytes(self) -> u64 {
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

/// A LoRA adapter in training on a frozen base.
pub struct TrainingClient {
    spec: LoraSpec,
    config: ModelConfig,
    base: Arc<Base>,
    precision: Precision,
    pairs: Vec<LoraPair>,
    slots: Vec<[Option<usize>; 7]>,
    /// Per pair: (grad of A, grad of B), summed over calls since the last step.
    grads: Option<Vec<(Tensor, Tensor)>>,
    accumulated: usize,
    moments: Vec<(Moments, Moments)>,
    step: u64,
    history: VecDeque<LossEntry>,
    tokens_seen: u64,
}

impl std::fmt::Debug for TrainingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainingClient")
            .field("spec", &self.spec)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

/// Loss history entries a client keeps (the oldest are dropped).
pub const MAX_LOSS_HISTORY: usize = 10_000;

impl TrainingClient {
    /// A client on `model`'s weights: `A` of each target uniform in `±1/√d_in` (PEFT's
    /// Kaiming-uniform with `a = √5`) from `spec.seed`, `B` zero, so it starts as the base.
    pub fn new(model: &Model, spec: &LoraSpec, precision: Precision) -> Result<Self> {
        let base = Base::new(model.config(), &model.frozen_weights(), precision.dtype())?;
        Self::on_base(Arc::new(base), model.config().clone(), spec, precision)
    }

    fn on_base(
        base: Arc<Base>,
        config: ModelConfig,
        spec: &LoraSpec,
        precision: Precision,
    ) -> Result<Self> {
        let mut rng = seeded(spec.seed);
        let mut pairs = Vec::new();
        let mut slots = vec![[None; 7]; base.num_layers()];
        let dtype = precision.dtype();
        for (layer, slot) in slots.iter_mut().enumerate() {
            for &projection in &spec.target_modules {
                let (d_in, d_out) = config.projection_shape(projection);
                let a = rng.vec_f32(spec.rank * d_in, 1.0 / (d_in as f32).sqrt());
                let a = Tensor::from_vec(a, (spec.rank, d_in), &Device::Cpu)?.to_dtype(dtype)?;
                let b = Tensor::zeros((d_out, spec.rank), dtype, &Device::Cpu)?;
                slot[projection.index()] = Some(pairs.len());
                pairs.push(LoraPair {
                    layer,
                    projection,
                    a: Var::from_tensor(&a)?,
                    b: Var::from_tensor(&b)?,
                });
            }
        }
        let moments = pairs
            .iter()
            .map(|p| {
                Ok((
                    Moments::zeros_like(p.a.as_tensor())?,
                    Moments::zeros_like(p.b.as_tensor())?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            spec: spec.clone(),
            config,
            base,
            precision,
            pairs,
            slots,
            grads: None,
            accumulated: 0,
            moments,
            step: 0,
            history: VecDeque::new(),
            tokens_seen: 0,
        })
    }

    /// Its LoRA configuration.
    pub fn spec(&self) -> &LoraSpec {
        &self.spec
    }
    /// Optimizer steps taken.
    pub fn step(&self) -> u64 {
        self.step
    }
    /// Losses of the `forward_backward` calls, oldest first (at most [`MAX_LOSS_HISTORY`]).
    pub fn loss_history(&self) -> impl Iterator<Item = &LossEntry> {
        self.history.iter()
    }
    /// Calls whose gradients wait for `optim_step`.
    pub fn accumulated(&self) -> usize {
        self.accumulated
    }
    /// Tokens passed through `forward_backward` so far.
    pub fn tokens_seen(&self) -> u64 {
        self.tokens_seen
    }
    /// Trainable scalars (`Σ r·(d_in + d_out)` over the adapted projections).
    pub fn parameter_count(&self) -> u64 {
        self.pairs
            .iter()
            .map(|p| (p.a.elem_count() + p.b.elem_count()) as u64)
            .sum()
    }

    /// Bytes the client holds between calls: parameters, gradients and both AdamW moments.
    pub fn state_bytes(&self) -> u64 {
        state_bytes(self.parameter_count(), self.precision)
    }

    /// Sets `B` of every pair to seeded uniform values in `±b_scale` (PEFT starts `B` at zero,
    /// where the gradient of `A` is zero too; a gradient check wants both non-zero).
    pub fn randomize_b(&mut self, seed: u64, b_scale: f32) -> Result<()> {
        let mut rng: ChaCha20Rng = seeded(seed);
        for pair in &self.pairs {
            let shape = pair.b.shape().clone();
            let values = rng.vec_f32(shape.elem_count(), b_scale);
            let t =
                Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(self.precision.dtype())?;
            pair.b.set(&t)?;
        }
        Ok(())
    }

    /// The trainable tensors by PEFT name
    /// (`base_model.model.model.layers.{i}.{module}.lora_A.weight`, …), in `f64`, row-major.
    pub fn parameters(&self) -> Result<Vec<NamedValues>> {
        let mut out = Vec::new();
        for pair in &self.pairs {
            for (which, var) in [("A", &pair.a), ("B", &pair.b)] {
                out.push((
                    peft::tensor_name(pair.layer, pair.projection, which),
                    flat_f64(var.as_tensor())?,
                ));
            }
        }
        Ok(out)
    }

    /// Overwrites element `index` of the trainable tensor `name` (finite differences).
    pub fn set_parameter_element(&mut self, name: &str, index: usize, value: f64) -> Result<()> {
        let var = self.var(name)?;
        let shape = var.shape().clone();
        let mut values = flat_f64(var.as_tensor())?;
        let slot = values
            .get_mut(index)
            .ok_or_else(|| Error::BadRequest(format!("{name} has no element {index}")))?;
        *slot = value;
        let t = Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(self.precision.dtype())?;
        var.set(&t)?;
        Ok(())
    }

    /// The accumulated gradient of each trainable tensor, in [`parameters`](Self::parameters)
    /// order; `None` before any `forward_backward`.
    pub fn gradients(&self) -> Result<Option<Vec<NamedValues>>> {
        let Some(grads) = &self.grads else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for (pair, (ga, gb)) in self.pairs.iter().zip(grads) {
            out.push((
                peft::tensor_name(pair.layer, pair.projection, "A"),
                flat_f64(ga)?,
            ));
            out.push((
                peft::tensor_name(pair.layer, pair.projection, "B"),
                flat_f64(gb)?,
            ));
        }
        Ok(Some(out))
    }

    fn var(&self, name: &str) -> Result<&Var> {
        for pair in &self.pairs {
            for (which, var) in [("A", &pair.a), ("B", &pair.b)] {
                if peft::tensor_name(pair.layer, pair.projection, which) == name {
                    return Ok(var);
                }
            }
        }
        Err(Error::BadRequest(format!("no trainable tensor `{name}`")))
    }

    fn delta(&self, detached: bool) -> Delta<'_> {
        Delta {
            slots: &self.slots,
            pairs: &self.pairs,
            scale: self.spec.scale() as f32 as f64,
            detached,
        }
    }

    /// The loss of a batch without touching the gradients.
    pub fn loss(&self, sequences: &[Vec<u32>], loss_mask: &[Vec<f32>]) -> Result<f64> {
        let prepared = prepare(&self.config, sequences, loss_mask, usize::MAX)?;
        let loss = forward::loss(
            &self.base,
            &self.delta(true),
            &prepared.batch,
            &prepared.targets,
            &prepared.weights,
            prepared.weight_sum,
        )?;
        scalar(&loss)
    }

    /// Runs the forward and the backward pass over a batch and adds the gradients of A and B to
    /// the accumulated ones. Nothing changes when the input is refused or the loss is not
    /// finite.
    pub fn forward_backward(
        &mut self,
        sequences: &[Vec<u32>],
        loss_mask: &[Vec<f32>],
    ) -> Result<ForwardBackward> {
        let prepared = prepare(&self.config, sequences, loss_mask, usize::MAX)?;
        self.forward_backward_prepared(&prepared)
    }

    fn forward_backward_prepared(&mut self, prepared: &Prepared) -> Result<ForwardBackward> {
        let loss = forward::loss(
            &self.base,
            &self.delta(false),
            &prepared.batch,
            &prepared.targets,
            &prepared.weights,
            prepared.weight_sum,
        )?;
        let value = scalar(&loss)?;
        if !value.is_finite() {
            return Err(Error::TrainingDiverged(format!(
                "the loss is {value}; nothing was accumulated (lower the learning rate)"
            )));
        }
        let store = loss.backward()?;
        let mut grads = Vec::with_capacity(self.pairs.len());
        for (i, pair) in self.pairs.iter().enumerate() {
            let get = |var: &Var| -> Result<Tensor> {
                match store.get(var.as_tensor()) {
                    Some(g) => Ok(g.detach()),
                    None => Ok(var.as_tensor().zeros_like()?),
                }
            };
            let (ga, gb) = (get(&pair.a)?, get(&pair.b)?);
            let (ga, gb) = match &self.grads {
                Some(old) => ((&old[i].0 + ga)?, (&old[i].1 + gb)?),
                None => (ga, gb),
            };
            grads.push((ga, gb));
        }
        self.grads = Some(grads);
        self.accumulated += 1;
        self.tokens_seen += prepared.tokens as u64;
        if self.history.len() == MAX_LOSS_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(LossEntry {
            step: self.step,
            loss: value,
            loss_weight: prepared.weight_sum,
        });
        Ok(ForwardBackward {
            loss: value,
            loss_weight: prepared.weight_sum,
            tokens: prepared.tokens,
            accumulated: self.accumulated,
        })
    }

    /// One AdamW step with the accumulated gradients, which it then clears. Refused (nothing
    /// changes) when `params` is out of range or no gradients wait.
    pub fn optim_step(&mut self, params: &AdamWParams) -> Result<OptimStep> {
        if let Some((field, message)) = params.check() {
            return Err(Error::TrainingInput {
                field: Some(field),
                message,
            });
        }
        let Some(grads) = &self.grads else {
            return Err(Error::TrainingInput {
                field: None,
                message: "no gradients to apply: call forward_backward first".into(),
            });
        };
        let flat: Vec<Tensor> = grads
            .iter()
            .flat_map(|(a, b)| [a.clone(), b.clone()])
            .collect();
        let grad_norm = adamw::global_norm(&flat)?;
        if !grad_norm.is_finite() {
            return Err(Error::TrainingDiverged(format!(
                "the gradients' norm is {grad_norm}; nothing was applied"
            )));
        }
        let factor = adamw::clip_factor(grad_norm, params.max_grad_norm);
        let t = self.step + 1;
        // Compute every new value first, then assign: a failure halfway changes nothing.
        let mut moments = self.moments.clone();
        let mut updated = Vec::with_capacity(self.pairs.len());
        for ((pair, (ga, gb)), (ma, mb)) in self.pairs.iter().zip(grads).zip(moments.iter_mut()) {
            let (ga, gb) = if factor < 1.0 {
                ((ga * factor)?, (gb * factor)?)
            } else {
                (ga.clone(), gb.clone())
            };
            let a = adamw::step(pair.a.as_tensor(), &ga, ma, params, t)?;
            let b = adamw::step(pair.b.as_tensor(), &gb, mb, params, t)?;
            updated.push((a, b));
        }
        for (pair, (a, b)) in self.pairs.iter().zip(updated) {
            pair.a.set(&a)?;
            pair.b.set(&b)?;
        }
        self.moments = moments;
        self.step = t;
        let applied = self.accumulated;
        self.grads = None;
        self.accumulated = 0;
        Ok(OptimStep {
            step: t,
            grad_norm,
            clipped: factor < 1.0,
            applied,
        })
    }

    /// The training forward's logits of every position of `tokens` (`len × vocab`, `f32`),
    /// with the current delta.
    pub fn logits(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        check_tokens(&self.config, tokens, "tokens")?;
        let batch = Batch::new(&[tokens.to_vec()])?;
        let logits = forward::logits(&self.base, &self.delta(true), &batch)?;
        Ok(logits.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }

    /// The current A and B as a serving [`Adapter`] (in `f32`), named `id`.
    pub fn to_adapter(&self, id: String) -> Result<Adapter> {
        let mut layers: Vec<[Option<LoraAdapter<f32>>; 7]> =
            (0..self.slots.len()).map(|_| Default::default()).collect();
        let scale = self.spec.scale() as f32;
        for pair in &self.pairs {
            let (d_in, d_out) = self.config.projection_shape(pair.projection);
            let a = flat_f32(pair.a.as_tensor())?;
            let b = flat_f32(pair.b.as_tensor())?;
            layers[pair.layer][pair.projection.index()] = Some(LoraAdapter::with_scale(
                &a,
                &b,
                self.spec.rank,
                d_in,
                d_out,
                scale,
            )?);
        }
        Ok(Adapter::from_parts(
            id,
            self.spec.rank,
            scale,
            self.spec.target_modules.clone(),
            layers,
        ))
    }

    /// The PEFT files of the current adapter: (`adapter_config.json`,
    /// `adapter_model.safetensors`) bytes, weights in `f32`.
    pub fn peft_files(&self, base_model_name: Option<&str>) -> Result<(Vec<u8>, Vec<u8>)> {
        let tensors = self
            .pairs
            .iter()
            .map(|p| {
                Ok((
                    p.layer,
                    p.projection,
                    flat_f32(p.a.as_tensor())?,
                    flat_f32(p.b.as_tensor())?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let config = peft::adapter_config(&self.spec, base_model_name);
        let weights = peft::adapter_weights(&self.config, self.spec.rank, &tensors)?;
        Ok((config, weights))
    }

    /// Writes the PEFT files into `dir` (created).
    pub fn save_peft(&self, dir: &Path, base_model_name: Option<&str>) -> Result<String> {
        let (config, weights) = self.peft_files(base_model_name)?;
        write_adapter_dir(dir, &config, &weights)?;
        Ok(adapter_id(&config, &weights))
    }
}

fn state_bytes(parameters: u64, precision: Precision) -> u64 {
    // Parameters, gradients, first and second moments.
    parameters
        .saturating_mul(4)
        .saturating_mul(precision.bytes())
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

fn flat_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

fn flat_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// Writes the two files into `dir` atomically enough for a reader: each file is written to a
/// temporary name and renamed.
fn write_adapter_dir(dir: &Path, config: &[u8], weights: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    for (name, bytes) in [
        (ADAPTER_CONFIG, config),
        (crate::lora::ADAPTER_WEIGHTS, weights),
    ] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
        let path = dir.join(name);
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

fn check_tokens(config: &ModelConfig, tokens: &[u32], field: &'static str) -> Result<()> {
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= config.vocab_size) {
        return Err(Error::TrainingInput {
            field: Some(field),
            message: format!(
                "token id {bad} is outside the vocabulary (size {})",
                config.vocab_size
            ),
        });
    }
    Ok(())
}

/// A checked batch, ready for the forward.
struct Prepared {
    batch: Batch,
    /// Per row: the next token (0 where there is none).
    targets: Vec<u32>,
    /// Per row: the weight of predicting `targets`.
    weights: Vec<f32>,
    weight_sum: f64,
    tokens: usize,
}

/// Checks a `forward_backward` batch against `config` and `max_tokens` (all positions).
fn prepare(
    config: &ModelConfig,
    sequences: &[Vec<u32>],
    loss_mask: &[Vec<f32>],
    max_tokens: usize,
) -> Result<Prepared> {
    let bad = |field: &'static str, message: String| Error::TrainingInput {
        field: Some(field),
        message,
    };
    if sequences.is_empty() {
        return Err(bad("tokens", "the batch has no sequences".into()));
    }
    if loss_mask.len() != sequences.len() {
        return Err(bad(
            "loss_mask",
            format!(
                "loss_mask has {} rows for {} sequences",
                loss_mask.len(),
                sequences.len()
            ),
        ));
    }
    let mut tokens = 0usize;
    let mut weight_sum = 0f64;
    for (s, (seq, mask)) in sequences.iter().zip(loss_mask).enumerate() {
        if seq.len() < 2 {
            return Err(bad(
                "tokens",
                format!(
                    "sequence {s} has {} tokens; at least 2 are needed",
                    seq.len()
                ),
            ));
        }
        if seq.len() > config.max_position_embeddings {
            return Err(bad(
                "tokens",
                format!(
                    "sequence {s} has {} tokens, over the context limit {}",
                    seq.len(),
                    config.max_position_embeddings
                ),
            ));
        }
        check_tokens(config, seq, "tokens")?;
        if mask.len() != seq.len() {
            return Err(bad(
                "loss_mask",
                format!(
                    "loss_mask row {s} has {} entries for {} tokens",
                    mask.len(),
                    seq.len()
                ),
            ));
        }
        if let Some(w) = mask.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
            return Err(bad(
                "loss_mask",
                format!("loss_mask entries must be finite and ≥ 0, got {w} in row {s}"),
            ));
        }
        if mask[0] != 0.0 {
            return Err(bad(
                "loss_mask",
                format!("loss_mask row {s} weights token 0, which nothing predicts; set it to 0"),
            ));
        }
        tokens += seq.len();
        weight_sum += mask.iter().map(|&w| f64::from(w)).sum::<f64>();
    }
    let len = sequences.iter().map(Vec::len).max().unwrap_or(0);
    let padded = sequences.len().saturating_mul(len);
    if padded > max_tokens {
        return Err(bad(
            "tokens",
            format!(
                "the batch pads to {} × {len} = {padded} positions, over the limit of {max_tokens} \
                 per call; split it over several forward_backward calls",
                sequences.len()
            ),
        ));
    }
    if weight_sum <= 0.0 {
        return Err(bad(
            "loss_mask",
            "loss_mask weights no token; nothing to learn from".into(),
        ));
    }
    let mut targets = vec![0u32; padded];
    let mut weights = vec![0f32; padded];
    for (s, (seq, mask)) in sequences.iter().zip(loss_mask).enumerate() {
        for k in 0..seq.len() - 1 {
            targets[s * len + k] = seq[k + 1];
            weights[s * len + k] = mask[k + 1];
        }
    }
    Ok(Prepared {
        batch: Batch::new(sequences)?,
        targets,
        weights,
        weight_sum,
        tokens,
    })
}

/// A bound on the bytes one `forward_backward` of `sequences × len` positions holds at its
/// peak in `f32`: the activations candle's graph keeps per layer (norms, q/k/v and their RoPE
/// copies, repeated keys/values, the attention scores and probabilities, the MLP's three
/// intermediate products), the logits and their log-softmax, and as much again for the
/// gradients flowing back.
pub fn activation_bytes(config: &ModelConfig, sequences: usize, len: usize) -> u64 {
    let n = (sequences * len) as u64;
    let d = config.hidden_size as u64;
    let q = (config.num_attention_heads * config.head_dim()) as u64;
    let kv = (config.kv_heads() * config.head_dim()) as u64;
    let inner = config.intermediate_size as u64;
    let scores = (sequences * config.num_attention_heads * len * len) as u64;
    let per_layer = n * (10 * d + 8 * q + 8 * kv + 5 * inner) + 5 * scores;
    let head = n * (4 * config.vocab_size as u64 + 3 * d);
    let elements = per_layer * config.num_hidden_layers as u64 + head;
    elements.saturating_mul(4).saturating_mul(2)
}

/// How the [`Trainer`] is limited.
#[derive(Clone, Debug)]
pub struct TrainingOptions {
    /// Where saved adapters are written (one folder per content id); an adapter root.
    pub dir: PathBuf,
    /// Training clients at most at once.
    pub max_clients: usize,
    /// Padded positions (`sequences × longest`) one `forward_backward` may hold.
    pub max_tokens_per_call: usize,
}

impl TrainingOptions {
    /// Defaults under `dir`: 8 clients, 8192 positions per call.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            max_clients: 8,
            max_tokens_per_call: 8192,
        }
    }
}

/// What a client looks like from outside (`GET /v1/training/clients/{id}`).
#[derive(Clone, Debug, Serialize)]
pub struct ClientInfo {
    /// The client's id.
    pub id: String,
    /// The base it trains on.
    pub base_model: String,
    /// Its LoRA configuration.
    pub config: ClientConfig,
    /// Optimizer steps taken.
    pub step: u64,
    /// `forward_backward` calls waiting for `optim_step`.
    pub accumulated: usize,
    /// Tokens passed through `forward_backward`.
    pub tokens_seen: u64,
    /// Trainable scalars.
    pub parameters: u64,
    /// Bytes held in the residency budget (parameters, gradients, AdamW moments).
    pub bytes: u64,
    /// Unix seconds at creation.
    pub created: u64,
    /// The adapters saved from it, oldest first.
    pub saved: Vec<String>,
    /// Losses, oldest first (only in the single-client view).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_history: Option<Vec<LossEntry>>,
}

/// A client's LoRA configuration as the API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ClientConfig {
    /// Rank.
    pub rank: usize,
    /// Alpha.
    pub lora_alpha: f64,
    /// PEFT module names.
    pub target_modules: Vec<&'static str>,
    /// rsLoRA.
    pub use_rslora: bool,
    /// Seed of `A`.
    pub seed: u64,
    /// The scale `s`.
    pub scale: f64,
}

/// What a save did.
#[derive(Clone, Debug, Serialize)]
pub struct Saved {
    /// Content id of the two files.
    pub id: String,
    /// The name it is registered under (the id unless a name was given).
    pub name: String,
    /// Its folder.
    pub path: PathBuf,
    /// The optimizer step saved.
    pub step: u64,
    /// Rank.
    pub rank: usize,
    /// Bytes it holds in the cache.
    pub bytes: u64,
    /// Pinned.
    pub pinned: bool,
    /// Ids evicted to make room.
    pub evicted: Vec<String>,
}

/// What a sample produced.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// The new tokens (EOS excluded).
    pub tokens: Vec<u32>,
    /// Their text.
    pub text: String,
    /// `stop` (EOS or a stop string) or `length`.
    pub finish_reason: crate::engine::FinishReason,
}

/// A sampling request on a client (the serving path's options).
#[derive(Clone, Debug)]
pub struct SampleRequest {
    /// Prompt token ids (non-empty, in the vocabulary).
    pub prompt: Vec<u32>,
    /// New tokens at most (≥ 1; prompt + max_tokens within the context).
    pub max_tokens: usize,
    /// Greedy at 0, else seeded sampling.
    pub sampling: Sampling,
    /// Stop strings (generation ends before the first one).
    pub stop: Vec<String>,
}

struct Entry {
    client: TrainingClient,
    created: u64,
    saved: Vec<String>,
}

/// The training clients of one engine: the one door to them (the HTTP layer asks it).
pub struct Trainer {
    engine: Engine,
    model_name: String,
    base: Arc<Base>,
    options: TrainingOptions,
    clients: Mutex<BTreeMap<String, Arc<Mutex<Entry>>>>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model_name", &self.model_name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A lock whose holder panicked still guards consistent data: a client is only changed by
/// assignments after every fallible computation has succeeded.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn reservation_key(id: &str) -> String {
    format!("training:{id}")
}

fn activation_key(id: &str) -> String {
    format!("training:{id}:activations")
}

impl Trainer {
    /// A trainer over `engine`'s model (the base answers to `model_name`); `options.dir` is
    /// created and made an adapter root so saved adapters load through the serving path.
    pub fn new(engine: Engine, model_name: String, options: TrainingOptions) -> Result<Self> {
        std::fs::create_dir_all(&options.dir).map_err(|e| Error::io(&options.dir, e))?;
        engine.add_adapter_roots(std::slice::from_ref(&options.dir))?;
        let model = engine.model();
        let base = Base::new(model.config(), &model.frozen_weights(), DType::F32)?;
        Ok(Self {
            engine,
            model_name,
            base: Arc::new(base),
            options,
            clients: Mutex::new(BTreeMap::new()),
        })
    }

    /// The limits.
    pub fn options(&self) -> &TrainingOptions {
        &self.options
    }

    /// The name of the base it trains on.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    fn entry(&self, id: &str) -> Result<Arc<Mutex<Entry>>> {
        lock(&self.clients)
            .get(id)
            .cloned()
            .ok_or_else(|| Error::UnknownTrainingClient(id.to_string()))
    }

    /// A new client; its state is reserved in the residency budget first (adapters may be
    /// evicted for it; [`Error::CacheFull`] when they cannot).
    pub fn create(&self, spec: &LoraSpec) -> Result<ClientInfo> {
        if let Some((field, message)) = spec.check(self.engine.max_rank()) {
            return Err(Error::TrainingInput {
                field: Some(field),
                message,
            });
        }
        let mut id_bytes = [0u8; 8];
        getrandom::fill(&mut id_bytes).expect("the operating system's random source");
        let id = format!("tc-{}", hex::encode(id_bytes));
        let config = self.engine.model().config().clone();
        let parameters: u64 = spec
            .target_modules
            .iter()
            .map(|&p| {
                let (d_in, d_out) = config.projection_shape(p);
                (spec.rank * (d_in + d_out)) as u64
            })
            .sum::<u64>()
            * config.num_hidden_layers as u64;
        let bytes = state_bytes(parameters, Precision::F32);
        // The count is checked and the client inserted under one lock: two creates cannot
        // both take the last slot.
        let mut clients = lock(&self.clients);
        if clients.len() >= self.options.max_clients {
            return Err(Error::TrainingLimit(format!(
                "{} training clients exist, the limit (--max-training-clients); delete one first",
                clients.len()
            )));
        }
        self.engine.reserve_bytes(&reservation_key(&id), bytes)?;
        let client = match TrainingClient::on_base(self.base.clone(), config, spec, Precision::F32)
        {
            Ok(client) => client,
            Err(e) => {
                self.engine.release_bytes(&reservation_key(&id));
                return Err(e);
            }
        };
        let entry = Entry {
            client,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            saved: Vec::new(),
        };
        let info = self.info(&id, &entry, false);
        clients.insert(id, Arc::new(Mutex::new(entry)));
        Ok(info)
    }

    fn info(&self, id: &str, entry: &Entry, history: bool) -> ClientInfo {
        let c = &entry.client;
        ClientInfo {
            id: id.to_string(),
            base_model: self.model_name.clone(),
            config: ClientConfig {
                rank: c.spec.rank,
                lora_alpha: c.spec.lora_alpha,
                target_modules: c.spec.target_modules.iter().map(|p| p.name()).collect(),
                use_rslora: c.spec.use_rslora,
                seed: c.spec.seed,
                scale: c.spec.scale(),
            },
            step: c.step,
            accumulated: c.accumulated,
            tokens_seen: c.tokens_seen,
            parameters: c.parameter_count(),
            bytes: c.state_bytes(),
            created: entry.created,
            saved: entry.saved.clone(),
            loss_history: history.then(|| c.history.iter().copied().collect()),
        }
    }

    /// Every client, by id (without loss histories).
    pub fn list(&self) -> Vec<ClientInfo> {
        let entries: Vec<(String, Arc<Mutex<Entry>>)> = lock(&self.clients)
            .iter()
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect();
        entries
            .iter()
            .map(|(id, e)| self.info(id, &lock(e), false))
            .collect()
    }

    /// One client, with its loss history.
    pub fn get(&self, id: &str) -> Result<ClientInfo> {
        let entry = self.entry(id)?;
        let entry = lock(&entry);
        Ok(self.info(id, &entry, true))
    }

    /// `forward_backward` on client `id`; the batch's activations are reserved in the residency
    /// budget while it runs. Blocking (the forward and backward run here).
    pub fn forward_backward(
        &self,
        id: &str,
        sequences: &[Vec<u32>],
        loss_mask: &[Vec<f32>],
    ) -> Result<ForwardBackward> {
        let entry = self.entry(id)?;
        let config = self.engine.model().config();
        let prepared = prepare(
            config,
            sequences,
            loss_mask,
            self.options.max_tokens_per_call,
        )?;
        let mut entry = lock(&entry);
        let key = activation_key(id);
        self.engine.reserve_bytes(
            &key,
            activation_bytes(config, prepared.batch.sequences, prepared.batch.len),
        )?;
        let outcome = entry.client.forward_backward_prepared(&prepared);
        self.engine.release_bytes(&key);
        outcome
    }

    /// `optim_step` on client `id`.
    pub fn optim_step(&self, id: &str, params: &AdamWParams) -> Result<OptimStep> {
        let entry = self.entry(id)?;
        let mut entry = lock(&entry);
        entry.client.optim_step(params)
    }

    /// Decodes from the base with client `id`'s current delta, through the serving forward
    /// (the same [`Model::forward`] and next-token choice as `/v1/completions`). Blocking.
    pub fn sample(&self, id: &str, request: &SampleRequest) -> Result<Sample> {
        let entry = self.entry(id)?;
        let model = self.engine.model();
        let config = model.config();
        if request.prompt.is_empty() {
            return Err(Error::TrainingInput {
                field: Some("prompt"),
                message: "the prompt is empty".into(),
            });
        }
        check_tokens(config, &request.prompt, "prompt")?;
        let total = request.prompt.len().saturating_add(request.max_tokens);
        if request.max_tokens == 0 || total > config.max_position_embeddings {
            return Err(Error::TrainingInput {
                field: Some("max_tokens"),
                message: format!(
                    "max_tokens must be ≥ 1 and prompt + max_tokens ≤ the context {} (got {} + {})",
                    config.max_position_embeddings,
                    request.prompt.len(),
                    request.max_tokens
                ),
            });
        }
        let adapter = lock(&entry).client.to_adapter(format!("training:{id}"))?;
        generate(model, self.engine.tokenizer(), &adapter, request)
    }

    /// Writes client `id`'s adapter as PEFT files under the training directory (a folder named
    /// by its content id) and loads it through the serving path: registered as `name` (the id
    /// when `None`) and resident at once, pinned if `pin`. Blocking.
    pub fn save(&self, id: &str, name: Option<&str>, pin: bool) -> Result<Saved> {
        let entry = self.entry(id)?;
        let mut entry = lock(&entry);
        let (config, weights) = entry.client.peft_files(Some(&self.model_name))?;
        let adapter = adapter_id(&config, &weights);
        let dir = self.options.dir.join(&adapter);
        write_adapter_dir(&dir, &config, &weights)?;
        let name = name.unwrap_or(&adapter).to_string();
        let loaded = self.engine.load_adapter(&name, &dir, pin)?;
        entry.saved.push(adapter.clone());
        Ok(Saved {
            id: loaded.id,
            name,
            path: dir,
            step: entry.client.step,
            rank: loaded.rank,
            bytes: loaded.bytes,
            pinned: loaded.pinned,
            evicted: loaded.evicted,
        })
    }

    /// Deletes client `id` and frees its reservation (saved adapters stay).
    pub fn delete(&self, id: &str) -> Result<()> {
        let removed = lock(&self.clients).remove(id);
        match removed {
            Some(_) => {
                self.engine.release_bytes(&reservation_key(id));
                Ok(())
            }
            None => Err(Error::UnknownTrainingClient(id.to_string())),
        }
    }
}

/// Greedy or sampled decoding of `request` with `adapter` through the serving forward.
fn generate(
    model: &Model,
    tokenizer: &crate::tokenizer::Tokenizer,
    adapter: &Adapter,
    request: &SampleRequest,
) -> Result<Sample> {
    use crate::engine::FinishReason;
    let eos = model.config().eos_ids();
    let mut rng: ChaCha20Rng = seeded(request.sampling.seed);
    let mut cache = KvCache::default();
    let mut next: Vec<u32> = request.prompt.clone();
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    let mut text = String::new();
    for _ in 0..request.max_tokens {
        let logits = model
            .forward(&mut [SeqInput {
                tokens: &next,
                cache: &mut cache,
                adapter: Some(adapter),
            }])?
            .remove(0);
        let token = crate::engine::decode::choose(&logits, request.sampling, &mut rng);
        if eos.contains(&token) {
            finish = FinishReason::Stop;
            break;
        }
        tokens.push(token);
        text = tokenizer.decode(&tokens)?;
        if let Some(cut) = request
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min()
        {
            text.truncate(cut);
            finish = FinishReason::Stop;
            break;
        }
        next = vec![token];
    }
    Ok(Sample {
        tokens,
        text,
        finish_reason: finish,
    })
}
