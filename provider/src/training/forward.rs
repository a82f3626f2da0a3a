//! The Llama forward again, in differentiable candle ops, so that candle's autograd
//! (`Tensor::backward`) gives the gradients of the LoRA weights: the same blocks, in the same
//! order and with the same constants as [`crate::model`] (RMSNorm with the serving `eps` in
//! `f32`, RoPE from the serving inverse frequencies, grouped-query causal attention, SwiGLU,
//! each projection `x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ` with the bias where the architecture has one,
//! Qwen3's per-head q/k RMSNorm before RoPE), over a padded batch instead of per-sequence
//! caches.
//!
//! Why a second forward: the serving forward is plain loops over `f32` slices (its reductions
//! have a fixed order for class D), which autograd cannot see. This one shares the frozen base
//! tensors with serving ([`FrozenWeights`], no copy in `f32`) and only A and B are
//! [`Var`]s; the tests hold the two forwards' logits within 1e-5 relative of each other.
//!
//! Shapes: a batch of `b` sequences padded to `t` tokens is `n = b·t` rows of `hidden`;
//! attention runs as `(b, heads, t, head_dim)`.

use candle_core::{CpuStorage, CustomOp1, D, DType, Device, Layout, Shape, Tensor, Var};
use cx_protocol::model_config::{ModelConfig, Projection};

use crate::error::Result;
use crate::model::FrozenWeights;

/// The base as the training forward reads it, in the training dtype (`f32` shares the serving
/// model's storage; `f64`, for gradient checks, is a widened copy).
#[derive(Clone, Debug)]
pub(crate) struct Base {
    embed_tokens: Tensor,
    layers: Vec<BaseLayer>,
    norm: Tensor,
    lm_head: Tensor,
    rms_eps: f64,
    inv_freq: Vec<f32>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    pub(crate) dtype: DType,
}

#[derive(Clone, Debug)]
struct BaseLayer {
    input_layernorm: Tensor,
    post_attention_layernorm: Tensor,
    projections: [Tensor; 7],
    /// `d_out` per projection that has one (Qwen2's q/k/v, `attention_bias`, `mlp_bias`).
    biases: [Option<Tensor>; 7],
    /// Qwen3's per-head norms of q and k (`head_dim` each).
    qk_norm: Option<[Tensor; 2]>,
}

impl Base {
    /// The frozen weights of `config`'s model, in `dtype` (`F32` or `F64`).
    pub(crate) fn new(config: &ModelConfig, frozen: &FrozenWeights, dtype: DType) -> Result<Self> {
        let cpu = Device::Cpu;
        let vector = |v: &[f32]| -> Result<Tensor> {
            Ok(Tensor::from_slice(v, v.len(), &cpu)?.to_dtype(dtype)?)
        };
        let convert = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(dtype)?) };
        let layers = frozen
            .layers
            .iter()
            .map(|l| {
                let p = &l.projections;
                let b = &l.biases;
                let bias = |b: &Option<Vec<f32>>| b.as_deref().map(vector).transpose();
                Ok(BaseLayer {
                    input_layernorm: vector(&l.input_layernorm)?,
                    post_attention_layernorm: vector(&l.post_attention_layernorm)?,
                    projections: [
                        convert(&p[0])?,
                        convert(&p[1])?,
                        convert(&p[2])?,
                        convert(&p[3])?,
                        convert(&p[4])?,
                        convert(&p[5])?,
                        convert(&p[6])?,
                    ],
                    biases: [
                        bias(&b[0])?,
                        bias(&b[1])?,
                        bias(&b[2])?,
                        bias(&b[3])?,
                        bias(&b[4])?,
                        bias(&b[5])?,
                        bias(&b[6])?,
                    ],
                    qk_norm: match &l.qk_norm {
                        Some([q, k]) => Some([vector(q)?, vector(k)?]),
                        None => None,
                    },
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            embed_tokens: convert(&frozen.embed_tokens)?,
            layers,
            norm: vector(&frozen.norm)?,
            lm_head: convert(&frozen.lm_head)?,
            rms_eps: f64::from(frozen.rms_eps),
            inv_freq: frozen.inv_freq.clone(),
            heads: config.num_attention_heads,
            kv_heads: config.kv_heads(),
            head_dim: config.head_dim(),
            dtype,
        })
    }

    /// Decoder layers.
    pub(crate) fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

/// One projection's trainable pair: `A` is `r × d_in`, `B` is `d_out × r`.
#[derive(Clone, Debug)]
pub(crate) struct LoraPair {
    pub(crate) layer: usize,
    pub(crate) projection: Projection,
    pub(crate) a: Var,
    pub(crate) b: Var,
}

/// The adapter the forward applies: the pairs and their scale `s`.
pub(crate) struct Delta<'a> {
    /// Per layer, per [`Projection::index`]: the index into `pairs`.
    pub(crate) slots: &'a [[Option<usize>; 7]],
    pub(crate) pairs: &'a [LoraPair],
    pub(crate) scale: f64,
    /// Detached: no graph is recorded (sampling, logits checks).
    pub(crate) detached: bool,
}

