//! The kernels compiled with AVX2 (and FMA for the fast mode).
//!
//! `expand` and `tn` are the portable generic bodies instantiated here with the wider
//! instruction set: they are `#[inline(always)]`, so LLVM vectorises them for AVX2, and the
//! portable build stays baseline x86-64.
//!
//! `nt` (the base GEMM, the LoRA shrink, the Freivalds products) is written with intrinsics
//! instead. LLVM's SLP vectoriser turned the generic `tile` into packed FMAs, but not its
//! deterministic instantiation: the separate multiply and add stayed scalar `vmulss`/`vaddss`
//! on accumulators spilled to the stack, which made [`super::Mode::Deterministic`] 10–17×
//! slower than the fast mode and made a row cost as much in a 32-row call as alone. The
//! intrinsics below do, lane for lane, what the generic body does: `acc + x·w` per lane
//! (rounded twice without FMA, once with), the same [`super::fold`] tree, the blocks in the
//! same order. Only the tiling over rows and columns differs, and tiling never changes one
//! output element's sequence of operations, so the bits are the portable kernel's.

use std::arch::x86_64::{
    __m256, _MM_HINT_T0, _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_movehdup_ps, _mm_movehl_ps,
    _mm_prefetch, _mm256_add_ps, _mm256_castps256_ps128, _mm256_extractf128_ps, _mm256_fmadd_ps,
    _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
};

use std::arch::x86_64::{
    __m512, _mm256_castpd_ps, _mm256_castps_pd, _mm512_add_ps, _mm512_broadcast_f64x4,
    _mm512_castpd_ps, _mm512_castpd256_pd512, _mm512_castpd512_pd256, _mm512_castps_pd,
    _mm512_extractf64x4_pd, _mm512_fmadd_ps, _mm512_insertf64x4, _mm512_mul_ps, _mm512_setzero_ps,
};

use super::{LANES, fold};

pub(super) mod bf16_dot;
mod blocks;
pub(super) mod int8;
pub(super) mod packed;
pub(super) mod widen;

/// `acc + x·w` in every lane: fused when `FMA`, otherwise a rounded product then a rounded
/// sum, exactly the scalar `acc + a * b` of the portable kernel.
///
/// # Safety
/// The CPU must support AVX2, and FMA when `FMA`.
#[inline(always)]
unsafe fn madd<const FMA: bool>(x: __m256, w: __m256, acc: __m256) -> __m256 {
    // SAFETY: the features are the caller's contract.
    unsafe {
        if FMA {
            _mm256_fmadd_ps(x, w, acc)
        } else {
            _mm256_add_ps(acc, _mm256_mul_ps(x, w))
        }
    }
}

/// [`fold`] of one register of lane sums, `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, with the
/// same operands in the same order.
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
unsafe fn fold_register(acc: __m256) -> f32 {
    // SAFETY: AVX2 (which implies SSE3) is the caller's contract.
    unsafe {
        // [l0+l4, l1+l5, l2+l6, l3+l7]
        let pairs = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        // [(l0+l4)+(l2+l6), (l1+l5)+(l3+l7), …]
        let quads = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
        _mm_cvtss_f32(_mm_add_ss(quads, _mm_movehdup_ps(quads)))
    }
}

