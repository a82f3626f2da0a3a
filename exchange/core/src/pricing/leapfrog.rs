//! The price dynamics: a particle in a regime-dependent anharmonic potential, integrated by a
//! symplectic leapfrog (Störmer–Verlet) step with friction.
//!
//! Coordinates: occupancy `q` (busy plus queued work ÷ capacity) and the log price premium `p`
//! (log of price ÷ reference). The pair `(−q, p)` is canonical for
//! `H(q, p) = p²/(2m) + V(q)`, which gives the two behaviours a market maker wants:
//! - `dq/dt = −p/m`: a high price drains occupancy (buyers defer), a low one fills it;
//! - `dp/dt = V′(q) − γ·p`: occupancy above the regime's target pushes the price up, below it
//!   pulls the price down, and friction γ bleeds the premium off once the pressure is gone.
//!
//! `V(q) = ½·k·(q − q*)² + ¼·g·(q − q*)⁴`: the quartic term makes the response gentle near the
//! target and steep in a backlog (anharmonic). Why leapfrog: without friction it is symplectic,
//! so energy errors stay bounded for any number of steps instead of drifting (an explicit Euler
//! step inflates the premium a little on every step). Friction is applied as an exact
//! `exp(−γ·dt/2)` half-step on each side (a conformally symplectic splitting), so the damped
//! scheme is still time-reversible up to the friction.

use serde::{Deserialize, Serialize};

/// One regime's potential `V(q) = ½·k·(q − q*)² + ¼·g·(q − q*)⁴`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Anharmonic {
    /// q*: the occupancy this regime aims for.
    pub target_occupancy: f64,
    /// k: harmonic stiffness.
    pub stiffness: f64,
    /// g: quartic stiffness (≥ 0, so V is convex and has one minimum at q*).
    pub quartic: f64,
}

impl Anharmonic {
    /// V(q).
    pub fn value(&self, occupancy: f64) -> f64 {
        let x = occupancy - self.target_occupancy;
        let x2 = x * x;
        0.5 * self.stiffness * x2 + 0.25 * self.quartic * x2 * x2
    }

    /// V′(q).
    pub fn slope(&self, occupancy: f64) -> f64 {
        let x = occupancy - self.target_occupancy;
        x * (self.stiffness + self.quartic * x * x)
    }
}

/// A potential: anything with a value and a slope in occupancy.
pub trait Potential {
    /// V(q).
    fn value(&self, occupancy: f64) -> f64;
    /// V′(q).
    fn slope(&self, occupancy: f64) -> f64;
}

impl Potential for Anharmonic {
    fn value(&self, occupancy: f64) -> f64 {
        Anharmonic::value(self, occupancy)
    }
    fn slope(&self, occupancy: f64) -> f64 {
        Anharmonic::slope(self, occupancy)
    }
}

/// The regime-weighted potential `Σ_r b_r·V_r(q)` under a filtered belief b: when the HMM is
/// unsure between two regimes, the force is the expectation of theirs.
#[derive(Debug, Clone, Copy)]
pub struct Blend<'a, const R: usize> {
    /// Per-regime potentials.
    pub parts: &'a [Anharmonic; R],
    /// Weights (a probability vector).
    pub weights: &'a [f64; R],
}

impl<const R: usize> Potential for Blend<'_, R> {
    fn value(&self, occupancy: f64) -> f64 {
        (0..R)
            .map(|r| self.weights[r] * self.parts[r].value(occupancy))
            .sum()
    }
    fn slope(&self, occupancy: f64) -> f64 {
        (0..R)
            .map(|r| self.weights[r] * self.parts[r].slope(occupancy))
            .sum()
    }
}

/// A point in phase space.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// q: occupancy.
    pub occupancy: f64,
    /// p: log price premium over the reference price.
    pub log_premium: f64,
}

/// H(q, p) = p²/(2m) + V(q).
pub fn energy<P: Potential>(phase: Phase, potential: &P, mass: f64) -> f64 {
    phase.log_premium * phase.log_premium / (2.0 * mass) + potential.value(phase.occupancy)
}

