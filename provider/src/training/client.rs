//! [`TrainingClient`]: one LoRA adapter in training on a frozen base — its A and B (candle
//! [`Var`]s), the gradients summed since the last step, AdamW's moments, its step and loss
//! history — and the checks a `forward_backward` batch passes before anything runs.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use cx_kernels::LoraAdapter;
use cx_kernels::rng::{ChaCha20Rng, UniformVec, seeded};
use cx_protocol::model_config::ModelConfig;

use super::adamw::{self, AdamWParams, Moments};
use super::forward::{self, Base, Batch, Delta, LoraPair};
use super::peft;
use super::{ForwardBackward, LoraSpec, LossEntry, NamedValues, OptimStep, Precision};
use crate::error::{Error, Result};
use crate::lora::{ADAPTER_CONFIG, Adapter, adapter_id};
use crate::model::Model;

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
        let base = Base::new(model.config(), &model.frozen_weights()?, precision.dtype())?;
        Self::on_base(Arc::new(base), model.config().clone(), spec, precision)
    }

    pub(super) fn on_base(
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

    pub(super) fn forward_backward_prepared(
        &mut self,
        prepared: &Prepared,
    ) -> Result<ForwardBackward> {
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

pub(super) fn state_bytes(parameters: u64, precision: Precision) -> u64 {
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
pub(super) fn write_adapter_dir(dir: &Path, config: &[u8], weights: &[u8]) -> Result<()> {
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

pub(super) fn check_tokens(
    config: &ModelConfig,
    tokens: &[u32],
    field: &'static str,
) -> Result<()> {
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
pub(super) struct Prepared {
    pub(super) batch: Batch,
    /// Per row: the next token (0 where there is none).
    targets: Vec<u32>,
    /// Per row: the weight of predicting `targets`.
    weights: Vec<f32>,
    weight_sum: f64,
    tokens: usize,
}

/// Checks a `forward_backward` batch against `config` and `max_tokens` (all positions).
pub(super) fn prepare(
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
