//! The Llama architecture (Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language
//! Models"; grouped-query attention from Ainslie et al. 2023), mirroring Hugging Face
//! `transformers/models/llama/modeling_llama.py`: RMSNorm, rotary embeddings applied as
//! `rotate_half` does (the two halves of each head, not interleaved pairs), grouped-query
//! attention, SwiGLU MLP, tied or separate `lm_head`.
//!
//! Weights are read with candle from a Hugging Face directory (`config.json` plus
//! `model.safetensors` or a sharded `model.safetensors.index.json`; F32, BF16 or F16, widened
//! to `f32`), under the names Hugging Face writes (`model.embed_tokens.weight`,
//! `model.layers.{i}.self_attn.q_proj.weight`, …).
//!
//! The forward runs a whole batch of sequences at once — each with its own new tokens, its own
//! [`KvCache`] and its own adapter (or none) — and applies every sequence's LoRA delta with
//! cx-kernels' SGMV on the activations (SPEC §6); the delta is never merged into `W`.
//!
//! # Why every reduction is ours
//! Determinism class D asks that a sequence's output bits do not depend on what else is in the
//! batch or on the thread count. With [`cx_kernels::Mode::Deterministic`] the projections go
//! through [`cx_kernels::gemm_xwt`] and [`cx_kernels::Device::sgmv`], whose reductions have a
//! fixed order per output element; RMSNorm, attention and softmax below are plain sequential
//! loops over one row, one head, one sequence. Nothing reduces across rows, so a row is computed
//! by the same operations whatever its neighbours are. With [`cx_kernels::Mode::Fast`] the base
//! projections use candle's matmul instead (faster; class D∞: equal up to rounding).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};
use cx_kernels::rng::{ChaCha20Rng, UniformVec, seeded};
use cx_kernels::{CpuConfig, Device, LoraAdapter, Mode, gemm_xwt, segments_from_row_adapters};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lora::{Adapter, Target};

/// `config.json` of a Hugging Face Llama checkpoint (the fields the forward reads).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct LlamaConfig {
    /// Model width `d`.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Decoder layers `L`.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base θ.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// RoPE frequency scaling (`llama3` or `linear`), as Hugging Face writes it.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// Context length: prompts plus generated tokens must fit.
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    /// The output projection is the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token(s): a number or a list.
    #[serde(default)]
    pub eos_token_id: Option<EosTokens>,
    /// Storage dtype as Hugging Face names it (`float32`, `bfloat16`, `float16`).
    #[serde(default)]
    pub torch_dtype: Option<String>,
    /// `["LlamaForCausalLM"]` for generated models.
    #[serde(default)]
    pub architectures: Option<Vec<String>>,
    /// `"llama"`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Biases on q/k/v/o (not supported: refused when true).
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP (not supported: refused when true).
    #[serde(default)]
    pub mlp_bias: bool,
    /// MLP activation; only `silu` (SwiGLU).
    #[serde(default)]
    pub hidden_act: Option<String>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_max_positions() -> usize {
    2048
}

/// `rope_scaling` of `config.json`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RopeScaling {
    /// `llama3`, `linear` or `default` (older files call it `type`).
    #[serde(alias = "type")]
    pub rope_type: String,
    /// Scale factor.
    #[serde(default)]
    pub factor: Option<f64>,
    /// llama3: low-frequency factor.
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    /// llama3: high-frequency factor.
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    /// llama3: the context the frequencies were trained for.
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
}

