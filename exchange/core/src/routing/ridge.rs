//! Offline fit of W by ridge regression, in closed form.
//!
//! The utility is linear in the joint feature `z = vec(x·pᵀ)` (length [`JOINT`]), so fitting W
//! from logged `(x, p, reward)` outcomes is ridge regression on z:
//! `vec(W) = (ZᵀZ + λ·I)⁻¹·Zᵀr`. The normal matrix is `JOINT × JOINT` (56 × 56) whatever the
//! log size, solved by Cholesky (it is symmetric positive definite for λ > 0).

use super::features::Features;
use super::utility::{JOINT, Profile, Utility, outer};
use crate::error::{Result, invalid};
use serde::{Deserialize, Serialize};

/// One logged outcome: the request's features, the chosen arm's profile and the reward seen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Logged {
    /// x of the request.
    pub features: Features,
    /// p of the arm it went to.
    pub profile: Profile,
    /// Observed reward (higher is better).
    pub reward: f64,
}

/// Solves `A·x = b` in place for symmetric positive definite `A` (`n × n`, row-major) by
/// Cholesky; `b` becomes x. Returns false if A is not positive definite.
pub(crate) fn cholesky_solve(a: &mut [f64], n: usize, b: &mut [f64]) -> bool {
    debug_assert_eq!(a.len(), n * n);
    debug_assert_eq!(b.len(), n);
    // A = L·Lᵀ, L stored in the lower triangle of a.
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if !(d > 0.0 && d.is_finite()) {
            return false;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
    }
    // Forward: L·y = b.
    for i in 0..n {
        let mut s = b[i];
        for k in 0..i {
            s -= a[i * n + k] * b[k];
        }
        b[i] = s / a[i * n + i];
    }
    // Backward: Lᵀ·x = y.
    for i in (0..n).rev() {
        let mut s = b[i];
        for k in i + 1..n {
            s -= a[k * n + i] * b[k];
        }
        b[i] = s / a[i * n + i];
    }
    true
}

/// Fits W to logged outcomes with ridge penalty `lambda` (> 0).
///
/// Non-finite features, profiles or rewards are refused with the row named.
pub fn fit_ridge(logs: &[Logged], lambda: f64) -> Result<Utility> {
    if !(lambda.is_finite() && lambda > 0.0) {
        return Err(invalid(
            "ridge.lambda",
            format!("must be finite and > 0, got {lambda}"),
        ));
    }
    let mut gram = vec![0.0; JOINT * JOINT];
    let mut rhs = vec![0.0; JOINT];
    for (row, log) in logs.iter().enumerate() {
        let finite = log.reward.is_finite()
            && log.features.iter().all(|v| v.is_finite())
            && log.profile.iter().all(|v| v.is_finite());
        if !finite {
            return Err(invalid(
                &format!("logs[{row}]"),
                "features, profile and reward must be finite",
            ));
        }
        let z = outer(&log.features, &log.profile);
        for i in 0..JOINT {
            if z[i] == 0.0 {
                continue;
            }
            rhs[i] += z[i] * log.reward;
            for j in 0..JOINT {
                gram[i * JOINT + j] += z[i] * z[j];
            }
        }
    }
    for i in 0..JOINT {
        gram[i * JOINT + i] += lambda;
    }
    if !cholesky_solve(&mut gram, JOINT, &mut rhs) {
        return Err(invalid(
            "ridge.lambda",
            "normal matrix not positive definite; raise lambda",
        ));
    }
    let mut flat = [0.0; JOINT];
    flat.copy_from_slice(&rhs);
    Ok(Utility::from_flat(&flat))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::TraceRng;
    use crate::routing::features::FEATURES;
    use crate::routing::utility::PROFILE;

    #[test]
    fn cholesky_solves_a_small_system() {
        let mut a = vec![4.0, 2.0, 2.0, 3.0];
        let mut b = vec![2.0, 1.0];
        assert!(cholesky_solve(&mut a, 2, &mut b));
        // 4x + 2y = 2, 2x + 3y = 1 → x = 0.5, y = 0.
        assert!((b[0] - 0.5).abs() < 1e-12 && b[1].abs() < 1e-12);
        assert!(!cholesky_solve(&mut [-1.0], 1, &mut [1.0]));
    }

    #[test]
    fn ridge_recovers_the_generating_weights() {
        let mut rng = TraceRng::new(9);
        let mut truth = [0.0; JOINT];
        truth.iter_mut().for_each(|w| *w = rng.normal());
        let truth = Utility::from_flat(&truth);
        let logs: Vec<Logged> = (0..3000)
            .map(|_| {
                let mut x = [0.0; FEATURES];
                x[0] = 1.0;
                x[1..].iter_mut().for_each(|v| *v = rng.next_f64());
                let mut p = [0.0; PROFILE];
                p[0] = 1.0;
                p[1..].iter_mut().for_each(|v| *v = rng.next_f64());
                Logged {
                    features: x,
                    profile: p,
                    reward: truth.score(&x, &p) + 0.05 * rng.normal(),
                }
            })
            .collect();
        let fit = fit_ridge(&logs, 1e-3).unwrap();
        let worst = fit
            .flat()
            .iter()
            .zip(truth.flat())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 0.25, "worst weight error {worst}");
        let mut bad = logs[0];
        bad.reward = f64::NAN;
        assert!(
            fit_ridge(&[bad], 1.0)
                .unwrap_err()
                .to_string()
                .contains("logs[0]")
        );
    }
}
