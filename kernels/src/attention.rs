//! Causal softmax attention of a batch's rows over their sequences' key/value caches
//! (grouped-query: `heads / kv_heads` query heads share a key/value head), on the kernels'
//! worker pool.
//!
//! # Why here
//! A decode step's attention is small beside its projections, but it ran on the calling thread
//! alone while the pool's workers waited, and its scores were one chain of dependent adds per
//! dot product (`head_dim` adds, each waiting for the last). Here the batch's (row, head) pairs
//! are the work items, and a score is [`LANES`] interleaved partial sums folded in the GEMM's
//! fixed tree ([`crate::cpu`]): the compiler vectorises it, and its bits still depend only on
//! the two vectors. Four keys' scores are computed side by side (four independent chains for
//! the core to overlap), and a 64- or 128-wide head's weighted sum of the values stays in
//! registers across the positions: 2.3–3.2× faster at one row and 1.6–1.7× at eight
//! (`attend` of SmolLM2's 9/3 heads of 64 over 160–2048 positions, AMD EPYC, 2 threads), the
//! same bits.
//!
//! # Why the bits do not depend on the batch
//! One (row, head) item reads only its own query, its sequence's cache up to its position, and
//! writes only its own output; the operations inside it are in a fixed order (scores, their
//! maximum, `exp` of each difference, their sum in position order, the weighted sum of the
//! values in position order). Which thread runs an item, and what else is in the batch, never
//! changes them (class D), in either [`crate::Mode`].

use crate::cpu::{CpuConfig, LANES, SharedOut, fold, for_each_item};
use crate::error::{Error, Result};

/// The heads of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

/// One row of a batch: its query and its sequence's cache.
#[derive(Clone, Copy, Debug)]
pub struct AttendRow<'a> {
    /// `heads × head_dim`.
    pub q: &'a [f32],
    /// The sequence's keys, `positions × kv_heads × head_dim` (at least `visible` positions).
    pub keys: &'a [f32],
    /// The sequence's values, laid out as `keys`.
    pub values: &'a [f32],
    /// Positions this row attends to (`0..visible`: its own and every earlier one).
    pub visible: usize,
}

/// `out[r] = softmax(q_r·Kᵀ / √head_dim)·V` per head, over each row's `visible` cached
/// positions (overwrites `out`, `rows × heads × head_dim`).
pub fn attend(
    rows: &[AttendRow<'_>],
    heads: Heads,
    out: &mut [f32],
    config: &CpuConfig,
) -> Result<()> {
    let Heads {
        heads: h,
        kv_heads,
        head_dim: hd,
    } = heads;
    if h == 0 || kv_heads == 0 || hd == 0 || h % kv_heads != 0 {
        return Err(Error::Batch(format!(
            "attend: {h} query heads cannot share {kv_heads} key/value heads of {hd}"
        )));
    }
    let (q_width, kv_width) = (h * hd, kv_heads * hd);
    crate::error::check_len(
        "out (rows × heads × head_dim)",
        out.len(),
        rows.len() * q_width,
    )?;
    for row in rows {
        crate::error::check_len("q (heads × head_dim)", row.q.len(), q_width)?;
        if row.visible == 0
            || row.keys.len() < row.visible * kv_width
            || row.values.len() < row.visible * kv_width
        {
            return Err(Error::Batch(format!(
                "attend: a row attends to {} positions of a cache of {} keys and {} values ({kv_width} wide)",
                row.visible,
                row.keys.len() / kv_width,
                row.values.len() / kv_width
            )));
        }
    }
    let group = h / kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let shared = SharedOut::new(out);
    for_each_item(
        config.threads,
        rows.len() * h,
        |item, scores: &mut Vec<f32>| {
            let (r, head) = (item / h, item % h);
            let row = &rows[r];
            let kv = head / group * hd;
            // SAFETY: item (r, head) alone writes this head's part of row r; `out` stays
            // borrowed by the caller for the whole parallel loop.
            let o = unsafe { shared.part(r * q_width + head * hd, hd) };
            attend_head(
                &row.q[head * hd..][..hd],
                |p| &row.keys[p * kv_width + kv..][..hd],
                |p| &row.values[p * kv_width + kv..][..hd],
                row.visible,
                scale,
                scores,
                o,
            );
        },
    );
    Ok(())
}

/// One query head `qh` over `visible` positions of its key/value head: the scores, their
/// maximum, `exp` of each difference, their sum in position order, and `o` the weighted sum
/// of the values in position order.
#[inline(always)]
fn attend_head<'c>(
    qh: &[f32],
    key: impl Fn(usize) -> &'c [f32],
    value: impl Fn(usize) -> &'c [f32],
    visible: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    let mut p = 0;
    while p + SIDE_BY_SIDE <= visible {
        for score in dots::<SIDE_BY_SIDE>(qh, std::array::from_fn(|i| key(p + i))) {
            let score = score * scale;
            max = max.max(score);
            scores.push(score);
        }
        p += SIDE_BY_SIDE;
    }
    for p in p..visible {
        let [score] = dots(qh, [key(p)]);
        let score = score * scale;
        max = max.max(score);
        scores.push(score);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    match o.len() {
        64 => weighted::<64>(scores, sum, value, o),
        128 => weighted::<128>(scores, sum, value, o),
        _ => weighted_any(scores, sum, value, o),
    }
}

/// Keys whose scores are computed side by side: independent chains of adds that the core
/// overlaps (one score's chain is `head_dim / LANES` dependent adds), each score's own
/// arithmetic unchanged.
const SIDE_BY_SIDE: usize = 4;

/// `a·b` for each `b` of `bs`, side by side: each as [`LANES`] interleaved partial sums
/// (element `i` into lane `i % LANES`, each product rounded, then added), folded in the GEMM's
/// tree. Its bits depend on `a` and that `b` alone, not on `N` nor on the others.
#[inline(always)]
fn dots<const N: usize>(a: &[f32], bs: [&[f32]; N]) -> [f32; N] {
    let bs = bs.map(|b| &b[..a.len()]);
    let mut lanes = [[0f32; LANES]; N];
    let full = a.len() / LANES * LANES;
    let mut c = 0;
    while c < full {
        let a: &[f32; LANES] = a[c..c + LANES].try_into().expect("a whole chunk");
        for (lanes, b) in lanes.iter_mut().zip(&bs) {
            let b: &[f32; LANES] = b[c..c + LANES].try_into().expect("a whole chunk");
            for l in 0..LANES {
                lanes[l] += a[l] * b[l];
            }
        }
        c += LANES;
    }
    for (lanes, b) in lanes.iter_mut().zip(&bs) {
        for (l, c) in (full..a.len()).enumerate() {
            lanes[l] += a[c] * b[c];
        }
    }
    lanes.map(|l| fold(&l))
}

/// `o = Σ_p (s_p / sum)·v_p` over the positions in order, for a head of `D` elements: the sum
/// stays in registers across the positions; each element's additions are [`weighted_any`]'s,
/// in the same order, so the bits are its bits.
#[inline(always)]
fn weighted<'v, const D: usize>(
    scores: &[f32],
    sum: f32,
    value: impl Fn(usize) -> &'v [f32],
    o: &mut [f32],
) {
    let mut acc = [0f32; D];
    for (p, s) in scores.iter().enumerate() {
        let weight = s / sum;
        let v: &[f32; D] = value(p).try_into().expect("a head of D elements");
        for e in 0..D {
            acc[e] += weight * v[e];
        }
    }
    o.copy_from_slice(&acc);
}

