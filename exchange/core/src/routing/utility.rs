//! Utility over arm profiles, `u(x, p) = xᵀ·W·p`, with hard ceilings gating before scoring.
//!
//! An arm is a model the router may send a request to; its profile p is a fixed-length row
//! (quality, cheapness, speed, skills). W (`FEATURES × PROFILE`) says how much each request
//! feature values each profile entry. Adding an arm adds a row of profiles; W does not change.

use super::features::{FEATURES, Features};
use serde::{Deserialize, Serialize};

/// Length of an arm profile.
pub const PROFILE: usize = 7;
/// p: `[bias, quality, cheapness, speed, code, vision, long context]`, each in [0, 1].
pub type Profile = [f64; PROFILE];
/// Length of the flattened outer product `x ⊗ p`.
pub const JOINT: usize = FEATURES * PROFILE;

/// One arm: a routable model with its profile and the numbers ceilings check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Arm {
    /// Model name (catalog key).
    pub name: String,
    /// Quality score in [0, 1] (higher is better).
    pub quality: f64,
    /// Typical time to a complete answer, seconds.
    pub latency_s: f64,
    /// Retail price per million tokens (input and output averaged), wei.
    pub cost_wei_per_mtok: u64,
    /// Skill at code in [0, 1].
    pub code: f64,
    /// Skill with images in [0, 1] (0 = cannot take images).
    pub vision: f64,
    /// Context limit in tokens.
    pub context_tokens: u32,
}

impl Arm {
    /// The arm's profile row p.
    pub fn profile(&self) -> Profile {
        [
            1.0,
            self.quality,
            // 1 / (1 + price in units per Mtok): free arms are 1, dear ones approach 0.
            1.0 / (1.0 + cx_protocol::price::to_units(self.cost_wei_per_mtok)),
            1.0 / (1.0 + self.latency_s),
            self.code,
            self.vision,
            (f64::from(self.context_tokens)).ln_1p() / 131_072f64.ln_1p(),
        ]
    }
}

/// W, `FEATURES × PROFILE`, row-major.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Utility {
    /// `w[i][j]` weighs feature i against profile entry j.
    pub w: [[f64; PROFILE]; FEATURES],
}

impl Default for Utility {
    /// A hand-set prior: quality matters, cheapness and speed matter, skills matter when the
    /// request needs them (code ↔ code, vision ↔ vision, long context ↔ context).
    fn default() -> Self {
        let mut w = [[0.0; PROFILE]; FEATURES];
        w[0][1] = 1.0; // quality
        w[0][2] = 0.5; // cheapness
        w[0][3] = 0.3; // speed
        w[5][4] = 1.0; // code request × code skill
        w[3][5] = 2.0; // vision request × vision skill
        w[2][6] = 1.0; // long request × context
        w[6][1] = 0.5; // reasoning wants quality
        Self { w }
    }
}

impl Utility {
    /// u(x, p) = xᵀ·W·p.
    pub fn score(&self, x: &Features, p: &Profile) -> f64 {
        let mut u = 0.0;
        for (i, xi) in x.iter().enumerate() {
            if *xi != 0.0 {
                let row: f64 = self.w[i].iter().zip(p).map(|(w, pj)| w * pj).sum();
                u += xi * row;
            }
        }
        u
    }

    /// W flattened row-major (length [`JOINT`]); `score(x, p) = flat · outer(x, p)`.
    pub fn flat(&self) -> [f64; JOINT] {
        let mut out = [0.0; JOINT];
        for i in 0..FEATURES {
            out[i * PROFILE..(i + 1) * PROFILE].copy_from_slice(&self.w[i]);
        }
        out
    }

    /// W from a row-major flat vector of length [`JOINT`].
    pub fn from_flat(flat: &[f64; JOINT]) -> Self {
        let mut w = [[0.0; PROFILE]; FEATURES];
        for (i, row) in w.iter_mut().enumerate() {
            row.copy_from_slice(&flat[i * PROFILE..(i + 1) * PROFILE]);
        }
        Self { w }
    }
}

/// `vec(x·pᵀ)`, row-major: the joint feature the utility is linear in.
pub fn outer(x: &Features, p: &Profile) -> [f64; JOINT] {
    let mut z = [0.0; JOINT];
    for i in 0..FEATURES {
        for j in 0..PROFILE {
            z[i * PROFILE + j] = x[i] * p[j];
        }
    }
    z
}

