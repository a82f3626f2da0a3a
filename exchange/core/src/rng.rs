//! The seeded generator of the synthetic traces: ChaCha20 (`rand_chacha`) through `rand`.
//!
//! It exists only to make *synthetic* traces (tests, the benchmarks, the simulations) reproducible
//! from a seed on every machine. Nothing on a quoting or clearing path draws from it: quotes and
//! clears are pure functions of their inputs. The few distributions the traces need (normal,
//! exponential, Poisson) are written on top of its uniform draws, so the streams depend on
//! `rand_chacha`'s, whose output for a seed is fixed by the ChaCha20 specification.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// A seeded generator for synthetic traces.
#[derive(Debug, Clone)]
pub struct TraceRng {
    inner: ChaCha20Rng,
}

impl TraceRng {
    /// A generator whose whole output is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            inner: ChaCha20Rng::seed_from_u64(seed),
        }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        self.inner.r#gen()
    }

    /// Uniform integer in `0..n` (0 when `n` is 0), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        self.inner.gen_range(0..n.max(1))
    }

    /// Standard normal by Box–Muller (one of the pair; the other is dropped for simplicity).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]: ln is finite
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Exponential with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }

    /// Poisson with mean `lambda`: Knuth's product method below 30, a rounded normal above
    /// (the synthetic traces only need the right mean and spread, not exact tails).
    pub fn poisson(&mut self, lambda: f64) -> u64 {
        if lambda <= 0.0 {
            return 0;
        }
        if lambda < 30.0 {
            let limit = (-lambda).exp();
            let mut k = 0;
            let mut product = self.next_f64();
            while product > limit {
                k += 1;
                product *= self.next_f64();
            }
            k
        } else {
            (lambda + lambda.sqrt() * self.normal()).round().max(0.0) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream_and_moments_are_right() {
        let mut a = TraceRng::new(7);
        let mut b = TraceRng::new(7);
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        let mut rng = TraceRng::new(1);
        let n = 50_000;
        let normals: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        let mean = normals.iter().sum::<f64>() / n as f64;
        let var = normals.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
        let poisson = (0..n).map(|_| rng.poisson(4.0)).sum::<u64>() as f64 / n as f64;
        assert!((poisson - 4.0).abs() < 0.05, "{poisson}");
    }
}
