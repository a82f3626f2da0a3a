//! The `nt` kernel over weights held narrower than `f32` — bf16, f16, or ggml's blocks — widened
//! in registers as the tiles read them.
//!
//! Dequantizing a 32-row panel into scratch and multiplying it there cost more than the product
//! itself at the few rows of a decode step (SmolLM2's 1536 × 576 projection, one row, one
//! thread: f32 69 µs, bf16 136 µs, Q4_0 186 µs), because every weight went to memory and back
//! once more. Here a tile loads each weight row's next 8 (bf16) or 32 (a ggml block group)
//! elements straight into registers, widened exactly ([`super::blocks`]), and uses them for
//! every row of `x` in the tile.
//!
//! The arithmetic is [`super::tile`]'s lane for lane — `acc + x·w` per lane in ascending order
//! (fused when `FMA`), the same [`fold`] tree, the blocks of `kc` in ascending order — on the
//! values the panel dequantization would have written, so every output has the bits of the f32
//! kernel on the dequantized matrix, at any batch composition or thread count.

// The tiles index several arrays (sums, registers of `w`, rows of `x`) by the same row and
// register numbers; iterators over one of them would hide which is which.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::{
    __m128i, __m256, __m256i, __m512, _MM_HINT_T0, _mm_loadu_si128, _mm_prefetch, _mm256_castps_pd,
    _mm256_castsi256_ps, _mm256_cvtepu16_epi32, _mm256_cvtph_ps, _mm256_loadu_ps, _mm256_set_m128i,
    _mm256_setzero_ps, _mm256_slli_epi32, _mm256_storeu_ps, _mm512_broadcast_f64x4,
    _mm512_castpd_ps, _mm512_castsi512_ps, _mm512_cvtepu16_epi32, _mm512_cvtph_ps,
    _mm512_setzero_ps, _mm512_slli_epi32,
};
use std::marker::PhantomData;

use super::blocks::{self, Blocks};
use super::{Ahead, LANES, Step, fold, fold_register, halves, madd, madd512, steps, tile_cols};
use crate::Mode;
use crate::cpu::Widened;
use crate::quant::{QK_K, QuantType};

/// Rows of a widened matrix as the tiles read them: `G` registers (`8·G` elements) at a time.
trait Rows<const G: usize>: Sync {
    /// Elements `c..c + 8·G` of row `j` (`c` a multiple of `8·G`).
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C; row `j` and those columns must exist.
    unsafe fn load(&self, j: usize, c: usize) -> [__m256; G];
    /// [`Rows::load`] of rows `j` and `j + 1` side by side: register `g` holds row `j`'s
    /// elements in lanes 0–7 and row `j + 1`'s in lanes 8–15 ([`super::pair`] of the two loads),
    /// widened in sixteen-lane instructions.
    ///
    /// # Safety
    /// As [`Rows::load`] for both rows, and AVX-512F.
    unsafe fn load_pair(&self, j: usize, c: usize) -> [__m512; G];
    /// Element `(j, c)`, for the end of a reduction that is not a whole group.
    fn at(&self, j: usize, c: usize) -> f32;
    /// The address of element `(j, c)` for a prefetch, computed with wrapping arithmetic (it
    /// may lie past the matrix: the prefetch never faults and nothing reads it).
    fn addr(&self, j: usize, c: isize) -> *const i8;
}

/// A two-byte float the tiles widen to `f32` exactly: bf16 (the top half of an f32: a
/// zero-extend and a shift) or f16 (F16C's conversion).
trait Half: Copy + Sync {
    /// Eight elements' bits as `f32`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C.
    unsafe fn widen8(bits: __m128i) -> __m256;
    /// Sixteen elements' bits as `f32`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    unsafe fn widen16(bits: __m256i) -> __m512;
    fn to_f32(self) -> f32;
}

