//! AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"), as PyTorch's
//! `torch.optim.AdamW` computes it, on candle tensors of any float dtype:
//!
//! ```text
//! θ ← θ·(1 − lr·λ)                         decoupled weight decay
//! m ← β₁·m + (1 − β₁)·g                     first moment
//! v ← β₂·v + (1 − β₂)·g²                    second moment
//! θ ← θ − lr · (m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε)   bias-corrected step, t from 1
//! ```
//!
//! with optional clipping of the gradients' global L2 norm first, as
//! `torch.nn.utils.clip_grad_norm_` does (`g ← g · max_norm / (‖g‖ + 1e-6)` when `‖g‖ >
//! max_norm`).

use candle_core::Tensor;
use serde::Serialize;

use crate::error::Result;

/// The optimizer's settings for one step (PyTorch's defaults: betas (0.9, 0.999), eps 1e-8,
/// weight decay 0.01).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AdamWParams {
    /// Learning rate `lr`.
    pub lr: f64,
    /// `β₁`, `β₂`.
    pub betas: (f64, f64),
    /// `ε`.
    pub eps: f64,
    /// Decoupled weight decay `λ`.
    pub weight_decay: f64,
    /// Clip the gradients' global L2 norm to this first, if set.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWParams {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: None,
        }
    }
}

impl AdamWParams {
    /// The first setting out of range, as (field, reason): lr > 0, β in [0, 1), ε > 0,
    /// λ ≥ 0, max_grad_norm > 0, all finite.
    pub fn check(&self) -> Option<(&'static str, String)> {
        cx_protocol::train::check_optimizer(
            self.lr,
            [self.betas.0, self.betas.1],
            self.eps,
            self.weight_decay,
            self.max_grad_norm,
        )
    }
}

/// One parameter's moments.
#[derive(Clone, Debug)]
pub(crate) struct Moments {
    m: Tensor,
    v: Tensor,
}

impl Moments {
    /// Zero moments shaped like `param`.
    pub(crate) fn zeros_like(param: &Tensor) -> Result<Self> {
        Ok(Self {
            m: param.zeros_like()?,
            v: param.zeros_like()?,
        })
    }
}

/// The global L2 norm of `grads` (in `f64`).
pub(crate) fn global_norm(grads: &[Tensor]) -> Result<f64> {
    let mut sum = 0f64;
    for g in grads {
        sum += g
            .to_dtype(candle_core::DType::F64)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f64>()?;
    }
    Ok(sum.sqrt())
}

/// The factor `clip_grad_norm_` multiplies the gradients by (1 when under the limit).
pub(crate) fn clip_factor(norm: f64, max_norm: Option<f64>) -> f64 {
    match max_norm {
        Some(max) if norm > max => max / (norm + 1e-6),
        _ => 1.0,
    }
}

