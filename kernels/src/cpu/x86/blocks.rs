//! ggml's blocks decoded into AVX2 registers, 32 elements (four registers of eight) at a time,
//! for [`super::widen`]'s kernels.
//!
//! Each decoder does exactly the float operations of [`crate::quant`]'s dequantization (the
//! integer code converted exactly, one rounded product by the block's scale, then one rounded
//! sum or difference where the format has a minimum, no fused multiply-add): the values the
//! panel dequantization writes to memory, produced in registers instead. A format's scales are
//! converted once per 32 elements rather than once per element.

use std::arch::x86_64::{
    __m256, __m256i, __m512, __m512i, __mmask16, _mm_cvtph_ps, _mm_cvtsi32_si128, _mm_cvtss_f32,
    _mm_insert_epi16, _mm_loadl_epi64, _mm_unpacklo_epi64, _mm256_add_epi32, _mm256_add_ps,
    _mm256_and_si256, _mm256_andnot_si256, _mm256_cvtepi8_epi32, _mm256_cvtepi32_ps,
    _mm256_cvtepu8_epi32, _mm256_mul_ps, _mm256_or_si256, _mm256_set1_epi32, _mm256_set1_ps,
    _mm256_setr_epi32, _mm256_slli_epi32, _mm256_sllv_epi32, _mm256_srai_epi32, _mm256_srli_epi32,
    _mm256_srlv_epi32, _mm256_sub_epi32, _mm256_sub_ps, _mm512_add_ps, _mm512_and_si512,
    _mm512_broadcast_i64x4, _mm512_castps128_ps512, _mm512_castsi256_si512, _mm512_cvtepi8_epi32,
    _mm512_cvtepi32_ps, _mm512_cvtepu8_epi32, _mm512_inserti64x4, _mm512_mask_or_epi32,
    _mm512_mask_sub_epi32, _mm512_mul_ps, _mm512_or_si512, _mm512_permutexvar_ps, _mm512_set_epi32,
    _mm512_set1_epi32, _mm512_slli_epi32, _mm512_srli_epi32, _mm512_srlv_epi32, _mm512_sub_epi32,
    _mm512_sub_ps, _mm512_test_epi32_mask, _mm512_testn_epi32_mask,
};

use crate::quant::QK_K;

/// `[e(0), e(1), e(2), e(3)]` for the four registers of a group, written out: a closure (as
/// `std::array::from_fn` takes) would not inherit the caller's target features, and the
/// intrinsics in it would become calls.
macro_rules! four {
    ($g:ident => $e:expr) => {
        [
            {
                let $g = 0usize;
                $e
            },
            {
                let $g = 1usize;
                $e
            },
            {
                let $g = 2usize;
                $e
            },
            {
                let $g = 3usize;
                $e
            },
        ]
    };
}

/// A ggml block format: `ELEMENTS` elements in `BYTES` bytes, decoded 32 at a time.
pub(super) trait Blocks: Copy + Send + Sync + 'static {
    const ELEMENTS: usize;
    const BYTES: usize;
    /// Elements `32·s..32·s + 32` of the block at `block`, in four registers.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C; `block` must point at `BYTES` readable bytes and
    /// `32·s < ELEMENTS`.
    unsafe fn group(block: *const u8, s: usize) -> [__m256; 4];
    /// [`Blocks::group`] of the block at `a` in lanes 0–7 and of the block at `b` in lanes
    /// 8–15 of each register (what [`super::pair`] of the two makes), in sixteen-lane
    /// instructions: the same operations lane for lane, so the same values, for about half the
    /// instructions (at one row of `x` the decoding, not the product, bounds the kernel).
    ///
    /// # Safety
    /// As [`Blocks::group`] for both blocks, and AVX-512F.
    unsafe fn group_pair(a: *const u8, b: *const u8, s: usize) -> [__m512; 4];
}

/// `x` in lanes 0–7 and `y` in lanes 8–15.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
pub(super) unsafe fn split_ps(x: f32, y: f32) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe { super::pair(_mm256_set1_ps(x), _mm256_set1_ps(y)) }
}

