//! SGMV against references, on every device.

use cx_kernels::rng::{UniformVec, seeded};
use cx_kernels::{
    CpuConfig, Device, Element, Error, LoraAdapter, Result, Segment, bf16, gemm_xwt_reference,
    segments_from_row_adapters, sgmv, sgmv_expand, sgmv_reference, sgmv_shrink,
};

use crate::common::{adapters, assert_close, mixed_segments, random, row_adapters};

/// Crosses a reduction block (d_in > 512) and leaves tails everywhere (not multiples of 8 or 32).
const D_IN: usize = 1100;
const D_OUT: usize = 250;

fn mixed_batch_matches_reference<X: Element, T: Element>(device: &Device, seed: u64) -> Result<()> {
    let ads = adapters::<T>(seed, D_IN, D_OUT);
    let table: Vec<&LoraAdapter<T>> = ads.iter().collect();
    let (rows, segments) = mixed_segments();
    assert!(segments.len() >= 12 && ads.len() >= 8);
    let mut rng = seeded(seed + 1);
    let x = random::<X>(&mut rng, rows * D_IN, 1.0);
    let y0 = rng.vec_f32(rows * D_OUT, 1.0);
    let mut got = y0.clone();
    device.sgmv(&x, &mut got, D_IN, D_OUT, &segments, &table)?;
    let mut want = y0.clone();
    sgmv_reference(&x, &mut want, D_IN, D_OUT, &segments, &table)?;
    assert_close(
        &got,
        &want,
        1e-5,
        1e-5,
        &format!("{} x, {} weights", X::NAME, T::NAME),
    );
    // Rows without an adapter are untouched, bit for bit.
    for (row, adapter) in row_adapters().iter().enumerate() {
        if adapter.is_none() {
            assert_eq!(
                got[row * D_OUT..(row + 1) * D_OUT],
                y0[row * D_OUT..(row + 1) * D_OUT]
            );
        }
    }
    // The delta is not negligible: the test would notice a kernel that did nothing.
    let moved = got
        .iter()
        .zip(&y0)
        .filter(|(g, y)| (*g - *y).abs() > 1e-3)
        .count();
    assert!(moved > rows * D_OUT / 2, "only {moved} outputs changed");
    Ok(())
}

fn sgmv_mixed_ranks(device: &Device) -> Result<()> {
    mixed_batch_matches_reference::<f32, f32>(device, 1)?;
    mixed_batch_matches_reference::<f32, bf16>(device, 2)?;
    mixed_batch_matches_reference::<bf16, bf16>(device, 3)?;
    mixed_batch_matches_reference::<bf16, f32>(device, 4)
}
test_device!(
    sgmv_mixed_ranks,
    sgmv_mixed_ranks_matches_naive_reference_cpu,
    sgmv_mixed_ranks_matches_naive_reference_cuda
);

/// Base + SGMV equals the product with merged weights `W + s·B·A`, to a stated tolerance:
/// |difference| ≤ 1e-4 + 1e-4·|value| (two f32 summation orders over 1100 terms).
fn sgmv_equals_merged(device: &Device) -> Result<()> {
    let ads = adapters::<bf16>(9, D_IN, D_OUT);
    let table: Vec<&LoraAdapter<bf16>> = ads.iter().collect();
    let (rows, segments) = mixed_segments();
    let mut rng = seeded(10);
    let x = rng.vec_f32(rows * D_IN, 1.0);
    let w = random::<bf16>(&mut rng, D_OUT * D_IN, 0.05);
    let mut got = gemm_xwt_reference(&x, &w, rows, D_IN, D_OUT);
    device.sgmv(&x, &mut got, D_IN, D_OUT, &segments, &table)?;
    for (row, adapter) in row_adapters().iter().enumerate() {
        let x_row = &x[row * D_IN..(row + 1) * D_IN];
        let mut merged: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        if let Some(a) = adapter {
            for (m, d) in merged.iter_mut().zip(ads[*a].delta_dense()) {
                *m += d;
            }
        }
        let want = gemm_xwt_reference(x_row, &merged, 1, D_IN, D_OUT);
        assert_close(
            &got[row * D_OUT..(row + 1) * D_OUT],
            &want,
            1e-4,
            1e-4,
            &format!("row {row}"),
        );
    }
    Ok(())
}
test_device!(
    sgmv_equals_merged,
    sgmv_equals_merged_weight_result_cpu,
    sgmv_equals_merged_weight_result_cuda
);