/// One `MR × NR` tile over one reduction block of length `k`: `out[i*out_stride + j] +=`
/// the folded block sum of row `i` of `x` against row `j` of `w`.
///
/// # Safety
/// The CPU must support AVX2, and FMA when `FMA`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const MR: usize, const NR: usize, const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    w: &[f32],
    w_stride: usize,
    k: usize,
    out: &mut [f32],
    out_stride: usize,
    ahead: Option<Ahead>,
) {
    // Bounds are checked here, once per tile; the loads below stay inside these slices.
    let xs: [&[f32]; MR] = std::array::from_fn(|i| &x[i * x_stride..i * x_stride + k]);
    let ws: [&[f32]; NR] = std::array::from_fn(|j| &w[j * w_stride..j * w_stride + k]);
    let full = k / LANES * LANES;
    // SAFETY: AVX2 (and FMA when `FMA`) is the caller's contract; every load reads
    // `o..o + LANES` with `o + LANES <= full <= k`, inside a slice of length `k`. The prefetch
    // addresses are computed with `wrapping_add` and never dereferenced.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        let mut o = 0;
        while o < full {
            // Fetch the line `ahead` elements on in each row of `w` (the next block's, or the
            // next tile's first block's: see [`prefetch_ahead`]) while this one is computed:
            // rows at a stride of `d_in` defeat the hardware prefetcher, which cost up to 2.7×
            // at 4 rows and 25 % at 1 and 32 rows. A prefetch never faults and changes no
            // arithmetic.
            if let Some(ahead) = ahead.filter(|_| o % 16 == 0).map(|a| a.at(o)) {
                for wj in &ws {
                    _mm_prefetch::<_MM_HINT_T0>(
                        wj.as_ptr().wrapping_offset(o as isize + ahead).cast(),
                    );
                }
            }
            let wv: [__m256; NR] = std::array::from_fn(|j| _mm256_loadu_ps(ws[j].as_ptr().add(o)));
            for i in 0..MR {
                let xv = _mm256_loadu_ps(xs[i].as_ptr().add(o));
                for j in 0..NR {
                    acc[i][j] = madd::<FMA>(xv, wv[j], acc[i][j]);
                }
            }
            o += LANES;
        }
        if full == k {
            for i in 0..MR {
                for j in 0..NR {
                    out[i * out_stride + j] += fold_register(acc[i][j]);
                }
            }
            return;
        }
        // A block whose length is not a multiple of LANES (the last one, when the reduction
        // length is): the leftover elements go to lanes 0, 1, … as in the portable kernel.
        for i in 0..MR {
            for j in 0..NR {
                let mut lanes = [0f32; LANES];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i][j]);
                for t in full..k {
                    lanes[t - full] = super::madd::<FMA>(xs[i][t], ws[j][t], lanes[t - full]);
                }
                out[i * out_stride + j] += fold(&lanes);
            }
        }
    }
}

/// Rows `0..MR` of `x` against the `n` rows of `w`, `NR` at a time, over one block; row `i`'s
/// sums go to `out[i*out_stride..]`, and the tiles prefetch `ahead` (see [`prefetch_ahead`]).
///
/// # Safety
/// The CPU must support AVX2, and FMA when `FMA`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_group<const MR: usize, const NR: usize, const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    out_stride: usize,
    ahead: Option<Ahead>,
) {
    let mut j = 0;
    // SAFETY: the features are the caller's contract; `tile` checks its own bounds.
    unsafe {
        while j + NR <= n {
            tile::<MR, NR, FMA>(
                x,
                x_stride,
                &w[j * w_stride..],
                w_stride,
                k,
                &mut out[j..],
                out_stride,
                ahead,
            );
            j += NR;
        }
        while j < n {
            tile::<MR, 1, FMA>(
                x,
                x_stride,
                &w[j * w_stride..],
                w_stride,
                k,
                &mut out[j..],
                out_stride,
                ahead,
            );
            j += 1;
        }
    }
}

/// Two registers of lane sums side by side in one AVX-512 register: `lo` in lanes 0–7, `hi` in
/// lanes 8–15.
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline(always)]
unsafe fn pair(lo: __m256, hi: __m256) -> __m512 {
    // SAFETY: AVX-512F is the caller's contract.
    unsafe {
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
            _mm256_castps_pd(hi),
        ))
    }
}

/// `acc + x·w` in sixteen lanes, as [`madd`] in eight.
///
/// # Safety
/// The CPU must support AVX-512F, and FMA when `FMA`.
#[inline(always)]
unsafe fn madd512<const FMA: bool>(x: __m512, w: __m512, acc: __m512) -> __m512 {
    // SAFETY: the features are the caller's contract.
    unsafe {
        if FMA {
            _mm512_fmadd_ps(x, w, acc)
        } else {
            _mm512_add_ps(acc, _mm512_mul_ps(x, w))
        }
    }
}

/// The two halves of [`pair`].
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline(always)]
unsafe fn halves(v: __m512) -> [__m256; 2] {
    // SAFETY: AVX-512F is the caller's contract.
    unsafe {
        let d = _mm512_castps_pd(v);
        [
            _mm256_castpd_ps(_mm512_castpd512_pd256(d)),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(d)),
        ]
    }
}

