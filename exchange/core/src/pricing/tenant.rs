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

/// Deadline buckets of a preference cell: θ (the job's work ÷ its deadline, in [0, 1]) in
/// quarters — a tenant may pay more for tight deadlines than for loose ones.
pub const DEADLINE_BUCKETS: usize = 4;

/// The cell of a (model class, θ) pair: `model_index × DEADLINE_BUCKETS + bucket(θ)`.
pub fn cell(model_index: usize, theta: f64) -> usize {
    let theta = if theta.is_finite() {
        theta.clamp(0.0, 1.0)
    } else {
        1.0
    };
    let bucket = ((theta * DEADLINE_BUCKETS as f64) as usize).min(DEADLINE_BUCKETS - 1);
    model_index * DEADLINE_BUCKETS + bucket
}

/// A tenant's delta in storable form: the packed sign bits (little-endian u64 words) and the
/// per-layer scales and biases.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct DeltaParts {
    /// Cells per layer.
    pub cells: usize,
    /// Sign bits, row-major, bit set = +1, as little-endian 64-bit words.
    pub signs: Vec<u8>,
    /// Per-layer scale (≥ 0).
    pub scales: Vec<f32>,
    /// Per-layer bias.
    pub biases: Vec<f32>,
}

impl TenantDelta {
    /// The delta of a tenant with no preference yet: every cell equal to the base (scale and
    /// bias 0).
    pub fn neutral(base: &BaseTable) -> Self {
        Self {
            cells: base.cells,
            signs: vec![0; (base.layers * base.cells).div_ceil(64)],
            scales: vec![0.0; base.layers],
            biases: vec![0.0; base.layers],
        }
    }

    /// Learns one observation online, in the compressed form itself (no full table is kept):
    /// the cell's value `base + scale·sign + bias` moves toward `target` by `rate` — the
    /// layer's bias by the whole error (a tenant's level in that regime, full precision), the
    /// layer's scale along the cell's sign, and the cell's sign bit to the side of the bias the
    /// target is on. Refuses a cell or layer outside the base, a non-finite target, or a rate
    /// outside (0, 1].
    pub fn learn(
        &mut self,
        base: &BaseTable,
        layer: usize,
        cell: usize,
        target: f32,
        rate: f32,
    ) -> Result<()> {
        if layer >= base.layers || cell >= base.cells || self.cells != base.cells {
            return Err(invalid(
                "preference.cell",
                format!(
                    "({layer}, {cell}) is outside the {}×{} table",
                    base.layers, base.cells
                ),
            ));
        }
        if !target.is_finite() {
            return Err(invalid("preference.target", "must be finite"));
        }
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(invalid("preference.rate", "must be within (0, 1]"));
        }
        let bit = layer * self.cells + cell;
        let sign = if self.signs[bit / 64] >> (bit % 64) & 1 == 1 {
            1.0
        } else {
            -1.0
        };
        let error = target - self.value(base, layer, cell);
        self.biases[layer] += rate * error;
        self.scales[layer] = (self.scales[layer] + rate * sign * error).max(0.0);
        let above = target - base.value(layer, cell) - self.biases[layer] >= 0.0;
        if above {
            self.signs[bit / 64] |= 1 << (bit % 64);
        } else {
            self.signs[bit / 64] &= !(1 << (bit % 64));
        }
        Ok(())
    }

    /// The storable form.
    pub fn to_parts(&self) -> DeltaParts {
        DeltaParts {
            cells: self.cells,
            signs: self.signs.iter().flat_map(|w| w.to_le_bytes()).collect(),
            scales: self.scales.clone(),
            biases: self.biases.clone(),
        }
    }

    /// A delta from its stored form, checked against `base` (its shape, finite values, scales
    /// ≥ 0): a stored delta of another shape (the catalog changed) is refused, not misread.
    pub fn from_parts(base: &BaseTable, parts: &DeltaParts) -> Result<Self> {
        let words = (base.layers * base.cells).div_ceil(64);
        if parts.cells != base.cells
            || parts.signs.len() != words * 8
            || parts.scales.len() != base.layers
            || parts.biases.len() != base.layers
        {
            return Err(invalid(
                "preference",
                format!(
                    "a stored delta of another shape than the {}×{} table",
                    base.layers, base.cells
                ),
            ));
        }
        check_finite("preference.scales", &parts.scales)?;
        check_finite("preference.biases", &parts.biases)?;
        if parts.scales.iter().any(|s| *s < 0.0) {
            return Err(invalid("preference.scales", "must be >= 0"));
        }
        let signs = parts
            .signs
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("chunks of 8")))
            .collect();
        Ok(Self {
            cells: parts.cells,
            signs,
            scales: parts.scales.clone(),
            biases: parts.biases.clone(),
        })
    }

    /// Per-layer (scale, bias).
    pub fn layers(&self) -> impl Iterator<Item = (f32, f32)> + '_ {
        self.scales.iter().copied().zip(self.biases.iter().copied())
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
    fn learning_online_in_the_compressed_form_reaches_the_target_and_round_trips() {
        let base = BaseTable::new(3, 8, vec![0.0; 24]).unwrap();
        let mut delta = TenantDelta::neutral(&base);
        assert!(delta.reconstruct(&base).iter().all(|v| *v == 0.0));
        for _ in 0..40 {
            delta.learn(&base, 1, 5, -0.3, 0.25).unwrap();
        }
        assert!((delta.value(&base, 1, 5) + 0.3).abs() < 0.02, "{delta:?}");
        // Other layers are untouched.
        assert_eq!(delta.value(&base, 0, 5), 0.0);
        let parts = delta.to_parts();
        assert_eq!(TenantDelta::from_parts(&base, &parts).unwrap(), delta);
        let other = BaseTable::new(3, 12, vec![0.0; 36]).unwrap();
        assert!(TenantDelta::from_parts(&other, &parts).is_err());
        assert!(delta.learn(&base, 3, 0, 0.1, 0.25).is_err());
        assert!(delta.learn(&base, 0, 0, f32::NAN, 0.25).is_err());
        assert!(delta.learn(&base, 0, 0, 0.1, 0.0).is_err());
        assert_eq!(cell(2, 0.0), 8);
        assert_eq!(cell(2, 1.0), 11);
        assert_eq!(cell(0, f64::NAN), 3);
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
