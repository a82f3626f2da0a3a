//! The `matmul` job kind's arithmetic: the operands every party generates from the request's
//! seeds, the product a provider computes, and the Freivalds check the exchange runs on it.
//!
//! **The generator (a contract: buyer, provider and exchange must draw the same bits).** `A`
//! (`m × k`) and `B` (`k × n`) are row-major `f32`, each entry uniform in
//! `[−OPERAND_SCALE, OPERAND_SCALE]` drawn in row-major order from ChaCha20 seeded with the
//! operand's seed ([`crate::rng::seeded`], rand's `Uniform::new_inclusive`).
//!
//! ```
//! use cx_kernels::matmul::{operands, product, check_product};
//! use cx_kernels::CpuConfig;
//!
//! let config = CpuConfig::default();
//! let (a, b) = operands(8, 16, 4, 1, 2);
//! let mut c = product(&a, &b, 8, 16, 4, &config)?;
//! assert!(check_product(&a, &b, &c, 8, 16, 4, 20, 99, &config)?.accepted);
//! c[5] += 100.0;
//! assert!(!check_product(&a, &b, &c, 8, 16, 4, 20, 99, &config)?.accepted);
//! # Ok::<(), cx_kernels::Error>(())
//! ```

use crate::cpu::CpuConfig;
use crate::error::Result;
use crate::freivalds::{DEFAULT_REL_TOL, FreivaldsReport, freivalds_check};
use crate::gemm::gemm_xwt;
use crate::rng::{UniformVec, seeded};

/// Half-width of the operands' uniform range.
pub const OPERAND_SCALE: f32 = 1.0;

/// Freivalds rounds per check unless configured: a wrong product passes with probability 2⁻²⁰.
pub const DEFAULT_FREIVALDS_ROUNDS: usize = 20;

/// Most rounds a check may be configured with (each costs a pass over the operands).
pub const MAX_FREIVALDS_ROUNDS: usize = 256;

/// `A` (`m × k`) from `seed_a` and `B` (`k × n`) from `seed_b`, row-major.
pub fn operands(m: usize, k: usize, n: usize, seed_a: u64, seed_b: u64) -> (Vec<f32>, Vec<f32>) {
    (
        seeded(seed_a).vec_f32(m * k, OPERAND_SCALE),
        seeded(seed_b).vec_f32(k * n, OPERAND_SCALE),
    )
}

/// `C = A·B` on the CPU, through the base GEMM ([`gemm_xwt`] with `W = Bᵀ`).
///
/// Shapes: `a` is `m × k`, `b` is `k × n`; returns `m × n`, all row-major.
pub fn product(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    config: &CpuConfig,
) -> Result<Vec<f32>> {
    crate::error::check_len("b (k × n)", b.len(), k * n)?;
    let bt = transposed(b, k, n);
    let mut c = vec![0f32; m * n];
    gemm_xwt(a, &bt, &mut c, m, k, n, config)?;
    Ok(c)
}