impl Half for half::bf16 {
    #[inline(always)]
    unsafe fn widen8(bits: __m128i) -> __m256 {
        // SAFETY: the caller's contract; the shift is exact.
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits))) }
    }

    #[inline(always)]
    unsafe fn widen16(bits: __m256i) -> __m512 {
        // SAFETY: the caller's contract; the shift is exact.
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits))) }
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl Half for half::f16 {
    #[inline(always)]
    unsafe fn widen8(bits: __m128i) -> __m256 {
        // SAFETY: the caller's contract; every f16 is exactly an f32.
        unsafe { _mm256_cvtph_ps(bits) }
    }

    #[inline(always)]
    unsafe fn widen16(bits: __m256i) -> __m512 {
        // SAFETY: the caller's contract; every f16 is exactly an f32.
        unsafe { _mm512_cvtph_ps(bits) }
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// Rows of `k` two-byte floats.
struct HalfRows<'a, T> {
    w: &'a [T],
    k: usize,
}

impl<T: Half> Rows<1> for HalfRows<'_, T> {
    #[inline(always)]
    unsafe fn load(&self, j: usize, c: usize) -> [__m256; 1] {
        // SAFETY: the trait's contract.
        unsafe {
            let at = self.w.as_ptr().add(j * self.k + c);
            [T::widen8(_mm_loadu_si128(at.cast()))]
        }
    }

    #[inline(always)]
    unsafe fn load_pair(&self, j: usize, c: usize) -> [__m512; 1] {
        // SAFETY: the trait's contract; as `load`, sixteen lanes at once.
        unsafe {
            let at = self.w.as_ptr().add(j * self.k + c);
            [T::widen16(_mm256_set_m128i(
                _mm_loadu_si128(at.add(self.k).cast()),
                _mm_loadu_si128(at.cast()),
            ))]
        }
    }

    #[inline(always)]
    fn at(&self, j: usize, c: usize) -> f32 {
        self.w[j * self.k + c].to_f32()
    }

    #[inline(always)]
    fn addr(&self, j: usize, c: isize) -> *const i8 {
        self.w
            .as_ptr()
            .wrapping_offset((j * self.k) as isize + c)
            .cast()
    }
}

struct BlockRows<'a, B> {
    data: &'a [u8],
    row_bytes: usize,
    kind: QuantType,
    format: PhantomData<B>,
}

impl<B: Blocks> BlockRows<'_, B> {
    /// The block holding element `(j, c)`.
    ///
    /// # Safety
    /// Row `j` and column `c` must exist.
    #[inline(always)]
    unsafe fn block(&self, j: usize, c: usize) -> *const u8 {
        // SAFETY: the caller's contract: the offset lies inside `data`.
        unsafe {
            self.data
                .as_ptr()
                .add(j * self.row_bytes + c / B::ELEMENTS * B::BYTES)
        }
    }

    /// Which 32-element group of its block column `c` starts.
    #[inline(always)]
    fn group_of(c: usize) -> usize {
        c % B::ELEMENTS / (4 * LANES)
    }
}

impl<B: Blocks> Rows<4> for BlockRows<'_, B> {
    #[inline(always)]
    unsafe fn load(&self, j: usize, c: usize) -> [__m256; 4] {
        // SAFETY: the trait's contract; the block lies inside row `j`.
        unsafe { B::group(self.block(j, c), Self::group_of(c)) }
    }

    #[inline(always)]
    unsafe fn load_pair(&self, j: usize, c: usize) -> [__m512; 4] {
        // SAFETY: the trait's contract; both blocks lie inside their rows.
        unsafe {
            let block = self.block(j, c);
            B::group_pair(block, block.add(self.row_bytes), Self::group_of(c))
        }
    }

    fn at(&self, j: usize, c: usize) -> f32 {
        let start = j * self.row_bytes + c / B::ELEMENTS * B::BYTES;
        let mut block = [0f32; QK_K];
        self.kind.dequantize(
            &self.data[start..start + B::BYTES],
            &mut block[..B::ELEMENTS],
        );
        block[c % B::ELEMENTS]
    }

    #[inline(always)]
    fn addr(&self, j: usize, c: isize) -> *const i8 {
        // Rows are contiguous and whole blocks, so a column past the row's end addresses the
        // rows below it, as the f32 kernel's element offsets do.
        let byte =
            (j * self.row_bytes) as isize + c.div_euclid(B::ELEMENTS as isize) * B::BYTES as isize;
        self.data.as_ptr().wrapping_offset(byte).cast()
    }
}

