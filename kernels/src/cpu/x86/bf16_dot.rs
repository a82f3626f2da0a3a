//! The kernel of [`crate::cpu::bf16_dot`] on AVX-512 BF16: tiles of up to two rows of `x` by
//! eight rows of `w`, each output one `vdpbf16ps` chain over the chunks of 32 in order.
//!
//! The rows of a tile only share loads: a row of `w` is loaded once per chunk for every row of
//! `x` in the tile, and a row of `x` once for every row of `w`. Which tile an output lands in
//! never changes its operations, so a tile's shape is chosen for speed alone: eight rows of
//! `w` read side by side (each a stream, prefetched), or one row at a time for one row of `x`
//! where a single sequential stream reads faster (AMD's Zen 4, see `cpu::one_stream`). Two
//! rows of `x` against eight of `w` rather than four against four: on the Intel Xeon, with the
//! prefetch not yet wrapping, 31.0–31.4 ms a step against 31.8–32.5 (SmolLM2-135M's shapes,
//! `decode_model` at eight rows; the wrap then took it to 27.8–28.7) — four rows of `x` share
//! more loads, eight rows of `w` keep more streams in flight, and here the streams won.

// The tiles index the sums by row of `x` and row of `w`, and the loads by one of the two:
// iterators over one of them would hide which is which.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::{
    __m512, __m512bh, __m512i, _MM_HINT_T0, _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_movehdup_ps,
    _mm_movehl_ps, _mm_prefetch, _mm256_add_ps, _mm256_castpd_ps, _mm256_castps256_ps128,
    _mm256_extractf128_ps, _mm512_castps_pd, _mm512_castps512_ps256, _mm512_dpbf16_ps,
    _mm512_extractf64x4_pd, _mm512_loadu_si512, _mm512_maskz_loadu_epi16, _mm512_setzero_ps,
    _mm512_setzero_si512,
};

use crate::cpu::bf16_dot::{Bf16Rows, CHUNK};

/// Whether the CPU has what [`product`] runs on.
pub(crate) fn supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// Elements of each row of `w` prefetched ahead of the chunk being read (one block of the
/// `f32` kernels', `cpu::KC`); past the row's end, the same distance into the row the next
/// tile reads in its place (rows are `k` apart and a tile's `N` rows adjacent), so a short row's
/// prefetches are not spent on the rows being read. A prefetch past the matrix never faults.
const AHEAD: usize = 512;

/// Rows of `x` per tile at most.
const MR: usize = 2;

/// [`crate::cpu::bf16_dot::product`]: `one_stream` reads one row of `w` at a time for one row
/// of `x` (the outputs' bits are the same either way).
///
/// # Safety
/// [`supported`]; `xb` holds `m` rows of `k` (its `k`), `w` at least `(j0 + cols)·k` elements
/// and `tile` at least `m·cols`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn product(
    xb: &Bf16Rows,
    m: usize,
    w: &[half::bf16],
    j0: usize,
    cols: usize,
    tile: &mut [f32],
    one_stream: bool,
) {
    let k = xb.k;
    let w = w[j0 * k..(j0 + cols) * k].as_ptr().cast::<u16>();
    for i0 in (0..m).step_by(MR) {
        let x = xb.bits[i0 * xb.stride..].as_ptr();
        let out = &mut tile[i0 * cols..];
        // SAFETY: the caller's contract; `rows` reads rows `i0..i0 + mr` of `x`, all of `w`'s
        // `cols` rows, and writes their outputs.
        unsafe {
            match (m - i0).min(MR) {
                1 if one_stream => rows::<1, 1>(x, xb.stride, w, k, cols, out),
                1 => rows::<1, 8>(x, xb.stride, w, k, cols, out),
                _ => rows::<2, 8>(x, xb.stride, w, k, cols, out),
            }
        }
    }
}

/// Rows `0..R` of `x` (rows `stride` apart) times all `cols` rows of `w` (rows `k` apart),
/// `N` rows of `w` at a time and the rest one by one, into `out` (`R × cols`).
///
/// # Safety
/// As [`product`], for these rows.
#[inline(always)]
unsafe fn rows<const R: usize, const N: usize>(
    x: *const u16,
    stride: usize,
    w: *const u16,
    k: usize,
    cols: usize,
    out: &mut [f32],
) {
    let whole = cols / N * N;
    // SAFETY: the caller's contract; each call reads rows `j..j + N` (or `j`) of `w`.
    unsafe {
        for j in (0..whole).step_by(N) {
            tile::<R, N>(x, stride, w.add(j * k), k, cols, &mut out[j..]);
        }
        for j in whole..cols {
            tile::<R, 1>(x, stride, w.add(j * k), k, cols, &mut out[j..]);
        }
    }
}