/// The `f16` at `a` in lanes 0–7 and the one at `b` in lanes 8–15, as `f32`: both converted
/// by one `vcvtph2ps` and spread by one permute, where [`split_ps`] of two [`half()`]s converts
/// and broadcasts each (a block pair's scale, every pair of blocks a tile reads).
///
/// # Safety
/// AVX-512F (with F16C); two readable bytes at each.
#[inline(always)]
pub(super) unsafe fn split_half(a: *const u8, b: *const u8) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        let bits =
            |at: *const u8| i32::from(u16::from_le_bytes(at.cast::<[u8; 2]>().read_unaligned()));
        let both = _mm_cvtph_ps(_mm_insert_epi16::<1>(_mm_cvtsi32_si128(bits(a)), bits(b)));
        let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(both))
    }
}

/// `x` in lanes 0–7 and `y` in lanes 8–15.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn split_epi32(x: i32, y: i32) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi32(x)),
            _mm256_set1_epi32(y),
        )
    }
}

/// Eight bytes at `a` and eight at `b`, zero-extended (sign-extended when `SIGNED`) to
/// sixteen 32-bit lanes, `a`'s first.
///
/// # Safety
/// AVX-512F; eight readable bytes at each.
#[inline(always)]
unsafe fn bytes8_pair<const SIGNED: bool>(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        let both = _mm_unpacklo_epi64(_mm_loadl_epi64(a.cast()), _mm_loadl_epi64(b.cast()));
        if SIGNED {
            _mm512_cvtepi8_epi32(both)
        } else {
            _mm512_cvtepu8_epi32(both)
        }
    }
}

/// [`nibbles`] of the 16 bytes at `a` in lanes 0–7 and of those at `b` in lanes 8–15.
///
/// # Safety
/// AVX-512F; 16 readable bytes at each; `g < 4`.
#[inline(always)]
unsafe fn nibbles_pair(a: *const u8, b: *const u8, g: usize) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        let v = bytes8_pair::<false>(a.add(8 * (g % 2)), b.add(8 * (g % 2)));
        low_or_high(v, g < 2)
    }
}

/// The low nibble of each lane's byte, or its high one.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn low_or_high(v: __m512i, low: bool) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        if low {
            _mm512_and_si512(v, _mm512_set1_epi32(0xF))
        } else {
            _mm512_srli_epi32::<4>(v)
        }
    }
}

/// The lanes whose Q5 fifth bit is set (`SET`) or clear: bit `8g + lane % 8` of the lane's `qh`
/// (two blocks' `qh`, `a`'s broadcast in lanes 0–7 and `b`'s in 8–15), as a mask — one test
/// where the eight-lane decoder shifts, spreads and masks.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn fifth_bit_pair<const SET: bool>(qh: __m512i, g: usize) -> __mmask16 {
    // SAFETY: the caller's contract.
    unsafe {
        let b = 8 * g as u32;
        let bit = |l: u32| (1u32 << (b + l)) as i32;
        // The same eight bits for each block's half.
        let select = _mm512_broadcast_i64x4(_mm256_setr_epi32(
            bit(0),
            bit(1),
            bit(2),
            bit(3),
            bit(4),
            bit(5),
            bit(6),
            bit(7),
        ));
        if SET {
            _mm512_test_epi32_mask(qh, select)
        } else {
            _mm512_testn_epi32_mask(qh, select)
        }
    }
}

/// [`scaled`] in sixteen lanes.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn scaled_pair(q: __m512i, d: __m512) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe { _mm512_mul_ps(_mm512_cvtepi32_ps(q), d) }
}

/// The 32-bit word at `at`, unaligned.
///
/// # Safety
/// Four readable bytes at `at`.
#[inline(always)]
unsafe fn word(at: *const u8) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { at.cast::<i32>().read_unaligned() }
}

/// The `f16` at `at` (little-endian), exactly, as `f32`.
///
/// # Safety
/// F16C; two readable bytes at `at`.
#[inline(always)]
pub(super) unsafe fn half(at: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        let bits = u16::from_le_bytes(at.cast::<[u8; 2]>().read_unaligned());
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }
}