/// `out[i*n + j] += Σ_{c<k} x[i*x_stride + c] · W[j0 + j][c]` for `i < m`, `j < n`, where `k`
/// is the row length of `w` (`k` for bf16 is given; a quantized matrix's is its `d_in`).
/// `false`, touching nothing, when this CPU lacks AVX2 or F16C (the caller then dequantizes
/// into a panel).
#[allow(clippy::too_many_arguments)]
pub(crate) fn nt(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: Widened<'_>,
    j0: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    mode: Mode,
    kc: usize,
) -> bool {
    if !super::has_avx2() || !std::arch::is_x86_feature_detected!("f16c") {
        return false;
    }
    if m == 0 || n == 0 || k == 0 {
        return true;
    }
    assert!(x.len() >= (m - 1) * x_stride + k, "nt widened: x too short");
    assert!(out.len() >= m * n, "nt widened: out too short");
    let run = Run {
        fma: mode == Mode::Fast && super::has_fma(),
        wide: has_avx512vl() && !crate::cpu::no_avx512(),
        kc,
    };
    run.widened(x, x_stride, m, w, j0, n, k, out);
    true
}

fn has_avx512vl() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// Which compiled kernel a call takes.
struct Run {
    fma: bool,
    /// AVX-512VL's 32 registers: groups of eight rows of `x` instead of four.
    wide: bool,
    kc: usize,
}

impl Run {
    /// Rows `j0..j0 + n` of `w` through the kernel for its format.
    #[allow(clippy::too_many_arguments)]
    fn widened(
        &self,
        x: &[f32],
        x_stride: usize,
        m: usize,
        w: Widened<'_>,
        j0: usize,
        n: usize,
        k: usize,
        out: &mut [f32],
    ) {
        match w {
            Widened::Bf16(w) => self.half(x, x_stride, m, w, j0, n, k, out),
            Widened::F16(w) => self.half(x, x_stride, m, w, j0, n, k, out),
            Widened::Quant(q) => {
                assert_eq!(k, q.d_in(), "nt widened: a quantized row is reduced whole");
                assert!(j0 + n <= q.d_out(), "nt widened: rows past the matrix");
                let row_bytes = q.data().len() / q.d_out();
                let data = &q.data()[j0 * row_bytes..(j0 + n) * row_bytes];
                macro_rules! go {
                    ($format:ty) => {
                        self.go(
                            x,
                            x_stride,
                            m,
                            &BlockRows::<$format> {
                                data,
                                row_bytes,
                                kind: q.kind(),
                                format: PhantomData,
                            },
                            n,
                            k,
                            out,
                        )
                    };
                }
                match q.kind() {
                    QuantType::Q8_0 => go!(blocks::Q8_0),
                    QuantType::Q4_0 => go!(blocks::Q4_0),
                    QuantType::Q4_1 => go!(blocks::Q4_1),
                    QuantType::Q5_0 => go!(blocks::Q5_0),
                    QuantType::Q5_1 => go!(blocks::Q5_1),
                    QuantType::Q4K => go!(blocks::Q4K),
                    QuantType::Q6K => go!(blocks::Q6K),
                }
            }
        }
    }

