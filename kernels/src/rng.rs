//! Seeded randomness for Freivalds vectors, benchmarks, tests and generated models: ChaCha20
//! from `rand_chacha`, drawn through `rand`'s distributions.
//!
//! ChaCha20 is a cryptographic generator, so a verifier that seeds it from a secret the
//! provider never sees gets vectors the provider cannot predict (Freivalds' check is sound only
//! against products fixed before the vectors are drawn). A public seed makes them public: the
//! benchmarks and tests use small fixed seeds for reproducible data, nothing more.

pub use rand::distributions::Standard;
use rand::distributions::Uniform;
pub use rand::{Rng, RngCore, SeedableRng};
pub use rand_chacha::ChaCha20Rng;

/// The generator seeded with `seed` (rand's `seed_from_u64` expansion of the 64 bits).
pub fn seeded(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

/// Vectors of uniform `f32`s from any [`Rng`].
pub trait UniformVec: Rng {
    /// `len` values uniform in `[-scale, scale]` (`scale ≥ 0`).
    fn vec_f32(&mut self, len: usize, scale: f32) -> Vec<f32> {
        let dist = Uniform::new_inclusive(-scale, scale);
        (0..len).map(|_| self.sample(dist)).collect()
    }
}

impl<R: Rng + ?Sized> UniformVec for R {}