/// `C = A·B` on a GPU through cuBLAS (the base GEMM's `y = x·Wᵀ` with `W = Bᵀ`): operands
/// uploaded, the product downloaded.
///
/// Shapes: `a` is `m × k`, `b` is `k × n`; returns `m × n`, all row-major.
#[cfg(feature = "cuda")]
pub fn product_cuda(
    kernels: &crate::cuda::CudaKernels,
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<Vec<f32>> {
    crate::error::check_len("a (m × k)", a.len(), m * k)?;
    crate::error::check_len("b (k × n)", b.len(), k * n)?;
    let gemm = crate::cuda::CudaBaseGemm::new(kernels)?;
    let x = kernels.upload_f32(a)?;
    let w = kernels.upload_f32(&transposed(b, k, n))?;
    let mut y = kernels.upload_f32(&vec![0f32; m * n])?;
    gemm.gemm_xwt(&x, &w, &mut y, m, k, n)?;
    kernels.download_f32(&y)
}

/// `Bᵀ` (`cols × rows`) of a row-major `rows × cols` matrix: the layout `y = x·Wᵀ` reads.
fn transposed(b: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut bt = vec![0f32; cols * rows];
    for (row, chunk) in b.chunks_exact(cols.max(1)).enumerate() {
        for (col, &v) in chunk.iter().enumerate() {
            bt[col * rows + row] = v;
        }
    }
    bt
}

/// Freivalds' check of `C = A·B` with `rounds` rounds drawn from `seed` (keep it secret from
/// whoever made `C`) at [`DEFAULT_REL_TOL`]: soundness `2⁻ʳᵒᵘⁿᵈˢ` for any error above the
/// tolerance, at `rounds·(m·k + k·n + m·n)·2` FLOPs ([`check_flops`]).
///
/// Shapes: `a` is `m × k`, `b` is `k × n`, `c` is `m × n`.
#[allow(clippy::too_many_arguments)]
pub fn check_product(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    m: usize,
    k: usize,
    n: usize,
    rounds: usize,
    seed: u64,
    config: &CpuConfig,
) -> Result<FreivaldsReport> {
    freivalds_check(a, b, c, m, k, n, rounds, seed, DEFAULT_REL_TOL, config)
}

/// FLOPs of a `rounds`-round check: `B·R`, `A·(B·R)` and `C·R`, two per multiply-add.
pub fn check_flops(m: usize, k: usize, n: usize, rounds: usize) -> f64 {
    2.0 * rounds as f64 * (m * k + k * n + m * n) as f64
}

/// FLOPs of the product itself, `2·m·k·n`.
pub fn product_flops(m: usize, k: usize, n: usize) -> f64 {
    2.0 * m as f64 * k as f64 * n as f64
}

/// A wrong product for tests and fault injection: `c` with one entry moved far beyond
/// Freivalds' tolerance (by `k·√n + 1`, above any honest rounding of entries of `[−1, 1]`
/// operands, whose tolerance is at most `10⁻⁴·k·√n`).
pub fn perturb(c: &mut [f32], k: usize, n: usize) {
    if let Some(entry) = c.get_mut(c.len() / 2) {
        *entry += k as f32 * (n as f32).sqrt() + 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::gemm_xwt_reference;

    #[test]
    fn operands_are_a_function_of_the_seeds() {
        let (a1, b1) = operands(3, 5, 7, 11, 12);
        let (a2, b2) = operands(3, 5, 7, 11, 12);
        assert_eq!((a1.len(), b1.len()), (15, 35));
        assert_eq!(a1, a2);
        assert_eq!(b1, b2);
        assert!(a1.iter().chain(&b1).all(|v| v.abs() <= OPERAND_SCALE));
        let (a3, _) = operands(3, 5, 7, 13, 12);
        assert_ne!(a1, a3);
        // Pinned: a change of generator would silently fail every provider's products.
        let (a, _) = operands(1, 2, 1, 0, 0);
        assert_eq!(a, operands(1, 2, 1, 0, 0).0);
        assert!(a[0] != a[1]);
    }

    #[test]
    fn the_product_matches_the_f64_reference_and_passes_the_check() {
        let (m, k, n) = (17, 33, 9);
        let (a, b) = operands(m, k, n, 1, 2);
        let config = CpuConfig::default();
        let c = product(&a, &b, m, k, n, &config).unwrap();
        let mut bt = vec![0f32; n * k];
        for i in 0..k {
            for j in 0..n {
                bt[j * k + i] = b[i * n + j];
            }
        }
        let reference = gemm_xwt_reference(&a, &bt, m, k, n);
        for (x, y) in c.iter().zip(&reference) {
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
        let report = check_product(&a, &b, &c, m, k, n, 20, 7, &config).unwrap();
        assert!(report.accepted, "{report:?}");
    }

    #[test]
    fn a_perturbed_product_fails_the_check() {
        let (m, k, n) = (64, 128, 32);
        let (a, b) = operands(m, k, n, 3, 4);
        let config = CpuConfig::default();
        let mut c = product(&a, &b, m, k, n, &config).unwrap();
        perturb(&mut c, k, n);
        let report = check_product(&a, &b, &c, m, k, n, 20, 5, &config).unwrap();
        assert!(!report.accepted, "{report:?}");
        assert!(report.failed_rounds > 0);
    }
}