/// Eight bytes at `at`, zero-extended to eight 32-bit lanes.
///
/// # Safety
/// AVX2; eight readable bytes at `at`.
#[inline(always)]
unsafe fn bytes8(at: *const u8) -> __m256i {
    // SAFETY: the caller's contract (`_mm_loadl_epi64` has no alignment requirement).
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.cast())) }
}

/// Register `g` (elements `8g..8g + 8`) of 32 nibbles packed as ggml packs them: elements 0–15
/// are the low nibbles of bytes 0–15, elements 16–31 their high nibbles.
///
/// # Safety
/// AVX2; 16 readable bytes at `qs`; `g < 4`.
#[inline(always)]
unsafe fn nibbles(qs: *const u8, g: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let v = bytes8(qs.add(8 * (g % 2)));
        if g < 2 {
            _mm256_and_si256(v, _mm256_set1_epi32(0xF))
        } else {
            _mm256_srli_epi32::<4>(v)
        }
    }
}

/// Whether Q5's fifth bit is set for each of elements `8g..8g + 8` (bit `e` of `qh` is element
/// `e`'s), as all-ones lanes: `qh` (broadcast once per block) shifted so that bit `e` is the sign
/// bit, then spread over the lane.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn fifth_bit_set(qh: __m256i, g: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let top = 31 - 8 * g as i32;
        let counts = _mm256_setr_epi32(
            top,
            top - 1,
            top - 2,
            top - 3,
            top - 4,
            top - 5,
            top - 6,
            top - 7,
        );
        _mm256_srai_epi32::<31>(_mm256_sllv_epi32(qh, counts))
    }
}

/// `d·q` in every lane (one rounded product, as `f32::from(q) * d`).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn scaled(q: __m256i, d: __m256) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe { _mm256_mul_ps(_mm256_cvtepi32_ps(q), d) }
}

