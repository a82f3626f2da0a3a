//! A projection of a decoder layer: the frozen base weight `W` (and bias `b`, where the
//! architecture has one) and, for the rows whose adapter adapts it, the LoRA delta
//! `s·(x·Aᵀ)·Bᵀ` by cx-kernels' SGMV. The delta is never merged.
//!
//! # Why every reduction is ours
//! Class D (`Mode::Deterministic`) multiplies with [`cx_kernels::gemm_xwt`] on the tensor's own
//! buffer and [`cx_kernels::Device::sgmv`], whose reductions have a fixed order per output
//! element; `Mode::Fast` (class D∞) runs the same GEMM with fused multiply-adds, faster where
//! the CPU has them, but with bits that differ between CPUs with and without FMA. The bias is
//! one addition per element, after the product and before the delta (PEFT adds the delta to
//! the base layer's output, bias included), the same in both modes.

use std::sync::Arc;

use candle_core::{DType, Tensor};
use cx_kernels::{
    CpuConfig, LoraAdapter, QuantMatrix, WeightView, gemm_xwt_many, segments_from_row_adapters,
};

use super::Step;
use super::config::Projection;
use super::weights::WeightData;
use crate::error::{Error, Result};
use crate::lora::Adapter;

/// A `Linear` weight (`d_out × d_in`, contiguous) as the checkpoint stored it: a candle
/// tensor, `f32` or `bf16` (a bf16 weight is never widened in memory: the GEMM widens each
/// panel as it reads it, exactly, so the products are the bits an `f32` copy would give), or
/// ggml blocks (dequantized a panel at a time by the GEMM, likewise exactly).
#[derive(Clone, Debug)]
pub(super) struct Weight {
    stored: Stored,
    pub(super) d_out: usize,
    pub(super) d_in: usize,
}

#[derive(Clone, Debug)]
enum Stored {
    Tensor(Tensor),
    Quant(Arc<QuantMatrix>),
}

impl Weight {
    /// A weight kept in the element type it is given (`f32`, bf16 or f16).
    pub(super) fn new<T: candle_core::WithDType>(
        data: Vec<T>,
        d_out: usize,
        d_in: usize,
    ) -> Result<Self> {
        Ok(Self {
            stored: Stored::Tensor(Tensor::from_vec(
                data,
                (d_out, d_in),
                &candle_core::Device::Cpu,
            )?),
            d_out,
            d_in,
        })
    }

    /// A weight from a checkpoint's tensor, kept in the type it was stored in.
    pub(super) fn stored(data: WeightData, d_out: usize, d_in: usize) -> Result<Self> {
        match data {
            WeightData::F32(data) => Self::new(data, d_out, d_in),
            WeightData::Bf16(data) => Self::new(data, d_out, d_in),
            WeightData::F16(data) => Self::new(data, d_out, d_in),
            WeightData::Quant(m) => {
                if (m.d_out(), m.d_in()) != (d_out, d_in) {
                    return Err(Error::Model(format!(
                        "a quantized {} × {} matrix where {d_out} × {d_in} is expected",
                        m.d_out(),
                        m.d_in()
                    )));
                }
                Ok(Self {
                    stored: Stored::Quant(Arc::new(m)),
                    d_out,
                    d_in,
                })
            }
        }
    }