/// [`tile`] without FMA for `MR` rows and `2·NP` columns, two columns per AVX-512 register:
/// column `2p` in lanes 0–7 and column `2p + 1` in lanes 8–15 of accumulator `p`, the row's
/// eight elements repeated in both halves. Every lane does exactly what the AVX2 tile's lane
/// does (`acc + x·w`, rounded twice, in the same order), so the bits are the same; only twice
/// as many lanes go through each instruction, which matters where the deterministic mode is
/// bound by its separate multiply and add (a batch's rows).
///
/// # Safety
/// The CPU must support AVX2 and AVX-512F.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_pairs<const MR: usize, const NP: usize, const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    w: &[f32],
    w_stride: usize,
    k: usize,
    out: &mut [f32],
    out_stride: usize,
    ahead: Option<Ahead>,
) {
    let xs: [&[f32]; MR] = std::array::from_fn(|i| &x[i * x_stride..i * x_stride + k]);
    let ws: [[&[f32]; 2]; NP] = std::array::from_fn(|p| {
        std::array::from_fn(|h| &w[(2 * p + h) * w_stride..(2 * p + h) * w_stride + k])
    });
    let full = k / LANES * LANES;
    // SAFETY: as in `tile`: the features are the caller's contract, every load reads
    // `o..o + LANES` with `o + LANES <= full <= k` inside a slice of length `k`, and prefetch
    // addresses are never dereferenced.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NP]; MR];
        let mut o = 0;
        while o < full {
            if let Some(ahead) = ahead.filter(|_| o % 16 == 0).map(|a| a.at(o)) {
                for wp in &ws {
                    for wj in wp {
                        _mm_prefetch::<_MM_HINT_T0>(
                            wj.as_ptr().wrapping_offset(o as isize + ahead).cast(),
                        );
                    }
                }
            }
            let wv: [__m512; NP] = std::array::from_fn(|p| {
                pair(
                    _mm256_loadu_ps(ws[p][0].as_ptr().add(o)),
                    _mm256_loadu_ps(ws[p][1].as_ptr().add(o)),
                )
            });
            for i in 0..MR {
                let xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(
                    _mm256_loadu_ps(xs[i].as_ptr().add(o)),
                )));
                for p in 0..NP {
                    acc[i][p] = madd512::<FMA>(xv, wv[p], acc[i][p]);
                }
            }
            o += LANES;
        }
        for i in 0..MR {
            for p in 0..NP {
                for (h, sums) in halves(acc[i][p]).into_iter().enumerate() {
                    let j = 2 * p + h;
                    let mut lanes = [0f32; LANES];
                    if full == k {
                        out[i * out_stride + j] += fold_register(sums);
                        continue;
                    }
                    _mm256_storeu_ps(lanes.as_mut_ptr(), sums);
                    for t in full..k {
                        lanes[t - full] =
                            super::madd::<FMA>(xs[i][t], ws[p][h][t], lanes[t - full]);
                    }
                    out[i * out_stride + j] += fold(&lanes);
                }
            }
        }
    }
}

/// [`row_group`] without FMA on AVX-512: `2·NP` columns at a time, the rest one by one with
/// the AVX2 tile (the same bits either way).
///
/// # Safety
/// The CPU must support AVX2 and AVX-512F.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_group_pairs<const MR: usize, const NP: usize, const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    out_stride: usize,
    ahead: Option<Ahead>,
) {
    let mut j = 0;
    // SAFETY: the features are the caller's contract; the tiles check their own bounds.
    unsafe {
        while j + 2 * NP <= n {
            tile_pairs::<MR, NP, FMA>(
                x,
                x_stride,
                &w[j * w_stride..],
                w_stride,
                k,
                &mut out[j..],
                out_stride,
                ahead,
            );
            j += 2 * NP;
        }
        while j < n {
            tile::<MR, 1, FMA>(
                x,
                x_stride,
                &w[j * w_stride..],
                w_stride,
                k,
                &mut out[j..],
                out_stride,
                ahead,
            );
            j += 1;
        }
    }
}

/// The deterministic `nt` kernel on AVX-512: [`nt`]'s loop ([`steps`]), with
/// [`tile_pairs`]: up to four rows by eight columns, five to eight rows by four (sixteen of the
/// 32 registers hold sums either way; 4 × 4 columns was 3–4 % slower on 8-row decode at hidden
/// 2048 than 4 × 8, and two groups of 4 × 8 slower than one of 8 × 4: see [`nt_pairs`]).
///
/// # Safety
/// The CPU must support AVX2 and AVX-512F.
#[target_feature(enable = "avx2,avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn nt_nofma_avx512(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    // SAFETY: this function's own contract.
    unsafe { nt_pairs::<false>(x, x_stride, m, w, w_stride, n, k, out, kc) }
}

