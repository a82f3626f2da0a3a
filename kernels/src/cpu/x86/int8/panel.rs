//! More rows than a decode step's few against quantized weights in integers: the panel kernel
//! of [`crate::cpu::int8::product`].
//!
//! The row kernel (the parent module) multiplies a row of `x` by a row of `w` in one register,
//! 64 products per `vpdpbusd` along `k`, and pays per row and chunk a conversion, a multiply
//! of the two scales and a fused add: past a few rows that float work is most of it, and the
//! `f32` packed kernel beat it at a prompt's rows. Here a panel of 32 rows of `w` is decoded
//! once into eight-bit codes laid out **across the rows** (`vpdpbusd`'s sixteen lanes are
//! sixteen rows of `w`, each lane's four bytes four consecutive elements of its row), so that
//! one `vpdpbusd` adds four elements of one row of `x` (broadcast) into sixteen outputs, the
//! integer sums run through a whole block of the weights' scale (32 elements; 16 for Q6_K),
//! and the floats are applied once per block and output — as llama.cpp's repacked GEMMs do.
//! The panel is decoded with the parent's per-format chunk decoders and turned across by a
//! 16 × 16 transpose of 32-bit words; decoding it costs about what the row kernel spends on
//! two rows, so the panel kernel takes over from five.
//!
//! The activations are [`Q8Rows::biased`] (codes + 128, `vpdpbusd`'s unsigned operand) and the
//! weights' codes signed (`q`, re-centred where ggml stores `q + off`): each block's sum starts
//! at `−128·Σq_w`, computed once per panel. Every output is the same operations in the same
//! order whatever the rows beside it (the tile's height) and whichever worker takes its panel.

// The tile indexes its sums, its registers of `w` and its rows of `x` by the same row and
// half numbers; iterators over one of them would hide which is which.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::{
    __m512i, _MM_HINT_T0, _mm_prefetch, _mm512_cvtepi32_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps,
    _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_storeu_ps, _mm512_mul_ps, _mm512_set1_epi8,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_shuffle_i32x4, _mm512_slli_epi32, _mm512_storeu_ps, _mm512_storeu_si512,
    _mm512_sub_epi8, _mm512_sub_epi32, _mm512_unpackhi_epi32, _mm512_unpackhi_epi64,
    _mm512_unpacklo_epi32, _mm512_unpacklo_epi64,
};

use super::{AHEAD, Int8Blocks};
use crate::cpu::int8::{BLOCK, CHUNK, LANES, PANEL_ROWS, Panel, Q8Rows};
use crate::quant::QuantMatrix;

/// Rows of `x` per tile: six rows by two registers of `w` is 12 integer and 12 float sums,
/// within AVX-512's 32 registers with the two of `w` and the broadcast row.
const ROWS: usize = 6;

/// Adds `x`'s rows times rows `j0..j0 + cols` (at most [`PANEL_ROWS`]) of `w` into the
/// `m × cols` tile, through `panel`.
///
/// # Safety
/// [`super::supported`]; `xq` holds `m` rows of `w.d_in()`; `j0 + cols ≤ w.d_out()`; `tile`
/// holds `m × cols`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c,avx2")]
pub(super) unsafe fn product<B: Int8Blocks>(
    xq: &Q8Rows,
    m: usize,
    w: &QuantMatrix,
    j0: usize,
    cols: usize,
    panel: &mut Panel,
    tile: &mut [f32],
) {
    // The activations' sums are per block of 32: a minimum's block must be one.
    const { assert!(!B::MINS || B::SCALE_BLOCK == BLOCK) };
    // SAFETY: the caller's contract; `repack` sizes the panel the tiles read.
    unsafe {
        repack::<B>(w, j0, cols, xq.chunks, panel);
        let mut i0 = 0;
        while i0 < m {
            let rows = ROWS.min(m - i0);
            macro_rules! go {
                ($($r:literal)*) => {
                    match rows {
                        $($r => tile_rows::<B, $r>(xq, i0, panel, cols, tile),)*
                        _ => unreachable!(),
                    }
                };
            }
            go!(1 2 3 4 5 6);
            i0 += rows;
        }
    }
}

