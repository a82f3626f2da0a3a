//! The `nt` kernel of a prompt's many rows on AVX-512, over operands packed for it.
//!
//! [`super::tile_pairs`] keeps two rows of `w` in one register (row `j` in lanes 0–7, `j + 1`
//! in 8–15) and a row of `x`'s eight elements in both halves: each register of `w` is joined
//! from two loads by an insert, and each of `x` is a broadcast. At a prompt's rows those
//! shuffles share the vector pipes with the multiplies and adds (a 6 × 8 tile over operands
//! already laid out so, against the 8 × 4 tile with its shuffles, SmolLM2-135M's projections at
//! 256 rows, AMD EPYC, 2 threads: 431 against 596 ms). Here `x` is written once per product
//! with each eight-element chunk twice side by side ([`crate::cpu::packed::pack_x`]), and each panel of `w` once
//! per panel as pairs of rows chunk by chunk ([`crate::cpu::packed::pack_w`]), so every register is one plain load.
//!
//! Every lane does what [`super::tile_pairs`]'s lane does — `acc + x·w` in ascending order
//! (fused when `FMA`), the same [`fold_register`] per block of `kc`, blocks in ascending order —
//! so every output has the bits of the row-major kernel.

// The tile indexes its sums, its registers of `w` and its rows of `x` by the same row and
// register numbers; iterators over one of them would hide which is which.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::{__m512, _mm512_loadu_ps, _mm512_setzero_ps};

use super::{LANES, fold_register, halves, madd512};
use crate::cpu::packed::{COLS, packed_len};

/// Rows of `x` per tile: six rows by eight columns is 24 sums, four registers of `w` and one
/// of `x`, within AVX-512's 32.
const ROWS: usize = 6;

/// `out[i*n + j] += Σ_c x[i][c]·w[j][c]` for the `m` rows of `x` and the `n` rows of `w` (a
/// multiple of [`COLS`]) as [`crate::cpu::packed`] lays them out, `k` elements each, in blocks of `kc`.
///
/// # Safety
/// The CPU must support AVX2 and AVX-512F, and FMA when `FMA`.
#[inline(always)]
unsafe fn nt<const FMA: bool>(
    xp: &[f32],
    m: usize,
    wp: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    let stride = packed_len(k);
    assert!(k.is_multiple_of(LANES) && kc.is_multiple_of(LANES) && n.is_multiple_of(COLS));
    assert!(xp.len() >= m * stride, "nt packed: x too short");
    assert!(wp.len() >= n / 2 * stride, "nt packed: w too short");
    assert!(out.len() >= m * n, "nt packed: out too short");
    for k0 in (0..k).step_by(kc) {
        let chunks = kc.min(k - k0) / LANES;
        for i in (0..m).step_by(ROWS) {
            for j in (0..n).step_by(COLS) {
                let at = Tile {
                    x: &xp[i * stride + 2 * k0..],
                    w: &wp[j / 2 * stride + 2 * k0..],
                    stride,
                    chunks,
                };
                let out = &mut out[i * n + j..];
                // SAFETY: the features are the caller's contract; the asserts above bound
                // every row and pair the tile reads and every output it writes.
                unsafe {
                    match m - i {
                        1 => at.run::<1, FMA>(out, n),
                        2 => at.run::<2, FMA>(out, n),
                        3 => at.run::<3, FMA>(out, n),
                        4 => at.run::<4, FMA>(out, n),
                        5 => at.run::<5, FMA>(out, n),
                        _ => at.run::<ROWS, FMA>(out, n),
                    }
                }
            }
        }
    }
}

/// One tile's operands: `MR` packed rows of `x` and four packed pairs of `w`, `stride` floats
/// apart, from the block's first chunk, for `chunks` chunks.
struct Tile<'a> {
    x: &'a [f32],
    w: &'a [f32],
    stride: usize,
    chunks: usize,
}

impl Tile<'_> {
    /// Adds the tile's folded block sums to `out` (row `i`'s at `out[i * out_stride..]`).
    ///
    /// # Safety
    /// As [`nt`]; the tile's rows, pairs and outputs lie inside the slices.
    #[inline(always)]
    unsafe fn run<const MR: usize, const FMA: bool>(&self, out: &mut [f32], out_stride: usize) {
        const NP: usize = COLS / 2;
        let (x, w, stride) = (self.x.as_ptr(), self.w.as_ptr(), self.stride);
        // SAFETY: the caller's contract: every offset below is inside `self.x` or `self.w`.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NP]; MR];
            for c in 0..self.chunks {
                let wv: [__m512; NP] =
                    std::array::from_fn(|p| _mm512_loadu_ps(w.add(p * stride + 2 * LANES * c)));
                for i in 0..MR {
                    let xv = _mm512_loadu_ps(x.add(i * stride + 2 * LANES * c));
                    for p in 0..NP {
                        acc[i][p] = madd512::<FMA>(xv, wv[p], acc[i][p]);
                    }
                }
            }
            for i in 0..MR {
                for p in 0..NP {
                    for (h, sums) in halves(acc[i][p]).into_iter().enumerate() {
                        out[i * out_stride + 2 * p + h] += fold_register(sums);
                    }
                }
            }
        }
    }
}

/// [`nt`] without FMA (class D).
///
/// # Safety
/// The CPU must support AVX2 and AVX-512F.
#[target_feature(enable = "avx2,avx512f")]
pub(crate) unsafe fn nt_nofma(
    xp: &[f32],
    m: usize,
    wp: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    // SAFETY: this function's own contract.
    unsafe { nt::<false>(xp, m, wp, n, k, out, kc) }
}

/// [`nt`] with fused multiply-adds (the fast mode).
///
/// # Safety
/// The CPU must support AVX2, FMA and AVX-512F.
#[target_feature(enable = "avx2,fma,avx512f")]
pub(crate) unsafe fn nt_fma(
    xp: &[f32],
    m: usize,
    wp: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    // SAFETY: this function's own contract.
    unsafe { nt::<true>(xp, m, wp, n, k, out, kc) }
}