/// Step `t` (from 1) of AdamW on one parameter: returns the new parameter; updates `moments`.
/// `grad` is already clipped. Shapes: `param`, `grad` and the moments alike.
pub(crate) fn step(
    param: &Tensor,
    grad: &Tensor,
    moments: &mut Moments,
    params: &AdamWParams,
    t: u64,
) -> Result<Tensor> {
    let (b1, b2) = params.betas;
    let m = ((&moments.m * b1)? + (grad * (1.0 - b1))?)?;
    let v = ((&moments.v * b2)? + (grad.sqr()? * (1.0 - b2))?)?;
    let t = t as i32;
    let correction1 = 1.0 - b1.powi(t);
    let correction2 = 1.0 - b2.powi(t);
    let decayed = (param * (1.0 - params.lr * params.weight_decay))?;
    let m_hat = (&m / correction1)?;
    let denominator = ((&v / correction2)?.sqrt()? + params.eps)?;
    let update = ((m_hat / denominator)? * params.lr)?;
    moments.m = m;
    moments.v = v;
    Ok((decayed - update)?)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    /// Two steps worked by hand: θ₀ = [1, −2], g₁ = [0.5, 0.1], g₂ = [−0.3, 0.2], lr 0.1,
    /// β (0.9, 0.999), ε 1e-8, λ 0.01.
    ///
    /// Step 1, element 0: θ·(1 − 0.001) = 0.999; m = 0.05, v = 0.00025; m̂ = 0.5, v̂ = 0.25;
    /// θ = 0.999 − 0.1·0.5/(0.5 + 1e-8) = 0.899000002. Element 1: −1.998; m = 0.01,
    /// v = 1e-5, m̂ = 0.1, v̂ = 0.01, θ = −1.998 − 0.1·0.1/(0.1 + 1e-8) = −2.09799999.
    /// Step 2, element 0: θ = 0.899000002·0.999 = 0.898101001998; m = 0.045 − 0.03 = 0.015,
    /// v = 0.00024975 + 0.00009 = 0.00033975; m̂ = 0.015/0.19 = 0.0789473684…,
    /// v̂ = 0.00033975/0.001999 = 0.169959979…, √v̂ = 0.412262028…;
    /// θ = 0.898101001998 − 0.1·0.0789473684/0.412262038 = 0.878951…
    #[test]
    fn adamw_matches_the_hand_computed_steps() {
        let cpu = Device::Cpu;
        let params = AdamWParams {
            lr: 0.1,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: None,
        };
        let mut theta = Tensor::new(&[1.0f64, -2.0], &cpu).unwrap();
        let mut moments = Moments::zeros_like(&theta).unwrap();
        let g1 = Tensor::new(&[0.5f64, 0.1], &cpu).unwrap();
        theta = step(&theta, &g1, &mut moments, &params, 1).unwrap();
        let got = theta.to_vec1::<f64>().unwrap();
        let expected1: [f64; 2] = [0.999 - 0.05 / (0.5 + 1e-8), -1.998 - 0.01 / (0.1 + 1e-8)];
        assert!((expected1[0] - 0.899000002).abs() < 1e-12);
        assert!((expected1[1] + 2.09799999).abs() < 1e-9);
        for (g, e) in got.iter().zip(expected1) {
            assert!((g - e).abs() < 1e-15, "{got:?} vs {expected1:?}");
        }
        let g2 = Tensor::new(&[-0.3f64, 0.2], &cpu).unwrap();
        theta = step(&theta, &g2, &mut moments, &params, 2).unwrap();
        let got = theta.to_vec1::<f64>().unwrap();
        // The same formula by hand, element by element.
        let hand = |theta: f64, m1: f64, v1: f64, g: f64| {
            let decayed = theta * (1.0 - 0.1 * 0.01);
            let m = 0.9 * m1 + 0.1 * g;
            let v = 0.999 * v1 + 0.001 * g * g;
            let m_hat = m / (1.0 - 0.81);
            let v_hat = v / (1.0 - 0.999f64 * 0.999);
            decayed - 0.1 * m_hat / (v_hat.sqrt() + 1e-8)
        };
        let expected2: [f64; 2] = [
            hand(expected1[0], 0.05, 0.00025, -0.3),
            hand(expected1[1], 0.01, 1e-5, 0.2),
        ];
        assert!((expected2[0] - 0.878951).abs() < 1e-6, "{expected2:?}");
        for (g, e) in got.iter().zip(expected2) {
            assert!((g - e).abs() < 1e-14, "{got:?} vs {expected2:?}");
        }
    }

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let cpu = Device::Cpu;
        let g = [
            Tensor::new(&[3.0f64], &cpu).unwrap(),
            Tensor::new(&[4.0f64], &cpu).unwrap(),
        ];
        let norm = global_norm(&g).unwrap();
        assert_eq!(norm, 5.0);
        assert_eq!(clip_factor(norm, None), 1.0);
        assert_eq!(clip_factor(norm, Some(10.0)), 1.0);
        assert!((clip_factor(norm, Some(1.0)) - 1.0 / (5.0 + 1e-6)).abs() < 1e-15);
    }

    #[test]
    fn out_of_range_settings_name_their_field() {
        let nan = AdamWParams {
            lr: f64::NAN,
            ..AdamWParams::default()
        };
        assert_eq!(nan.check().unwrap().0, "lr");
        let beta = AdamWParams {
            betas: (0.9, 1.0),
            ..AdamWParams::default()
        };
        assert_eq!(beta.check().unwrap().0, "betas");
        assert!(AdamWParams::default().check().is_none());
    }
}