    /// Calls `f` with the weight's `d_out × d_in` row-major elements.
    fn with_elements<R>(&self, f: impl FnOnce(WeightView<'_>) -> Result<R>) -> Result<R> {
        Self::with_all_elements([self], |[w]| f(w))
    }

    /// Calls `f` with the elements of every weight of `weights` at once.
    fn with_all_elements<const N: usize, R>(
        weights: [&Self; N],
        f: impl FnOnce([WeightView<'_>; N]) -> Result<R>,
    ) -> Result<R> {
        // The storages stay read-locked while `f` runs (candle's tensors share them).
        let held = weights.map(|w| match &w.stored {
            Stored::Quant(_) => None,
            Stored::Tensor(t) => Some(t.storage_and_layout()),
        });
        let mut elements = Vec::with_capacity(N);
        for (w, held) in weights.iter().zip(&held) {
            elements.push(match (&w.stored, held) {
                (Stored::Quant(m), _) => WeightView::Quant(m),
                (Stored::Tensor(t), Some((storage, layout))) => {
                    let range = layout.start_offset()..layout.start_offset() + w.d_out * w.d_in;
                    match &**storage {
                        candle_core::Storage::Cpu(cpu) if t.dtype() == DType::BF16 => {
                            WeightView::Bf16(&cpu.as_slice::<half::bf16>()?[range])
                        }
                        candle_core::Storage::Cpu(cpu) if t.dtype() == DType::F16 => {
                            WeightView::F16(&cpu.as_slice::<half::f16>()?[range])
                        }
                        candle_core::Storage::Cpu(cpu) => {
                            WeightView::F32(&cpu.as_slice::<f32>()?[range])
                        }
                        _ => return Err(Error::Model("weights must live in host memory".into())),
                    }
                }
                (Stored::Tensor(_), None) => unreachable!("a tensor's storage is held above"),
            });
        }
        let Ok(elements) = <[WeightView<'_>; N]>::try_from(elements) else {
            unreachable!("one element view per weight")
        };
        f(elements)
    }

    /// The `d_out × d_in` tensor for the training forward: the stored tensor itself (shared
    /// storage), or for a quantized weight its dequantized values as `f32` (a copy: training
    /// on a quantized base computes with exactly the values serving uses, at four bytes an
    /// element while it runs).
    pub(super) fn tensor(&self) -> Result<Tensor> {
        match &self.stored {
            Stored::Tensor(t) => Ok(t.clone()),
            Stored::Quant(m) => Ok(Tensor::from_vec(
                m.to_f32(),
                (self.d_out, self.d_in),
                &candle_core::Device::Cpu,
            )?),
        }
    }

    /// The block format, for a quantized weight.
    pub(super) fn quant_type(&self) -> Option<cx_kernels::QuantType> {
        match &self.stored {
            Stored::Quant(m) => Some(m.kind()),
            Stored::Tensor(_) => None,
        }
    }

    /// Whether its elements are held in bf16.
    pub(super) fn is_bf16(&self) -> bool {
        matches!(&self.stored, Stored::Tensor(t) if t.dtype() == DType::BF16)
    }

    /// Its elements as `f32` (a copy).
    fn to_vec(&self) -> Result<Vec<f32>> {
        self.with_elements(|w| {
            Ok(match w {
                WeightView::F32(w) => w.to_vec(),
                WeightView::Bf16(w) => w.iter().map(|v| v.to_f32()).collect(),
                WeightView::F16(w) => w.iter().map(|v| v.to_f32()).collect(),
                WeightView::Quant(m) => m.to_f32(),
            })
        })
    }

    /// Writes row `row` of each `rows[i]` into `out[i·d_in..]` as `f32` (an embedding lookup).
    pub(super) fn gather_rows(&self, rows: &[u32], out: &mut [f32]) -> Result<()> {
        let d = self.d_in;
        self.with_elements(|w| {
            for (i, &r) in rows.iter().enumerate() {
                let (r, dst) = (r as usize, &mut out[i * d..(i + 1) * d]);
                match w {
                    WeightView::F32(w) => dst.copy_from_slice(&w[r * d..(r + 1) * d]),
                    WeightView::Bf16(w) => {
                        for (o, v) in dst.iter_mut().zip(&w[r * d..(r + 1) * d]) {
                            *o = v.to_f32();
                        }
                    }
                    WeightView::F16(w) => {
                        for (o, v) in dst.iter_mut().zip(&w[r * d..(r + 1) * d]) {
                            *o = v.to_f32();
                        }
                    }
                    WeightView::Quant(m) => m.dequantize_rows(r, 1, dst),
                }
            }
            Ok(())
        })
    }

    /// Elements held.
    pub(super) fn len(&self) -> usize {
        self.d_out * self.d_in
    }

    /// Bytes held (2 an element for a bf16 or f16 weight, 4 for an `f32` one, the blocks' bytes
    /// for a quantized one).
    pub(super) fn bytes(&self) -> usize {
        match &self.stored {
            Stored::Tensor(t) => self.len() * t.dtype().size_in_bytes(),
            Stored::Quant(m) => m.bytes(),
        }
    }

    /// `x·Wᵀ`. Shapes: `x` is `rows × d_in`; returns `rows × d_out`.
    pub(super) fn apply(&self, x: &[f32], rows: usize, cpu: &CpuConfig) -> Result<Vec<f32>> {
        let [y] = Self::apply_all([self], x, rows, cpu)?;
        Ok(y)
    }

    /// `x·Wₚᵀ` for each weight of `weights` (all `d_in` wide), in one parallel pass of
    /// cx-kernels' GEMM ([`gemm_xwt_many`]: one hand-off to the worker pool for the group).
    /// Shapes: `x` is `rows × d_in`; returns a `rows × d_outₚ` buffer per weight.
    ///
    /// Both modes use cx-kernels' GEMM (fast mode with FMA). Fast mode used candle's matmul
    /// below 4 rows while cx-kernels spawned threads per product; on the persistent pool
    /// candle's path was the slower one (one stream at hidden 2048: 26.6 tokens/s against the
    /// deterministic kernel's 65).
    pub(super) fn apply_all<const N: usize>(
        weights: [&Self; N],
        x: &[f32],
        rows: usize,
        cpu: &CpuConfig,
    ) -> Result<[Vec<f32>; N]> {
        let Some(d_in) = weights.first().map(|w| w.d_in) else {
            return Ok(weights.map(|_| Vec::new()));
        };
        if let Some(w) = weights.iter().find(|w| w.d_in != d_in) {
            return Err(Error::Model(format!(
                "projections of one input must share its width: {} against {d_in}",
                w.d_in
            )));
        }
        let mut ys = weights.map(|w| vec![0f32; rows * w.d_out]);
        Self::with_all_elements(weights, |elements| {
            let mut products: Vec<(WeightView<'_>, &mut [f32])> = elements
                .into_iter()
                .zip(ys.iter_mut().map(Vec::as_mut_slice))
                .collect();
            Ok(gemm_xwt_many(x, rows, d_in, &mut products, cpu)?)
        })?;
        Ok(ys)
    }
}

/// Projection `projection` of decoder layer `layer`: base weight (and bias) plus the batch's
/// LoRA deltas.
#[derive(Clone, Debug)]
pub(super) struct Linear {
    weight: Weight,
    /// `d_out`, where the architecture has a bias on this projection.
    bias: Option<Vec<f32>>,
    layer: usize,
    projection: Projection,
}

impl Linear {
    /// The frozen base weight.
    pub(super) fn weight(&self) -> &Weight {
        &self.weight
    }

    /// The frozen bias (`d_out`), if any.
    pub(super) fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// `bias`, when given, must be `weight.d_out` long.
    pub(super) fn new(
        weight: Weight,
        bias: Option<Vec<f32>>,
        layer: usize,
        projection: Projection,
    ) -> Result<Self> {
        if let Some(b) = &bias
            && b.len() != weight.d_out
        {
            return Err(Error::Model(format!(
                "layer {layer} {} bias has {} elements, the projection {}",
                projection.name(),
                b.len(),
                weight.d_out
            )));
        }
        Ok(Self {
            weight,
            bias,
            layer,
            projection,
        })
    }

    /// Elements of the base weight and bias.
    pub(super) fn len(&self) -> usize {
        self.weight.len() + self.bias.as_ref().map_or(0, Vec::len)
    }

    /// `y = x·Wᵀ + b + Σ_segments s·(x·Aᵀ)·Bᵀ`, each row's delta from its own adapter (none
    /// for rows whose adapter does not adapt this projection).
    ///
    /// Shapes: `x` is `step.rows × d_in`; returns `step.rows × d_out`.
    pub(super) fn forward(&self, x: &[f32], step: &Step<'_>) -> Result<Vec<f32>> {
        let [y] = Self::forward_all([self], x, step)?;
        Ok(y)
    }

    /// [`Linear::forward`] of several projections of the same input (a layer's q, k and v;
    /// its gate and up), their base products in one pass ([`Weight::apply_all`]); the bits are
    /// those of each projection's own `forward`.
    pub(super) fn forward_all<const N: usize>(
        linears: [&Self; N],
        x: &[f32],
        step: &Step<'_>,
    ) -> Result<[Vec<f32>; N]> {
        let mut ys = Weight::apply_all(linears.map(|l| &l.weight), x, step.rows, step.cpu)?;
        for (linear, y) in linears.iter().zip(ys.iter_mut()) {
            linear.add_bias_and_deltas(x, y, step)?;
        }
        Ok(ys)
    }

    /// Adds the bias and the batch's LoRA deltas to `y = x·Wᵀ`.
    fn add_bias_and_deltas(&self, x: &[f32], y: &mut [f32], step: &Step<'_>) -> Result<()> {
        let (d_in, d_out) = (self.weight.d_in, self.weight.d_out);
        if let Some(bias) = &self.bias {
            for row in y.chunks_mut(d_out) {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v += b;
                }
            }
        }
        // The table holds the adapters that adapt this projection; rows of others get no delta.
        let mut table: Vec<&LoraAdapter<f32>> = Vec::new();
        let mut slot: Vec<Option<usize>> = Vec::with_capacity(step.adapters.len());
        for adapter in &step.adapters {
            slot.push(adapter.projection(self.layer, self.projection).map(|lora| {
                table.push(lora);
                table.len() - 1
            }));
        }
        if table.is_empty() {
            return Ok(());
        }
        let rows_to_table: Vec<Option<usize>> = step
            .row_adapter
            .iter()
            .map(|a| a.and_then(|a| slot[a]))
            .collect();
        let segments = segments_from_row_adapters(&rows_to_table);
        step.device.sgmv(x, y, d_in, d_out, &segments, &table)?;
        Ok(())
    }

    /// This projection with `W + s·B·A` of `adapter` folded in (unchanged when the adapter
    /// does not adapt it; the bias is kept as it is).
    pub(super) fn merged(&self, adapter: &Adapter) -> Result<Self> {
        let Some(lora) = adapter.projection(self.layer, self.projection) else {
            return Ok(self.clone());
        };
        let mut merged = self.weight.to_vec()?;
        for (w, d) in merged.iter_mut().zip(lora.delta_dense()) {
            *w += d;
        }
        Ok(Self {
            weight: Weight::new(merged, self.weight.d_out, self.weight.d_in)?,
            ..self.clone()
        })
    }
}
