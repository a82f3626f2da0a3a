//! The Llama architecture (Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language
//! Models"; grouped-query attention from Ainslie et al. 2023), mirroring Hugging Face
//! `transformers/models/llama/modeling_llama.py` block by block, as candle's
//! `candle-transformers/src/models/mistral.rs` lays a model out:
//!
//! * [`config`] — the `config.json` type (cx-protocol's [`ModelConfig`], the project's one parse)
//!   and what this forward refuses;
//! * `weights` — safetensors loading (bf16 kept as bf16, the rest `f32`); `gguf` and
//!   `from_gguf` — a llama.cpp GGUF read as the checkpoint it was converted from, its blocks
//!   kept as blocks; `files` — the one door to a model's files (folder or GGUF);
//! * `linear` — a projection: base `x·Wᵀ` (`+ b` where the architecture has a bias) plus each
//!   row's LoRA delta (SGMV), never merged;
//! * `rotary`, `attention`, `mlp`, `layer` — `RotaryEmbedding`, `Attention`, `Mlp`,
//!   `DecoderLayer` with `RmsNorm`, each with its own `forward`;
//! * here — [`Model`]: embeddings, the layers, the final norm and `lm_head` (tied or not);
//! * [`generate`] — seeded random checkpoints for tests and benchmarks.
//!
//! The forward runs a whole batch of sequences at once — each with its own new tokens, its own
//! [`KvCache`] and its own adapter (or none) — and applies every sequence's LoRA delta with
//! cx-kernels' SGMV on the activations (SPEC §6).
//!
//! # Why every reduction is ours
//! Determinism class D asks that a sequence's output bits do not depend on what else is in the
//! batch or on the thread count. With [`cx_kernels::Mode::Deterministic`] the projections go
//! through [`cx_kernels::gemm_xwt`] and [`cx_kernels::Device::sgmv`], whose reductions have a
//! fixed order per output element; RMSNorm (Qwen3's per-head q/k norms too), attention and
//! softmax are plain sequential loops over one row, one head, one sequence, and a bias is one
//! addition per element. Nothing reduces across rows, so a row is computed by the same
//! operations whatever its neighbours are. With [`cx_kernels::Mode::Fast`] the same
//! kernels fuse multiply and add where the CPU can (faster; class D∞: equal up to rounding).

mod attention;
pub mod config;
pub mod content;
mod files;
mod from_gguf;
pub mod generate;
pub mod gguf;
mod layer;
mod linear;
mod mlp;
mod rotary;
mod weights;

use std::path::Path;

use cx_kernels::{CpuConfig, Device};

pub use config::{Architecture, DType, ModelConfig, Projection, read_config};
pub use files::ModelFiles;
pub use generate::{
    GENERATED_BOS, GENERATED_EOS, GenModelOptions, generated_config, generated_tensors,
    generated_tokenizer_json, write_generated_model,
};
pub use weights::{Checkpoint, NamedTensors, tensors_from_bytes};

use crate::error::{Error, Result};
use crate::lora::Adapter;
use attention::Attention;
use layer::{DecoderLayer, RmsNorm};
use linear::{Linear, Weight};
use mlp::Mlp;
use rotary::RotaryEmbedding;
use weights::TensorStore;

/// A sequence's keys and values so far, per layer (`positions × kv_heads·head_dim`).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Nothing held yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(Vec::len)
            .sum::<usize>()
            * 4
    }
    /// Forgets every position (the next forward starts the sequence again).
    pub fn clear(&mut self) {
        *self = Self::default();
    }
    /// Keeps the first `len` positions only (a held prefix reused up to where a new prompt
    /// departs from it); the next forward appends from there, as if only they had been run.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if len == 0 {
            self.clear();
            return;
        }
        let width = self.keys.first().map_or(0, |k| k.len() / self.len);
        for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
            layer.truncate(len * width);
            layer.shrink_to_fit();
        }
        self.len = len;
    }
}

