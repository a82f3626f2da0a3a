//! The base GEMM `y = x·Wᵀ`.

use cx_kernels::rng::{UniformVec, seeded};
use cx_kernels::{
    CpuConfig, Error, QuantMatrix, QuantType, WeightView, bf16, gemm_xwt, gemm_xwt_many,
    gemm_xwt_quant, gemm_xwt_reference,
};

use crate::common::{assert_close, random};

#[test]
fn gemm_matches_reference_on_ragged_shapes() {
    let mut rng = seeded(61);
    for &(m, d_in, d_out) in &[
        (1, 1, 1),
        (3, 7, 5),
        (9, 1030, 67),
        (37, 520, 33),
        (5, 64, 64),
    ] {
        let x = rng.vec_f32(m * d_in, 1.0);
        let w = rng.vec_f32(d_out * d_in, 1.0);
        let w16: Vec<bf16> = random(&mut rng, d_out * d_in, 1.0);
        for config in [
            CpuConfig::default(),
            CpuConfig::deterministic().with_threads(3),
        ] {
            let mut y = vec![f32::NAN; m * d_out];
            gemm_xwt(&x, &w, &mut y, m, d_in, d_out, &config).unwrap();
            let tol = 1e-5 * (d_in as f32).sqrt();
            assert_close(
                &y,
                &gemm_xwt_reference(&x, &w, m, d_in, d_out),
                tol,
                1e-5,
                "f32",
            );
            gemm_xwt(&x, &w16, &mut y, m, d_in, d_out, &config).unwrap();
            assert_close(
                &y,
                &gemm_xwt_reference(&x, &w16, m, d_in, d_out),
                tol,
                1e-5,
                "bf16",
            );
        }
    }
}

#[test]
fn gemm_row_bits_independent_of_batch_rows_and_threads() {
    let (d_in, d_out) = (700, 70);
    let mut rng = seeded(62);
    let w = rng.vec_f32(d_out * d_in, 1.0);
    let x = rng.vec_f32(13 * d_in, 1.0);
    let mut alone = vec![0f32; d_out];
    gemm_xwt(
        &x[6 * d_in..7 * d_in],
        &w,
        &mut alone,
        1,
        d_in,
        d_out,
        &CpuConfig::deterministic().with_threads(1),
    )
    .unwrap();
    for threads in [1, 2, 5] {
        let mut y = vec![0f32; 13 * d_out];
        gemm_xwt(
            &x,
            &w,
            &mut y,
            13,
            d_in,
            d_out,
            &CpuConfig::deterministic().with_threads(threads),
        )
        .unwrap();
        assert_eq!(&y[6 * d_out..7 * d_out], &alone[..], "{threads} threads");
    }
}

/// f16 weights are held at two bytes an element and widened exactly as they are read: every
/// output has the bits of the same values held as `f32`, at a decode step's rows (widened in
/// registers) and a prompt's (widened into a panel), in both modes.
#[test]
fn f16_weights_give_the_bits_of_their_values_in_f32() {
    let (d_in, d_out) = (544, 45);
    let mut rng = seeded(64);
    let w16: Vec<half::f16> = rng
        .vec_f32(d_out * d_in, 1.0)
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    let w32: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
    for m in [1, 3, 8, 17, 40] {
        let x = rng.vec_f32(m * d_in, 1.0);
        for config in [
            CpuConfig::default(),
            CpuConfig::deterministic().with_threads(3),
        ] {
            let (mut want, mut got) = (vec![0f32; m * d_out], vec![f32::NAN; m * d_out]);
            gemm_xwt(&x, &w32, &mut want, m, d_in, d_out, &config).unwrap();
            gemm_xwt_many(
                &x,
                m,
                d_in,
                &mut [(WeightView::F16(&w16), &mut got)],
                &config,
            )
            .unwrap();
            assert_eq!(got, want, "{m} rows, {:?}", config.mode);
        }
    }
}

/// A layer's q, k, v (or gate, up) in one pass: every output is bit for bit its own product's,
/// whatever the weights' types, the rows and the threads.
#[test]
fn one_pass_over_several_weights_gives_each_products_bits() {
    let d_in = 544;
    let mut rng = seeded(63);
    let w32 = rng.vec_f32(70 * d_in, 1.0);
    let w16: Vec<bf16> = random(&mut rng, 33 * d_in, 1.0);
    let wq =
        QuantMatrix::quantize(QuantType::Q8_0, &rng.vec_f32(40 * d_in, 1.0), 40, d_in).unwrap();
    for m in [1, 3, 8, 17, 40] {
        let x = rng.vec_f32(m * d_in, 1.0);
        for threads in [1, 2, 5] {
            let config = CpuConfig::deterministic().with_threads(threads);
            let (mut a, mut b, mut c) =
                (vec![0f32; m * 70], vec![0f32; m * 33], vec![0f32; m * 40]);
            gemm_xwt(&x, &w32, &mut a, m, d_in, 70, &config).unwrap();
            gemm_xwt(&x, &w16, &mut b, m, d_in, 33, &config).unwrap();
            gemm_xwt_quant(&x, &wq, &mut c, m, &config).unwrap();
            let (mut a2, mut b2, mut c2) = (
                vec![f32::NAN; m * 70],
                vec![f32::NAN; m * 33],
                vec![f32::NAN; m * 40],
            );
            gemm_xwt_many(
                &x,
                m,
                d_in,
                &mut [
                    (WeightView::Bf16(&w16), &mut b2),
                    (WeightView::F32(&w32), &mut a2),
                    (WeightView::Quant(&wq), &mut c2),
                ],
                &config,
            )
            .unwrap();
            assert_eq!((a, b, c), (a2, b2, c2), "{m} rows, {threads} threads");
        }
    }
    let err = gemm_xwt_many(
        &[0f32; 6],
        2,
        3,
        &mut [
            (WeightView::F32(&[0f32; 6]), &mut [0f32; 4]),
            (WeightView::F32(&[0f32; 6]), &mut [0f32; 3]),
        ],
        &CpuConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(
        err,
        Error::Shape {
            what: "y (m × d_out)",
            expected: 4,
            got: 3
        }
    ));
}

#[test]
fn gemm_rejects_wrong_lengths() {
    let mut y = vec![0f32; 4];
    gemm_xwt(
        &[0f32; 6],
        &[0f32; 6],
        &mut y,
        2,
        3,
        2,
        &CpuConfig::default(),
    )
    .unwrap();
    let err = gemm_xwt(
        &[0f32; 6],
        &[0f32; 5],
        &mut y,
        2,
        3,
        2,
        &CpuConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(
        err,
        Error::Shape {
            what: "w (d_out × d_in)",
            expected: 6,
            got: 5
        }
    ));
    let mut short_y = vec![0f32; 3];
    let err = gemm_xwt(
        &[0f32; 6],
        &[0f32; 6],
        &mut short_y,
        2,
        3,
        2,
        &CpuConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(
        err,
        Error::Shape {
            what: "y (m × d_out)",
            expected: 4,
            got: 3
        }
    ));
}