/// Rows `j0..j0 + cols` of `w` into `panel`: per group of four elements (`g`), the 32 rows'
/// signed codes side by side (`codes[(32g + j)·4..][..4]`, rows past `cols` zero); per block of
/// [`Int8Blocks::SCALE_BLOCK`] elements (`b`), each row's scale, minimum and `−128·Σq`
/// (`[32b + j]`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c,avx2")]
unsafe fn repack<B: Int8Blocks>(
    w: &QuantMatrix,
    j0: usize,
    cols: usize,
    chunks: usize,
    panel: &mut Panel,
) {
    let per_chunk = CHUNK / B::SCALE_BLOCK;
    let blocks = chunks * per_chunk;
    panel.codes.resize(chunks * CHUNK * PANEL_ROWS, 0);
    panel.staged.resize(chunks * CHUNK * LANES, 0);
    panel.scales.resize(blocks * PANEL_ROWS, 0.0);
    panel
        .mins
        .resize(if B::MINS { blocks * PANEL_ROWS } else { 0 }, 0.0);
    panel.starts.resize(blocks * PANEL_ROWS, 0);
    let row_bytes = w.data().len() / w.d_out();
    let chunk_bytes = row_bytes / chunks;
    let lane_step = B::SCALE_BLOCK / 4;
    // SAFETY: rows j0..j0 + cols of the matrix are read; every store is inside the sizes set
    // above.
    unsafe {
        let ones = _mm512_set1_epi8(1);
        let staged = panel.staged.as_mut_ptr();
        for half in 0..PANEL_ROWS / LANES {
            let first = half * LANES;
            let valid = LANES.min(cols.saturating_sub(first));
            // Row by row (the panel's rows are one run of memory, read ahead as the row kernel
            // reads it), each chunk's codes to `staged` (chunk c of row j at `(16c + j)·64`),
            // its blocks' scales and minima straight to their places. Chunk by chunk across
            // the rows instead (no staging, the scales turned across too) was ~3 % slower
            // (SmolLM2-135M's shapes at Q4_K, 6 to 37 rows, Intel Xeon, 3 alternating rounds).
            for j in 0..LANES {
                if j >= valid {
                    for c in 0..chunks {
                        let at = staged.add((c * LANES + j) * CHUNK);
                        _mm512_storeu_si512(at.cast(), _mm512_setzero_si512());
                    }
                    continue;
                }
                let row = w.data().as_ptr().add((j0 + first + j) * row_bytes);
                for c in 0..chunks {
                    let at = staged.add((c * LANES + j) * CHUNK).cast();
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(c * chunk_bytes + AHEAD).cast());
                    let chunk = B::chunk(row, c);
                    let codes = match B::OFFSET {
                        Some(shift) => _mm512_sub_epi8(
                            chunk.codes,
                            _mm512_set1_epi8((1u32 << shift) as u8 as i8),
                        ),
                        None => chunk.codes,
                    };
                    _mm512_storeu_si512(at, codes);
                    // Lane `s·lane_step` of the chunk holds block s's scale (and minimum).
                    let mut lanes = [0f32; LANES];
                    _mm512_storeu_ps(lanes.as_mut_ptr(), chunk.scales);
                    for s in 0..per_chunk {
                        panel.scales[(c * per_chunk + s) * PANEL_ROWS + first + j] =
                            lanes[s * lane_step];
                    }
                    if B::MINS {
                        _mm512_storeu_ps(lanes.as_mut_ptr(), chunk.mins);
                        for s in 0..per_chunk {
                            panel.mins[(c * per_chunk + s) * PANEL_ROWS + first + j] =
                                lanes[s * lane_step];
                        }
                    }
                }
            }
            for c in 0..chunks {
                // Group `g` of the chunk: the sixteen rows' four codes of elements 4g..4g + 4.
                let groups = transpose(std::array::from_fn(|j| {
                    _mm512_loadu_si512(staged.add((c * LANES + j) * CHUNK).cast())
                }));
                for (g, group) in groups.iter().enumerate() {
                    let at = (c * LANES + g) * PANEL_ROWS + first;
                    _mm512_storeu_si512(panel.codes.as_mut_ptr().add(at * 4).cast(), *group);
                }
                for s in 0..per_chunk {
                    let mut sum = _mm512_setzero_si512();
                    for group in &groups[s * lane_step..(s + 1) * lane_step] {
                        sum = _mm512_dpbusd_epi32(sum, ones, *group);
                    }
                    let start =
                        _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sum));
                    let at = (c * per_chunk + s) * PANEL_ROWS + first;
                    _mm512_storeu_si512(panel.starts.as_mut_ptr().add(at).cast(), start);
                }
            }
        }
    }
}