    /// Rows `j0..j0 + n` of two-byte floats through the kernel.
    #[allow(clippy::too_many_arguments)]
    fn half<T: Half>(
        &self,
        x: &[f32],
        x_stride: usize,
        m: usize,
        w: &[T],
        j0: usize,
        n: usize,
        k: usize,
        out: &mut [f32],
    ) {
        assert!(w.len() >= (j0 + n) * k, "nt widened: w too short");
        let rows = HalfRows { w: &w[j0 * k..], k };
        self.go(x, x_stride, m, &rows, n, k, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn go<const G: usize, S: Rows<G>>(
        &self,
        x: &[f32],
        x_stride: usize,
        m: usize,
        w: &S,
        n: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let kc = self.kc;
        // SAFETY: each kernel's features were detected at run time (`nt` checked AVX2 and
        // F16C, `fma` and `wide` their own); the bounds of `w` were checked by `nt`.
        unsafe {
            match (self.fma, self.wide) {
                (true, true) => nt_fma_avx512::<G, S>(x, x_stride, m, w, n, k, out, kc),
                (true, false) => nt_fma::<G, S>(x, x_stride, m, w, n, k, out, kc),
                (false, true) => nt_nofma_avx512::<G, S>(x, x_stride, m, w, n, k, out, kc),
                (false, false) => nt_nofma::<G, S>(x, x_stride, m, w, n, k, out, kc),
            }
        }
    }
}

macro_rules! kernel {
    ($name:ident, $features:literal, $fma:literal, $group:literal) => {
        /// # Safety
        /// The CPU must have the features this function enables; `w` must have `n` rows of
        /// at least `k` elements.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name<const G: usize, S: Rows<G>>(
            x: &[f32],
            x_stride: usize,
            m: usize,
            w: &S,
            n: usize,
            k: usize,
            out: &mut [f32],
            kc: usize,
        ) {
            // SAFETY: this function's own contract.
            unsafe { nt_rows::<G, S, $fma, $group>(x, x_stride, m, w, n, k, out, kc) }
        }
    };
}

kernel!(nt_fma, "avx2,fma,f16c", true, 4);
kernel!(nt_nofma, "avx2,f16c", false, 4);
kernel!(nt_fma_avx512, "avx2,fma,f16c,avx512f,avx512vl", true, 8);
kernel!(nt_nofma_avx512, "avx2,f16c,avx512f,avx512vl", false, 8);

/// [`super::nt`]'s loop ([`steps`]) over a widened `w`: groups of up to `GROUP` rows of `x`,
/// each against as many rows of `w` at a time as the registers hold (for few rows of `x`,
/// enough independent sums in flight to hide the add latency).
///
/// # Safety
/// AVX2 and F16C, FMA when `FMA`, AVX-512VL when `GROUP` is 8; `w` has `n` rows of `k`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn nt_rows<const G: usize, S: Rows<G>, const FMA: bool, const GROUP: usize>(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &S,
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    for Step {
        i,
        rows,
        j0,
        cols,
        k0,
        kl,
        ahead,
    } in steps(m, n, k, kc, k, GROUP, tile_cols(m, G == 1))
    {
        let xb = &x[i * x_stride + k0..];
        let ob = &mut out[i * n + j0..];
        let at = Place {
            j0,
            cols,
            k0,
            kl,
            ahead,
        };
        macro_rules! group {
            ($mr:literal, $nr:literal) => {
                // SAFETY: the caller's contract.
                unsafe { row_group::<G, S, $mr, $nr, FMA>(xb, x_stride, w, at, ob, n) }
            };
        }
        // Registers: `NR · G` of widened weights and `MR · NR` sums, within AVX-512VL's 32
        // (`GROUP` 8) or AVX2's 16 (`GROUP` 4). With AVX-512 two rows of `w` share a register
        // ([`tile_pairs`]): each multiply and add does sixteen lanes' work.
        macro_rules! pairs {
            ($mr:literal) => {
                // SAFETY: the caller's contract (AVX-512VL where `GROUP` is 8).
                unsafe { row_group_pairs::<G, S, $mr, FMA>(xb, x_stride, w, at, ob, n) }
            };
        }
        match (GROUP, rows, G) {
            (8, 8, _) => pairs!(8),
            (8, 7, _) => pairs!(7),
            (8, 6, _) => pairs!(6),
            (8, 5, _) => pairs!(5),
            (8, 4, _) => pairs!(4),
            (8, 3, _) => pairs!(3),
            (8, 2, _) => pairs!(2),
            (8, _, _) => pairs!(1),
            (_, 4, 1) => group!(4, 2),
            (_, 3, 1) => group!(3, 2),
            (_, 2, 1) => group!(2, 4),
            (_, _, 1) => group!(1, 4),
            (_, 4, _) => group!(4, 1),
            (_, 3, _) => group!(3, 1),
            (_, 2, _) => group!(2, 2),
            _ => group!(1, 2),
        }
    }
}