/// One sequence's part of a batch.
pub struct SeqInput<'a> {
    /// The tokens to append (the whole prompt on the first step, one token after).
    pub tokens: &'a [u32],
    /// The sequence's cache; extended by `tokens.len()` positions.
    pub cache: &'a mut KvCache,
    /// Its adapter, if any.
    pub adapter: Option<&'a Adapter>,
}

/// The layout of one forward step, shared by every block: the batch's new tokens as rows
/// (sequence by sequence), each row's sequence and position, and which adapter adapts it.
struct Step<'a> {
    rows: usize,
    tokens: Vec<u32>,
    row_seq: Vec<usize>,
    row_pos: Vec<usize>,
    /// Distinct adapters of the batch.
    adapters: Vec<&'a Adapter>,
    /// Each row's index into `adapters`.
    row_adapter: Vec<Option<usize>>,
    cpu: &'a CpuConfig,
    device: &'a Device,
}

impl<'a> Step<'a> {
    /// Checks the batch against `config` and readies each sequence's cache for its new rows.
    fn new<'b: 'a>(
        config: &ModelConfig,
        batch: &mut [SeqInput<'b>],
        cpu: &'a CpuConfig,
        device: &'a Device,
    ) -> Result<Self> {
        let kv_width = config.kv_heads() * config.head_dim();
        let mut row_seq = Vec::new();
        let mut row_pos = Vec::new();
        let mut tokens = Vec::new();
        for (s, seq) in batch.iter_mut().enumerate() {
            if seq.tokens.is_empty() {
                return Err(Error::BadRequest(format!("sequence {s} has no tokens")));
            }
            let start = seq.cache.len;
            if start + seq.tokens.len() > config.max_position_embeddings {
                return Err(Error::BadRequest(format!(
                    "sequence of {} tokens is over the context limit {}",
                    start + seq.tokens.len(),
                    config.max_position_embeddings
                )));
            }
            for (k, &t) in seq.tokens.iter().enumerate() {
                if t as usize >= config.vocab_size {
                    return Err(Error::BadRequest(format!(
                        "token id {t} is outside the vocabulary (size {})",
                        config.vocab_size
                    )));
                }
                row_seq.push(s);
                row_pos.push(start + k);
                tokens.push(t);
            }
            if seq.cache.keys.is_empty() {
                seq.cache.keys = vec![Vec::new(); config.num_hidden_layers];
                seq.cache.values = vec![Vec::new(); config.num_hidden_layers];
            }
            // A forward that failed halfway may have appended keys without counting them.
            for layer in seq.cache.keys.iter_mut().chain(seq.cache.values.iter_mut()) {
                layer.truncate(start * kv_width);
            }
        }
        let mut adapters: Vec<&'a Adapter> = Vec::new();
        let mut seq_adapter: Vec<Option<usize>> = Vec::with_capacity(batch.len());
        for seq in batch.iter() {
            seq_adapter.push(seq.adapter.map(|a| {
                match adapters.iter().position(|known| std::ptr::eq(*known, a)) {
                    Some(i) => i,
                    None => {
                        adapters.push(a);
                        adapters.len() - 1
                    }
                }
            }));
        }
        let row_adapter = row_seq.iter().map(|&s| seq_adapter[s]).collect();
        Ok(Self {
            rows: tokens.len(),
            tokens,
            row_seq,
            row_pos,
            adapters,
            row_adapter,
            cpu,
            device,
        })
    }
}

/// What llama.cpp's `llama-quantize` stores a tensor in when its rows are not whole blocks of
/// the type asked for (K-quants need 256-element rows; SmolLM2's 576 are not).
pub fn quantize_fallback(kind: cx_kernels::QuantType) -> cx_kernels::QuantType {
    use cx_kernels::QuantType::*;
    match kind {
        Q4K => Q5_0,
        Q6K => Q8_0,
        other => other,
    }
}

/// The base's frozen weights as the training forward reads them: candle tensors that share the
/// serving model's storage (nothing is copied), the norms and rotary frequencies exactly as the
/// serving forward uses them (`f32`).
#[derive(Clone, Debug)]
pub(crate) struct FrozenWeights {
    /// `vocab × hidden`.
    pub(crate) embed_tokens: candle_core::Tensor,
    /// One per decoder layer.
    pub(crate) layers: Vec<FrozenLayer>,
    /// The final norm's weight (`hidden`).
    pub(crate) norm: Vec<f32>,
    /// `vocab × hidden` (the embedding itself when tied).
    pub(crate) lm_head: candle_core::Tensor,
    /// RMSNorm's `eps`, as the forward adds it (`f32`).
    pub(crate) rms_eps: f32,
    /// RoPE inverse frequencies (`head_dim / 2`), scaling applied.
    pub(crate) inv_freq: Vec<f32>,
}

/// One decoder layer's frozen weights.
#[derive(Clone, Debug)]
pub(crate) struct FrozenLayer {
    /// `hidden`.
    pub(crate) input_layernorm: Vec<f32>,
    /// `hidden`.
    pub(crate) post_attention_layernorm: Vec<f32>,
    /// `d_out × d_in` per projection, in [`Projection::ALL`] order.
    pub(crate) projections: [candle_core::Tensor; 7],
    /// `d_out` per projection that has a bias, in [`Projection::ALL`] order.
    pub(crate) biases: [Option<Vec<f32>>; 7],
    /// Qwen3's per-head norms of q and k (`head_dim` each), where the architecture has them.
    pub(crate) qk_norm: Option<[Vec<f32>; 2]>,
}

/// A Llama-family model ready to run.
#[derive(Clone)]
pub struct Model {
    config: ModelConfig,
    architecture: Architecture,
    embed_tokens: Weight,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<Weight>,
    rotary: RotaryEmbedding,
    cpu: CpuConfig,
    device: Device,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("cpu", &self.cpu)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Loads a Hugging Face folder or a GGUF ([`ModelFiles`]); the forward runs on the CPU with
    /// `cpu`.
    pub fn load(path: &Path, cpu: CpuConfig) -> Result<Self> {
        Self::load_quantized(path, cpu, None)
    }