/// [`weighted`] for a head of any width.
fn weighted_any<'v>(scores: &[f32], sum: f32, value: impl Fn(usize) -> &'v [f32], o: &mut [f32]) {
    o.fill(0.0);
    for (p, s) in scores.iter().enumerate() {
        let weight = s / sum;
        for (o, v) in o.iter_mut().zip(value(p)) {
            *o += weight * v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dot_product_is_its_lanes_folded() {
        let a: Vec<f32> = (0..21).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..21).map(|i| (i as f32 * 0.91).cos()).collect();
        let mut lanes = [0f32; LANES];
        for i in 0..21 {
            lanes[i % LANES] += a[i] * b[i];
        }
        let [one] = dots(&a, [&b]);
        assert_eq!(one.to_bits(), fold(&lanes).to_bits());
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        assert!((f64::from(one) - exact).abs() < 1e-5);
    }

    #[test]
    fn side_by_side_each_dot_product_and_each_head_keeps_its_bits() {
        let wave =
            |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f + 0.3).sin()).collect() };
        for len in [5, 8, 21, 64, 128] {
            let a = wave(len, 0.37);
            let bs: Vec<Vec<f32>> = (0..4).map(|j| wave(len, 0.5 + j as f32 * 0.11)).collect();
            let four = dots::<4>(&a, std::array::from_fn(|j| bs[j].as_slice()));
            for (j, b) in bs.iter().enumerate() {
                assert_eq!(four[j].to_bits(), dots(&a, [b.as_slice()])[0].to_bits());
            }
        }
        let scores = wave(37, 0.7).iter().map(|s| s.exp()).collect::<Vec<_>>();
        let sum: f32 = scores.iter().sum();
        for width in [64, 128] {
            let values = wave(37 * width, 0.013);
            let value = |p: usize| &values[p * width..][..width];
            let (mut fixed, mut any) = (vec![1f32; width], vec![2f32; width]);
            match width {
                64 => weighted::<64>(&scores, sum, value, &mut fixed),
                _ => weighted::<128>(&scores, sum, value, &mut fixed),
            }
            weighted_any(&scores, sum, value, &mut any);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fixed), bits(&any), "width {width}");
        }
    }
}