/// Where a row group works: rows `j0..j0 + cols` of `w`, columns `k0..k0 + kl`, prefetching
/// `ahead` columns on.
#[derive(Clone, Copy)]
struct Place {
    j0: usize,
    cols: usize,
    k0: usize,
    kl: usize,
    ahead: Option<Ahead>,
}

/// `MR` rows of `x` against the place's rows of `w`, `NR` at a time, the rest one by one.
///
/// # Safety
/// As [`nt_rows`].
#[inline(always)]
unsafe fn row_group<
    const G: usize,
    S: Rows<G>,
    const MR: usize,
    const NR: usize,
    const FMA: bool,
>(
    x: &[f32],
    x_stride: usize,
    w: &S,
    at: Place,
    out: &mut [f32],
    out_stride: usize,
) {
    let mut j = 0;
    // SAFETY: the caller's contract; `tile` checks the bounds of `x` and `out`.
    unsafe {
        while j + NR <= at.cols {
            tile::<G, S, MR, NR, FMA>(x, x_stride, w, at.j0 + j, at, &mut out[j..], out_stride);
            j += NR;
        }
        while j < at.cols {
            tile::<G, S, MR, 1, FMA>(x, x_stride, w, at.j0 + j, at, &mut out[j..], out_stride);
            j += 1;
        }
    }
}

/// [`row_group`] on AVX-512 (any number of rows of `x`): rows of `w` two by two per register
/// ([`tile_pairs`]), four at a time, the rest one by one with [`tile`].
///
/// # Safety
/// As [`nt_rows`], and AVX-512F.
#[inline(always)]
unsafe fn row_group_pairs<const G: usize, S: Rows<G>, const MR: usize, const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    w: &S,
    at: Place,
    out: &mut [f32],
    out_stride: usize,
) {
    let mut j = 0;
    // SAFETY: the caller's contract; the tiles check the bounds of `x` and `out`.
    unsafe {
        while j + 4 <= at.cols {
            tile_pairs::<G, S, MR, 2, FMA>(
                x,
                x_stride,
                w,
                at.j0 + j,
                at,
                &mut out[j..],
                out_stride,
            );
            j += 4;
        }
        while j < at.cols {
            tile::<G, S, MR, 1, FMA>(x, x_stride, w, at.j0 + j, at, &mut out[j..], out_stride);
            j += 1;
        }
    }
}

/// [`tile`] for `MR` rows of `x` and `2·NP` rows of `w`, two rows of `w` per AVX-512 register
/// (row `j + 2p` in lanes 0–7, row `j + 2p + 1` in lanes 8–15; `x`'s eight elements in both
/// halves), as [`super::tile_pairs`] does for `f32`: every lane does what [`tile`]'s lane
/// does, in the same order, so the bits are the same.
///
/// # Safety
/// As [`nt_rows`], and AVX-512F.
#[inline(always)]
unsafe fn tile_pairs<
    const G: usize,
    S: Rows<G>,
    const MR: usize,
    const NP: usize,
    const FMA: bool,