/// The fast mode's `nt` kernel on AVX-512: [`nt_nofma_avx512`] with fused multiply-adds (the
/// bits of the AVX2 FMA kernel: a fused multiply-add is exactly rounded everywhere).
///
/// # Safety
/// The CPU must support AVX2, FMA and AVX-512F.
#[target_feature(enable = "avx2,fma,avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn nt_fma_avx512(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    // SAFETY: this function's own contract.
    unsafe { nt_pairs::<true>(x, x_stride, m, w, w_stride, n, k, out, kc) }
}

/// The body of the AVX-512 `nt` kernels.
///
/// # Safety
/// The CPU must support AVX2 and AVX-512F, and FMA when `FMA`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn nt_pairs<const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        for Step {
            i,
            rows,
            j0,
            cols,
            k0,
            kl,
            ahead,
        } in steps(m, n, k, kc, w_stride, 8, tile_cols(m, true))
        {
            let (xb, wb) = (&x[i * x_stride + k0..], &w[j0 * w_stride + k0..]);
            let ob = &mut out[i * n + j0..];
            // Five to eight rows take four columns per pass (sixteen sums for eight rows): one
            // pass over a block of `w` for a whole decode batch of eight, where two groups of
            // four left the memory stream idle while the second group computed, and half the
            // column-pair inserts per multiply.
            macro_rules! group {
                ($mr:literal, $np:literal) => {
                    row_group_pairs::<$mr, $np, FMA>(
                        xb, x_stride, wb, w_stride, cols, kl, ob, n, ahead,
                    )
                };
            }
            match rows {
                8 => group!(8, 2),
                7 => group!(7, 2),
                6 => group!(6, 2),
                5 => group!(5, 2),
                4 => group!(4, 4),
                3 => group!(3, 4),
                2 => group!(2, 4),
                _ => group!(1, 4),
            }
        }
    }
}

/// Output columns per column tile of the `nt` kernels.
const TILE_COLS: usize = 8;

/// The column tile for `m` rows of `x`: [`TILE_COLS`], or for one row on a CPU that reads
/// fewer streams faster ([`super::one_stream`]) fewer rows of `w` side by side: one where the
/// weights are cheap to read (`f32`, `bf16`: a single row read front to back), four where they
/// are not (a quantized row's dequantization is work enough that one chain of sums bounds it:
/// Q8_0 and Q4_K decode at one row ran 0.7–0.8× as fast one row at a time, and 1.08–1.2× as
/// fast four at a time, as with eight).
pub(super) fn tile_cols(m: usize, cheap: bool) -> usize {
    match (m == 1 && super::one_stream(), cheap) {
        (true, true) => 1,
        (true, false) => 4,
        (false, _) => TILE_COLS,
    }
}

/// One call of a row group in the `nt` kernels' loop: rows `i..i + rows` of `x` against rows
/// `j0..j0 + cols` of `w`, over the reduction block `k0..k0 + kl`, prefetching `ahead`.
struct Step {
    i: usize,
    rows: usize,
    j0: usize,
    cols: usize,
    k0: usize,
    kl: usize,
    ahead: Option<Ahead>,
}

/// Rows of `x` up to which the `nt` kernels put column tiles outermost (see [`steps`]).
const TILES_FIRST_MAX_ROWS: usize = 256;