    /// [`Model::load`], with every weight matrix not already in a block format quantized to
    /// `quantize` as it is loaded (`--quantize`; see [`Checkpoint::quantize`] for rows that
    /// are not whole blocks).
    pub fn load_quantized(
        path: &Path,
        cpu: CpuConfig,
        quantize: Option<cx_kernels::QuantType>,
    ) -> Result<Self> {
        let config = read_config(path)?;
        let files = ModelFiles::locate(path)?;
        let mut tensors = match files.gguf() {
            Some(file) => from_gguf::checkpoint(&gguf::Gguf::open(file)?, &config)?,
            None => weights::load_tensors(path)?,
        };
        if let Some(kind) = quantize {
            tensors.quantize(kind, quantize_fallback(kind))?;
        }
        Self::new(config, tensors, cpu)
    }

    /// Builds a model from named `f32` tensors (name → (shape, data)), checking every shape;
    /// the tensors must be exactly those `config`'s [`Architecture`] uses.
    pub fn new(
        config: ModelConfig,
        tensors: impl Into<Checkpoint>,
        cpu: CpuConfig,
    ) -> Result<Self> {
        let architecture = Architecture::of(&config)?;
        let mut store = TensorStore(tensors.into());
        let d = config.hidden_size;
        let vocab = config.vocab_size;
        let embed_tokens = Weight::stored(
            store.take_weight("model.embed_tokens.weight", &[vocab, d])?,
            vocab,
            d,
        )?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let mut linear = |p: Projection| -> Result<Linear> {
                let (d_in, d_out) = config.projection_shape(p);
                let prefix = format!("model.layers.{i}.{}", p.module_path());
                let data = store.take_weight(&format!("{prefix}.weight"), &[d_out, d_in])?;
                let bias = if architecture.has_bias(&config, p) {
                    Some(store.take(&format!("{prefix}.bias"), &[d_out])?)
                } else {
                    None
                };
                Linear::new(Weight::stored(data, d_out, d_in)?, bias, i, p)
            };
            let [q, k, v, o] = attention::PROJECTIONS;
            let attention = [linear(q)?, linear(k)?, linear(v)?, linear(o)?];
            let [gate, up, down] = mlp::PROJECTIONS;
            let mlp = Mlp::new([linear(gate)?, linear(up)?, linear(down)?]);
            // `name` is the path inside the layer; `width` the weight's length.
            let mut norm = |name: &str, width: usize| -> Result<RmsNorm> {
                let weight = store.take(&format!("model.layers.{i}.{name}.weight"), &[width])?;
                Ok(RmsNorm::new(weight, config.rms_norm_eps))
            };
            let qk_norm = if architecture.has_qk_norm() {
                let hd = config.head_dim();
                Some([norm("self_attn.q_norm", hd)?, norm("self_attn.k_norm", hd)?])
            } else {
                None
            };
            let self_attn = Attention::new(&config, i, attention, qk_norm);
            layers.push(DecoderLayer {
                input_layernorm: norm("input_layernorm", d)?,
                self_attn,
                post_attention_layernorm: norm("post_attention_layernorm", d)?,
                mlp,
            });
        }
        let norm = RmsNorm::new(store.take("model.norm.weight", &[d])?, config.rms_norm_eps);
        let lm_head = if config.tie_word_embeddings {
            // Some tied checkpoints also store the head; tied means it is the embedding, as
            // transformers reads it, so the copy is not an unused tensor.
            store.drop("lm_head.weight");
            None
        } else {
            Some(Weight::stored(
                store.take_weight("lm_head.weight", &[vocab, d])?,
                vocab,
                d,
            )?)
        };
        store.finish(architecture)?;
        Ok(Self {
            rotary: RotaryEmbedding::new(&config),
            config,
            architecture,
            embed_tokens,
            layers,
            norm,
            lm_head,
            cpu,
            device: Device::cpu(cpu),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The architecture (`model_type`) the forward runs.
    pub fn architecture(&self) -> Architecture {
        self.architecture
    }

    /// How the CPU kernels run.
    pub fn cpu_config(&self) -> CpuConfig {
        self.cpu
    }

    /// Runs SGMV on `device` instead of the CPU (the base projections stay on the CPU).
    pub fn set_device(&mut self, device: Device) {
        self.device = device;
    }

    /// The device SGMV runs on (and a `cx/matmul-f32` product).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The kernel corpus the whole forward reproduces bit for bit (class D), if any: both the
    /// CPU projections and the SGMV device must run the deterministic kernels, so `--fast` (FMA)
    /// and `--gpu` name none and are class D∞.
    pub fn kernel_corpus(&self) -> Option<&'static str> {
        match self.cpu.mode {
            cx_kernels::Mode::Deterministic => self.device.kernel_corpus(),
            cx_kernels::Mode::Fast => None,
        }
    }

    /// The device SGMV runs on, by name (what an offer states as the bundle's device).
    pub fn device_name(&self) -> String {
        self.device.name()
    }

    /// The frozen weights, shared with this model (for the training forward; a quantized
    /// weight is dequantized for it, see `Weight::tensor`).
    pub(crate) fn frozen_weights(&self) -> Result<FrozenWeights> {
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                let all = layer.projections();
                let tensors = all
                    .iter()
                    .map(|l| l.weight().tensor())
                    .collect::<Result<Vec<_>>>()?;
                Ok(FrozenLayer {
                    input_layernorm: layer.input_layernorm.parts().0.to_vec(),
                    post_attention_layernorm: layer.post_attention_layernorm.parts().0.to_vec(),
                    projections: tensors.try_into().expect("seven projections"),
                    biases: all.map(|l| l.bias().map(<[f32]>::to_vec)),
                    qk_norm: layer
                        .self_attn
                        .qk_norms()
                        .map(|norms| norms.map(|n| n.parts().0.to_vec())),
                })
            })
            .collect::<Result<_>>()?;
        Ok(FrozenWeights {
            embed_tokens: self.embed_tokens.tensor()?,
            layers,
            norm: self.norm.parts().0.to_vec(),
            lm_head: self
                .lm_head
                .as_ref()
                .unwrap_or(&self.embed_tokens)
                .tensor()?,
            rms_eps: self.norm.parts().1,
            inv_freq: self.rotary.inv_freq().to_vec(),
        })
    }