/// Hard limits an arm must meet before it is scored at all.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ceilings {
    /// Longest acceptable latency, seconds.
    pub max_latency_s: f64,
    /// Dearest acceptable price per million tokens, wei.
    pub max_cost_wei_per_mtok: u64,
    /// Lowest acceptable quality.
    pub min_quality: f64,
}

impl Default for Ceilings {
    fn default() -> Self {
        Self {
            max_latency_s: f64::INFINITY,
            max_cost_wei_per_mtok: u64::MAX,
            min_quality: 0.0,
        }
    }
}

/// Whether an arm passes the ceilings and can take the request (images need vision, the
/// context must fit).
pub fn admissible(arm: &Arm, ceilings: &Ceilings, x: &Features, context_tokens: u32) -> bool {
    arm.latency_s <= ceilings.max_latency_s
        && arm.cost_wei_per_mtok <= ceilings.max_cost_wei_per_mtok
        && arm.quality >= ceilings.min_quality
        && (x[3] == 0.0 || arm.vision > 0.0)
        && context_tokens <= arm.context_tokens
}

/// An arm with its utility.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scored {
    /// Index into the arm list.
    pub arm: usize,
    /// u(x, p) (or the bandit's optimistic score).
    pub utility: f64,
}

/// Admissible arms by descending score, ties by arm index (deterministic).
pub fn rank_by(
    arms: &[Arm],
    ceilings: &Ceilings,
    x: &Features,
    context_tokens: u32,
    mut score: impl FnMut(&Profile) -> f64,
) -> Vec<Scored> {
    let mut out: Vec<Scored> = arms
        .iter()
        .enumerate()
        .filter(|(_, a)| admissible(a, ceilings, x, context_tokens))
        .map(|(i, a)| Scored {
            arm: i,
            utility: score(&a.profile()),
        })
        .collect();
    out.sort_by(|a, b| b.utility.total_cmp(&a.utility).then(a.arm.cmp(&b.arm)));
    out
}

/// Admissible arms ranked by `utility`.
pub fn rank(
    arms: &[Arm],
    ceilings: &Ceilings,
    utility: &Utility,
    x: &Features,
    context_tokens: u32,
) -> Vec<Scored> {
    rank_by(arms, ceilings, x, context_tokens, |p| utility.score(x, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn arm(name: &str, quality: f64, latency_s: f64, cost: u64, vision: f64) -> Arm {
        Arm {
            name: name.into(),
            quality,
            latency_s,
            cost_wei_per_mtok: cost,
            code: 0.5,
            vision,
            context_tokens: 32_768,
        }
    }

    #[test]
    fn score_equals_the_flat_dot_product() {
        let u = Utility::default();
        let x = [1.0, 0.3, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0];
        let p = arm("a", 0.7, 1.0, 500_000, 0.8).profile();
        let flat: f64 = u.flat().iter().zip(outer(&x, &p)).map(|(w, z)| w * z).sum();
        assert!((u.score(&x, &p) - flat).abs() < 1e-12);
        assert_eq!(Utility::from_flat(&u.flat()), u);
    }

    #[test]
    fn ceilings_gate_before_scoring() {
        let arms = [
            arm("best-but-slow", 0.95, 30.0, 100_000, 0.0),
            arm("ok", 0.6, 1.0, 100_000, 0.0),
            arm("dear", 0.9, 1.0, 90_000_000, 0.0),
            arm("sees", 0.5, 1.0, 100_000, 1.0),
        ];
        let x = [1.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let ceilings = Ceilings {
            max_latency_s: 5.0,
            max_cost_wei_per_mtok: 10_000_000,
            min_quality: 0.55,
        };
        let ranked = rank(&arms, &ceilings, &Utility::default(), &x, 100);
        assert_eq!(ranked.iter().map(|s| s.arm).collect::<Vec<_>>(), vec![1]);
        // An image request admits only an arm that sees.
        let mut xv = x;
        xv[3] = 1.0;
        let ranked = rank(&arms, &Ceilings::default(), &Utility::default(), &xv, 100);
        assert_eq!(ranked.iter().map(|s| s.arm).collect::<Vec<_>>(), vec![3]);
        // Context that does not fit admits nothing.
        assert!(rank(&arms, &Ceilings::default(), &Utility::default(), &x, 40_000).is_empty());
    }
}
