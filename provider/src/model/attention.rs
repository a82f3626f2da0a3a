//! Grouped-query self-attention (Ainslie et al. 2023), as Hugging Face's `LlamaAttention`:
//! q/k/v projections (with their biases, where the architecture has them: Qwen2's q/k/v,
//! Llama's and Qwen3's `attention_bias`), Qwen3's per-head RMSNorm of q and k
//! (`Qwen3Attention`'s `q_norm`/`k_norm`), rotary embeddings on q and k, causal softmax
//! attention over the sequence's cache, the o projection. Every LoRA delta rides on its
//! projection ([`Linear`]).
//!
//! Scores, softmax and the weighted sum are cx-kernels' [`cx_kernels::attend`] (a (row, head)
//! pair per work item, fixed-order arithmetic inside one); the per-head norms are plain
//! sequential loops over one row and one head. Either way a row's bits do not depend on the
//! other rows of the batch (class D).

use cx_kernels::{AttendRow, Heads};

use super::config::{ModelConfig, Projection};
use super::layer::RmsNorm;
use super::linear::Linear;
use super::rotary::RotaryTables;
use super::{SeqInput, Step};
use crate::error::Result;

/// One layer's attention block.
#[derive(Clone, Debug)]
pub(super) struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// Qwen3's RMSNorm over each query head (`head_dim`), before RoPE.
    q_norm: Option<RmsNorm>,
    /// Qwen3's RMSNorm over each key head (`head_dim`), before RoPE.
    k_norm: Option<RmsNorm>,
    layer: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    /// `projections` are q, k, v, o in [`Projection::ALL`] order; `qk_norm` the per-head
    /// norms of q and k (weights of `head_dim`), where the architecture has them.
    pub(super) fn new(
        config: &ModelConfig,
        layer: usize,
        projections: [Linear; 4],
        qk_norm: Option<[RmsNorm; 2]>,
    ) -> Self {
        let [q_proj, k_proj, v_proj, o_proj] = projections;
        let (q_norm, k_norm) = match qk_norm {
            Some([q, k]) => (Some(q), Some(k)),
            None => (None, None),
        };
        Self {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            layer,
            heads: config.num_attention_heads,
            kv_heads: config.kv_heads(),
            head_dim: config.head_dim(),
        }
    }

    /// The projections, in [`Projection::ALL`] order.
    pub(super) fn projections(&self) -> [&Linear; 4] {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
    }

    /// The per-head norms of q and k, where the architecture has them.
    pub(super) fn qk_norms(&self) -> Option<[&RmsNorm; 2]> {
        Some([self.q_norm.as_ref()?, self.k_norm.as_ref()?])
    }

    /// Elements of all its weights (projections, biases, norms).
    pub(super) fn len(&self) -> usize {
        let norms = [&self.q_norm, &self.k_norm]
            .into_iter()
            .flatten()
            .map(RmsNorm::len)
            .sum::<usize>();
        self.projections().iter().map(|p| p.len()).sum::<usize>() + norms
    }

    /// This block with `adapter` merged into its projections.
    pub(super) fn merged(&self, adapter: &crate::lora::Adapter) -> Result<Self> {
        Ok(Self {
            q_proj: self.q_proj.merged(adapter)?,
            k_proj: self.k_proj.merged(adapter)?,
            v_proj: self.v_proj.merged(adapter)?,
            o_proj: self.o_proj.merged(adapter)?,
            ..self.clone()
        })
    }

    /// Appends each row's key and value to its sequence's cache, then attends.
    ///
    /// Shapes: `h` is `step.rows × hidden`; returns `step.rows × hidden`.
    pub(super) fn forward(
        &self,
        h: &[f32],
        step: &Step<'_>,
        rope: &RotaryTables,
        batch: &mut [SeqInput<'_>],
    ) -> Result<Vec<f32>> {
        let (l, hd) = (self.layer, self.head_dim);
        let kv_width = self.kv_heads * hd;
        let q_width = self.heads * hd;
        let [mut q, mut k, v] =
            Linear::forward_all([&self.q_proj, &self.k_proj, &self.v_proj], h, step)?;
        // Qwen3: each head of q and k normalised on its own (the norm's weight is one head
        // wide, so `RmsNorm::forward` takes the rows × heads buffer head by head).
        if let Some(norm) = &self.q_norm {
            q = norm.forward(&q);
        }
        if let Some(norm) = &self.k_norm {
            k = norm.forward(&k);
        }
        for r in 0..step.rows {
            rope.apply(r, &mut q[r * q_width..(r + 1) * q_width]);
            rope.apply(r, &mut k[r * kv_width..(r + 1) * kv_width]);
        }
        // Append every new key/value before attending, so a prompt's rows see each other.
        for r in 0..step.rows {
            let seq = &mut batch[step.row_seq[r]];
            seq.cache.keys[l].extend_from_slice(&k[r * kv_width..(r + 1) * kv_width]);
            seq.cache.values[l].extend_from_slice(&v[r * kv_width..(r + 1) * kv_width]);
        }
        let rows: Vec<AttendRow<'_>> = (0..step.rows)
            .map(|r| {
                let cache = &batch[step.row_seq[r]].cache;
                AttendRow {
                    q: &q[r * q_width..(r + 1) * q_width],
                    keys: &cache.keys[l],
                    values: &cache.values[l],
                    visible: step.row_pos[r] + 1,
                }
            })
            .collect();
        let mut attn = vec![0f32; step.rows * q_width];
        let heads = Heads {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: hd,
        };
        cx_kernels::attend(&rows, heads, &mut attn, step.cpu)?;
        self.o_proj.forward(&attn, step)
    }
}

/// The attention projections of a layer, for [`Attention::new`].
pub(super) const PROJECTIONS: [Projection; 4] =
    [Projection::Q, Projection::K, Projection::V, Projection::O];
