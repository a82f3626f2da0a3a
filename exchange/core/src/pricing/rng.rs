//! SplitMix64: the one pseudo-random generator of the pricing and routing layers.
//!
//! It exists only to make *synthetic* traces (tests, the pricing bench, the regime-shift
//! simulation) reproducible from a seed on every machine. Nothing on a quoting path draws from
//! it: quotes are a pure function of the job and the market state.

/// Steele, Lea and Flood's SplitMix64 (the seeder of `xoshiro`): 64 bits of state, passes
/// BigCrush, and its output for a seed is fixed forever, unlike an external crate's.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole output is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (`n > 0`); the modulo bias is below 2⁻³² for the sizes used.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
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
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        let mut rng = SplitMix64::new(1);
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
