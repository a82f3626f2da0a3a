//! The integer kernels of [`crate::cpu::int8`] on AVX-512 VNNI. Here the row kernel, for a
//! decode step's few rows (up to `ROWS`): each chunk of 64 weights of a row of `w` decoded
//! to eight-bit codes in one register with its per-lane scales, and multiplied by every row's
//! activation codes in one `vpdpbusd` each; the panel kernel for more rows is [`panel`].
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, four to a 32-bit lane; the integer sums are
//! exact either way round, and the row kernel takes what needs no work on the weights:
//!
//! - **Weights unsigned**: the codes as ggml stores them, `q + off` (Q4_0's nibbles `q + 8`,
//!   Q5_0's `q + 16`, Q6_K's `q + 32`; Q4_1, Q5_1 and Q4_K store `q` and a minimum), times the
//!   activations' signed codes; each row's sum starts at `−off·Σq_x` over the lane's four codes
//!   (the row's lane sums times a power of two: one shift per row and chunk).
//! - **Weights signed** (Q8_0, whose bytes are signed): the codes times the activations' codes
//!   plus 128; each row's sum starts at `−128·Σq_w` (one `vpdpbusd` of ones by the weights per
//!   chunk, for every row).
//!
//! SmolLM2-135M's shapes at Q4_K (Q5_0 where rows are not whole super-blocks), AMD EPYC, one
//! thread: one row 1.15× the kernel that took the second way for every format with the
//! activations row-major (`decode_model` example, 7 alternating rounds).
//! The sixteen lanes of a chunk are two blocks of 32 (four lanes per 16 elements, where a
//! format's sub-blocks are 16 long): the lane sums are converted to `f32` (exactly: far below
//! 2²⁴) and multiplied by the weight's and the row's scales per lane.

use std::arch::x86_64::{
    __m512, __m512i, _MM_HINT_T0, _mm_cvtsi32_si128, _mm_loadu_si128, _mm_prefetch, _mm_setr_epi8,
    _mm_shuffle_epi8, _mm_storeu_si128, _mm256_loadu_si256, _mm512_add_epi32, _mm512_and_si512,
    _mm512_andnot_ps, _mm512_broadcast_i64x4, _mm512_castsi128_si512, _mm512_castsi256_si512,
    _mm512_cvtepi8_epi32, _mm512_cvtepi32_epi8, _mm512_cvtepi32_ps, _mm512_cvtps_epi32,
    _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_inserti32x4, _mm512_inserti64x4, _mm512_loadu_ps,
    _mm512_loadu_si512, _mm512_maskz_mov_epi8, _mm512_max_epi32, _mm512_max_ps, _mm512_min_epi32,
    _mm512_mul_ps, _mm512_or_si512, _mm512_reduce_add_epi32, _mm512_reduce_add_ps,
    _mm512_reduce_max_ps, _mm512_set_epi64, _mm512_set1_epi8, _mm512_set1_epi32, _mm512_set1_ps,
    _mm512_setzero_ps, _mm512_setzero_si512, _mm512_sll_epi32, _mm512_slli_epi16,
    _mm512_slli_epi32, _mm512_srli_epi16, _mm512_srlv_epi64, _mm512_sub_epi32,
};

mod panel;

use super::blocks::{half, split_half, split_ps};
use crate::cpu::int8::{CHUNK, LANES, Panel, Q8Rows, ROW_KERNEL_ROWS};
use crate::quant::{QuantMatrix, QuantType, scale_min_k4};

/// Whether the CPU has what [`product`] runs on.
pub(crate) fn supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// One chunk of 64 weights: the codes as stored (`q + 2^OFFSET` unsigned, or `q` signed where
/// [`Int8Blocks::SIGNED`]), the scale of each lane's four, and (formats with a minimum) the
/// minimum of each half's block in all its lanes: weight = scale·q + min.
struct Chunk {
    codes: __m512i,
    scales: __m512,
    mins: __m512,
}

/// A ggml block format decoded a chunk at a time.
trait Int8Blocks {
    /// Whether weights are `scale·q + min` (the kernel then adds `min·Σx`).
    const MINS: bool;
    /// `log2` of the offset of the stored codes (`q + 2^OFFSET`), or `None` where they are `q`.
    const OFFSET: Option<u32>;
    /// Elements per scale of the weights (the panel kernel applies the floats once per block):
    /// 32, or 16 for Q6_K. Formats with a minimum have blocks of 32.
    const SCALE_BLOCK: usize = 32;
    /// Whether the stored codes are signed bytes (Q8_0): the row kernel then takes the
    /// activations' codes plus 128 against them, which needs nothing done to the weights.
    const SIGNED: bool = false;
    /// Chunk `c` (elements `64c..64c + 64`) of the row of blocks at `row`.
    ///
    /// # Safety
    /// [`supported`]; `row` points at a whole row of blocks holding chunk `c`.
    unsafe fn chunk(row: *const u8, c: usize) -> Chunk;
}