/// One leapfrog step of `dt_s` with friction `friction_per_s` (γ; 0 makes it symplectic).
///
/// Friction half-step, kick, drift, kick, friction half-step.
pub fn leapfrog<P: Potential>(
    phase: Phase,
    potential: &P,
    mass: f64,
    friction_per_s: f64,
    dt_s: f64,
) -> Phase {
    let damp = (-friction_per_s * dt_s * 0.5).exp();
    let mut p = phase.log_premium * damp;
    let mut q = phase.occupancy;
    p += 0.5 * dt_s * potential.slope(q);
    q -= dt_s * p / mass;
    p += 0.5 * dt_s * potential.slope(q);
    Phase {
        occupancy: q,
        log_premium: p * damp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POT: Anharmonic = Anharmonic {
        target_occupancy: 0.8,
        stiffness: 1.0,
        quartic: 4.0,
    };

    #[test]
    fn frictionless_energy_error_stays_bounded_where_euler_drifts() {
        let start = Phase {
            occupancy: 1.4,
            log_premium: 0.0,
        };
        let (mass, dt) = (2.0, 0.05);
        let e0 = energy(start, &POT, mass);
        let mut phase = start;
        let mut worst = 0.0f64;
        for _ in 0..200_000 {
            phase = leapfrog(phase, &POT, mass, 0.0, dt);
            worst = worst.max((energy(phase, &POT, mass) - e0).abs() / e0);
        }
        assert!(worst < 5e-3, "leapfrog relative energy error {worst}");
        // Explicit Euler on the same system gains energy on every step: within 200 steps
        // (a thousandth of the run above) it is far worse than leapfrog ever was.
        let mut euler = start;
        for _ in 0..200 {
            let slope = POT.slope(euler.occupancy);
            euler = Phase {
                occupancy: euler.occupancy - dt * euler.log_premium / mass,
                log_premium: euler.log_premium + dt * slope,
            };
        }
        let euler_drift = (energy(euler, &POT, mass) - e0) / e0;
        assert!(
            euler_drift.is_finite() && euler_drift > 10.0 * worst,
            "euler {euler_drift} vs leapfrog {worst}"
        );
    }

    #[test]
    fn frictionless_step_is_time_reversible() {
        let start = Phase {
            occupancy: 1.1,
            log_premium: 0.3,
        };
        let mut phase = start;
        for _ in 0..1000 {
            phase = leapfrog(phase, &POT, 3.0, 0.0, 0.1);
        }
        phase.log_premium = -phase.log_premium;
        for _ in 0..1000 {
            phase = leapfrog(phase, &POT, 3.0, 0.0, 0.1);
        }
        assert!((phase.occupancy - start.occupancy).abs() < 1e-9);
        assert!((phase.log_premium + start.log_premium).abs() < 1e-9);
    }

    #[test]
    fn friction_settles_at_the_target_with_no_premium() {
        let mut phase = Phase {
            occupancy: 1.5,
            log_premium: 0.0,
        };
        for _ in 0..20_000 {
            phase = leapfrog(phase, &POT, 2.0, 0.5, 0.05);
        }
        assert!((phase.occupancy - 0.8).abs() < 1e-6, "{phase:?}");
        assert!(phase.log_premium.abs() < 1e-6, "{phase:?}");
    }

    #[test]
    fn backlog_raises_the_premium_and_slack_lowers_it() {
        let up = leapfrog(
            Phase {
                occupancy: 1.3,
                log_premium: 0.0,
            },
            &POT,
            2.0,
            0.3,
            0.1,
        );
        let down = leapfrog(
            Phase {
                occupancy: 0.3,
                log_premium: 0.0,
            },
            &POT,
            2.0,
            0.3,
            0.1,
        );
        assert!(up.log_premium > 0.0 && down.log_premium < 0.0);
    }
}
