//! The SwiGLU MLP (Shazeer 2020, "GLU Variants Improve Transformer"), as Hugging Face's
//! `LlamaMLP`: `down(SiLU(gate(x)) ⊙ up(x))`.

use super::Step;
use super::config::Projection;
use super::linear::Linear;
use crate::error::Result;

/// One layer's MLP block.
#[derive(Clone, Debug)]
pub(super) struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// The MLP projections of a layer, for [`Mlp::new`].
pub(super) const PROJECTIONS: [Projection; 3] =
    [Projection::Gate, Projection::Up, Projection::Down];

impl Mlp {
    /// `projections` are gate, up, down.
    pub(super) fn new(projections: [Linear; 3]) -> Self {
        let [gate_proj, up_proj, down_proj] = projections;
        Self {
            gate_proj,
            up_proj,
            down_proj,
        }
    }

    /// The projections, in [`Projection::ALL`] order.
    pub(super) fn projections(&self) -> [&Linear; 3] {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
    }

    /// This block with `adapter` merged into its projections.
    pub(super) fn merged(&self, adapter: &crate::lora::Adapter) -> Result<Self> {
        Ok(Self {
            gate_proj: self.gate_proj.merged(adapter)?,
            up_proj: self.up_proj.merged(adapter)?,
            down_proj: self.down_proj.merged(adapter)?,
        })
    }

    /// Shapes: `h` is `step.rows × hidden`; returns `step.rows × hidden`.
    pub(super) fn forward(&self, h: &[f32], step: &Step<'_>) -> Result<Vec<f32>> {
        let [gate, mut up] = Linear::forward_all([&self.gate_proj, &self.up_proj], h, step)?;
        for (u, g) in up.iter_mut().zip(&gate) {
            // SiLU(g)·u.
            *u *= g / (1.0 + (-g).exp());
        }
        self.down_proj.forward(&up, step)
    }
}
