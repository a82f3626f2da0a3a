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
//! the two vectors.
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
            let qh = &row.q[head * hd..][..hd];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for p in 0..row.visible {
                let score = dot(qh, &row.keys[p * kv_width + kv..][..hd]) * scale;
                max = max.max(score);
                scores.push(score);
            }
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            // SAFETY: item (r, head) alone writes this head's part of row r; `out` stays
            // borrowed by the caller for the whole parallel loop.
            let o = unsafe { shared.part(r * q_width + head * hd, hd) };
            o.fill(0.0);
            for (p, s) in scores.iter().enumerate() {
                let weight = s / sum;
                let vp = &row.values[p * kv_width + kv..][..hd];
                for (o, v) in o.iter_mut().zip(vp) {
                    *o += weight * v;
                }
            }
        },
    );
    Ok(())
}

/// `a·b` as [`LANES`] interleaved partial sums (element `i` into lane `i % LANES`, each
/// product rounded, then added), folded in the GEMM's tree.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (a_rest, b_rest) = (a_chunks.remainder(), b_chunks.remainder());
    for (a, b) in a_chunks.zip(b_chunks) {
        for l in 0..LANES {
            lanes[l] += a[l] * b[l];
        }
    }
    for (l, (a, b)) in a_rest.iter().zip(b_rest).enumerate() {
        lanes[l] += a * b;
    }
    fold(&lanes)
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
        assert_eq!(dot(&a, &b).to_bits(), fold(&lanes).to_bits());
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        assert!((f64::from(dot(&a, &b)) - exact).abs() < 1e-5);
    }
}