>(
    x: &[f32],
    x_stride: usize,
    w: &S,
    j: usize,
    at: Place,
    out: &mut [f32],
    out_stride: usize,
) {
    let (k0, k) = (at.k0, at.kl);
    let xs: [&[f32]; MR] = std::array::from_fn(|i| &x[i * x_stride..i * x_stride + k]);
    let step = LANES * G;
    let full = k / step * step;
    // SAFETY: as in `tile`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NP]; MR];
        let mut o = 0;
        while o < full {
            if let Some(ahead) = at.ahead.filter(|_| o % 32 == 0).map(|a| a.at(o)) {
                for r in 0..2 * NP {
                    _mm_prefetch::<_MM_HINT_T0>(w.addr(j + r, (k0 + o) as isize + ahead));
                }
            }
            let mut wv = [[_mm512_setzero_ps(); G]; NP];
            for (p, wp) in wv.iter_mut().enumerate() {
                *wp = w.load_pair(j + 2 * p, k0 + o);
            }
            for g in 0..G {
                for i in 0..MR {
                    let xv = _mm256_loadu_ps(xs[i].as_ptr().add(o + LANES * g));
                    let xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(xv)));
                    for p in 0..NP {
                        acc[i][p] = madd512::<FMA>(xv, wv[p][g], acc[i][p]);
                    }
                }
            }
            o += step;
        }
        for i in 0..MR {
            for p in 0..NP {
                for (h, sums) in halves(acc[i][p]).into_iter().enumerate() {
                    let r = 2 * p + h;
                    if full == k {
                        out[i * out_stride + r] += fold_register(sums);
                        continue;
                    }
                    let mut lanes = [0f32; LANES];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), sums);
                    for t in full..k {
                        let lane = (t - full) % LANES;
                        lanes[lane] =
                            crate::cpu::madd::<FMA>(xs[i][t], w.at(j + r, k0 + t), lanes[lane]);
                    }
                    out[i * out_stride + r] += fold(&lanes);
                }
            }
        }
    }
}

