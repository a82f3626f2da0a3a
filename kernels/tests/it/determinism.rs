//! Deterministic mode: a row's output bits depend on the row, its adapter and the weights only.

use cx_kernels::rng::{UniformVec, seeded};
use cx_kernels::{CpuConfig, Device, LoraAdapter, Result, Segment, bf16, gemm_xwt, sgmv};

use crate::common::{adapters, mixed_segments, random};

const D_IN: usize = 1100;
const D_OUT: usize = 250;

/// `y = x·Wᵀ + SGMV` for one probe row placed in different batches; returns the probe's output.
fn probe_output(
    config: &CpuConfig,
    batch_x: &[f32],
    rows: usize,
    segments: &[Segment],
    probe_row: usize,
    w: &[bf16],
    table: &[&LoraAdapter<bf16>],
) -> Vec<f32> {
    let mut y = vec![0f32; rows * D_OUT];
    gemm_xwt(batch_x, w, &mut y, rows, D_IN, D_OUT, config).unwrap();
    sgmv(batch_x, &mut y, D_IN, D_OUT, segments, table, config).unwrap();
    y[probe_row * D_OUT..(probe_row + 1) * D_OUT].to_vec()
}

#[test]
fn deterministic_bits_independent_of_batch_composition_and_threads() {
    let ads = adapters::<bf16>(31, D_IN, D_OUT);
    let table: Vec<&LoraAdapter<bf16>> = ads.iter().collect();
    let mut rng = seeded(32);
    let w = random::<bf16>(&mut rng, D_OUT * D_IN, 0.05);
    let probe = rng.vec_f32(D_IN, 1.0);
    let probe_adapter = 8; // rank 32

    // Batch A: the probe alone.
    let alone = vec![Segment {
        start: 0,
        len: 1,
        adapter: probe_adapter,
    }];
    // Batch B: the mixed 64-row batch with the probe written into the middle of a 13-row
    // segment of its adapter (so it sits in a 4-row tile with other rows, and in the second
    // work item of that segment).
    let (rows, mut segments) = mixed_segments();
    let seg = segments.iter().position(|s| s.len == 13).unwrap();
    segments[seg].adapter = probe_adapter;
    let probe_row_b = segments[seg].start + 9;
    let mut x_b = rng.vec_f32(rows * D_IN, 1.0);
    x_b[probe_row_b * D_IN..(probe_row_b + 1) * D_IN].copy_from_slice(&probe);
    // Batch C: the same rows with the segments listed in reverse row order of the batch
    // (the probe first, then neighbours of other adapters), different row count.
    let c_rows = 7;
    let mut x_c = rng.vec_f32(c_rows * D_IN, 1.0);
    x_c[..D_IN].copy_from_slice(&probe);
    let c_segments = vec![
        Segment {
            start: 0,
            len: 2,
            adapter: probe_adapter,
        },
        Segment {
            start: 2,
            len: 3,
            adapter: 0,
        },
        Segment {
            start: 5,
            len: 2,
            adapter: 9,
        },
    ];

    let reference = probe_output(
        &CpuConfig::deterministic().with_threads(1),
        &probe,
        1,
        &alone,
        0,
        &w,
        &table,
    );
    for threads in [1, 2, 3, 7] {
        let config = CpuConfig::deterministic().with_threads(threads);
        let a = probe_output(&config, &probe, 1, &alone, 0, &w, &table);
        let b = probe_output(&config, &x_b, rows, &segments, probe_row_b, &w, &table);
        let c = probe_output(&config, &x_c, c_rows, &c_segments, 0, &w, &table);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&reference), "alone, {threads} threads");
        assert_eq!(
            bits(&b),
            bits(&reference),
            "in the mixed batch, {threads} threads"
        );
        assert_eq!(
            bits(&c),
            bits(&reference),
            "in a reordered batch, {threads} threads"
        );
    }
}

/// Fast mode may use FMA, so its bits can differ from deterministic mode, but only by rounding.
#[test]
fn fast_mode_agrees_with_deterministic_within_rounding() {
    let ads = adapters::<f32>(41, D_IN, D_OUT);
    let table: Vec<&LoraAdapter<f32>> = ads.iter().collect();
    let (rows, segments) = mixed_segments();
    let mut rng = seeded(42);
    let x = rng.vec_f32(rows * D_IN, 1.0);
    let w = rng.vec_f32(D_OUT * D_IN, 0.05);
    let run = |config: CpuConfig| {
        let mut y = vec![0f32; rows * D_OUT];
        gemm_xwt(&x, &w, &mut y, rows, D_IN, D_OUT, &config).unwrap();
        sgmv(&x, &mut y, D_IN, D_OUT, &segments, &table, &config).unwrap();
        y
    };
    let det = run(CpuConfig::deterministic());
    let fast = run(CpuConfig::default());
    crate::common::assert_close(&fast, &det, 1e-5, 1e-5, "fast vs deterministic");
}

/// On any device, a row's SGMV output does not change with its neighbours or segment order.
fn row_bits_independent_of_neighbours(device: &Device) -> Result<()> {
    let ads = adapters::<f32>(51, D_IN, D_OUT);
    let table: Vec<&LoraAdapter<f32>> = ads.iter().collect();
    let mut rng = seeded(52);
    let probe = rng.vec_f32(D_IN, 1.0);
    let mut alone = vec![0f32; D_OUT];
    device.sgmv(
        &probe,
        &mut alone,
        D_IN,
        D_OUT,
        &[Segment {
            start: 0,
            len: 1,
            adapter: 6,
        }],
        &table,
    )?;
    let rows = 20;
    let mut x = rng.vec_f32(rows * D_IN, 1.0);
    x[11 * D_IN..12 * D_IN].copy_from_slice(&probe);
    let segments = [
        Segment {
            start: 0,
            len: 4,
            adapter: 9,
        },
        Segment {
            start: 4,
            len: 10,
            adapter: 6,
        },
        Segment {
            start: 14,
            len: 6,
            adapter: 1,
        },
    ];
    let mut y = vec![0f32; rows * D_OUT];
    device.sgmv(&x, &mut y, D_IN, D_OUT, &segments, &table)?;
    assert_eq!(&y[11 * D_OUT..12 * D_OUT], &alone[..]);
    Ok(())
}
test_device!(
    row_bits_independent_of_neighbours,
    row_bits_independent_of_neighbours_cpu,
    row_bits_independent_of_neighbours_cuda
);