/// `eos_token_id`: one id or several.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum EosTokens {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl LlamaConfig {
    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }
    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }
    /// End-of-sequence ids.
    pub fn eos_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            None => Vec::new(),
            Some(EosTokens::One(id)) => vec![*id],
            Some(EosTokens::Many(ids)) => ids.clone(),
        }
    }
    /// `(d_in, d_out)` of a projection.
    pub fn projection_shape(&self, target: Target) -> (usize, usize) {
        let d = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim();
        let kv = self.kv_heads() * self.head_dim();
        let ff = self.intermediate_size;
        match target {
            Target::Q => (d, q),
            Target::K | Target::V => (d, kv),
            Target::O => (q, d),
            Target::Gate | Target::Up => (d, ff),
            Target::Down => (ff, d),
        }
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| Error::Config {
            path: path.to_path_buf(),
            what: "config.json",
            reason,
        };
        if self.hidden_size == 0
            || self.intermediate_size == 0
            || self.num_hidden_layers == 0
            || self.num_attention_heads == 0
            || self.vocab_size == 0
        {
            return Err(bad("sizes must be positive".into()));
        }
        if self.kv_heads() == 0 || !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return Err(bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.kv_heads()
            )));
        }
        if self.head_dim() == 0 || !self.head_dim().is_multiple_of(2) {
            return Err(bad(format!(
                "head_dim {} must be even and positive (RoPE rotates halves)",
                self.head_dim()
            )));
        }
        if self.attention_bias || self.mlp_bias {
            return Err(bad(
                "attention_bias / mlp_bias are not supported (Llama has no biases)".into(),
            ));
        }
        if let Some(act) = &self.hidden_act
            && act != "silu"
        {
            return Err(bad(format!("hidden_act `{act}` is not supported (silu)")));
        }
        if let Some(scaling) = &self.rope_scaling
            && !matches!(scaling.rope_type.as_str(), "llama3" | "linear" | "default")
        {
            return Err(bad(format!(
                "rope_scaling type `{}` is not supported (llama3, linear, default)",
                scaling.rope_type
            )));
        }
        Ok(())
    }

    /// RoPE inverse frequencies `θ^(−2i/d_head)`, rescaled as `rope_scaling` asks (Hugging Face
    /// `_compute_llama3_parameters` / `_compute_linear_scaling_rope_parameters`).
    fn inv_freq(&self) -> Vec<f32> {
        let hd = self.head_dim();
        let base: Vec<f64> = (0..hd / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / hd as f64))
            .collect();
        let scaled: Vec<f64> = match &self.rope_scaling {
            Some(s) if s.rope_type == "linear" => {
                let factor = s.factor.unwrap_or(1.0);
                base.iter().map(|f| f / factor).collect()
            }
            Some(s) if s.rope_type == "llama3" => {
                let factor = s.factor.unwrap_or(8.0);
                let low = s.low_freq_factor.unwrap_or(1.0);
                let high = s.high_freq_factor.unwrap_or(4.0);
                let old = s.original_max_position_embeddings.unwrap_or(8192) as f64;
                let low_wavelen = old / low;
                let high_wavelen = old / high;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            _ => base,
        };
        scaled.into_iter().map(|f| f as f32).collect()
    }
}

/// Named `f32` tensors: name → (shape, data), as Hugging Face names them.
pub type NamedTensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads and checks `DIR/config.json`.
pub fn read_config(dir: &Path) -> Result<LlamaConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let config: LlamaConfig = serde_json::from_str(&text).map_err(|e| Error::Config {
        path: path.clone(),
        what: "config.json",
        reason: e.to_string(),
    })?;
    config.validate(&path)?;
    Ok(config)
}

/// The safetensors files of a model directory: the shards named by
/// `model.safetensors.index.json`, or `model.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        #[derive(Deserialize)]
        struct Index {
            weight_map: HashMap<String, String>,
        }
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let parsed: Index = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: index.clone(),
            what: "safetensors index",
            reason: e.to_string(),
        })?;
        let mut files: Vec<String> = parsed.weight_map.into_values().collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        Ok(vec![single])
    } else {
        Err(Error::Model(format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )))
    }
}

/// Every tensor of a model directory, widened to `f32`: name → (shape, data).
fn load_tensors(dir: &Path) -> Result<NamedTensors> {
    let mut out = HashMap::new();
    for file in weight_files(dir)? {
        let tensors =
            candle_core::safetensors::load(&file, &candle_core::Device::Cpu).map_err(|e| {
                Error::Safetensors {
                    path: file.clone(),
                    reason: e.to_string(),
                }
            })?;
        for (name, tensor) in tensors {
            let shape = tensor.dims().to_vec();
            let data = tensor
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            out.insert(name, (shape, data));
        }
    }
    Ok(out)
}

/// A `Linear` weight (`d_out × d_in`, `f32`, contiguous) held as a candle tensor.
///
/// Class D (`Mode::Deterministic`) multiplies with [`cx_kernels::gemm_xwt`] on the tensor's
/// own buffer, whose reduction order is fixed per output element; `Mode::Fast` (class D∞)
/// uses candle's matmul (the `gemm` crate), faster but with a blocking that depends on the
/// batch shape, so a row's bits may change with its neighbours.
#[derive(Clone, Debug)]
struct Weight {
    tensor: Tensor,
    d_out: usize,
    d_in: usize,
}