impl Delta<'_> {
    fn pair(&self, layer: usize, projection: Projection) -> Option<(Tensor, Tensor)> {
        let i = self.slots.get(layer)?[projection.index()]?;
        let pair = &self.pairs[i];
        let (a, b) = (pair.a.as_tensor(), pair.b.as_tensor());
        Some(if self.detached {
            (a.detach(), b.detach())
        } else {
            (a.clone(), b.clone())
        })
    }
}

/// A padded batch: `tokens` is `b × t` (`u32`), shorter sequences padded with token 0 at the
/// end (causal attention keeps real rows from seeing the padding).
pub(crate) struct Batch {
    pub(crate) tokens: Tensor,
    pub(crate) sequences: usize,
    pub(crate) len: usize,
}

impl Batch {
    /// Pads `sequences` (each non-empty, checked by the caller) to the longest.
    pub(crate) fn new(sequences: &[Vec<u32>]) -> Result<Self> {
        let len = sequences.iter().map(Vec::len).max().unwrap_or(0);
        let mut flat = vec![0u32; sequences.len() * len];
        for (s, seq) in sequences.iter().enumerate() {
            flat[s * len..s * len + seq.len()].copy_from_slice(seq);
        }
        Ok(Self {
            tokens: Tensor::from_vec(flat, (sequences.len(), len), &Device::Cpu)?,
            sequences: sequences.len(),
            len,
        })
    }
}

/// `w ⊙ x / sqrt(mean(x²) + eps)` per row. Shapes: `x` is `n × d`, `w` is `d`.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let inv = (x.sqr()?.mean_keepdim(1)? + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(w)?)
}

/// `x·Wᵀ` for a frozen `W` (`d_out × d_in`) whose backward gives only `x`'s gradient,
/// `g·W`. candle's own matmul backward also computes `xᵀ·g`, the gradient of `W`, which no
/// one reads here and which costs as much as the forward product itself: a LoRA step would pay
/// for full fine-tuning's backward.
struct FrozenMatmul {
    w: Tensor,
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("frozen-matmul needs a contiguous input")
        };
        let cpu = Device::Cpu;
        let shape = layout.shape().clone();
        let x = match storage {
            CpuStorage::F32(v) => Tensor::from_slice(&v[start..end], shape, &cpu)?,
            CpuStorage::F64(v) => Tensor::from_slice(&v[start..end], shape, &cpu)?,
            _ => candle_core::bail!("frozen-matmul runs in f32 or f64"),
        };
        let y = x.matmul(&self.w.t()?)?;
        let out_shape = y.shape().clone();
        let flat = y.flatten_all()?;
        let out = match storage {
            CpuStorage::F64(_) => CpuStorage::F64(flat.to_vec1::<f64>()?),
            _ => CpuStorage::F32(flat.to_vec1::<f32>()?),
        };
        Ok((out, out_shape))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad_res.matmul(&self.w)?))
    }
}

/// `x·Wᵀ` with `W` frozen (see [`FrozenMatmul`]). Shapes: `x` is `n × d_in`, `w` is
/// `d_out × d_in`; returns `n × d_out`.
fn frozen_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(x.contiguous()?.apply_op1(FrozenMatmul { w: w.clone() })?)
}

/// `x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ` (no `b` where `bias` is `None`). Shapes: `x` is `n × d_in`,
/// `bias` is `d_out`; returns `n × d_out`.
fn project(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    lora: Option<(Tensor, Tensor)>,
    scale: f64,
) -> Result<Tensor> {
    let mut y = frozen_matmul(x, w)?;
    if let Some(bias) = bias {
        y = y.broadcast_add(bias)?;
    }
    match lora {
        None => Ok(y),
        Some((a, b)) => {
            let delta = x.matmul(&a.t()?)?.matmul(&b.t()?)?;
            Ok((y + (delta * scale)?)?)
        }
    }
}

/// `x·cos + rotate_half(x)·sin` over the two halves of each head. Shapes: `x` is
/// `(b, h, t, head_dim)`, `cos`/`sin` are `t × head_dim`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
}

/// Softmax over the last dimension; the max is a constant of the gradient, so it is detached.
fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    Ok(e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?)
}

/// `log softmax` over the last dimension.
pub(crate) fn log_softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&log_sum)?)
}

