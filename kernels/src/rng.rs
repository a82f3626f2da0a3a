//! A small seeded generator (SplitMix64) for Freivalds vectors, benchmarks and tests.
//!
//! Not cryptographic: a verifier that fears a provider predicting its vectors must seed it
//! from a secret the provider never sees (the check is sound only against products fixed
//! before the vectors are drawn).

/// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit state, full period, good enough
/// statistics for test data and random 0/1 vectors.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn next_signed_unit(&mut self) -> f32 {
        // 24 random bits: every value is exactly representable.
        let u = (self.next_u64() >> 40) as f32 / (1u32 << 24) as f32;
        2.0 * u - 1.0
    }

    /// `len` values uniform in `[-scale, scale)`.
    pub fn vec_f32(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| scale * self.next_signed_unit()).collect()
    }
}