impl Weight {
    fn new(data: Vec<f32>, d_out: usize, d_in: usize) -> Result<Self> {
        Ok(Self {
            tensor: Tensor::from_vec(data, (d_out, d_in), &candle_core::Device::Cpu)?,
            d_out,
            d_in,
        })
    }

    /// Calls `f` with the weight's `d_out × d_in` row-major buffer.
    fn with_slice<R>(&self, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
        let (storage, layout) = self.tensor.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(cpu) => {
                let all = cpu.as_slice::<f32>()?;
                let start = layout.start_offset();
                f(&all[start..start + self.d_out * self.d_in])
            }
            _ => Err(Error::Model("weights must live in host memory".into())),
        }
    }

    fn to_vec(&self) -> Result<Vec<f32>> {
        self.with_slice(|w| Ok(w.to_vec()))
    }

    fn len(&self) -> usize {
        self.d_out * self.d_in
    }

    /// `x·Wᵀ`. Shapes: `x` is `rows × d_in`; returns `rows × d_out`.
    fn apply(&self, x: &[f32], rows: usize, cpu: &CpuConfig) -> Result<Vec<f32>> {
        match cpu.mode {
            Mode::Deterministic => self.with_slice(|w| {
                let mut y = vec![0f32; rows * self.d_out];
                gemm_xwt(x, w, &mut y, rows, self.d_in, self.d_out, cpu)?;
                Ok(y)
            }),
            Mode::Fast => {
                let x = Tensor::from_slice(x, (rows, self.d_in), &candle_core::Device::Cpu)?;
                Ok(x.matmul(&self.tensor.t()?)?
                    .flatten_all()?
                    .to_vec1::<f32>()?)
            }
        }
    }
}

/// One decoder layer's weights, `f32`, Hugging Face layouts (`d_out × d_in`).
struct Layer {
    input_norm: Vec<f32>,
    post_attention_norm: Vec<f32>,
    /// q, k, v, o, gate, up, down in [`Target::ALL`] order.
    projections: [Weight; 7],
}

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

