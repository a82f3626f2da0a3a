//! Freivalds' check: is `C = A·B` without recomputing the product.
//!
//! Each round draws `r ∈ {0,1}ᵖ` and compares `A·(B·r)` with `C·r`, costing three
//! matrix-vector products instead of a matrix product. If `C ≠ A·B`, some row of
//! `C − A·B` is a nonzero vector `e`, and `e·r = 0` for at most half of all `r` (flip one
//! coordinate where `e` is nonzero), so one round misses with probability ≤ ½ and `k`
//! independent rounds with probability ≤ 2⁻ᵏ (Freivalds 1977). The `k` rounds are batched:
//! `R` is `p × k`, and the products become thin GEMMs that read each matrix once. For
//! `y = x·Wᵀ` against fixed weights, [`FreivaldsSketch`] keeps `Wᵀ·R` between checks.
//!
//! Floats: `A·(B·r)` and `C·r` differ by rounding even for an honest `C`, so an entry
//! passes when `|A·(B·r) − C·r|ᵢ ≤ rel_tol·‖Aᵢ‖₂·‖B·r‖₂` (Cauchy–Schwarz scale of the dot
//! product; honest `f32` rounding is about `√n·2⁻²⁴` of it). A corruption smaller than that
//! tolerance is indistinguishable from rounding and is not detected.

use crate::cpu::{
    CpuConfig, SharedOut, TN_ROUNDS, for_each_item, nt_accumulate, nt_accumulate_blocked,
    tn_accumulate,
};
use crate::element::{Element, as_f32};
use crate::error::{Error, Result, check_len};
use crate::rng::{RngCore, seeded};

/// Reduction block of the thin products: long, so that the lane folds at block ends stay a
/// small part of the work (the thin operand is re-read from L2 either way).
const THIN_KC: usize = 1024;

/// Default relative tolerance for `f32` products (see the module docs).
pub const DEFAULT_REL_TOL: f32 = 1e-4;

/// What a check found.
#[derive(Clone, Debug, PartialEq)]
pub struct FreivaldsReport {
    /// Every round passed.
    pub accepted: bool,
    /// Rounds run (`k`).
    pub rounds: usize,
    /// Rounds in which at least one entry exceeded the tolerance.
    pub failed_rounds: usize,
    /// Largest `|A·(B·r) − C·r| / tolerance` seen (≤ 1 when accepted).
    pub worst_ratio: f64,
}

/// `rounds` random 0/1 vectors of length `p`, as `Rᵀ` (`rounds × p`).
fn random_rt(p: usize, rounds: usize, seed: u64) -> Vec<f32> {
    let mut rng = seeded(seed);
    let mut rt = vec![0f32; rounds * p];
    for chunk in rt.chunks_mut(64) {
        let bits = rng.next_u64();
        for (b, v) in chunk.iter_mut().enumerate() {
            *v = ((bits >> b) & 1) as f32;
        }
    }
    rt
}

/// `out = x·wᵀ` split by rows of `x` across threads.
///
/// Shapes: `x` is `m × k_len`, `w` is `n × k_len`, returns `m × n`.
fn nt_parallel(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k_len: usize,
    config: &CpuConfig,
) -> Vec<f32> {
    const ROWS: usize = 64;
    let mut out = vec![0f32; m * n];
    let shared = SharedOut::new(&mut out);
    for_each_item(config.threads, m.div_ceil(ROWS), |item, _: &mut ()| {
        let i0 = item * ROWS;
        let rows = ROWS.min(m - i0);
        // SAFETY: items write disjoint row blocks of `out`, borrowed for the whole loop.
        let part = unsafe { shared.part(i0 * n, rows * n) };
        nt_accumulate(
            &x[i0 * k_len..],
            k_len,
            rows,
            w,
            k_len,
            n,
            k_len,
            part,
            config.mode,
        );
    });
    out
}

/// Euclidean norms of the rows of `x` (`rows × cols`), in parallel.
fn row_norms(x: &[f32], rows: usize, cols: usize, config: &CpuConfig) -> Vec<f64> {
    const ROWS: usize = 64;
    let mut squares = vec![0f32; rows];
    let shared = SharedOut::new(&mut squares);
    for_each_item(config.threads, rows.div_ceil(ROWS), |item, _: &mut ()| {
        let i0 = item * ROWS;
        let n = ROWS.min(rows - i0);
        // SAFETY: items write disjoint ranges of `squares`.
        let part = unsafe { shared.part(i0, n) };
        for (i, sq) in part.iter_mut().enumerate() {
            let row = &x[(i0 + i) * cols..(i0 + i + 1) * cols];
            nt_accumulate(
                row,
                cols,
                1,
                row,
                cols,
                1,
                cols,
                std::slice::from_mut(sq),
                config.mode,
            );
        }
    });
    squares.iter().map(|&s| f64::from(s).sqrt()).collect()
}

