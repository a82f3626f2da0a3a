//! Rotary position embeddings (Su et al. 2021, "RoFormer"), applied as Hugging Face's
//! `apply_rotary_pos_emb` with `rotate_half` does: the two halves of each head, not interleaved
//! pairs; frequencies rescaled as `rope_scaling` asks.

use super::config::ModelConfig;

/// The inverse frequencies of one head width.
#[derive(Clone, Debug)]
pub(super) struct RotaryEmbedding {
    inv_freq: Vec<f32>,
}

/// `cos`/`sin` of each row's angles (`rows × head_dim/2`).
pub(super) struct RotaryTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl RotaryEmbedding {
    /// `θ^(−2i/d_head)`, rescaled as `rope_scaling` asks (Hugging Face
    /// `_compute_llama3_parameters` / `_compute_linear_scaling_rope_parameters`).
    pub(super) fn new(config: &ModelConfig) -> Self {
        let hd = config.head_dim();
        let base: Vec<f64> = (0..hd / 2)
            .map(|i| 1.0 / config.rope_theta.powf((2 * i) as f64 / hd as f64))
            .collect();
        let scaled: Vec<f64> = match &config.rope_scaling {
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
        Self {
            inv_freq: scaled.into_iter().map(|f| f as f32).collect(),
        }
    }

    /// The inverse frequencies (`head_dim/2`, `f32`), as [`tables`](Self::tables) uses them.
    pub(super) fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// The tables of rows at `positions`: angle = position · inv_freq (`f32`, as Hugging Face
    /// computes it).
    pub(super) fn tables(&self, positions: &[usize]) -> RotaryTables {
        let half = self.inv_freq.len();
        let mut cos = vec![0f32; positions.len() * half];
        let mut sin = vec![0f32; positions.len() * half];
        for (r, &position) in positions.iter().enumerate() {
            for i in 0..half {
                let angle = position as f32 * self.inv_freq[i];
                cos[r * half + i] = angle.cos();
                sin[r * half + i] = angle.sin();
            }
        }
        RotaryTables { cos, sin, half }
    }
}

impl RotaryTables {
    /// Rotates every head of row `row` in place (`heads` is `n × head_dim`):
    /// `x·cos + rotate_half(x)·sin`, where `rotate_half(x) = (−x₂, x₁)` over the two halves.
    pub(super) fn apply(&self, row: usize, heads: &mut [f32]) {
        let half = self.half;
        let cos = &self.cos[row * half..(row + 1) * half];
        let sin = &self.sin[row * half..(row + 1) * half];
        for head in heads.chunks_mut(2 * half) {
            for i in 0..half {
                let (x1, x2) = (head[i], head[i + half]);
                head[i] = x1 * cos[i] - x2 * sin[i];
                head[i + half] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}