/// `tile[i0 + r][j] = Σ x[i0 + r]·w[j]` for `r < R` and the panel's `cols` rows of `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c,avx2")]
unsafe fn tile_rows<B: Int8Blocks, const R: usize>(
    xq: &Q8Rows,
    i0: usize,
    panel: &Panel,
    cols: usize,
    tile: &mut [f32],
) {
    const H: usize = PANEL_ROWS / LANES;
    let (rows, g_per_block) = (xq.rows, B::SCALE_BLOCK / 4);
    let blocks = xq.chunks * CHUNK / B::SCALE_BLOCK;
    let (codes, scales, mins, starts) = (
        panel.codes.as_ptr(),
        panel.scales.as_ptr(),
        panel.mins.as_ptr(),
        panel.starts.as_ptr(),
    );
    // SAFETY: every group, block and row read is inside the panel `repack` sized for
    // `xq.chunks` chunks and inside `xq`'s `rows` rows; the tile holds rows i0..i0 + R.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); H]; R];
        for b in 0..blocks {
            let start: [__m512i; H] = std::array::from_fn(|h| {
                _mm512_loadu_si512(starts.add(b * PANEL_ROWS + h * LANES).cast())
            });
            let mut dot = [start; R];
            for s in 0..g_per_block {
                let g = b * g_per_block + s;
                let wv: [__m512i; H] = std::array::from_fn(|h| {
                    _mm512_loadu_si512(codes.add((g * PANEL_ROWS + h * LANES) * 4).cast())
                });
                // Group g is elements 4g..4g + 4: chunk g / 16, its lanes' bytes 4(g % 16)...
                let (c, lane) = (g / LANES, g % LANES);
                for r in 0..R {
                    let x = xq
                        .biased
                        .as_ptr()
                        .add((c * rows + i0 + r) * CHUNK + 4 * lane)
                        .cast::<i32>()
                        .read_unaligned();
                    let x = _mm512_set1_epi32(x);
                    for h in 0..H {
                        dot[r][h] = _mm512_dpbusd_epi32(dot[r][h], x, wv[h]);
                    }
                }
            }
            // The activations' block of 32 holding this block: its chunk and half.
            let e = b * B::SCALE_BLOCK;
            let (c, half) = (e / CHUNK, e % CHUNK / BLOCK);
            let ws: [_; H] =
                std::array::from_fn(|h| _mm512_loadu_ps(scales.add(b * PANEL_ROWS + h * LANES)));
            for r in 0..R {
                let at = (c * rows + i0 + r) * LANES + half * 8;
                let dx = _mm512_set1_ps(*xq.scales.as_ptr().add(at));
                for h in 0..H {
                    acc[r][h] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(dot[r][h]),
                        _mm512_mul_ps(ws[h], dx),
                        acc[r][h],
                    );
                }
                // A minimum's block is one of the activations' (asserted in `product`).
                if B::MINS {
                    let sx = _mm512_set1_ps(*xq.sums.as_ptr().add(at));
                    for h in 0..H {
                        let min = _mm512_loadu_ps(mins.add(b * PANEL_ROWS + h * LANES));
                        acc[r][h] = _mm512_fmadd_ps(min, sx, acc[r][h]);
                    }
                }
            }
        }
        for r in 0..R {
            for h in 0..H {
                let valid = cols.saturating_sub(h * LANES).min(LANES);
                if valid == 0 {
                    continue;
                }
                _mm512_mask_storeu_ps(
                    tile.as_mut_ptr().add((i0 + r) * cols + h * LANES),
                    ((1u32 << valid) - 1) as u16,
                    acc[r][h],
                );
            }
        }
    }
}

/// The 16 × 16 matrix of 32-bit words in `r` (row `i` in `r[i]`) transposed: lane `i` of
/// `out[e]` is lane `e` of `r[i]`.
#[inline(always)]
unsafe fn transpose(r: [__m512i; 16]) -> [__m512i; 16] {
    // SAFETY: AVX-512F is the caller's contract.
    unsafe {
        // Pairs of rows interleaved: t[2p] holds rows 2p, 2p + 1 at elements 4L, 4L + 1 of each
        // 128-bit lane L, t[2p + 1] at 4L + 2, 4L + 3.
        let t: [__m512i; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_epi32(a, b)
            } else {
                _mm512_unpackhi_epi32(a, b)
            }
        });
        // Fours of rows: u[4q + s] holds rows 4q..4q + 4 at element 4L + s of lane L.
        let u: [__m512i; 16] = std::array::from_fn(|i| {
            let (q, s) = (i / 4, i % 4);
            let (lo, hi) = (t[4 * q + s / 2], t[4 * q + 2 + s / 2]);
            if s % 2 == 0 {
                _mm512_unpacklo_epi64(lo, hi)
            } else {
                _mm512_unpackhi_epi64(lo, hi)
            }
        });
        // The four fours' lanes L side by side: element 4L + s.
        let mut out = [_mm512_setzero_si512(); 16];
        for s in 0..4 {
            let v = _mm512_shuffle_i32x4::<0x44>(u[s], u[4 + s]);
            let w = _mm512_shuffle_i32x4::<0xEE>(u[s], u[4 + s]);
            let v2 = _mm512_shuffle_i32x4::<0x44>(u[8 + s], u[12 + s]);
            let w2 = _mm512_shuffle_i32x4::<0xEE>(u[8 + s], u[12 + s]);
            out[s] = _mm512_shuffle_i32x4::<0x88>(v, v2);
            out[4 + s] = _mm512_shuffle_i32x4::<0xDD>(v, v2);
            out[8 + s] = _mm512_shuffle_i32x4::<0x88>(w, w2);
            out[12 + s] = _mm512_shuffle_i32x4::<0xDD>(w, w2);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transpose_swaps_rows_and_lanes() {
        if !super::super::supported() {
            return;
        }
        let m: [[i32; 16]; 16] =
            std::array::from_fn(|i| std::array::from_fn(|e| (i * 100 + e) as i32));
        // SAFETY: the features were just checked.
        let out = unsafe {
            transpose(std::array::from_fn(|i| {
                _mm512_loadu_si512(m[i].as_ptr().cast())
            }))
        };
        for (e, v) in out.iter().enumerate() {
            let lanes: [i32; 16] = unsafe { std::mem::transmute(*v) };
            for (i, lane) in lanes.iter().enumerate() {
                assert_eq!(*lane, m[i][e], "out[{e}] lane {i}");
            }
        }
    }
}