#[derive(Clone, Copy)]
pub(super) struct Q8_0;
impl Blocks for Q8_0 {
    const ELEMENTS: usize = 32;
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn group(b: *const u8, _s: usize) -> [__m256; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let d = _mm256_set1_ps(half(b));
            four!(g => {
                scaled(
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(2 + 8 * g).cast())),
                    d,
                )
            })
        }
    }
    #[inline(always)]
    unsafe fn group_pair(a: *const u8, b: *const u8, _s: usize) -> [__m512; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let d = split_half(a, b);
            four!(g => scaled_pair(bytes8_pair::<true>(a.add(2 + 8 * g), b.add(2 + 8 * g)), d))
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct Q4_0;
impl Blocks for Q4_0 {
    const ELEMENTS: usize = 32;
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn group(b: *const u8, _s: usize) -> [__m256; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let d = _mm256_set1_ps(half(b));
            let eight = _mm256_set1_epi32(8);
            four!(g => scaled(_mm256_sub_epi32(nibbles(b.add(2), g), eight), d))
        }
    }
    #[inline(always)]
    unsafe fn group_pair(a: *const u8, b: *const u8, _s: usize) -> [__m512; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let d = split_half(a, b);
            let eight = _mm512_set1_epi32(8);
            four!(g => scaled_pair(_mm512_sub_epi32(nibbles_pair(a.add(2), b.add(2), g), eight), d))
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct Q4_1;
impl Blocks for Q4_1 {
    const ELEMENTS: usize = 32;
    const BYTES: usize = 20;
    #[inline(always)]
    unsafe fn group(b: *const u8, _s: usize) -> [__m256; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let (d, m) = (_mm256_set1_ps(half(b)), _mm256_set1_ps(half(b.add(2))));
            four!(g => _mm256_add_ps(scaled(nibbles(b.add(4), g), d), m))
        }
    }
    #[inline(always)]
    unsafe fn group_pair(a: *const u8, b: *const u8, _s: usize) -> [__m512; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let d = split_half(a, b);
            let m = split_half(a.add(2), b.add(2));
            four!(g => _mm512_add_ps(scaled_pair(nibbles_pair(a.add(4), b.add(4), g), d), m))
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct Q5_0;
impl Blocks for Q5_0 {
    const ELEMENTS: usize = 32;
    const BYTES: usize = 22;
    #[inline(always)]
    unsafe fn group(b: *const u8, _s: usize) -> [__m256; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let d = _mm256_set1_ps(half(b));
            let qh = b.add(2).cast::<i32>().read_unaligned();
            let (qh, minus_sixteen) = (_mm256_set1_epi32(qh), _mm256_set1_epi32(-16));
            // `(nibble | h·16) − 16` as `nibble + (h ? 0 : −16)`: the same integer.
            four!(g => {
                let high = _mm256_andnot_si256(fifth_bit_set(qh, g), minus_sixteen);
                scaled(_mm256_add_epi32(nibbles(b.add(6), g), high), d)
            })
        }
    }
    #[inline(always)]
    unsafe fn group_pair(a: *const u8, b: *const u8, _s: usize) -> [__m512; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let d = split_half(a, b);
            let qh = split_epi32(word(a.add(2)), word(b.add(2)));
            let sixteen = _mm512_set1_epi32(16);
            four!(g => {
                // `(nibble | h·16) − 16` as `nibble − 16` where `h` is clear: the same integer.
                let nibble = nibbles_pair(a.add(6), b.add(6), g);
                let clear = fifth_bit_pair::<false>(qh, g);
                scaled_pair(_mm512_mask_sub_epi32(nibble, clear, nibble, sixteen), d)
            })
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct Q5_1;
impl Blocks for Q5_1 {
    const ELEMENTS: usize = 32;
    const BYTES: usize = 24;
    #[inline(always)]
    unsafe fn group(b: *const u8, _s: usize) -> [__m256; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let (d, m) = (_mm256_set1_ps(half(b)), _mm256_set1_ps(half(b.add(2))));
            let qh = _mm256_set1_epi32(b.add(4).cast::<i32>().read_unaligned());
            let sixteen = _mm256_set1_epi32(16);
            four!(g => {
                let high = _mm256_and_si256(fifth_bit_set(qh, g), sixteen);
                _mm256_add_ps(scaled(_mm256_or_si256(nibbles(b.add(8), g), high), d), m)
            })
        }
    }
    #[inline(always)]
    unsafe fn group_pair(a: *const u8, b: *const u8, _s: usize) -> [__m512; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let d = split_half(a, b);
            let m = split_half(a.add(2), b.add(2));
            let qh = split_epi32(word(a.add(4)), word(b.add(4)));
            let sixteen = _mm512_set1_epi32(16);
            four!(g => {
                let nibble = nibbles_pair(a.add(8), b.add(8), g);
                let set = fifth_bit_pair::<true>(qh, g);
                let code = _mm512_mask_or_epi32(nibble, set, nibble, sixteen);
                _mm512_add_ps(scaled_pair(code, d), m)
            })
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct Q4K;
impl Blocks for Q4K {
    const ELEMENTS: usize = QK_K;
    const BYTES: usize = 144;
    /// Sub-block `s` (its own 6-bit scale and min): the low nibbles of bytes `32·(s/2)..` for
    /// even `s`, their high nibbles for odd.
    #[inline(always)]
    unsafe fn group(b: *const u8, s: usize) -> [__m256; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let scales = &*b.add(4).cast::<[u8; 12]>();
            let (sc, mn) = crate::quant::scale_min_k4(s, scales);
            let d1 = _mm256_set1_ps(half(b) * f32::from(sc));
            let m1 = _mm256_set1_ps(half(b.add(2)) * f32::from(mn));
            let qs = b.add(16 + 32 * (s / 2));
            four!(g => {
                let v = bytes8(qs.add(8 * g));
                let q = if s.is_multiple_of(2) {
                    _mm256_and_si256(v, _mm256_set1_epi32(0xF))
                } else {
                    _mm256_srli_epi32::<4>(v)
                };
                _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(q)), m1)
            })
        }
    }
    #[inline(always)]
    unsafe fn group_pair(a: *const u8, b: *const u8, s: usize) -> [__m512; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let (sa, ma) = crate::quant::scale_min_k4(s, &*a.add(4).cast::<[u8; 12]>());
            let (sb, mb) = crate::quant::scale_min_k4(s, &*b.add(4).cast::<[u8; 12]>());
            let d1 = split_ps(half(a) * f32::from(sa), half(b) * f32::from(sb));
            let m1 = split_ps(
                half(a.add(2)) * f32::from(ma),
                half(b.add(2)) * f32::from(mb),
            );
            let (qa, qb) = (a.add(16 + 32 * (s / 2)), b.add(16 + 32 * (s / 2)));
            four!(g => {
                let v = bytes8_pair::<false>(qa.add(8 * g), qb.add(8 * g));
                let q = low_or_high(v, s.is_multiple_of(2));
                _mm512_sub_ps(_mm512_mul_ps(d1, _mm512_cvtepi32_ps(q)), m1)
            })
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct Q6K;
impl Blocks for Q6K {
    const ELEMENTS: usize = QK_K;
    const BYTES: usize = 210;
    /// Elements `32·s..32·s + 32`: half `n = s/4` of the super-block, quarter `q = s%4` of it
    /// (low nibbles of `ql[0..32]`, of `ql[32..64]`, then their high nibbles; the 2-bit pairs
    /// `q` of `qh`), two 16-element scales.
    #[inline(always)]
    unsafe fn group(b: *const u8, s: usize) -> [__m256; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let (n, q) = (s / 4, s % 4);
            let d = half(b.add(208));
            let ql = b.add(64 * n + 32 * (q % 2));
            let qh = b.add(128 + 32 * n);
            let thirty_two = _mm256_set1_epi32(32);
            four!(g => {
                let low = bytes8(ql.add(8 * g));
                let low = if q < 2 {
                    _mm256_and_si256(low, _mm256_set1_epi32(0xF))
                } else {
                    _mm256_srli_epi32::<4>(low)
                };
                let high = _mm256_srlv_epi32(bytes8(qh.add(8 * g)), _mm256_set1_epi32(2 * q as i32));
                let high = _mm256_slli_epi32::<4>(_mm256_and_si256(high, _mm256_set1_epi32(3)));
                let code = _mm256_sub_epi32(_mm256_or_si256(low, high), thirty_two);
                let scale = *b.add(192 + 8 * n + g / 2 + 2 * q) as i8;
                _mm256_mul_ps(_mm256_set1_ps(d * f32::from(scale)), _mm256_cvtepi32_ps(code))
            })
        }
    }
    #[inline(always)]
    unsafe fn group_pair(a: *const u8, b: *const u8, s: usize) -> [__m512; 4] {
        // SAFETY: the trait's contract.
        unsafe {
            let (n, q) = (s / 4, s % 4);
            let (da, db) = (half(a.add(208)), half(b.add(208)));
            let low_at = 64 * n + 32 * (q % 2);
            let high_at = 128 + 32 * n;
            let thirty_two = _mm512_set1_epi32(32);
            four!(g => {
                let low = bytes8_pair::<false>(a.add(low_at + 8 * g), b.add(low_at + 8 * g));
                let low = low_or_high(low, q < 2);
                let high = bytes8_pair::<false>(a.add(high_at + 8 * g), b.add(high_at + 8 * g));
                let high = _mm512_srlv_epi32(high, _mm512_set1_epi32(2 * q as i32));
                let high = _mm512_slli_epi32::<4>(_mm512_and_si512(high, _mm512_set1_epi32(3)));
                let code = _mm512_sub_epi32(_mm512_or_si512(low, high), thirty_two);
                let at = 192 + 8 * n + g / 2 + 2 * q;
                let (sa, sb) = (*a.add(at) as i8, *b.add(at) as i8);
                let scale = split_ps(da * f32::from(sa), db * f32::from(sb));
                _mm512_mul_ps(scale, _mm512_cvtepi32_ps(code))
            })
        }
    }
}