/// Two blocks' 16 bytes of nibbles as 64 codes in element order: for each block its low
/// nibbles (elements 0–15) then its high ones (16–31), as ggml's `Q4_0` and `Q5_0` hold them.
#[inline(always)]
unsafe fn nibbles(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: 16 readable bytes at each, AVX-512F/BW: the caller's contract.
    unsafe {
        let (a, b) = (_mm_loadu_si128(a.cast()), _mm_loadu_si128(b.cast()));
        let v = _mm512_inserti32x4::<3>(
            _mm512_inserti32x4::<2>(_mm512_inserti32x4::<1>(_mm512_castsi128_si512(a), a), b),
            b,
        );
        // The second and fourth 128-bit lanes take the high nibbles.
        _mm512_and_si512(
            _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)),
            _mm512_set1_epi8(0x0F),
        )
    }
}

/// Two blocks' 32-bit words of fifth bits (bit `i` is element `i`'s) as 16 in each code
/// whose bit is set.
#[inline(always)]
unsafe fn fifth_bits(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: four readable bytes at each, AVX-512BW: the caller's contract.
    unsafe {
        let word = |p: *const u8| u64::from(p.cast::<u32>().read_unaligned());
        _mm512_maskz_mov_epi8(word(a) | word(b) << 32, _mm512_set1_epi8(16))
    }
}