/// The per-row half of a check in one pass over row blocks: `lhs = A·(B·R)`, `rhs = C·R`
/// and the row norms of `A`, each block of `A` still in cache when its norms are taken.
///
/// Shapes: `a` is `m × n`, `br_t` is `k × n`, `c` is `m × p`, `rt` is `k × p`; returns
/// `lhs` and `rhs` (`m × k`) and `‖Aᵢ‖₂` (`m`).
#[allow(clippy::too_many_arguments)]
fn row_pass(
    a: &[f32],
    n: usize,
    br_t: &[f32],
    c: &[f32],
    p: usize,
    rt: &[f32],
    m: usize,
    k: usize,
    config: &CpuConfig,
) -> (Vec<f32>, Vec<f32>, Vec<f64>) {
    const ROWS: usize = 32;
    let mut lhs = vec![0f32; m * k];
    let mut rhs = vec![0f32; m * k];
    let mut squares = vec![0f32; m];
    let (lhs_out, rhs_out, sq_out) = (
        SharedOut::new(&mut lhs),
        SharedOut::new(&mut rhs),
        SharedOut::new(&mut squares),
    );
    for_each_item(config.threads, m.div_ceil(ROWS), |item, _: &mut ()| {
        let i0 = item * ROWS;
        let rows = ROWS.min(m - i0);
        // SAFETY: items write disjoint row blocks of the three outputs, borrowed for the loop.
        let (l, r, sq) = unsafe {
            (
                lhs_out.part(i0 * k, rows * k),
                rhs_out.part(i0 * k, rows * k),
                sq_out.part(i0, rows),
            )
        };
        let a_blk = &a[i0 * n..(i0 + rows) * n];
        nt_accumulate_blocked(a_blk, n, rows, br_t, n, k, n, l, config.mode, THIN_KC);
        for (i, s) in sq.iter_mut().enumerate() {
            let row = &a_blk[i * n..(i + 1) * n];
            nt_accumulate(
                row,
                n,
                1,
                row,
                n,
                1,
                n,
                std::slice::from_mut(s),
                config.mode,
            );
        }
        let c_blk = &c[i0 * p..(i0 + rows) * p];
        nt_accumulate_blocked(c_blk, p, rows, rt, p, k, p, r, config.mode, THIN_KC);
    });
    (
        lhs,
        rhs,
        squares.iter().map(|&s| f64::from(s).sqrt()).collect(),
    )
}

/// Compares `lhs = A·(B·R)` with `rhs = C·R` (both `m × k`) under the tolerance.
fn judge(
    lhs: &[f32],
    rhs: &[f32],
    a_norms: &[f64],
    br_norms: &[f64],
    k: usize,
    rel_tol: f32,
) -> FreivaldsReport {
    let mut failed = vec![false; k];
    let mut worst = 0f64;
    for (i, a_norm) in a_norms.iter().enumerate() {
        for t in 0..k {
            let diff = (f64::from(lhs[i * k + t]) - f64::from(rhs[i * k + t])).abs();
            let tol = f64::from(rel_tol) * a_norm * br_norms[t] + f64::from(f32::MIN_POSITIVE);
            let ratio = diff / tol;
            // NaN (a poisoned product) fails too.
            if ratio > 1.0 || ratio.is_nan() {
                failed[t] = true;
            }
            if ratio.is_nan() {
                worst = f64::INFINITY;
            } else {
                worst = worst.max(ratio);
            }
        }
    }
    let failed_rounds = failed.iter().filter(|&&f| f).count();
    FreivaldsReport {
        accepted: failed_rounds == 0,
        rounds: k,
        failed_rounds,
        worst_ratio: worst,
    }
}

/// Checks `C = A·B` with `rounds` Freivalds rounds drawn from `seed`.
///
/// Shapes: `a` is `m × n`, `b` is `n × p`, `c` is `m × p`, all row-major.
#[allow(clippy::too_many_arguments)]
pub fn freivalds_check(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    m: usize,
    n: usize,
    p: usize,
    rounds: usize,
    seed: u64,
    rel_tol: f32,
    config: &CpuConfig,
) -> Result<FreivaldsReport> {
    check_len("a (m × n)", a.len(), m * n)?;
    check_len("b (n × p)", b.len(), n * p)?;
    check_len("c (m × p)", c.len(), m * p)?;
    if rounds == 0 {
        return Err(Error::Batch(
            "freivalds: at least one round is needed".into(),
        ));
    }
    let rt = random_rt(p, rounds, seed);
    let br = nt_parallel(b, n, &rt, rounds, p, config); // n × k
    let mut br_t = vec![0f32; rounds * n];
    for d in 0..n {
        for t in 0..rounds {
            br_t[t * n + d] = br[d * rounds + t];
        }
    }
    let (lhs, rhs, a_norms) = row_pass(a, n, &br_t, c, p, &rt, m, rounds, config);
    Ok(judge(
        &lhs,
        &rhs,
        &a_norms,
        &row_norms(&br_t, rounds, n, config),
        rounds,
        rel_tol,
    ))
}