/// The loop of the `nt` kernels, as the [`Step`]s it makes (plain data: the intrinsics stay in
/// the `target_feature` functions, which a closure would not inherit).
///
/// Up to [`TILES_FIRST_MAX_ROWS`] rows (decode steps, prompts): column tiles of `tile_cols`
/// rows of `w` ([`tile_cols`]: [`TILE_COLS`], fewer for one row on AMD) outermost, then the
/// reduction blocks of `kc` in ascending order, then groups of up to `group` rows of `x`
/// (eight with AVX-512's 32 registers, four with AVX2's 16). A
/// tile's rows of `w` are read front to back, one block after another (8 × `kc` floats, 16
/// KiB), every row group uses that block while it is in L1, and the first row group prefetches
/// for the whole tile ([`prefetch_ahead`]). With blocks outermost a single row re-fetched each
/// panel's 32 rows at a stride of `d_in` from scratch (one row −6 %, 24 rows −16 %, 192 rows
/// −21 % at hidden 2048 in the `decode_layer` example).
///
/// More rows (a large `matmul` job): blocks outermost, then row groups, then column tiles, each
/// tile prefetching its next block. Then every block of `x` is read once and `w`'s block comes
/// from L2; with tiles outermost, `x` went through memory once per tile (4096 rows: +40 %).
///
/// Either way every output adds its blocks' folded sums in ascending order, so the order
/// changes no bits, only what memory sees.
fn steps(
    m: usize,
    n: usize,
    k: usize,
    kc: usize,
    w_stride: usize,
    group: usize,
    tile_cols: usize,
) -> impl Iterator<Item = Step> {
    let (tiles, blocks, groups) = (n.div_ceil(tile_cols), k.div_ceil(kc), m.div_ceil(group));
    let tiles_first = m <= TILES_FIRST_MAX_ROWS;
    // The three counters, innermost first, advanced like an odometer: no division per step
    // (with one-row tiles a step is a single row's block, and dividing out the counters cost
    // 5 % of a served decode step).
    let sizes = if tiles_first {
        [groups, blocks, tiles]
    } else {
        [tiles, groups, blocks]
    };
    let mut at = [0usize; 3];
    let mut left = tiles * blocks * groups;
    std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        left -= 1;
        let [a, b, c] = at;
        let (tile, block, row_group) = if tiles_first { (c, b, a) } else { (a, c, b) };
        for (counter, size) in at.iter_mut().zip(sizes) {
            *counter += 1;
            if *counter < size {
                break;
            }
            *counter = 0;
        }
        let (j0, k0, i) = (tile * tile_cols, block * kc, row_group * group);
        let kl = kc.min(k - k0);
        Some(Step {
            i,
            rows: (m - i).min(group),
            j0,
            cols: tile_cols.min(n - j0),
            k0,
            kl,
            ahead: if tiles_first {
                (i == 0).then(|| prefetch_ahead(k0, kc, k, w_stride, tile_cols))
            } else {
                Some(Ahead {
                    by: kl as isize,
                    wrap_from: usize::MAX,
                    wrapped: 0,
                })
            },
        })
    })
}

/// How far past the element being loaded, in a row of `w`, a tile prefetches: a fixed
/// distance along the row, and where that lies past the row's end, the same distance into the
/// row `tile_cols` further on (the next tile's, which this tile's row group reads next). For
/// rows a whole number of blocks long that is the same line of the next block, or from the last
/// block, the next tile's first block. For a row of 576 (a small model's width: one block and
/// 64 columns) it is what keeps the next tile coming: a next-block distance fetched the other
/// rows of the same tile, already being read, and only two lines of the next tile (one-row
/// decode of SmolLM2-135M in tiles of eight, before and after: bf16 52–58 → 57–66 tokens/s,
/// Q8_0 54–64 → 74–86, AMD EPYC).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ahead {
    /// Elements on, along the row.
    by: isize,
    /// The first column, counted from the block's start, from which `by` lies past the row.
    wrap_from: usize,
    /// The distance from there on (into the next tile's row).
    wrapped: isize,
}

impl Ahead {
    /// The prefetch distance for the element `o` columns into the block.
    #[inline(always)]
    pub(super) fn at(self, o: usize) -> isize {
        if o < self.wrap_from {
            self.by
        } else {
            self.wrapped
        }
    }
}

/// [`Ahead`] for block `k0..` of rows `k` long at a stride of `w_stride`, in tiles of
/// `tile_cols` rows: `kc` elements on (one block).
fn prefetch_ahead(k0: usize, kc: usize, k: usize, w_stride: usize, tile_cols: usize) -> Ahead {
    Ahead {
        by: kc as isize,
        wrap_from: k.saturating_sub(k0 + kc),
        wrapped: (tile_cols * w_stride + kc) as isize - k as isize,
    }
}

pub(super) fn has_avx512f() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("avx512f")
}

