//! Per-tenant preferences as a one-bit sign delta over a shared base quote table.
//!
//! The base table holds one f32 per cell, `layers × cells` (a layer is a regime, a cell a
//! resource: model class × deadline bucket); its values are log price multipliers that
//! [`super::market::with_preference`] applies to a market quote. Tiers are deliberately not
//! cells: one multiplier for every tier of a class keeps the tiers of a tenant's quotes from
//! crossing. A tenant's own table is stored as
//!
//! `T[l][c] ≈ base[l][c] + scale[l]·sign[l][c] + bias[l]`,  `sign ∈ {−1, +1}`,
//!
//! i.e. one bit per cell plus two full-precision f32s per layer — the BitDelta idea
//! (Liu et al. 2024) applied to a quote table. For a fixed sign pattern the least-squares
//! optimal `bias` is the layer's mean delta and the optimal `scale` the mean absolute residual,
//! which is what [`TenantDelta::fit`] computes. Memory per tenant is `⌈L·C/8⌉ + 8·L` bytes
//! against `4·L·C` for an f32 table: ≈ 32× smaller once a layer has a few hundred cells.

use crate::error::{Result, invalid};
use serde::Serialize;

/// The shared base table, `layers × cells`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseTable {
    layers: usize,
    cells: usize,
    values: Vec<f32>,
}

impl BaseTable {
    /// A table from row-major values (`values.len() == layers × cells`, all finite).
    pub fn new(layers: usize, cells: usize, values: Vec<f32>) -> Result<Self> {
        if layers == 0 || cells == 0 {
            return Err(invalid(
                "base_table",
                "needs at least one layer and one cell",
            ));
        }
        if values.len() != layers * cells {
            return Err(invalid(
                "base_table.values",
                format!(
                    "expected {} values ({layers}×{cells}), got {}",
                    layers * cells,
                    values.len()
                ),
            ));
        }
        check_finite("base_table.values", &values)?;
        Ok(Self {
            layers,
            cells,
            values,
        })
    }

    /// Number of layers (regimes).
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Cells per layer (resources).
    pub fn cells(&self) -> usize {
        self.cells
    }

    /// The value of one cell.
    pub fn value(&self, layer: usize, cell: usize) -> f32 {
        self.values[layer * self.cells + cell]
    }

    /// Bytes a full f32 table of this shape takes: what a tenant would cost without the delta.
    pub fn f32_bytes(&self) -> usize {
        self.values.len() * std::mem::size_of::<f32>()
    }
}

fn check_finite(field: &str, values: &[f32]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(invalid(&format!("{field}[{i}]"), "must be finite")),
        None => Ok(()),
    }
}

/// One tenant's compressed preferences over a [`BaseTable`].
#[derive(Debug, Clone, PartialEq)]
pub struct TenantDelta {
    cells: usize,
    /// One bit per cell, row-major, bit set = +1.
    signs: Vec<u64>,
    /// Per-layer scale (≥ 0).
    scales: Vec<f32>,
    /// Per-layer bias.
    biases: Vec<f32>,
}

impl TenantDelta {
    /// Fits the delta of a tenant's full table (row-major, the base's shape) to the base.
    pub fn fit(base: &BaseTable, full: &[f32]) -> Result<Self> {
        if full.len() != base.values.len() {
            return Err(invalid(
                "tenant_table",
                format!("expected {} values, got {}", base.values.len(), full.len()),
            ));
        }
        check_finite("tenant_table", full)?;
        let (layers, cells) = (base.layers, base.cells);
        let mut signs = vec![0u64; (layers * cells).div_ceil(64)];
        let mut scales = Vec::with_capacity(layers);
        let mut biases = Vec::with_capacity(layers);
        for l in 0..layers {
            let row = l * cells..(l + 1) * cells;
            let delta = || {
                full[row.clone()]
                    .iter()
                    .zip(&base.values[row.clone()])
                    .map(|(t, b)| f64::from(t - b))
            };
            let bias = delta().sum::<f64>() / cells as f64;
            let scale = delta().map(|d| (d - bias).abs()).sum::<f64>() / cells as f64;
            for (c, d) in delta().enumerate() {
                if d - bias >= 0.0 {
                    let bit = l * cells + c;
                    signs[bit / 64] |= 1 << (bit % 64);
                }
            }
            scales.push(scale as f32);
            biases.push(bias as f32);
        }
        Ok(Self {
            cells,
            signs,
            scales,
            biases,
        })
    }