/// A Llama model ready to run.
pub struct Model {
    config: LlamaConfig,
    embed: Weight,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None` when tied to `embed`.
    lm_head: Option<Weight>,
    inv_freq: Vec<f32>,
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
    /// Loads a Hugging Face directory; the forward runs on the CPU with `cpu`.
    pub fn load(dir: &Path, cpu: CpuConfig) -> Result<Self> {
        let config = read_config(dir)?;
        let tensors = load_tensors(dir)?;
        Self::from_tensors(config, tensors, cpu)
    }

    /// Builds a model from named `f32` tensors (name → (shape, data)), checking every shape.
    pub fn from_tensors(
        config: LlamaConfig,
        mut tensors: NamedTensors,
        cpu: CpuConfig,
    ) -> Result<Self> {
        let mut take = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let (got, data) = tensors
                .remove(name)
                .ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
            if got != shape {
                return Err(Error::Model(format!(
                    "{name} has shape {got:?}, config.json implies {shape:?}"
                )));
            }
            Ok(data)
        };
        let d = config.hidden_size;
        let embed = Weight::new(
            take("model.embed_tokens.weight", &[config.vocab_size, d])?,
            config.vocab_size,
            d,
        )?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let mut projections = Vec::with_capacity(7);
            for t in Target::ALL {
                let (d_in, d_out) = config.projection_shape(t);
                let data = take(
                    &format!("model.layers.{i}.{}.weight", t.module_path()),
                    &[d_out, d_in],
                )?;
                projections.push(Weight::new(data, d_out, d_in)?);
            }
            let projections: [Weight; 7] = projections
                .try_into()
                .map_err(|_| Error::Model("seven projections per layer".into()))?;
            layers.push(Layer {
                input_norm: take(&format!("model.layers.{i}.input_layernorm.weight"), &[d])?,
                post_attention_norm: take(
                    &format!("model.layers.{i}.post_attention_layernorm.weight"),
                    &[d],
                )?,
                projections,
            });
        }
        let norm = take("model.norm.weight", &[d])?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(Weight::new(
                take("lm_head.weight", &[config.vocab_size, d])?,
                config.vocab_size,
                d,
            )?)
        };
        Ok(Self {
            inv_freq: config.inv_freq(),
            config,
            embed,
            layers,
            norm,
            lm_head,
            cpu,
            device: Device::cpu(cpu),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// How the CPU kernels run.
    pub fn cpu_config(&self) -> CpuConfig {
        self.cpu
    }

    /// Runs SGMV on `device` instead of the CPU (the base projections stay on the CPU).
    pub fn set_device(&mut self, device: Device) {
        self.device = device;
    }

    /// A copy of this model with every adapted projection replaced by `W + s·B·A` (the
    /// merged-weight reference the tests compare the unmerged forward with).
    pub fn merged_with(&self, adapter: &Adapter) -> Result<Self> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let mut projections = layer.projections.clone();
            for t in Target::ALL {
                if let Some(lora) = adapter.projection(i, t) {
                    let weight = &projections[t.index()];
                    let mut merged = weight.to_vec()?;
                    for (w, d) in merged.iter_mut().zip(lora.delta_dense()) {
                        *w += d;
                    }
                    projections[t.index()] = Weight::new(merged, weight.d_out, weight.d_in)?;
                }
            }
            layers.push(Layer {
                input_norm: layer.input_norm.clone(),
                post_attention_norm: layer.post_attention_norm.clone(),
                projections,
            });
        }
        Ok(Self {
            config: self.config.clone(),
            embed: self.embed.clone(),
            layers,
            norm: self.norm.clone(),
            lm_head: self.lm_head.clone(),
            inv_freq: self.inv_freq.clone(),
            cpu: self.cpu,
            device: self.device.clone(),
        })
    }

    /// Bytes of weights (as held, `f32`).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.input_norm.len()
                    + l.post_attention_norm.len()
                    + l.projections.iter().map(Weight::len).sum::<usize>()
            })
            .sum();
        (self.embed.len() + layers + self.norm.len() + self.lm_head.as_ref().map_or(0, Weight::len))
            * 4
    }

    /// Runs one step for a batch of sequences and returns, per sequence, the logits
    /// (`vocab_size`) of its last new token.
    ///
    /// Each sequence's `tokens` are appended to its cache; a sequence with no tokens is an
    /// error. Sequences may mix prefill and decode, adapters and ranks freely.
    pub fn forward(&self, batch: &mut [SeqInput<'_>]) -> Result<Vec<Vec<f32>>> {
        let cfg = &self.config;
        let d = cfg.hidden_size;
        let hd = cfg.head_dim();
        let heads = cfg.num_attention_heads;
        let kv_heads = cfg.kv_heads();
        let group = heads / kv_heads;
        let kv_width = kv_heads * hd;
        let q_width = heads * hd;

        // Rows: every new token of every sequence, sequence by sequence.
        let mut row_seq = Vec::new();
        let mut row_pos = Vec::new();
        let mut tokens = Vec::new();
        for (s, seq) in batch.iter_mut().enumerate() {
            if seq.tokens.is_empty() {
                return Err(Error::BadRequest(format!("sequence {s} has no tokens")));
            }
            let start = seq.cache.len;
            if start + seq.tokens.len() > cfg.max_position_embeddings {
                return Err(Error::BadRequest(format!(
                    "sequence of {} tokens is over the context limit {}",
                    start + seq.tokens.len(),
                    cfg.max_position_embeddings
                )));
            }
            for (k, &t) in seq.tokens.iter().enumerate() {
                if t as usize >= cfg.vocab_size {
                    return Err(Error::BadRequest(format!(
                        "token id {t} is outside the vocabulary (size {})",
                        cfg.vocab_size
                    )));
                }
                row_seq.push(s);
                row_pos.push(start + k);
                tokens.push(t);
            }
            if seq.cache.keys.is_empty() {
                seq.cache.keys = vec![Vec::new(); cfg.num_hidden_layers];
                seq.cache.values = vec![Vec::new(); cfg.num_hidden_layers];
            }
            // A forward that failed halfway may have appended keys without counting them.
            for layer in seq.cache.keys.iter_mut().chain(seq.cache.values.iter_mut()) {
                layer.truncate(start * kv_width);
            }
        }
        let rows = tokens.len();

        // Distinct adapters of the batch, and each row's index among them.
        let mut distinct: Vec<&Adapter> = Vec::new();
        let mut seq_adapter: Vec<Option<usize>> = Vec::with_capacity(batch.len());
        for seq in batch.iter() {
            seq_adapter.push(seq.adapter.map(|a| {
                match distinct.iter().position(|known| std::ptr::eq(*known, a)) {
                    Some(i) => i,
                    None => {
                        distinct.push(a);
                        distinct.len() - 1
                    }
                }
            }));
        }
        let row_adapter: Vec<Option<usize>> = row_seq.iter().map(|&s| seq_adapter[s]).collect();

        let mut x = vec![0f32; rows * d];
        self.embed.with_slice(|embed| {
            for (r, &t) in tokens.iter().enumerate() {
                x[r * d..(r + 1) * d].copy_from_slice(&embed[t as usize * d..(t as usize + 1) * d]);
            }
            Ok(())
        })?;
        // cos/sin per row: angle = position · inv_freq (f32, as Hugging Face computes it).
        let half = hd / 2;
        let mut cos = vec![0f32; rows * half];
        let mut sin = vec![0f32; rows * half];
        for r in 0..rows {
            for i in 0..half {
                let angle = row_pos[r] as f32 * self.inv_freq[i];
                cos[r * half + i] = angle.cos();
                sin[r * half + i] = angle.sin();
            }
        }
        let eps = cfg.rms_norm_eps as f32;
        let mut h = vec![0f32; rows * d];
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.input_norm, &mut h, d, eps);
            let mut q = self.project(&h, rows, l, Target::Q, &distinct, &row_adapter)?;
            let mut k = self.project(&h, rows, l, Target::K, &distinct, &row_adapter)?;
            let v = self.project(&h, rows, l, Target::V, &distinct, &row_adapter)?;
            for r in 0..rows {
                let (c, s) = (
                    &cos[r * half..(r + 1) * half],
                    &sin[r * half..(r + 1) * half],
                );
                for head in q[r * q_width..(r + 1) * q_width].chunks_mut(hd) {
                    rope(head, c, s);
                }
                for head in k[r * kv_width..(r + 1) * kv_width].chunks_mut(hd) {
                    rope(head, c, s);
                }
            }
            // Append every new key/value before attending, so a prompt's rows see each other.
            for r in 0..rows {
                let seq = &mut batch[row_seq[r]];
                seq.cache.keys[l].extend_from_slice(&k[r * kv_width..(r + 1) * kv_width]);
                seq.cache.values[l].extend_from_slice(&v[r * kv_width..(r + 1) * kv_width]);
            }
            let mut attn = vec![0f32; rows * q_width];
            let scale = 1.0 / (hd as f32).sqrt();
            let mut scores = Vec::new();
            for r in 0..rows {
                let cache = &batch[row_seq[r]].cache;
                let (keys, values) = (&cache.keys[l], &cache.values[l]);
                let visible = row_pos[r] + 1;
                for head in 0..heads {
                    let kvh = head / group;
                    let qh = &q[r * q_width + head * hd..][..hd];
                    scores.clear();
                    let mut max = f32::NEG_INFINITY;
                    for p in 0..visible {
                        let kp = &keys[p * kv_width + kvh * hd..][..hd];
                        let mut dot = 0f32;
                        for i in 0..hd {
                            dot += qh[i] * kp[i];
                        }
                        let score = dot * scale;
                        max = max.max(score);
                        scores.push(score);
                    }
                    let mut sum = 0f32;
                    for s in scores.iter_mut() {
                        *s = (*s - max).exp();
                        sum += *s;
                    }
                    let out = &mut attn[r * q_width + head * hd..][..hd];
                    for (p, s) in scores.iter().enumerate() {
                        let weight = s / sum;
                        let vp = &values[p * kv_width + kvh * hd..][..hd];
                        for i in 0..hd {
                            out[i] += weight * vp[i];
                        }
                    }
                }
            }
            let o = self.project(&attn, rows, l, Target::O, &distinct, &row_adapter)?;
            for (xi, oi) in x.iter_mut().zip(&o) {
                *xi += oi;
            }
            rms_norm(&x, &layer.post_attention_norm, &mut h, d, eps);
            let gate = self.project(&h, rows, l, Target::Gate, &distinct, &row_adapter)?;
            let mut up = self.project(&h, rows, l, Target::Up, &distinct, &row_adapter)?;
            for (u, g) in up.iter_mut().zip(&gate) {
                // SiLU(g)·u, as Hugging Face's LlamaMLP.
                *u *= g / (1.0 + (-g).exp());
            }
            let down = self.project(&up, rows, l, Target::Down, &distinct, &row_adapter)?;
            for (xi, di) in x.iter_mut().zip(&down) {
                *xi += di;
            }
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
        let mut normed = vec![0f32; last.len()];
        rms_norm(&last, &self.norm, &mut normed, d, eps);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let vocab = cfg.vocab_size;
        let logits = head.apply(&normed, batch.len(), &self.cpu)?;
        Ok(logits.chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// `y = x·Wᵀ + Σ_segments s·(x·Aᵀ)·Bᵀ` for projection `target` of layer `layer`.
    ///
    /// Shapes: `x` is `rows × d_in`; returns `rows × d_out`.
    fn project(
        &self,
        x: &[f32],
        rows: usize,
        layer: usize,
        target: Target,
        distinct: &[&Adapter],
        row_adapter: &[Option<usize>],
    ) -> Result<Vec<f32>> {
        let (d_in, d_out) = self.config.projection_shape(target);
        let mut y = self.layers[layer].projections[target.index()].apply(x, rows, &self.cpu)?;
        // The table holds the adapters that adapt this projection; rows of others get no delta.
        let mut table: Vec<&LoraAdapter<f32>> = Vec::new();
        let mut slot: Vec<Option<usize>> = Vec::with_capacity(distinct.len());
        for adapter in distinct {
            slot.push(adapter.projection(layer, target).map(|lora| {
                table.push(lora);
                table.len() - 1
            }));
        }
        if table.is_empty() {
            return Ok(y);
        }
        let rows_to_table: Vec<Option<usize>> = row_adapter
            .iter()
            .map(|a| a.and_then(|a| slot[a]))
            .collect();
        let segments = segments_from_row_adapters(&rows_to_table);
        self.device
            .sgmv(x, &mut y, d_in, d_out, &segments, &table)?;
        Ok(y)
    }
}

/// `out = w ⊙ x / sqrt(mean(x²) + eps)` per row (Hugging Face `LlamaRMSNorm`).
fn rms_norm(x: &[f32], weight: &[f32], out: &mut [f32], d: usize, eps: f32) {
    for (row, o) in x.chunks(d).zip(out.chunks_mut(d)) {
        let mut sum = 0f32;
        for v in row {
            sum += v * v;
        }
        let inv = 1.0 / (sum / d as f32 + eps).sqrt();
        for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
            *o = w * (v * inv);
        }
    }
}

/// Rotates one head in place as Hugging Face's `apply_rotary_pos_emb` with `rotate_half`:
/// `x·cos + rotate_half(x)·sin`, where `rotate_half(x) = (−x₂, x₁)` over the two halves.
fn rope(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = head.len() / 2;
    for i in 0..half {
        let (x1, x2) = (head[i], head[i + half]);
        head[i] = x1 * cos[i] - x2 * sin[i];
        head[i + half] = x2 * cos[i] + x1 * sin[i];
    }
}

/// Options of a generated model.
#[derive(Clone, Debug)]
pub struct GenModelOptions {
    /// Hidden size.
    pub hidden: usize,
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// SwiGLU inner width.
    pub intermediate: usize,
    /// Vocabulary (at least 258: 256 bytes, BOS, EOS).
    pub vocab: usize,
    /// Context length.
    pub max_positions: usize,
    /// Tie `lm_head` to the embeddings.
    pub tie: bool,
    /// Storage dtype: `F32`, `BF16` or `F16`.
    pub dtype: DType,
    /// Seed of the weights.
    pub seed: u64,
}

/// Byte-level tokenizer ids of generated models: bytes are `0..256`, then BOS and EOS.
pub const GENERATED_BOS: u32 = 256;
/// End of sequence in generated models.
pub const GENERATED_EOS: u32 = 257;

/// The config a generated model gets.
pub fn generated_config(o: &GenModelOptions) -> Result<LlamaConfig> {
    if o.vocab < 258 {
        return Err(Error::BadRequest(
            "--vocab must be at least 258 (256 bytes, BOS, EOS)".into(),
        ));
    }
    if o.heads == 0 || o.kv_heads == 0 || o.hidden == 0 || !o.hidden.is_multiple_of(o.heads) {
        return Err(Error::BadRequest(
            "--hidden must be a positive multiple of --heads".into(),
        ));
    }
    let config = LlamaConfig {
        hidden_size: o.hidden,
        intermediate_size: o.intermediate,
        num_hidden_layers: o.layers,
        num_attention_heads: o.heads,
        num_key_value_heads: Some(o.kv_heads),
        head_dim: Some(o.hidden / o.heads),
        vocab_size: o.vocab,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        max_position_embeddings: o.max_positions,
        tie_word_embeddings: o.tie,
        bos_token_id: Some(GENERATED_BOS),
        eos_token_id: Some(EosTokens::One(GENERATED_EOS)),
        torch_dtype: Some(
            match o.dtype {
                DType::BF16 => "bfloat16",
                DType::F16 => "float16",
                _ => "float32",
            }
            .into(),
        ),
        architectures: Some(vec!["LlamaForCausalLM".into()]),
        model_type: Some("llama".into()),
        attention_bias: false,
        mlp_bias: false,
        hidden_act: Some("silu".into()),
    };
    config.validate(Path::new("<generated>"))?;
    Ok(config)
}

/// Seeded random weights for `config`, named as Hugging Face names them: name → (shape, data).
///
/// Projections are uniform in `±1/√d_in` (unit-variance activations stay unit-variance),
/// norms near 1, embeddings uniform in `±1`.
pub fn generated_tensors(config: &LlamaConfig, seed: u64) -> NamedTensors {
    let mut rng = seeded(seed);
    let mut out = HashMap::new();
    let d = config.hidden_size;
    out.insert(
        "model.embed_tokens.weight".to_string(),
        (
            vec![config.vocab_size, d],
            rng.vec_f32(config.vocab_size * d, 1.0),
        ),
    );
    let norm = |rng: &mut ChaCha20Rng| -> Vec<f32> {
        rng.vec_f32(d, 0.1).into_iter().map(|v| 1.0 + v).collect()
    };
    for i in 0..config.num_hidden_layers {
        for t in Target::ALL {
            let (d_in, d_out) = config.projection_shape(t);
            out.insert(
                format!("model.layers.{i}.{}.weight", t.module_path()),
                (
                    vec![d_out, d_in],
                    rng.vec_f32(d_out * d_in, 1.0 / (d_in as f32).sqrt()),
                ),
            );
        }
        out.insert(
            format!("model.layers.{i}.input_layernorm.weight"),
            (vec![d], norm(&mut rng)),
        );
        out.insert(
            format!("model.layers.{i}.post_attention_layernorm.weight"),
            (vec![d], norm(&mut rng)),
        );
    }
    out.insert("model.norm.weight".to_string(), (vec![d], norm(&mut rng)));
    if !config.tie_word_embeddings {
        out.insert(
            "lm_head.weight".to_string(),
            (
                vec![config.vocab_size, d],
                rng.vec_f32(config.vocab_size * d, 1.0 / (d as f32).sqrt()),
            ),
        );
    }
    out
}

/// Writes a seeded random Llama into `dir`: `config.json` and `model.safetensors` (written by
/// candle in `o.dtype`). Returns the config.
pub fn write_generated_model(dir: &Path, o: &GenModelOptions) -> Result<LlamaConfig> {
    let config = generated_config(o)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tensors = generated_tensors(&config, o.seed);
    let mut candle_tensors = HashMap::new();
    for (name, (shape, data)) in tensors {
        let t = Tensor::from_vec(data, shape, &candle_core::Device::Cpu)?.to_dtype(o.dtype)?;
        candle_tensors.insert(name, t);
    }
    let path = dir.join("model.safetensors");
    candle_core::safetensors::save(&candle_tensors, &path).map_err(|e| Error::Safetensors {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let config_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&config).expect("config serialises");
    std::fs::write(&config_path, text).map_err(|e| Error::io(&config_path, e))?;
    Ok(config)
}