#[derive(Clone, Copy)]
struct Q8_0;
impl Int8Blocks for Q8_0 {
    const MINS: bool = false;
    const OFFSET: Option<u32> = None;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn chunk(row: *const u8, c: usize) -> Chunk {
        // SAFETY: blocks 2c and 2c + 1 (34 bytes: f16 d, 32 × i8) are in the row.
        unsafe {
            let a = row.add(2 * c * 34);
            let b = a.add(34);
            Chunk {
                codes: _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(a.add(2).cast())),
                    _mm256_loadu_si256(b.add(2).cast()),
                ),
                scales: split_half(a, b),
                mins: _mm512_setzero_ps(),
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Q4_0;
impl Int8Blocks for Q4_0 {
    const MINS: bool = false;
    const OFFSET: Option<u32> = Some(3);
    #[inline(always)]
    unsafe fn chunk(row: *const u8, c: usize) -> Chunk {
        // SAFETY: blocks 2c and 2c + 1 (18 bytes: f16 d, 16 of nibbles) are in the row.
        unsafe {
            let a = row.add(2 * c * 18);
            let b = a.add(18);
            Chunk {
                codes: nibbles(a.add(2), b.add(2)),
                scales: split_half(a, b),
                mins: _mm512_setzero_ps(),
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Q5_0;
impl Int8Blocks for Q5_0 {
    const MINS: bool = false;
    const OFFSET: Option<u32> = Some(4);
    #[inline(always)]
    unsafe fn chunk(row: *const u8, c: usize) -> Chunk {
        // SAFETY: blocks 2c and 2c + 1 (22 bytes: f16 d, 4 of fifth bits, 16 of nibbles) are
        // in the row.
        unsafe {
            let a = row.add(2 * c * 22);
            let b = a.add(22);
            Chunk {
                codes: _mm512_or_si512(nibbles(a.add(6), b.add(6)), fifth_bits(a.add(2), b.add(2))),
                scales: split_half(a, b),
                mins: _mm512_setzero_ps(),
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Q4_1;
impl Int8Blocks for Q4_1 {
    const MINS: bool = true;
    const OFFSET: Option<u32> = None;
    #[inline(always)]
    unsafe fn chunk(row: *const u8, c: usize) -> Chunk {
        // SAFETY: blocks 2c and 2c + 1 (20 bytes: f16 d, f16 m, 16 of nibbles) are in the row.
        unsafe {
            let a = row.add(2 * c * 20);
            let b = a.add(20);
            Chunk {
                codes: nibbles(a.add(4), b.add(4)),
                scales: split_half(a, b),
                mins: split_half(a.add(2), b.add(2)),
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Q5_1;
impl Int8Blocks for Q5_1 {
    const MINS: bool = true;
    const OFFSET: Option<u32> = None;
    #[inline(always)]
    unsafe fn chunk(row: *const u8, c: usize) -> Chunk {
        // SAFETY: blocks 2c and 2c + 1 (24 bytes: f16 d, f16 m, 4 of fifth bits, 16 of
        // nibbles) are in the row.
        unsafe {
            let a = row.add(2 * c * 24);
            let b = a.add(24);
            Chunk {
                codes: _mm512_or_si512(nibbles(a.add(8), b.add(8)), fifth_bits(a.add(4), b.add(4))),
                scales: split_half(a, b),
                mins: split_half(a.add(2), b.add(2)),
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Q4K;
impl Int8Blocks for Q4K {
    const MINS: bool = true;
    const OFFSET: Option<u32> = None;
    #[inline(always)]
    unsafe fn chunk(row: *const u8, c: usize) -> Chunk {
        // SAFETY: super-block c / 4 (144 bytes: f16 d, f16 dmin, 12 of scales, 128 of
        // nibbles) is in the row.
        unsafe {
            let block = row.add(c / 4 * 144);
            let t = c % 4;
            // Bytes 32t..32t + 32: low nibbles sub-block 2t, high nibbles 2t + 1.
            let v = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(16 + 32 * t).cast()));
            let codes = _mm512_and_si512(
                _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)),
                _mm512_set1_epi8(0x0F),
            );
            let packed = &*block.add(4).cast::<[u8; 12]>();
            let (s0, m0) = scale_min_k4(2 * t, packed);
            let (s1, m1) = scale_min_k4(2 * t + 1, packed);
            let (d, dmin) = (half(block), half(block.add(2)));
            Chunk {
                codes,
                scales: split_ps(d * f32::from(s0), d * f32::from(s1)),
                mins: split_ps(-dmin * f32::from(m0), -dmin * f32::from(m1)),
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Q6K;
impl Int8Blocks for Q6K {
    const MINS: bool = false;
    const OFFSET: Option<u32> = Some(5);
    const SCALE_BLOCK: usize = 16;
    #[inline(always)]
    unsafe fn chunk(row: *const u8, c: usize) -> Chunk {
        // SAFETY: super-block c / 4 (210 bytes: 128 of low nibbles, 64 of high pairs, 16 i8
        // scales, f16 d) is in the row.
        unsafe {
            let block = row.add(c / 4 * 210);
            let (n, second) = ((c % 4) / 2, c % 2);
            // Half `n` (128 elements) is ql[64n..64n + 64] and qh[32n..32n + 32]: elements
            // 0–31 low nibbles of ql[0..32] with qh's bits 0–1, 32–63 low nibbles of
            // ql[32..64] with bits 2–3, 64–127 the high nibbles with bits 4–5 and 6–7.
            let ql = _mm512_loadu_si512(block.add(64 * n).cast());
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(128 + 32 * n).cast()));
            let (low, high) = if second == 0 {
                (
                    ql,
                    _mm512_srlv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)),
                )
            } else {
                (
                    _mm512_srli_epi16::<4>(ql),
                    _mm512_srlv_epi64(qh, _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4)),
                )
            };
            let q = _mm512_or_si512(
                _mm512_and_si512(low, _mm512_set1_epi8(0x0F)),
                _mm512_slli_epi16::<4>(_mm512_and_si512(high, _mm512_set1_epi8(0x03))),
            );
            // The chunk's four sub-blocks of 16, four lanes each: scales 8n + 4·second + 0..4.
            let sc = block
                .add(192 + 8 * n + 4 * second)
                .cast::<i32>()
                .read_unaligned();
            let spread = _mm_shuffle_epi8(
                _mm_cvtsi32_si128(sc),
                _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
            );
            let scales = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(spread)),
                _mm512_set1_ps(half(block.add(208))),
            );
            Chunk {
                codes: q,
                scales,
                mins: _mm512_setzero_ps(),
            }
        }
    }
}

/// Adds `x`'s rows times rows `j0..j0 + cols` of `w` into the `m × cols` tile: up to
/// `ROWS` rows the row kernel, more the panel kernel (through `panel`).
///
/// # Safety
/// [`supported`]; `xq` holds `m` rows of `w.d_in()`; `j0 + cols ≤ w.d_out()`, `cols` at most
/// `PANEL_ROWS`; `tile` holds `m × cols`.
pub(crate) unsafe fn product(
    xq: &Q8Rows,
    m: usize,
    w: &QuantMatrix,
    j0: usize,
    cols: usize,
    panel: &mut Panel,
    tile: &mut [f32],
) {
    /// One format's kernel for `m` rows.
    ///
    /// # Safety
    /// As [`product`].
    unsafe fn rows<B: Int8Blocks>(
        xq: &Q8Rows,
        m: usize,
        w: &QuantMatrix,
        j0: usize,
        cols: usize,
        panel: &mut Panel,
        tile: &mut [f32],
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            if m <= ROWS {
                columns::<B>(xq, m, w, j0, cols, tile)
            } else {
                panel::product::<B>(xq, m, w, j0, cols, panel, tile)
            }
        }
    }
    // SAFETY: the caller's contract.
    unsafe {
        match w.kind() {
            QuantType::Q8_0 => rows::<Q8_0>(xq, m, w, j0, cols, panel, tile),
            QuantType::Q4_0 => rows::<Q4_0>(xq, m, w, j0, cols, panel, tile),
            QuantType::Q5_0 => rows::<Q5_0>(xq, m, w, j0, cols, panel, tile),
            QuantType::Q4_1 => rows::<Q4_1>(xq, m, w, j0, cols, panel, tile),
            QuantType::Q5_1 => rows::<Q5_1>(xq, m, w, j0, cols, panel, tile),
            QuantType::Q4K => rows::<Q4K>(xq, m, w, j0, cols, panel, tile),
            QuantType::Q6K => rows::<Q6K>(xq, m, w, j0, cols, panel, tile),
        }
    }
}

/// Bytes of weights prefetched ahead of the chunk being decoded (a few rows on: the rows of a
/// panel are contiguous, and a prefetch past the matrix never faults). Without it the decode
/// waits on every line: SmolLM2-135M at Q4_K (Q5_0 where rows are not whole super-blocks), one
/// row, Intel Xeon: 51 tokens/s with none, 70 at 512 bytes, 78 at 1024, 81 at 2048.
const AHEAD: usize = 2048;

/// Rows of `x` this kernel takes at most (more go to the panel kernel, `panel`): four rows'
/// accumulators for each of two rows of `w` side by side (at one row the decoding bounds the
/// kernel, and two independent chains of it overlap).
const ROWS: usize = ROW_KERNEL_ROWS;

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c,avx2")]
unsafe fn columns<B: Int8Blocks>(
    xq: &Q8Rows,
    m: usize,
    w: &QuantMatrix,
    j0: usize,
    cols: usize,
    tile: &mut [f32],
) {
    let row_bytes = w.data().len() / w.d_out();
    // SAFETY: row j < d_out of the matrix's bytes.
    let row = |j: usize| unsafe { w.data().as_ptr().add(j * row_bytes) };
    let mut jj = 0;
    while jj < cols {
        let pair = usize::from(jj + 1 < cols) + 1;
        let mut sums = [[0f32; ROWS]; 2];
        macro_rules! go {
            ($($r:literal)*) => {
                match (m, pair) {
                    $(
                        ($r, 2) => rows_of::<B, $r, 2>(
                            xq,
                            [row(j0 + jj), row(j0 + jj + 1)],
                            row_bytes,
                            &mut sums,
                        ),
                        ($r, _) => rows_of::<B, $r, 1>(xq, [row(j0 + jj)], row_bytes, &mut sums),
                    )*
                    _ => unreachable!("the int8 row kernel takes at most {ROWS} rows"),
                }
            };
        }
        // SAFETY: rows 0..m of `xq`, rows j0 + jj (and j0 + jj + 1 when paired) of `w`: the
        // caller's contract.
        unsafe { go!(1 2 3 4) };
        for (c, sums) in sums[..pair].iter().enumerate() {
            for (r, s) in sums[..m].iter().enumerate() {
                tile[r * cols + jj + c] += s;
            }
        }
        jj += pair;
    }
}

/// `sums[c][r] = Σ x[r]·w_rows[c]` for `r < R`, `c < C`. Each output's operations are the
/// same whichever `R` and `C` it is computed among.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c,avx2")]
unsafe fn rows_of<B: Int8Blocks, const R: usize, const C: usize>(
    xq: &Q8Rows,
    w_rows: [*const u8; C],
    row_bytes: usize,
    sums: &mut [[f32; ROWS]; 2],
) {
    let (chunks, stride) = (xq.chunks, xq.rows);
    let chunk_bytes = row_bytes / chunks;
    let mut acc = [[_mm512_setzero_ps(); R]; C];
    let (ones, zero) = (_mm512_set1_epi8(1), _mm512_setzero_si512());
    for c in 0..chunks {
        // SAFETY: chunk c of the rows of `w` and of rows 0..R of `xq`: the caller's contract.
        unsafe {
            for (row, acc) in w_rows.iter().zip(acc.iter_mut()) {
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(c * chunk_bytes + AHEAD).cast());
                let w = B::chunk(*row, c);
                // Chunk c of rows 0.. lie one after another (`Q8Rows`' layout).
                let at = c * stride;
                let (codes, scales, sums, lane_sums) = (
                    if B::SIGNED { &xq.biased } else { &xq.codes }
                        .as_ptr()
                        .add(at * CHUNK),
                    xq.scales.as_ptr().add(at * LANES),
                    xq.sums.as_ptr().add(at * LANES),
                    xq.neg_lane_sums.as_ptr().add(at * LANES),
                );
                // Signed weights (Q8_0): −128·Σq_w per lane, the same for every row.
                let shared = if B::SIGNED {
                    _mm512_sub_epi32(
                        zero,
                        _mm512_slli_epi32::<7>(_mm512_dpbusd_epi32(zero, ones, w.codes)),
                    )
                } else {
                    zero
                };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_loadu_si512(codes.add(r * CHUNK).cast());
                    let dot = if B::SIGNED {
                        _mm512_dpbusd_epi32(shared, x, w.codes)
                    } else {
                        // −off·Σq_x per lane: what the weight codes' offset adds.
                        let start = match B::OFFSET {
                            Some(shift) => _mm512_sll_epi32(
                                _mm512_loadu_si512(lane_sums.add(r * LANES).cast()),
                                _mm_cvtsi32_si128(shift as i32),
                            ),
                            None => zero,
                        };
                        _mm512_dpbusd_epi32(start, w.codes, x)
                    };
                    let scale = _mm512_mul_ps(w.scales, _mm512_loadu_ps(scales.add(r * LANES)));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc);
                    if B::MINS {
                        let sums = _mm512_loadu_ps(sums.add(r * LANES));
                        *acc = _mm512_fmadd_ps(w.mins, sums, *acc);
                    }
                }
            }
        }
    }
    for (sums, acc) in sums.iter_mut().zip(acc) {
        for (s, acc) in sums.iter_mut().zip(acc) {
            *s = _mm512_reduce_add_ps(acc);
        }
    }
}

/// Rounds one block of 32 of `x` to codes (nearest, ties to even) with the scale `|x|max/127`
/// (rounded to f16),
/// writing them to `codes` and the negated sum of each four to `neg_lane_sums`; returns the
/// scale and the sum of the codes.
///
/// # Safety
/// [`supported`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c,avx2")]
pub(crate) unsafe fn quantize_block(
    x: &[f32; 32],
    codes: &mut [u8; 32],
    neg_lane_sums: &mut [i32],
) -> (f32, i32) {
    // SAFETY: 32 floats and 32 bytes, the features the caller's contract.
    unsafe {
        let v = [
            _mm512_loadu_ps(x.as_ptr()),
            _mm512_loadu_ps(x.as_ptr().add(16)),
        ];
        let sign = _mm512_set1_ps(-0.0);
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(
            _mm512_andnot_ps(sign, v[0]),
            _mm512_andnot_ps(sign, v[1]),
        ));
        // The codes of `x·127/|x|max`, the scale rounded to f16: ggml's Q8_0 activations to the
        // bit. The scale kept in f32 instead is nearer `x`, but its rounding then differs
        // from llama.cpp's in every block, and the servers' greedy tokens with it (same
        // context, SmolLM2-135M, Intel Xeon: 0.941 / 0.948 of positions on Q8_0 / Q4_K_M
        // against 0.969 / 0.972 with the f16 scale; perplexity +0.06 / +0.70 % against
        // −0.14 / +0.25 %).
        let d = half::f16::from_f32(amax / 127.0).to_f32();
        let inv = _mm512_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
        let q = [code(v[0], inv), code(v[1], inv)];
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
        for (h, q) in q.into_iter().enumerate() {
            _mm_storeu_si128(
                codes.as_mut_ptr().add(16 * h).cast(),
                _mm512_cvtepi32_epi8(q),
            );
        }
        for (lane, four) in neg_lane_sums.iter_mut().zip(codes.chunks_exact(4)) {
            *lane = -four.iter().map(|&c| i32::from(c as i8)).sum::<i32>();
        }
        (d, sum)
    }
}

/// `v·inv` rounded to the nearest integer and clamped to ±127: `|x·inv| ≤ 127` up to `inv`'s
/// rounding, which `vpmovdb`'s truncation would wrap (clamped before the codes are summed).
#[inline(always)]
unsafe fn code(v: __m512, inv: __m512) -> __m512i {
    // SAFETY: AVX-512F is the caller's contract.
    unsafe {
        let q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
        _mm512_min_epi32(
            _mm512_max_epi32(q, _mm512_set1_epi32(-127)),
            _mm512_set1_epi32(127),
        )
    }
}