/// One `MR × NR` tile (rows `j..j + NR` of `w`) over the place's block.
///
/// # Safety
/// As [`nt_rows`].
#[inline(always)]
unsafe fn tile<const G: usize, S: Rows<G>, const MR: usize, const NR: usize, const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    w: &S,
    j: usize,
    at: Place,
    out: &mut [f32],
    out_stride: usize,
) {
    let (k0, k) = (at.k0, at.kl);
    let xs: [&[f32]; MR] = std::array::from_fn(|i| &x[i * x_stride..i * x_stride + k]);
    let step = LANES * G;
    let full = k / step * step;
    // SAFETY: the features and the rows of `w` are the caller's contract; every load of `x`
    // reads `o + 8g..o + 8g + 8` with `o + step <= full <= k`, inside a slice of length `k`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        let mut o = 0;
        while o < full {
            // A line of 64 bytes holds 32 bf16 and one or two blocks' groups: one prefetch per
            // 32 elements of each row (see `super::tile` for why the rows need it).
            if let Some(ahead) = at.ahead.filter(|_| o % 32 == 0).map(|a| a.at(o)) {
                for r in 0..NR {
                    _mm_prefetch::<_MM_HINT_T0>(w.addr(j + r, (k0 + o) as isize + ahead));
                }
            }
            // Every row's registers first, then each register of `x` loaded once and used
            // for every row: loaded inside the row loop, LLVM hoisted all `MR · G` registers
            // of `x` out of it and spilled them to the stack. (Loops, not closures: a closure
            // does not inherit the target features, and its intrinsics would become calls.)
            let mut wv = [[_mm256_setzero_ps(); G]; NR];
            for (r, wr) in wv.iter_mut().enumerate() {
                *wr = w.load(j + r, k0 + o);
            }
            for g in 0..G {
                for i in 0..MR {
                    let xv = _mm256_loadu_ps(xs[i].as_ptr().add(o + LANES * g));
                    for r in 0..NR {
                        acc[i][r] = madd::<FMA>(xv, wv[r][g], acc[i][r]);
                    }
                }
            }
            o += step;
        }
        for i in 0..MR {
            for r in 0..NR {
                if full == k {
                    out[i * out_stride + r] += fold_register(acc[i][r]);
                    continue;
                }
                // The elements after the last whole group go to lanes 0, 1, … in turn, as the
                // f32 kernel's eight-element steps and its tail put them.
                let mut lanes = [0f32; LANES];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i][r]);
                for t in full..k {
                    let lane = (t - full) % LANES;
                    lanes[lane] =
                        crate::cpu::madd::<FMA>(xs[i][t], w.at(j + r, k0 + t), lanes[lane]);
                }
                out[i * out_stride + r] += fold(&lanes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QuantMatrix;
    use crate::quant::tests::random_matrix;
    use crate::rng::seeded;
    use rand::Rng;

    /// Every compiled variant (four rows a group or eight, with or without FMA, as this CPU
    /// has them) against the f32 kernel on the widened matrix, at every row count of a group.
    #[test]
    fn every_variant_has_the_bits_of_the_f32_kernel_on_the_widened_rows() {
        if !super::super::has_avx2() || !std::arch::is_x86_feature_detected!("f16c") {
            return;
        }
        // 832 is not whole super-blocks (no K-quant): 1024 is, for those.
        for k in [576 + 256, 1024] {
            every_variant_at(k);
        }
        // The bf16 rows with a reduction that is not a whole number of registers (the tail).
        let mut rng = seeded(7);
        let x: Vec<f32> = (0..9 * 77).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let bf16: Vec<half::bf16> = (0..5 * 77)
            .map(|_| half::bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
            .collect();
        bf16_tail(&x, &bf16);
    }

    fn every_variant_at(k: usize) {
        let n = 19;
        let mut rng = seeded(7);
        let x: Vec<f32> = (0..9 * k).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let bf16: Vec<half::bf16> = (0..n * k)
            .map(|_| half::bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
            .collect();
        // f16 over its whole range, subnormals included (each is exactly an f32).
        let f16: Vec<half::f16> = (0..n * k)
            .map(|_| {
                half::f16::from_bits(rng.gen_range(0u16..0x7c00) | (rng.gen_range(0u16..2) << 15))
            })
            .collect();
        let quants: Vec<QuantMatrix> = QuantType::ALL
            .into_iter()
            .filter(|t| k.is_multiple_of(t.block_elements()))
            .map(|t| random_matrix(t, n, k, 11))
            .collect();
        let mut cases: Vec<(String, Widened<'_>, Vec<f32>)> = vec![
            (
                "bf16".into(),
                Widened::Bf16(&bf16),
                bf16.iter().map(|v| v.to_f32()).collect(),
            ),
            (
                "f16".into(),
                Widened::F16(&f16),
                f16.iter().map(|v| v.to_f32()).collect(),
            ),
        ];
        for q in &quants {
            cases.push((q.kind().name().into(), Widened::Quant(q), q.to_f32()));
        }
        for (name, w, dense) in &cases {
            for fma in [false, super::super::has_fma()] {
                for wide in [false, has_avx512vl()] {
                    let mode = if fma { Mode::Fast } else { Mode::Deterministic };
                    for m in 1..=9 {
                        let mut want = vec![0f32; m * n];
                        crate::cpu::nt_accumulate(&x, k, m, dense, k, n, k, &mut want, mode);
                        let mut got = vec![0f32; m * n];
                        let run = Run {
                            fma,
                            wide,
                            kc: crate::cpu::KC,
                        };
                        run.widened(&x, k, m, *w, 0, n, k, &mut got);
                        assert_eq!(got, want, "{name}, fma {fma}, wide {wide}, {m} rows");
                    }
                }
            }
        }
    }

    fn bf16_tail(x: &[f32], bf16: &[half::bf16]) {
        let k = 77;
        let mut want = vec![0f32; 3 * 5];
        let dense: Vec<f32> = bf16[..5 * k].iter().map(|v| v.to_f32()).collect();
        crate::cpu::nt_accumulate(x, k, 3, &dense, k, 5, k, &mut want, Mode::Deterministic);
        let mut got = vec![0f32; 3 * 5];
        let w = Widened::Bf16(&bf16[..5 * k]);
        assert!(nt(
            x,
            k,
            3,
            w,
            0,
            5,
            k,
            &mut got,
            Mode::Deterministic,
            crate::cpu::KC
        ));
        assert_eq!(got, want);
    }
}
