//! Online per-tenant adaptation of W by a contextual bandit (LinUCB, Li et al. 2010).
//!
//! The model is the ridge prior plus a learned correction: `θ = vec(W₀) + A⁻¹·b` with
//! `A = λ·I + Σ z·zᵀ` and `b = Σ z·(r − z·vec(W₀))` over the tenant's own outcomes, z the joint
//! feature of (request, chosen arm). The arm chosen is the admissible one with the largest
//! `z·θ + α·√(zᵀA⁻¹z)`: optimism in proportion to how little this tenant has taught us about
//! such (request, arm) pairs. A⁻¹ is kept by Sherman–Morrison rank-one updates (O(JOINT²) per
//! outcome, no inversion). Arms are rows of profiles, so a new arm needs no new parameters.

use super::features::Features;
use super::utility::{Arm, Ceilings, JOINT, Profile, Scored, Utility, outer, rank_by};
use crate::error::{Result, invalid};
use std::collections::BTreeMap;

/// One tenant's LinUCB state.
#[derive(Debug, Clone)]
pub struct LinUcb {
    prior: [f64; JOINT],
    /// A⁻¹, `JOINT × JOINT` row-major.
    a_inv: Vec<f64>,
    b: [f64; JOINT],
    theta: [f64; JOINT],
    alpha: f64,
    updates: u64,
}

impl LinUcb {
    /// Starts at the prior W with ridge `lambda` (> 0) and exploration `alpha` (≥ 0).
    pub fn new(prior: &Utility, lambda: f64, alpha: f64) -> Result<Self> {
        if !(lambda.is_finite() && lambda > 0.0) {
            return Err(invalid(
                "bandit.lambda",
                format!("must be finite and > 0, got {lambda}"),
            ));
        }
        if !(alpha.is_finite() && alpha >= 0.0) {
            return Err(invalid(
                "bandit.alpha",
                format!("must be finite and >= 0, got {alpha}"),
            ));
        }
        let mut a_inv = vec![0.0; JOINT * JOINT];
        for i in 0..JOINT {
            a_inv[i * JOINT + i] = 1.0 / lambda;
        }
        let flat = prior.flat();
        Ok(Self {
            prior: flat,
            a_inv,
            b: [0.0; JOINT],
            theta: flat,
            alpha,
            updates: 0,
        })
    }

    /// The current estimate of W.
    pub fn utility(&self) -> Utility {
        Utility::from_flat(&self.theta)
    }

    /// Outcomes folded in so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    fn ucb(&self, z: &[f64; JOINT]) -> f64 {
        let mean: f64 = z.iter().zip(&self.theta).map(|(a, b)| a * b).sum();
        let mut quad = 0.0;
        for i in 0..JOINT {
            if z[i] == 0.0 {
                continue;
            }
            let row = &self.a_inv[i * JOINT..(i + 1) * JOINT];
            quad += z[i] * row.iter().zip(z).map(|(a, b)| a * b).sum::<f64>();
        }
        mean + self.alpha * quad.max(0.0).sqrt()
    }

    /// Admissible arms by optimistic score, best first.
    pub fn rank(
        &self,
        arms: &[Arm],
        ceilings: &Ceilings,
        x: &Features,
        context_tokens: u32,
    ) -> Vec<Scored> {
        rank_by(arms, ceilings, x, context_tokens, |p| {
            self.ucb(&outer(x, p))
        })
    }

    /// The arm to play, if any is admissible.
    pub fn choose(
        &self,
        arms: &[Arm],
        ceilings: &Ceilings,
        x: &Features,
        context_tokens: u32,
    ) -> Option<usize> {
        self.rank(arms, ceilings, x, context_tokens)
            .first()
            .map(|s| s.arm)
    }

    /// Folds in the reward seen for playing the arm with profile `profile` on `x`.
    ///
    /// A non-finite reward or feature is refused and leaves the state as it was.
    pub fn update(&mut self, x: &Features, profile: &Profile, reward: f64) -> Result<()> {
        if !reward.is_finite() {
            return Err(invalid(
                "bandit.reward",
                format!("must be finite, got {reward}"),
            ));
        }
        if x.iter().chain(profile).any(|v| !v.is_finite()) {
            return Err(invalid(
                "bandit.features",
                "features and profile must be finite",
            ));
        }
        let z = outer(x, profile);
        // Sherman–Morrison: (A + z zᵀ)⁻¹ = A⁻¹ − (A⁻¹z)(A⁻¹z)ᵀ / (1 + zᵀA⁻¹z); A⁻¹ is symmetric.
        let mut az = [0.0; JOINT];
        for (i, slot) in az.iter_mut().enumerate() {
            let row = &self.a_inv[i * JOINT..(i + 1) * JOINT];
            *slot = row.iter().zip(&z).map(|(a, b)| a * b).sum();
        }
        let denom = 1.0 + z.iter().zip(&az).map(|(a, b)| a * b).sum::<f64>();
        for i in 0..JOINT {
            if az[i] == 0.0 {
                continue;
            }
            let scale = az[i] / denom;
            let row = &mut self.a_inv[i * JOINT..(i + 1) * JOINT];
            for (slot, azj) in row.iter_mut().zip(&az) {
                *slot -= scale * azj;
            }
        }
        let residual = reward - z.iter().zip(&self.prior).map(|(a, b)| a * b).sum::<f64>();
        for (bi, zi) in self.b.iter_mut().zip(&z) {
            *bi += zi * residual;
        }
        for i in 0..JOINT {
            let row = &self.a_inv[i * JOINT..(i + 1) * JOINT];
            self.theta[i] =
                self.prior[i] + row.iter().zip(&self.b).map(|(a, b)| a * b).sum::<f64>();
        }
        self.updates += 1;
        Ok(())
    }
}

