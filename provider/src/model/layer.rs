//! A decoder layer, as Hugging Face's `LlamaDecoderLayer`: pre-norm residual blocks,
//! `x += attention(rms_norm(x))`, then `x += mlp(rms_norm(x))`.

use super::attention::Attention;
use super::linear::Linear;
use super::mlp::Mlp;
use super::rotary::RotaryTables;
use super::{SeqInput, Step};
use crate::error::Result;
use crate::lora::Adapter;

/// RMSNorm (Zhang & Sennrich 2019), as Hugging Face's `LlamaRMSNorm` (and `Qwen3RMSNorm`,
/// which Qwen3 also applies to each head of q and k).
#[derive(Clone, Debug)]
pub(super) struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub(super) fn new(weight: Vec<f32>, eps: f64) -> Self {
        Self {
            weight,
            eps: eps as f32,
        }
    }

    /// The weight and `eps`, as the forward uses them (`f32`).
    pub(super) fn parts(&self) -> (&[f32], f32) {
        (&self.weight, self.eps)
    }

    /// Elements of the weight.
    pub(super) fn len(&self) -> usize {
        self.weight.len()
    }

    /// `w ⊙ x / sqrt(mean(x²) + eps)` per row, one sequential sum per row.
    ///
    /// Shapes: `x` is `rows × d` with `d` the weight's length (a head's width for Qwen3's q/k
    /// norms, whose rows are then heads); returns the same shape.
    pub(super) fn forward(&self, x: &[f32]) -> Vec<f32> {
        let d = self.weight.len();
        let mut out = vec![0f32; x.len()];
        for (row, o) in x.chunks(d).zip(out.chunks_mut(d)) {
            let mut sum = 0f32;
            for v in row {
                sum += v * v;
            }
            let inv = 1.0 / (sum / d as f32 + self.eps).sqrt();
            for ((o, v), w) in o.iter_mut().zip(row).zip(&self.weight) {
                *o = w * (v * inv);
            }
        }
        out
    }
}

/// One decoder layer.
#[derive(Clone, Debug)]
pub(super) struct DecoderLayer {
    pub(super) input_layernorm: RmsNorm,
    pub(super) self_attn: Attention,
    pub(super) post_attention_layernorm: RmsNorm,
    pub(super) mlp: Mlp,
}

impl DecoderLayer {
    /// Its seven projections in Hugging Face's order: q, k, v, o, gate, up, down.
    pub(super) fn projections(&self) -> [&Linear; 7] {
        let [q, k, v, o] = self.self_attn.projections();
        let [gate, up, down] = self.mlp.projections();
        [q, k, v, o, gate, up, down]
    }

    /// Elements of all its weights.
    pub(super) fn len(&self) -> usize {
        let mlp: usize = self.mlp.projections().iter().map(|p| p.len()).sum();
        self.input_layernorm.len()
            + self.post_attention_layernorm.len()
            + self.self_attn.len()
            + mlp
    }

    /// This layer with `adapter` merged into its projections.
    pub(super) fn merged(&self, adapter: &Adapter) -> Result<Self> {
        Ok(Self {
            self_attn: self.self_attn.merged(adapter)?,
            mlp: self.mlp.merged(adapter)?,
            ..self.clone()
        })
    }

    /// Updates the residual stream `x` (`step.rows × hidden`) in place.
    pub(super) fn forward(
        &self,
        x: &mut [f32],
        step: &Step<'_>,
        rope: &RotaryTables,
        batch: &mut [SeqInput<'_>],
    ) -> Result<()> {
        let h = self.input_layernorm.forward(x);
        let o = self.self_attn.forward(&h, step, rope, batch)?;
        for (xi, oi) in x.iter_mut().zip(&o) {
            *xi += oi;
        }
        let h = self.post_attention_layernorm.forward(x);
        let down = self.mlp.forward(&h, step)?;
        for (xi, di) in x.iter_mut().zip(&down) {
            *xi += di;
        }
        Ok(())
    }
}