/// The AVX2 `nt` kernel: the loop of [`steps`] (column tiles, then blocks of `kc` in ascending
/// order, then groups of up to four rows of `x`).
///
/// Four rows by two columns (eight accumulators, two loads of `w` shared by four rows) when
/// there are four rows; fewer rows take four columns so that enough independent sums are in
/// flight to hide the add latency.
///
/// # Safety
/// The CPU must support AVX2, and FMA when `FMA`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn nt<const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    // SAFETY: the features are the caller's contract.
    unsafe {
        for Step {
            i,
            rows,
            j0,
            cols,
            k0,
            kl,
            ahead,
        } in steps(m, n, k, kc, w_stride, 4, tile_cols(m, true))
        {
            let (xb, wb) = (&x[i * x_stride + k0..], &w[j0 * w_stride + k0..]);
            let ob = &mut out[i * n + j0..];
            match rows {
                4 => row_group::<4, 2, FMA>(xb, x_stride, wb, w_stride, cols, kl, ob, n, ahead),
                3 => row_group::<3, 2, FMA>(xb, x_stride, wb, w_stride, cols, kl, ob, n, ahead),
                2 => row_group::<2, 4, FMA>(xb, x_stride, wb, w_stride, cols, kl, ob, n, ahead),
                _ => row_group::<1, 4, FMA>(xb, x_stride, wb, w_stride, cols, kl, ob, n, ahead),
            }
        }
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn nt_fma(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    // SAFETY: this function's own contract.
    unsafe { nt::<true>(x, x_stride, m, w, w_stride, n, k, out, kc) }
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn nt_nofma(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    // SAFETY: this function's own contract.
    unsafe { nt::<false>(x, x_stride, m, w, w_stride, n, k, out, kc) }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn expand_fma<T: crate::Element>(
    v: &[f32],
    bt: &[T],
    rank: usize,
    d_out: usize,
    scale: f32,
    y: &mut [f32],
    rows: usize,
) {
    super::expand_generic::<T, true>(v, bt, rank, d_out, scale, y, rows)
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn expand_nofma<T: crate::Element>(
    v: &[f32],
    bt: &[T],
    rank: usize,
    d_out: usize,
    scale: f32,
    y: &mut [f32],
    rows: usize,
) {
    super::expand_generic::<T, false>(v, bt, rank, d_out, scale, y, rows)
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tn_fma(
    r: &[f32],
    r_stride: usize,
    k: usize,
    p: usize,
    w: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    super::tn_generic::<true>(r, r_stride, k, p, w, cols, out)
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tn_nofma(
    r: &[f32],
    r_stride: usize,
    k: usize,
    p: usize,
    w: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    super::tn_generic::<false>(r, r_stride, k, p, w, cols, out)
}

pub(super) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

pub(super) fn has_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The odometer visits what the loop nest it replaces visits, in the same order.
    #[test]
    fn steps_visit_the_loop_nest_in_order() {
        for (m, n, k, group, tile_cols) in [
            (1usize, 1usize, 1usize, 8usize, 1usize),
            (1, 67, 576, 8, 1),
            (1, 67, 576, 8, 8),
            (8, 32, 1536, 8, 8),
            (13, 30, 2049, 4, 8),
            (300, 19, 1100, 8, 8),
        ] {
            let kc = 512;
            let (tiles, blocks, groups) =
                (n.div_ceil(tile_cols), k.div_ceil(kc), m.div_ceil(group));
            let mut want = Vec::new();
            if m <= TILES_FIRST_MAX_ROWS {
                for t in 0..tiles {
                    for b in 0..blocks {
                        for g in 0..groups {
                            want.push((g * group, t * tile_cols, b * kc));
                        }
                    }
                }
            } else {
                for b in 0..blocks {
                    for g in 0..groups {
                        for t in 0..tiles {
                            want.push((g * group, t * tile_cols, b * kc));
                        }
                    }
                }
            }
            let got: Vec<_> = steps(m, n, k, kc, k, group, tile_cols)
                .map(|s| {
                    assert_eq!(s.rows, (m - s.i).min(group));
                    assert_eq!(s.cols, tile_cols.min(n - s.j0));
                    assert_eq!(s.kl, kc.min(k - s.k0));
                    (s.i, s.j0, s.k0)
                })
                .collect();
            assert_eq!(got, want, "m {m} n {n} k {k}");
        }
    }
}