/// LinUCB states per tenant, each started from the shared offline W.
#[derive(Debug, Clone)]
pub struct TenantBandits {
    prior: Utility,
    lambda: f64,
    alpha: f64,
    tenants: BTreeMap<String, LinUcb>,
}

impl TenantBandits {
    /// Bandits that start at `prior` (validated by building one).
    pub fn new(prior: Utility, lambda: f64, alpha: f64) -> Result<Self> {
        LinUcb::new(&prior, lambda, alpha)?;
        Ok(Self {
            prior,
            lambda,
            alpha,
            tenants: BTreeMap::new(),
        })
    }

    /// The tenant's bandit, created at the prior on first use.
    pub fn tenant(&mut self, tenant: &str) -> &mut LinUcb {
        let (prior, lambda, alpha) = (&self.prior, self.lambda, self.alpha);
        self.tenants.entry(tenant.to_owned()).or_insert_with(|| {
            LinUcb::new(prior, lambda, alpha).expect("parameters were validated in new")
        })
    }

    /// The tenant's bandit if it has one.
    pub fn get(&self, tenant: &str) -> Option<&LinUcb> {
        self.tenants.get(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::TraceRng;

    fn arms() -> Vec<Arm> {
        (0..4)
            .map(|i| Arm {
                name: format!("arm-{i}"),
                quality: 0.2 * i as f64,
                latency_s: 1.0,
                cost_wei_per_mtok: 1_000_000,
                code: 1.0 - 0.3 * i as f64,
                vision: 0.0,
                context_tokens: 100_000,
            })
            .collect()
    }

    #[test]
    fn a_tenant_that_values_quality_over_code_skill_learns_to_pick_quality() {
        // On code requests the prior prefers the code specialist (arm 0); this tenant only
        // rewards quality (arm 3 has the most).
        let arms = arms();
        let mut bandit = LinUcb::new(&Utility::default(), 1.0, 0.5).unwrap();
        let mut x = [0.0; 8];
        x[0] = 1.0;
        x[5] = 1.0;
        assert_eq!(bandit.choose(&arms, &Ceilings::default(), &x, 10), Some(0));
        let mut rng = TraceRng::new(1);
        for _ in 0..300 {
            let arm = bandit.choose(&arms, &Ceilings::default(), &x, 10).unwrap();
            let reward = arms[arm].quality + 0.05 * rng.normal();
            bandit.update(&x, &arms[arm].profile(), reward).unwrap();
        }
        assert_eq!(bandit.choose(&arms, &Ceilings::default(), &x, 10), Some(3));
        assert!(bandit.update(&x, &arms[0].profile(), f64::NAN).is_err());
        assert_eq!(bandit.updates(), 300);
    }

    #[test]
    fn tenants_adapt_separately() {
        let mut bandits = TenantBandits::new(Utility::default(), 1.0, 0.1).unwrap();
        let x = [1.0, 0.1, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        let p = arms()[0].profile();
        bandits.tenant("a").update(&x, &p, 5.0).unwrap();
        let a = bandits.get("a").unwrap().utility();
        let b = bandits.tenant("b").utility();
        assert_ne!(a, b);
        assert_eq!(b, Utility::default());
    }
}