    /// The tenant's value of one cell: `base + scale·sign + bias`.
    pub fn value(&self, base: &BaseTable, layer: usize, cell: usize) -> f32 {
        let bit = layer * self.cells + cell;
        let sign = if self.signs[bit / 64] >> (bit % 64) & 1 == 1 {
            1.0
        } else {
            -1.0
        };
        base.value(layer, cell) + self.scales[layer] * sign + self.biases[layer]
    }

    /// The whole reconstructed table, row-major.
    pub fn reconstruct(&self, base: &BaseTable) -> Vec<f32> {
        (0..base.layers)
            .flat_map(|l| (0..base.cells).map(move |c| (l, c)))
            .map(|(l, c)| self.value(base, l, c))
            .collect()
    }

    /// Bytes of tenant-specific state: packed sign bits plus an f32 scale and bias per layer.
    pub fn bytes(&self) -> usize {
        let layers = self.scales.len();
        (layers * self.cells).div_ceil(8) + layers * 2 * std::mem::size_of::<f32>()
    }
}

/// How far a reconstruction is from the full table.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReconstructionError {
    /// Root mean square error over cells.
    pub rmse: f64,
    /// RMSE ÷ RMS of the tenant's delta from the base (1.0 = no better than storing no delta).
    pub relative_to_delta: f64,
    /// Largest absolute error of a cell.
    pub max_abs: f64,
}

/// Measures a reconstruction against the full f32 table it came from.
pub fn reconstruction_error(
    base: &BaseTable,
    full: &[f32],
    reconstructed: &[f32],
) -> ReconstructionError {
    let n = full.len().max(1) as f64;
    let mut se = 0.0;
    let mut delta_sq = 0.0;
    let mut max_abs = 0.0f64;
    for ((f, r), b) in full.iter().zip(reconstructed).zip(&base.values) {
        let e = f64::from(f - r);
        se += e * e;
        max_abs = max_abs.max(e.abs());
        delta_sq += f64::from(f - b).powi(2);
    }
    let rmse = (se / n).sqrt();
    let delta_rms = (delta_sq / n).sqrt();
    ReconstructionError {
        rmse,
        relative_to_delta: if delta_rms > 0.0 {
            rmse / delta_rms
        } else {
            0.0
        },
        max_abs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::TraceRng;

    fn tables(layers: usize, cells: usize) -> (BaseTable, Vec<f32>) {
        let mut rng = TraceRng::new(3);
        let base: Vec<f32> = (0..layers * cells)
            .map(|_| rng.normal() as f32 * 0.3)
            .collect();
        // A tenant that likes some resources and dislikes others, by a layer-wide amount.
        let full: Vec<f32> = base
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let layer = (i / cells) as f32;
                let like = if rng.next_f64() < 0.5 { 0.1 } else { -0.1 };
                b + like * (1.0 + layer) + 0.05 + rng.normal() as f32 * 0.01
            })
            .collect();
        (BaseTable::new(layers, cells, base).unwrap(), full)
    }

    #[test]
    fn sign_delta_is_about_32x_smaller_and_close() {
        let (base, full) = tables(3, 1024);
        let delta = TenantDelta::fit(&base, &full).unwrap();
        let ratio = base.f32_bytes() as f64 / delta.bytes() as f64;
        assert!(ratio > 29.0 && ratio <= 32.0, "compression {ratio}");
        let err = reconstruction_error(&base, &full, &delta.reconstruct(&base));
        assert!(err.relative_to_delta < 0.15, "{err:?}");
    }

    #[test]
    fn exact_sign_deltas_reconstruct_exactly() {
        let base = BaseTable::new(2, 4, vec![0.0, 1.0, 2.0, 3.0, 0.5, 0.5, 0.5, 0.5]).unwrap();
        let full = [0.2, 0.8, 2.2, 2.8, 1.5, 0.5, 1.5, 0.5];
        let delta = TenantDelta::fit(&base, &full).unwrap();
        for (r, f) in delta.reconstruct(&base).iter().zip(full) {
            assert!((r - f).abs() < 1e-6, "{r} vs {f}");
        }
    }

    #[test]
    fn shape_mismatch_and_nan_are_refused() {
        let base = BaseTable::new(1, 2, vec![0.0, 0.0]).unwrap();
        assert!(TenantDelta::fit(&base, &[0.0]).is_err());
        let err = TenantDelta::fit(&base, &[0.0, f32::NAN]).unwrap_err();
        assert!(err.to_string().contains("tenant_table[1]"), "{err}");
        assert!(BaseTable::new(1, 2, vec![0.0]).is_err());
    }
}
