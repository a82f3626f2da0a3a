//! Freivalds' check: honest products pass, corrupted ones fail with probability ≥ 1 − 2⁻ᵏ.

use cx_kernels::rng::{UniformVec, seeded};
use cx_kernels::{
    CpuConfig, DEFAULT_REL_TOL, bf16, freivalds_check, freivalds_check_xwt, gemm_xwt,
};

use crate::common::random;

fn matmul(a: &[f32], b: &[f32], m: usize, n: usize, p: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * p];
    for i in 0..m {
        for k in 0..n {
            for j in 0..p {
                c[i * p + j] += a[i * n + k] * b[k * p + j];
            }
        }
    }
    c
}

#[test]
fn freivalds_accepts_honest_products() {
    let mut rng = seeded(71);
    let config = CpuConfig::default();
    for &(m, n, p) in &[(1, 1, 1), (17, 33, 9), (64, 700, 80)] {
        let a = rng.vec_f32(m * n, 1.0);
        let b = rng.vec_f32(n * p, 1.0);
        let c = matmul(&a, &b, m, n, p);
        for seed in 0..20 {
            let report =
                freivalds_check(&a, &b, &c, m, n, p, 20, seed, DEFAULT_REL_TOL, &config).unwrap();
            assert!(report.accepted, "{m}×{n}×{p} seed {seed}: {report:?}");
            assert_eq!(report.failed_rounds, 0);
        }
    }
    // y = x·Wᵀ with bf16 weights, as the provider computes it.
    let (m, d_in, d_out) = (40, 1100, 96);
    let x = rng.vec_f32(m * d_in, 1.0);
    let w: Vec<bf16> = random(&mut rng, d_out * d_in, 0.05);
    let mut y = vec![0f32; m * d_out];
    gemm_xwt(&x, &w, &mut y, m, d_in, d_out, &config).unwrap();
    for seed in 0..20 {
        let report = freivalds_check_xwt(
            &x,
            &w,
            &y,
            m,
            d_in,
            d_out,
            20,
            seed,
            DEFAULT_REL_TOL,
            &config,
        )
        .unwrap();
        assert!(report.accepted, "seed {seed}: {report:?}");
    }
}

/// Statistical soundness with a fixed seed: a single corrupted entry is caught in a round
/// exactly when the random vector selects its column (probability ½), so `k` rounds reject
/// with probability 1 − 2⁻ᵏ. Over `TRIALS` seeds the rejection rate must be at least that,
/// minus four standard deviations of the binomial estimate.
#[test]
fn freivalds_rejects_corrupted_product_with_probability_at_least_1_minus_2_pow_minus_k() {
    const TRIALS: usize = 3000;
    let (m, n, p) = (12, 20, 16);
    let mut rng = seeded(72);
    let a = rng.vec_f32(m * n, 1.0);
    let b = rng.vec_f32(n * p, 1.0);
    let honest = matmul(&a, &b, m, n, p);
    let mut corrupted = honest.clone();
    corrupted[5 * p + 11] += 0.5;
    let mut row_corrupted = honest.clone();
    for j in 0..p {
        row_corrupted[3 * p + j] -= 0.25 * (j as f32 - 7.5);
    }
    let config = CpuConfig::default().with_threads(1);
    for k in 1..=6 {
        let bound = 1.0 - 0.5f64.powi(k as i32);
        let sigma = (bound * (1.0 - bound) / TRIALS as f64).sqrt();
        for (name, c) in [("one entry", &corrupted), ("one row", &row_corrupted)] {
            let rejected = (0..TRIALS as u64)
                .filter(|&t| {
                    let seed = 0xF5EE_D000 + t * 1_000 + k as u64;
                    !freivalds_check(&a, &b, c, m, n, p, k, seed, DEFAULT_REL_TOL, &config)
                        .unwrap()
                        .accepted
                })
                .count();
            let rate = rejected as f64 / TRIALS as f64;
            assert!(
                rate >= bound - 4.0 * sigma,
                "{name}, k = {k}: rejected {rate:.4}, bound {bound:.4}"
            );
        }
    }
}

#[test]
fn freivalds_xwt_rejects_a_corrupted_output_and_nan() {
    let (m, d_in, d_out) = (16, 300, 48);
    let mut rng = seeded(73);
    let x = rng.vec_f32(m * d_in, 1.0);
    let w = rng.vec_f32(d_out * d_in, 0.05);
    let config = CpuConfig::default();
    let mut y = vec![0f32; m * d_out];
    gemm_xwt(&x, &w, &mut y, m, d_in, d_out, &config).unwrap();
    let mut bad = y.clone();
    bad[7 * d_out + 30] += 0.01;
    let report = freivalds_check_xwt(
        &x,
        &w,
        &bad,
        m,
        d_in,
        d_out,
        20,
        1,
        DEFAULT_REL_TOL,
        &config,
    )
    .unwrap();
    assert!(
        !report.accepted && report.failed_rounds > 0 && report.worst_ratio > 1.0,
        "{report:?}"
    );
    bad[7 * d_out + 30] = f32::NAN;
    let report = freivalds_check_xwt(
        &x,
        &w,
        &bad,
        m,
        d_in,
        d_out,
        20,
        1,
        DEFAULT_REL_TOL,
        &config,
    )
    .unwrap();
    assert!(!report.accepted, "{report:?}");
}

/// One sketch of `W` serves many products: honest ones pass, a corrupted one fails, and the
/// one-shot function agrees with the sketch built from the same seed.
#[test]
fn freivalds_sketch_is_reused_across_products() {
    let (d_in, d_out) = (520, 72);
    let mut rng = seeded(74);
    let w: Vec<bf16> = random(&mut rng, d_out * d_in, 0.05);
    let config = CpuConfig::default();
    let sketch = cx_kernels::FreivaldsSketch::new(&w, d_in, d_out, 20, 99, &config).unwrap();
    assert_eq!(sketch.rounds(), 20);
    for (batch, m) in [1usize, 7, 33].into_iter().enumerate() {
        let x = rng.vec_f32(m * d_in, 1.0);
        let mut y = vec![0f32; m * d_out];
        gemm_xwt(&x, &w, &mut y, m, d_in, d_out, &config).unwrap();
        let report = sketch.check(&x, &y, m, DEFAULT_REL_TOL, &config).unwrap();
        assert!(report.accepted, "batch {batch}: {report:?}");
        let one_shot =
            freivalds_check_xwt(&x, &w, &y, m, d_in, d_out, 20, 99, DEFAULT_REL_TOL, &config)
                .unwrap();
        assert_eq!(one_shot, report);
        y[(m - 1) * d_out + 5] -= 0.05;
        let report = sketch.check(&x, &y, m, DEFAULT_REL_TOL, &config).unwrap();
        assert!(
            !report.accepted,
            "batch {batch}: corrupted product accepted: {report:?}"
        );
    }
    // A sketch is for one shape of W.
    assert!(
        sketch
            .check(&[0f32; 10], &[0f32; 72], 1, DEFAULT_REL_TOL, &config)
            .is_err()
    );
}
