//! Causal attention over key/value caches.

use cx_kernels::rng::{UniformVec, seeded};
use cx_kernels::{AttendRow, CpuConfig, Error, Heads, attend};

use crate::common::assert_close;

const HEADS: Heads = Heads {
    heads: 6,
    kv_heads: 2,
    head_dim: 20,
};

/// Softmax attention in `f64`, the yardstick.
fn reference(row: &AttendRow<'_>, heads: Heads) -> Vec<f32> {
    let Heads {
        heads: h,
        kv_heads,
        head_dim: hd,
    } = heads;
    let kv_width = kv_heads * hd;
    let mut out = vec![0f32; h * hd];
    for head in 0..h {
        let kv = head / (h / kv_heads) * hd;
        let scores: Vec<f64> = (0..row.visible)
            .map(|p| {
                (0..hd)
                    .map(|i| {
                        f64::from(row.q[head * hd + i]) * f64::from(row.keys[p * kv_width + kv + i])
                    })
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        for i in 0..hd {
            let v: f64 = (0..row.visible)
                .map(|p| {
                    (scores[p] - max).exp() / sum * f64::from(row.values[p * kv_width + kv + i])
                })
                .sum();
            out[head * hd + i] = v as f32;
        }
    }
    out
}

#[test]
fn attention_matches_the_reference_and_a_rows_bits_ignore_its_batch() {
    let mut rng = seeded(71);
    let (q_width, kv_width) = (
        HEADS.heads * HEADS.head_dim,
        HEADS.kv_heads * HEADS.head_dim,
    );
    // Three sequences' caches; rows at several positions of each (a prompt, a decode step).
    let caches: Vec<(Vec<f32>, Vec<f32>)> = [9, 1, 40]
        .iter()
        .map(|&n| {
            (
                rng.vec_f32(n * kv_width, 1.0),
                rng.vec_f32(n * kv_width, 1.0),
            )
        })
        .collect();
    let places = [(0, 3), (0, 9), (1, 1), (2, 40), (2, 17), (0, 1)];
    let qs: Vec<Vec<f32>> = places.iter().map(|_| rng.vec_f32(q_width, 2.0)).collect();
    let rows: Vec<AttendRow<'_>> = places
        .iter()
        .zip(&qs)
        .map(|(&(seq, visible), q)| AttendRow {
            q,
            keys: &caches[seq].0,
            values: &caches[seq].1,
            visible,
        })
        .collect();
    let mut alone = Vec::new();
    for row in &rows {
        let mut out = vec![f32::NAN; q_width];
        attend(
            &[*row],
            HEADS,
            &mut out,
            &CpuConfig::deterministic().with_threads(1),
        )
        .unwrap();
        assert_close(&out, &reference(row, HEADS), 1e-5, 1e-4, "one row");
        alone.extend(out);
    }
    for threads in [1, 2, 5] {
        let mut out = vec![f32::NAN; rows.len() * q_width];
        attend(
            &rows,
            HEADS,
            &mut out,
            &CpuConfig::default().with_threads(threads),
        )
        .unwrap();
        assert_eq!(out, alone, "{threads} threads");
    }
}

#[test]
fn attention_refuses_what_does_not_fit() {
    let (q, kv) = (vec![0f32; 120], vec![0f32; 2 * 40]);
    let row = AttendRow {
        q: &q,
        keys: &kv,
        values: &kv,
        visible: 3,
    };
    let mut out = vec![0f32; 120];
    let config = CpuConfig::default();
    assert!(matches!(
        attend(&[row], HEADS, &mut out, &config),
        Err(Error::Batch(_))
    ));
    let row = AttendRow { visible: 2, ..row };
    attend(&[row], HEADS, &mut out, &config).unwrap();
    assert!(matches!(
        attend(
            &[row],
            Heads {
                kv_heads: 4,
                ..HEADS
            },
            &mut out,
            &config
        ),
        Err(Error::Batch(_))
    ));
    assert!(matches!(
        attend(&[row], HEADS, &mut out[..100], &config),
        Err(Error::Shape { .. })
    ));
}