/// `out[i·cols + j] = Σ x[i]·w[j]` for `R` rows of `x` and `N` rows of `w`: per output one
/// `vdpbf16ps` chain over the chunks in ascending order (the last masked to `k`: `x` is
/// zero-padded), then [`sum`].
///
/// # Safety
/// As [`rows`]; `w` points at `N` rows of `k`.
#[inline(always)]
unsafe fn tile<const R: usize, const N: usize>(
    x: *const u16,
    stride: usize,
    w: *const u16,
    k: usize,
    cols: usize,
    out: &mut [f32],
) {
    // SAFETY: the CPU has AVX-512F (the caller's `product`).
    let mut acc = [[unsafe { _mm512_setzero_ps() }; N]; R];
    let whole = k / CHUNK;
    let tail = k % CHUNK;
    // SAFETY: chunk `c < whole` lies inside every row of `w`; the tail's load is masked to the
    // row; `x`'s rows hold `stride ≥ k` padded elements; prefetches never fault.
    unsafe {
        for c in 0..whole {
            let ahead = if c * CHUNK + AHEAD < k {
                AHEAD
            } else {
                N * k + AHEAD - k
            };
            let mut wc = [_mm512_setzero_si512(); N];
            for j in 0..N {
                let at = w.add(j * k + c * CHUNK);
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(ahead).cast());
                wc[j] = _mm512_loadu_si512(at.cast());
            }
            step::<R, N>(&mut acc, x, stride, c, &wc);
        }
        if tail > 0 {
            let mask = (1u32 << tail) - 1;
            let mut wc = [_mm512_setzero_si512(); N];
            for j in 0..N {
                wc[j] = _mm512_maskz_loadu_epi16(mask, w.add(j * k + whole * CHUNK).cast());
            }
            step::<R, N>(&mut acc, x, stride, whole, &wc);
        }
    }
    for i in 0..R {
        for j in 0..N {
            // SAFETY: the CPU has AVX-512F (the caller's `product`).
            out[i * cols + j] = unsafe { sum(acc[i][j]) };
        }
    }
}

/// One chunk `c` of every row of `x` into the tile's sums.
///
/// # Safety
/// Chunk `c` of `R` rows of `x` (`stride` apart) exists.
#[inline(always)]
unsafe fn step<const R: usize, const N: usize>(
    acc: &mut [[__m512; N]; R],
    x: *const u16,
    stride: usize,
    c: usize,
    wc: &[__m512i; N],
) {
    for i in 0..R {
        // SAFETY: the caller's contract.
        let xc = unsafe { _mm512_loadu_si512(x.add(i * stride + c * CHUNK).cast()) };
        for j in 0..N {
            // SAFETY: the CPU has AVX-512 BF16 (the caller's `product`).
            acc[i][j] = unsafe { _mm512_dpbf16_ps(acc[i][j], bh(xc), bh(wc[j])) };
        }
    }
}

/// Thirty-two bf16 as `vdpbf16ps` takes them (the same bits).
#[inline(always)]
fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain data; every bit pattern is a valid bf16 vector.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// The sixteen lanes' sum by one fixed tree: halves, quarters, pairs, the last two (a written
/// order, not the unordered reduction `_mm512_reduce_add_ps` lets the compiler choose).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn sum(v: __m512) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let eight = _mm256_add_ps(lo, hi);
        let four = _mm_add_ps(
            _mm256_castps256_ps128(eight),
            _mm256_extractf128_ps::<1>(eight),
        );
        let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
        _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`sum`] adds the lanes in its written order: the halves first.
    #[test]
    fn the_lanes_are_summed_halves_first() {
        if !supported() {
            return;
        }
        // 2²⁴ + 1 + 1 − 2²⁴: in the halves-first order the two ones meet first (lanes 0 and 8).
        let mut lanes = [0f32; 16];
        lanes[0] = 1.0;
        lanes[8] = 1.0;
        lanes[1] = 16_777_216.0;
        lanes[9] = -16_777_216.0;
        // SAFETY: `supported` checked AVX-512F.
        let got = unsafe { sum(std::arch::x86_64::_mm512_loadu_ps(lanes.as_ptr())) };
        assert_eq!(got, 2.0);
    }
}