/// Checks `y = x·Wᵀ` (the layout of [`crate::gemm_xwt`]) with `rounds` Freivalds rounds.
///
/// Builds a [`FreivaldsSketch`] of `W` and checks once; a verifier that checks many products
/// against the same weights keeps the sketch instead (see there).
///
/// Shapes: `x` is `m × d_in`, `w` is `d_out × d_in`, `y` is `m × d_out`.
#[allow(clippy::too_many_arguments)]
pub fn freivalds_check_xwt<X: Element, W: Element>(
    x: &[X],
    w: &[W],
    y: &[f32],
    m: usize,
    d_in: usize,
    d_out: usize,
    rounds: usize,
    seed: u64,
    rel_tol: f32,
    config: &CpuConfig,
) -> Result<FreivaldsReport> {
    FreivaldsSketch::new(w, d_in, d_out, rounds, seed, config)?.check(x, y, m, rel_tol, config)
}

/// The verifier's secret half of Freivalds checks against fixed weights `W` (`d_out × d_in`):
/// `k` random 0/1 vectors `R` and `Wᵀ·R`.
///
/// `Wᵀ·R` costs `k·d_in·d_out`, as much as `k` passes over `W`, and does not depend on the
/// product being checked; with it kept, checking `y = x·Wᵀ` costs only `k·m·(d_in + d_out)`
/// (`x·(Wᵀ·R)` and `y·R`), about `2k/d` of the product instead of `k/m`. Soundness is
/// unchanged as long as `R` stays secret from the party whose products are checked: keep the
/// sketch with the verifier, never send it, and build a new one (new seed) after a check fails,
/// since a rejected product tells its sender something about `R`.
#[derive(Clone, Debug)]
pub struct FreivaldsSketch {
    rounds: usize,
    d_in: usize,
    d_out: usize,
    /// `Rᵀ`, `rounds × d_out`.
    rt: Vec<f32>,
    /// `Rᵀ·W`, `rounds × d_in`.
    rtw: Vec<f32>,
    /// `‖(Rᵀ·W)_t‖₂` per round.
    rtw_norms: Vec<f64>,
}

impl FreivaldsSketch {
    /// Draws `rounds` vectors from `seed` and computes `Rᵀ·W`.
    ///
    /// Shapes: `w` is `d_out × d_in` row-major.
    pub fn new<W: Element>(
        w: &[W],
        d_in: usize,
        d_out: usize,
        rounds: usize,
        seed: u64,
        config: &CpuConfig,
    ) -> Result<Self> {
        check_len("w (d_out × d_in)", w.len(), d_out * d_in)?;
        if rounds == 0 {
            return Err(Error::Batch(
                "freivalds: at least one round is needed".into(),
            ));
        }
        let rt = random_rt(d_out, rounds, seed); // k × d_out
        // Rᵀ·W, k × d_in, split by columns of W; Rᵀ padded with zero rows to whole round
        // groups of the kernel.
        const COLS: usize = 256;
        let padded = rounds.div_ceil(TN_ROUNDS) * TN_ROUNDS;
        let mut rt_padded = rt.clone();
        rt_padded.resize(padded * d_out, 0.0);
        let mut rtw = vec![0f32; rounds * d_in];
        let shared = SharedOut::new(&mut rtw);
        for_each_item(
            config.threads,
            d_in.div_ceil(COLS),
            |item, scratch: &mut (Vec<f32>, Vec<f32>)| {
                let c0 = item * COLS;
                let cols = COLS.min(d_in - c0);
                let (acc, packed) = scratch;
                acc.clear();
                acc.resize(padded * cols, 0.0);
                tn_accumulate(
                    &rt_padded,
                    padded,
                    d_out,
                    &w[c0..],
                    d_in,
                    cols,
                    acc,
                    packed,
                    config.mode,
                );
                for t in 0..rounds {
                    // SAFETY: items own disjoint column blocks of every row of `rtw`.
                    let part = unsafe { shared.part(t * d_in + c0, cols) };
                    part.copy_from_slice(&acc[t * cols..(t + 1) * cols]);
                }
            },
        );
        let rtw_norms = row_norms(&rtw, rounds, d_in, config);
        Ok(Self {
            rounds,
            d_in,
            d_out,
            rt,
            rtw,
            rtw_norms,
        })
    }

    /// Rounds `k`.
    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// Checks `y = x·Wᵀ` for the `W` this sketch was built from.
    ///
    /// Shapes: `x` is `m × d_in`, `y` is `m × d_out`.
    pub fn check<X: Element>(
        &self,
        x: &[X],
        y: &[f32],
        m: usize,
        rel_tol: f32,
        config: &CpuConfig,
    ) -> Result<FreivaldsReport> {
        let (d_in, d_out, k) = (self.d_in, self.d_out, self.rounds);
        check_len("x (m × d_in)", x.len(), m * d_in)?;
        check_len("y (m × d_out)", y.len(), m * d_out)?;
        let x = as_f32(x);
        let (lhs, rhs, x_norms) = row_pass(&x, d_in, &self.rtw, y, d_out, &self.rt, m, k, config);
        Ok(judge(&lhs, &rhs, &x_norms, &self.rtw_norms, k, rel_tol))
    }
}