/// Empty batches and batches with no adapter rows leave `y` alone.
fn sgmv_empty(device: &Device) -> Result<()> {
    let ads = adapters::<f32>(5, 16, 8);
    let table: Vec<&LoraAdapter<f32>> = ads.iter().collect();
    let mut y = vec![1.5f32; 3 * 8];
    device.sgmv(&[0.25f32; 3 * 16], &mut y, 16, 8, &[], &table)?;
    assert!(y.iter().all(|&v| v == 1.5));
    let mut none: Vec<f32> = vec![];
    device.sgmv::<f32, f32>(&[], &mut none, 16, 8, &[], &table)?;
    Ok(())
}
test_device!(
    sgmv_empty,
    sgmv_without_segments_is_identity_cpu,
    sgmv_without_segments_is_identity_cuda
);

#[test]
fn shrink_then_expand_equals_fused_bits() {
    let ads = adapters::<f32>(21, D_IN, D_OUT);
    let table: Vec<&LoraAdapter<f32>> = ads.iter().collect();
    let (rows, segments) = mixed_segments();
    let mut rng = seeded(22);
    let x = rng.vec_f32(rows * D_IN, 1.0);
    let config = CpuConfig::deterministic();
    let mut fused = vec![0f32; rows * D_OUT];
    sgmv(&x, &mut fused, D_IN, D_OUT, &segments, &table, &config).unwrap();
    let (v, layout) = sgmv_shrink(&x, D_IN, D_OUT, &segments, &table, &config).unwrap();
    // No padding: the intermediate holds exactly Σ len·rank values.
    let expected: usize = segments.iter().map(|s| s.len * ads[s.adapter].rank()).sum();
    assert_eq!(layout.total(), expected);
    assert_eq!(v.len(), expected);
    let mut split = vec![0f32; rows * D_OUT];
    sgmv_expand(&v, &mut split, D_IN, D_OUT, &segments, &table, &config).unwrap();
    assert_eq!(fused, split);
}

#[test]
fn segments_group_consecutive_rows_of_one_adapter() {
    let rows = [Some(2), Some(2), None, Some(2), Some(0), Some(0), None];
    assert_eq!(
        segments_from_row_adapters(&rows),
        vec![
            Segment {
                start: 0,
                len: 2,
                adapter: 2
            },
            Segment {
                start: 3,
                len: 1,
                adapter: 2
            },
            Segment {
                start: 4,
                len: 2,
                adapter: 0
            },
        ]
    );
}

#[test]
fn malformed_batches_are_rejected() {
    let ads = adapters::<f32>(5, 16, 8);
    let table: Vec<&LoraAdapter<f32>> = ads.iter().collect();
    let x = vec![0f32; 4 * 16];
    let mut y = vec![0f32; 4 * 8];
    let config = CpuConfig::default();
    let overlapping = [
        Segment {
            start: 0,
            len: 3,
            adapter: 0,
        },
        Segment {
            start: 2,
            len: 2,
            adapter: 1,
        },
    ];
    assert!(matches!(
        sgmv(&x, &mut y, 16, 8, &overlapping, &table, &config),
        Err(Error::Batch(_))
    ));
    let past_end = [Segment {
        start: 3,
        len: 2,
        adapter: 0,
    }];
    assert!(matches!(
        sgmv(&x, &mut y, 16, 8, &past_end, &table, &config),
        Err(Error::Batch(_))
    ));
    let unknown = [Segment {
        start: 0,
        len: 1,
        adapter: 10,
    }];
    assert!(matches!(
        sgmv(&x, &mut y, 16, 8, &unknown, &table, &config),
        Err(Error::UnknownAdapter {
            segment: 0,
            adapter: 10,
            available: 10
        })
    ));
    let ok = [Segment {
        start: 0,
        len: 1,
        adapter: 0,
    }];
    let mut short_y = vec![0f32; 3 * 8];
    assert!(matches!(
        sgmv(&x, &mut short_y, 16, 8, &ok, &table, &config),
        Err(Error::Shape { .. })
    ));
    // An adapter for another layer shape.
    let wrong = adapters::<f32>(5, 16, 9);
    let wrong_table: Vec<&LoraAdapter<f32>> = wrong.iter().collect();
    assert!(matches!(
        sgmv(&x, &mut y, 16, 8, &ok, &wrong_table, &config),
        Err(Error::Batch(_))
    ));
    assert!(matches!(
        LoraAdapter::from_peft(&[0f32; 5], &[0f32; 8], 1, 16, 8, 1.0),
        Err(Error::Shape { .. })
    ));
}