    /// A fresh cache for one sequence (the same as [`KvCache::default`]; the first forward
    /// sizes it).
    pub fn new_cache(&self) -> KvCache {
        KvCache::default()
    }

    /// A copy of this model with every adapted projection replaced by `W + s·B·A` (the
    /// merged-weight reference the tests compare the unmerged forward with).
    pub fn merged_with(&self, adapter: &Adapter) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|layer| layer.merged(adapter))
            .collect::<Result<_>>()?;
        Ok(Self {
            layers,
            ..self.clone()
        })
    }

    /// The block format of the quantized weight matrices, if any are (the most common one:
    /// a Q4_K_M file mixes Q4_K with Q6_K).
    pub fn quant_type(&self) -> Option<cx_kernels::QuantType> {
        let mut counts: Vec<(cx_kernels::QuantType, usize)> = Vec::new();
        for q in self.matrices().filter_map(Weight::quant_type) {
            match counts.iter_mut().find(|(k, _)| *k == q) {
                Some((_, n)) => *n += 1,
                None => counts.push((q, 1)),
            }
        }
        counts.into_iter().max_by_key(|&(_, n)| n).map(|(k, _)| k)
    }

    /// Whether any weight matrix is held in bf16 (what `CpuConfig::bf16_dot` takes).
    pub fn holds_bf16(&self) -> bool {
        self.matrices().any(Weight::is_bf16)
    }

    /// Parameters: weights, biases and norms.
    pub fn parameters(&self) -> usize {
        let layers: usize = self.layers.iter().map(DecoderLayer::len).sum();
        self.embed_tokens.len()
            + layers
            + self.norm.len()
            + self.lm_head.as_ref().map_or(0, Weight::len)
    }

    /// Bytes of weights as held (bf16 matrices at 2 bytes an element, quantized ones at their
    /// blocks' bytes, everything else `f32`), biases and norms included: what residency of this
    /// base costs.
    pub fn weight_bytes(&self) -> usize {
        let narrowed: usize = self.matrices().map(|w| w.len() * 4 - w.bytes()).sum();
        self.parameters() * 4 - narrowed
    }

    /// Every weight matrix: the layers' projections, the embedding and the untied head.
    fn matrices(&self) -> impl Iterator<Item = &Weight> {
        self.layers
            .iter()
            .flat_map(|layer| layer.projections().map(Linear::weight))
            .chain(std::iter::once(&self.embed_tokens))
            .chain(self.lm_head.as_ref())
    }

    /// Runs one step for a batch of sequences and returns, per sequence, the logits
    /// (`vocab_size`) of its last new token.
    ///
    /// Each sequence's `tokens` are appended to its cache; a sequence with no tokens is an
    /// error. Sequences may mix prefill and decode, adapters and ranks freely.
    pub fn forward(&self, batch: &mut [SeqInput<'_>]) -> Result<Vec<Vec<f32>>> {
        let d = self.config.hidden_size;
        let step = Step::new(&self.config, batch, &self.cpu, &self.device)?;
        let mut x = vec![0f32; step.rows * d];
        self.embed_tokens.gather_rows(&step.tokens, &mut x)?;
        let rope = self.rotary.tables(&step.row_pos);
        for layer in &self.layers {
            layer.forward(&mut x, &step, &rope, batch)?;
        }
        for seq in batch.iter_mut() {
            seq.cache.len += seq.tokens.len();
        }
        // Logits of each sequence's last row only.
        let mut last = Vec::with_capacity(batch.len() * d);
        let mut end = 0;
        for seq in batch.iter() {
            end += seq.tokens.len();
            last.extend_from_slice(&x[(end - 1) * d..end * d]);
        }
        let normed = self.norm.forward(&last);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let logits = head.apply(&normed, batch.len(), &self.cpu)?;
        Ok(logits
            .chunks(self.config.vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }
}