/// The logits of every position: `(b·t) × vocab` in the base's dtype.
pub(crate) fn logits(base: &Base, delta: &Delta<'_>, batch: &Batch) -> Result<Tensor> {
    let (b, t) = (batch.sequences, batch.len);
    let (heads, kv_heads, hd) = (base.heads, base.kv_heads, base.head_dim);
    let group = heads / kv_heads;
    let dtype = base.dtype;
    let cpu = Device::Cpu;
    let mut x = base
        .embed_tokens
        .index_select(&batch.tokens.flatten_all()?, 0)?;
    // RoPE tables as the serving forward computes them: angle = position · inv_freq in f32.
    let half = base.inv_freq.len();
    let mut cos = vec![0f32; t * 2 * half];
    let mut sin = vec![0f32; t * 2 * half];
    for p in 0..t {
        for i in 0..half {
            let angle = p as f32 * base.inv_freq[i];
            let row = p * 2 * half;
            cos[row + i] = angle.cos();
            cos[row + half + i] = angle.cos();
            sin[row + i] = angle.sin();
            sin[row + half + i] = angle.sin();
        }
    }
    let cos = Tensor::from_vec(cos, (t, 2 * half), &cpu)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (t, 2 * half), &cpu)?.to_dtype(dtype)?;
    let mask: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), &cpu)?.to_dtype(dtype)?;
    let attn_scale = 1.0 / (hd as f64).sqrt();
    let s = delta.scale;
    for (l, layer) in base.layers.iter().enumerate() {
        // Projection `j` of this layer, its bias and the adapter's pair.
        let proj = |x: &Tensor, j: Projection| {
            let i = j.index();
            project(
                x,
                &layer.projections[i],
                layer.biases[i].as_ref(),
                delta.pair(l, j),
                s,
            )
        };
        let h = rms_norm(&x, &layer.input_layernorm, base.rms_eps)?;
        let mut q = proj(&h, Projection::Q)?;
        let mut k = proj(&h, Projection::K)?;
        let v = proj(&h, Projection::V)?;
        // Qwen3: each head of q and k RMS-normalised over `head_dim`, before RoPE.
        if let Some([q_norm, k_norm]) = &layer.qk_norm {
            q = rms_norm(&q.reshape((b * t * heads, hd))?, q_norm, base.rms_eps)?
                .reshape((b * t, heads * hd))?;
            k = rms_norm(&k.reshape((b * t * kv_heads, hd))?, k_norm, base.rms_eps)?
                .reshape((b * t, kv_heads * hd))?;
        }
        let q = q
            .reshape((b, t, heads, hd))?
            .transpose(1, 2)?
            .contiguous()?;
        let k = k
            .reshape((b, t, kv_heads, hd))?
            .transpose(1, 2)?
            .contiguous()?;
        let v = v
            .reshape((b, t, kv_heads, hd))?
            .transpose(1, 2)?
            .contiguous()?;
        let q = rope(&q, &cos, &sin)?;
        let k = rope(&k, &cos, &sin)?;
        // Grouped-query attention: query head h reads key/value head h / group.
        let repeat = |x: &Tensor| -> Result<Tensor> {
            Ok(x.unsqueeze(2)?
                .broadcast_as((b, kv_heads, group, t, hd))?
                .reshape((b, heads, t, hd))?)
        };
        let (k, v) = (repeat(&k)?, repeat(&v)?);
        let scores = (q.matmul(&k.t()?.contiguous()?)? * attn_scale)?.broadcast_add(&mask)?;
        let attn = softmax_last(&scores)?.matmul(&v)?;
        let attn = attn
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * t, heads * hd))?;
        let o = proj(&attn, Projection::O)?;
        x = (x + o)?;
        let h = rms_norm(&x, &layer.post_attention_layernorm, base.rms_eps)?;
        let gate = proj(&h, Projection::Gate)?;
        let up = proj(&h, Projection::Up)?;
        let down = proj(&(gate.silu()? * up)?, Projection::Down)?;
        x = (x + down)?;
    }
    let x = rms_norm(&x, &base.norm, base.rms_eps)?;
    frozen_matmul(&x, &base.lm_head)
}

/// The weighted mean negative log-likelihood of the batch's targets, as a scalar tensor.
///
/// `weights` is `b·t` (row-major like the batch): the weight of predicting row `r + 1`'s token
/// from row `r`; it is 0 at each sequence's last position and over padding. `weight_sum` is
/// their sum (positive, checked by the caller).
pub(crate) fn loss(
    base: &Base,
    delta: &Delta<'_>,
    batch: &Batch,
    targets: &[u32],
    weights: &[f32],
    weight_sum: f64,
) -> Result<Tensor> {
    let logits = logits(base, delta, batch)?;
    let log_probs = log_softmax_last(&logits)?;
    let n = targets.len();
    let targets = Tensor::from_slice(targets, (n, 1), &Device::Cpu)?;
    let picked = log_probs.gather(&targets, 1)?.flatten_all()?;
    let weights = Tensor::from_slice(weights, n, &Device::Cpu)?.to_dtype(base.dtype)?;
    Ok(((picked * weights)?.sum_all()? * (-1.0 / weight_sum))?)
}
