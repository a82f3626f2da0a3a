//! Test data: seeded random matrices and mixed-rank adapter batches.

use cx_kernels::rng::{ChaCha20Rng, UniformVec, seeded};
use cx_kernels::{Element, LoraAdapter, Segment, segments_from_row_adapters};

/// Ranks of the mixed batch: ten adapters, all different, including 1, odd ranks and 64.
pub(crate) const RANKS: [usize; 10] = [1, 2, 3, 4, 7, 8, 16, 24, 32, 64];

pub(crate) fn random<T: Element>(rng: &mut ChaCha20Rng, len: usize, scale: f32) -> Vec<T> {
    rng.vec_f32(len, scale)
        .into_iter()
        .map(T::from_f32)
        .collect()
}

pub(crate) fn adapters<T: Element>(seed: u64, d_in: usize, d_out: usize) -> Vec<LoraAdapter<T>> {
    let mut rng = seeded(seed);
    RANKS
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            let a = random::<T>(&mut rng, r * d_in, 0.1);
            let b = random::<T>(&mut rng, d_out * r, 0.1);
            LoraAdapter::from_peft(&a, &b, r, d_in, d_out, (2 + i) as f32).unwrap()
        })
        .collect()
}

/// Row → adapter for a 64-row batch: segments of lengths 1..13 (longer than one work item),
/// every adapter used, adapters appearing twice in separate segments, and base-only rows.
pub(crate) fn row_adapters() -> Vec<Option<usize>> {
    let pattern: [(Option<usize>, usize); 14] = [
        (Some(3), 5),
        (None, 2),
        (Some(9), 13),
        (Some(0), 1),
        (Some(5), 4),
        (Some(1), 3),
        (None, 1),
        (Some(7), 9),
        (Some(2), 2),
        (Some(3), 6),
        (Some(8), 1),
        (Some(4), 7),
        (Some(6), 8),
        (Some(9), 2),
    ];
    pattern
        .iter()
        .flat_map(|&(a, n)| std::iter::repeat_n(a, n))
        .collect()
}

pub(crate) fn mixed_segments() -> (usize, Vec<Segment>) {
    let rows = row_adapters();
    (rows.len(), segments_from_row_adapters(&rows))
}

/// `|got − want| ≤ abs + rel·|want|` elementwise, with the worst offender in the message.
pub(crate) fn assert_close(got: &[f32], want: &[f32], abs: f32, rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= abs + rel * w.abs(),
            "{what}: element {i}: got {g}, want {w} (tolerance {abs} + {rel}·|want|)"
        );
    }
}
