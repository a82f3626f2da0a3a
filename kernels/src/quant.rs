//! Quantized weight matrices as llama.cpp's ggml stores them (`ggml-common.h`): rows of blocks,
//! each block a few `f16` scales and packed small integers. The base projection reads them as
//! stored ([`crate::gemm_xwt_quant`]): for a decode step's few rows the GEMM's tiles dequantize
//! the blocks in registers as they read them; for more rows a panel of rows is dequantized into
//! an L2-resident scratch as the GEMM reaches it; never the whole matrix.
//!
//! # Why dequantize exactly as ggml does
//! Each element is rebuilt by the float operations ggml's `dequantize_row_*` performs, in its
//! order (for Q4_K `d·sc` then `·q` then `− dmin·m`), so a matrix here is the same `f32` values
//! llama.cpp, gguf-py and transformers' GGUF loader see; the GEMM on top is the f32 kernel
//! itself, so a quantized projection is bit for bit the f32 GEMM of the dequantized weights and
//! keeps every property of class D (fixed reduction order at any batch or thread count).
//!
//! Quantizers (`quantize`) exist for [`QuantType::Q8_0`], [`QuantType::Q4_0`],
//! [`QuantType::Q5_0`] and [`QuantType::Q4K`] (what `--quantize` uses); the others are read-only,
//! as files bring them.

use half::f16;

use crate::error::{Error, Result};
use crate::quantize;

/// Elements of a K-quant super-block.
pub(crate) const QK_K: usize = 256;

/// A ggml block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// 32 elements: `f16 d`, 32 × `i8`; `x = d·q`.
    Q8_0,
    /// 32 elements: `f16 d`, 16 bytes of nibbles; `x = d·(q − 8)`.
    Q4_0,
    /// 32 elements: `f16 d`, `f16 m`, 16 bytes of nibbles; `x = d·q + m`.
    Q4_1,
    /// 32 elements: `f16 d`, 4 bytes of fifth bits, 16 bytes of nibbles; `x = d·(q − 16)`
    /// (llama.cpp's fallback for Q4_K rows that are not whole super-blocks).
    Q5_0,
    /// 32 elements: `f16 d`, `f16 m`, 4 bytes of fifth bits, 16 of nibbles; `x = d·q + m`.
    Q5_1,
    /// 256 elements: `f16 d`, `f16 dmin`, 12 bytes of 6-bit scales and mins (8 sub-blocks of
    /// 32), 128 bytes of nibbles; `x = d·sc·q − dmin·m`.
    Q4K,
    /// 256 elements: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 `i8` scales (sub-blocks
    /// of 16), `f16 d`; `x = d·sc·(q − 32)`.
    Q6K,
}

impl QuantType {
    /// Every type, for messages and tests.
    pub const ALL: [QuantType; 7] = [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q4K,
        QuantType::Q6K,
    ];

    /// The name llama.cpp gives it (`q8_0`, `q4_K`, …).
    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q8_0 => "q8_0",
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4_1 => "q4_1",
            QuantType::Q5_0 => "q5_0",
            QuantType::Q5_1 => "q5_1",
            QuantType::Q4K => "q4_K",
            QuantType::Q6K => "q6_K",
        }
    }

    /// The type a name gives, case-insensitively (`q4_k`, `Q8_0`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Its `ggml_type` number in a GGUF file.
    pub fn ggml_type(self) -> u32 {
        match self {
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q5_1 => 7,
            QuantType::Q8_0 => 8,
            QuantType::Q4K => 12,
            QuantType::Q6K => 14,
        }
    }

    /// The type of a `ggml_type` number, if it is one of these.
    pub fn from_ggml_type(t: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|q| q.ggml_type() == t)
    }

    /// Elements per block.
    pub fn block_elements(self) -> usize {
        match self {
            QuantType::Q8_0
            | QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1 => 32,
            QuantType::Q4K | QuantType::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q8_0 => 34,
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q4K => 144,
            QuantType::Q6K => 210,
        }
    }

    /// Bytes of `elements` elements (a whole number of blocks), or why not.
    pub fn bytes_for(self, elements: usize) -> Result<usize> {
        if !elements.is_multiple_of(self.block_elements()) {
            return Err(Error::Batch(format!(
                "{} stores blocks of {} elements; {elements} is not a whole number of them",
                self.name(),
                self.block_elements()
            )));
        }
        Ok(elements / self.block_elements() * self.block_bytes())
    }

    /// Dequantizes whole blocks: `out.len()` is `bytes.len() / block_bytes · block_elements`.
    pub fn dequantize(self, bytes: &[u8], out: &mut [f32]) {
        let (be, bb) = (self.block_elements(), self.block_bytes());
        debug_assert_eq!(bytes.len() / bb * be, out.len());
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 was detected at run time.
            return unsafe { dequantize_avx2(self, bytes, out) };
        }
        dequantize_generic(self, bytes, out);
    }
}

/// [`dequantize_generic`] compiled for AVX2: the same operations (no FMA: every product and
/// sum is rounded as ggml's reference rounds it), wider registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequantize_avx2(t: QuantType, bytes: &[u8], out: &mut [f32]) {
    dequantize_generic(t, bytes, out)
}

#[inline(always)]
fn dequantize_generic(t: QuantType, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (t.block_elements(), t.block_bytes());
    for (block, out) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        match t {
            QuantType::Q8_0 => q8_0(block, out),
            QuantType::Q4_0 => q4_0(block, out),
            QuantType::Q4_1 => q4_1(block, out),
            QuantType::Q5_0 => q5(block, out, false),
            QuantType::Q5_1 => q5(block, out, true),
            QuantType::Q4K => q4_k(block, out),
            QuantType::Q6K => q6_k(block, out),
        }
    }
}

#[inline(always)]
pub(crate) fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[inline(always)]
fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    let qs: &[u8; 32] = b[2..34].try_into().expect("block");
    let out: &mut [f32; 32] = out.try_into().expect("block");
    for l in 0..32 {
        out[l] = f32::from(qs[l] as i8) * d;
    }
}

#[inline(always)]
fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    let qs: &[u8; 16] = b[2..18].try_into().expect("block");
    let out: &mut [f32; 32] = out.try_into().expect("block");
    for l in 0..16 {
        out[l] = f32::from((qs[l] & 0xF) as i8 - 8) * d;
        out[l + 16] = f32::from((qs[l] >> 4) as i8 - 8) * d;
    }
}

#[inline(always)]
fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qs: &[u8; 16] = b[4..20].try_into().expect("block");
    let out: &mut [f32; 32] = out.try_into().expect("block");
    for l in 0..16 {
        out[l] = f32::from(qs[l] & 0xF) * d + m;
        out[l + 16] = f32::from(qs[l] >> 4) * d + m;
    }
}

/// Q5_0 (`with_min` false: `x = d·(q − 16)`) and Q5_1 (`x = d·q + m`).
#[inline(always)]
fn q5(b: &[u8], out: &mut [f32], with_min: bool) {
    let d = half_at(b, 0);
    let (m, at) = if with_min {
        (half_at(b, 2), 4)
    } else {
        (0.0, 2)
    };
    let qh = u32::from_le_bytes(b[at..at + 4].try_into().expect("qh"));
    let qs: &[u8; 16] = b[at + 4..at + 20].try_into().expect("block");
    let out: &mut [f32; 32] = out.try_into().expect("block");
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        let (x0, x1) = ((qs[j] & 0xF) | h0, (qs[j] >> 4) | h1);
        if with_min {
            out[j] = f32::from(x0) * d + m;
            out[j + 16] = f32::from(x1) * d + m;
        } else {
            out[j] = f32::from(x0 as i8 - 16) * d;
            out[j + 16] = f32::from(x1 as i8 - 16) * d;
        }
    }
}

/// Sub-block `j`'s 6-bit scale and min (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[inline(always)]
fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales: &[u8; 12] = b[4..16].try_into().expect("block");
    let qs = &b[16..144];
    for c in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let q: &[u8; 32] = qs[32 * c..32 * c + 32].try_into().expect("chunk");
        let o: &mut [f32; 64] = (&mut out[64 * c..64 * c + 64]).try_into().expect("chunk");
        for l in 0..32 {
            o[l] = d1 * f32::from(q[l] & 0xF) - m1;
            o[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
        }
    }
}

#[inline(always)]
fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 208);
    for n in 0..2 {
        let ql: &[u8; 64] = b[64 * n..64 * n + 64].try_into().expect("chunk");
        let qh: &[u8; 32] = b[128 + 32 * n..160 + 32 * n].try_into().expect("chunk");
        let sc: [f32; 8] = std::array::from_fn(|i| d * f32::from(b[192 + 8 * n + i] as i8));
        let o: &mut [f32; 128] = (&mut out[128 * n..128 * n + 128])
            .try_into()
            .expect("chunk");
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            o[l] = sc[is] * f32::from(q1);
            o[l + 32] = sc[is + 2] * f32::from(q2);
            o[l + 64] = sc[is + 4] * f32::from(q3);
            o[l + 96] = sc[is + 6] * f32::from(q4);
        }
    }
}

/// A `d_out × d_in` matrix of one [`QuantType`], row-major, each row `d_in /
/// block_elements` blocks (ggml's layout: `ne[0] = d_in`).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantMatrix {
    kind: QuantType,
    d_out: usize,
    d_in: usize,
    data: Vec<u8>,
}

impl QuantMatrix {
    /// The matrix these bytes hold; their length must be exactly `d_out` rows of blocks.
    pub fn new(kind: QuantType, d_out: usize, d_in: usize, data: Vec<u8>) -> Result<Self> {
        let want = d_out
            .checked_mul(kind.bytes_for(d_in)?)
            .ok_or_else(|| Error::Batch(format!("{d_out} × {d_in} overflows")))?;
        crate::error::check_len("quantized matrix bytes", data.len(), want)?;
        Ok(Self {
            kind,
            d_out,
            d_in,
            data,
        })
    }

    /// Quantizes a row-major `d_out × d_in` `f32` matrix (`Q8_0`, `Q4_0` or `Q4_K`).
    pub fn quantize(kind: QuantType, w: &[f32], d_out: usize, d_in: usize) -> Result<Self> {
        crate::error::check_len("w (d_out × d_in)", w.len(), d_out * d_in)?;
        let row_bytes = kind.bytes_for(d_in)?;
        let block: fn(&[f32], &mut [u8]) = match kind {
            QuantType::Q8_0 => quantize::q8_0,
            QuantType::Q4_0 => quantize::q4_0,
            QuantType::Q5_0 => quantize::q5_0,
            QuantType::Q4K => quantize::q4_k,
            other => {
                return Err(Error::Batch(format!(
                    "quantizing to {} is not supported (q8_0, q4_0, q5_0 and q4_K are)",
                    other.name()
                )));
            }
        };
        let mut data = vec![0u8; d_out * row_bytes];
        for (x, q) in w
            .chunks_exact(kind.block_elements())
            .zip(data.chunks_exact_mut(kind.block_bytes()))
        {
            block(x, q);
        }
        Self::new(kind, d_out, d_in, data)
    }

    /// Its block format.
    pub fn kind(&self) -> QuantType {
        self.kind
    }

    /// Output rows.
    pub fn d_out(&self) -> usize {
        self.d_out
    }

    /// Elements per row.
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The stored bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    fn row_bytes(&self) -> usize {
        self.data.len() / self.d_out.max(1)
    }

    /// Rows `start..start + rows` as `f32`, written to `out` (`rows × d_in`).
    pub fn dequantize_rows(&self, start: usize, rows: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        self.kind.dequantize(
            &self.data[start * rb..(start + rows) * rb],
            &mut out[..rows * self.d_in],
        );
    }

    /// The whole matrix as `f32`.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.d_out * self.d_in];
        self.dequantize_rows(0, self.d_out, &mut out);
        out
    }

    /// The same matrix with its rows reordered: row `i` of the result is row `from[i]` of this
    /// one (whole rows of blocks move; nothing is requantized).
    pub fn permute_rows(&self, from: &[usize]) -> Result<Self> {
        crate::error::check_len("row permutation", from.len(), self.d_out)?;
        let rb = self.row_bytes();
        let mut data = Vec::with_capacity(self.data.len());
        for &r in from {
            if r >= self.d_out {
                return Err(Error::Batch(format!("row {r} of {}", self.d_out)));
            }
            data.extend_from_slice(&self.data[r * rb..(r + 1) * rb]);
        }
        Self::new(self.kind, self.d_out, self.d_in, data)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rng::seeded;
    use rand::Rng;

    /// A `d_out × d_in` matrix of random blocks of `kind`, every `f16` scale finite.
    pub(crate) fn random_matrix(
        kind: QuantType,
        d_out: usize,
        d_in: usize,
        seed: u64,
    ) -> QuantMatrix {
        let mut rng = seeded(seed);
        let bytes = d_out * kind.bytes_for(d_in).unwrap();
        let mut data: Vec<u8> = (0..bytes).map(|_| rng.r#gen()).collect();
        let scales: &[usize] = match kind {
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K => &[0, 2],
            QuantType::Q6K => &[208],
            _ => &[0],
        };
        for block in data.chunks_exact_mut(kind.block_bytes()) {
            for &at in scales {
                let scale = f16::from_f32(rng.gen_range(-0.05f32..0.05));
                block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
            }
        }
        QuantMatrix::new(kind, d_out, d_in, data).unwrap()
    }

    fn random_rows(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = seeded(seed);
        (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    #[test]
    fn quantizers_round_trip_within_their_step() {
        let (d_out, d_in) = (4, 512);
        let w = random_rows(1, d_out * d_in);
        for (kind, tol) in [
            (QuantType::Q8_0, 1.0 / 127.0),
            (QuantType::Q4_0, 1.0 / 7.0),
            (QuantType::Q5_0, 1.0 / 15.0),
            (QuantType::Q4K, 2.0 / 15.0),
        ] {
            let q = QuantMatrix::quantize(kind, &w, d_out, d_in).unwrap();
            assert_eq!(q.bytes(), d_out * kind.bytes_for(d_in).unwrap());
            let back = q.to_f32();
            let worst = w
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= tol, "{}: worst error {worst}", kind.name());
        }
    }

    #[test]
    fn q4_k_scales_pack_as_get_scale_min_k4_reads_them() {
        // Every 6-bit scale/min value at every sub-block position survives the packing.
        let mut x = vec![0f32; QK_K];
        for s in 0..8 {
            for l in 0..32 {
                x[32 * s + l] = (s as f32 + 1.0) * (l as f32 / 31.0) - 0.1 * s as f32;
            }
        }
        let mut b = [0u8; 144];
        quantize::q4_k(&x, &mut b);
        let mut back = [0f32; QK_K];
        q4_k(&b, &mut back);
        let worst = x
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 0.6, "worst {worst}");
    }

    #[test]
    fn sizes_and_names() {
        assert_eq!(QuantType::Q4K.bytes_for(4096).unwrap(), 16 * 144);
        assert!(QuantType::Q4K.bytes_for(576).is_err());
        assert_eq!(QuantType::from_name("Q4_k"), Some(QuantType::Q4K));
        assert_eq!(QuantType::from_ggml_type(14), Some(QuantType::Q6K));
        assert!(QuantMatrix::new(QuantType::Q8_0, 2, 32, vec![0; 67]).is_err());
    }

    #[test]
    fn the_quantized_gemm_is_the_f32_gemm_of_the_dequantized_matrix_at_any_batch_or_thread_count() {
        // 70 rows: two whole panels and a part, tiles with a remainder; 768 columns: a reduction
        // block of 512 and a part, whole blocks of every format. 17 rows of `x` take the panel
        // path, fewer the kernel that widens in registers: one row's bits are the same in both.
        let (d_out, d_in, m) = (70, 768, 17);
        let x = random_rows(3, m * d_in);
        for kind in QuantType::ALL {
            let q = random_matrix(kind, d_out, d_in, 5);
            let dense = q.to_f32();
            for config in [
                crate::CpuConfig::deterministic(),
                crate::CpuConfig::default(),
            ] {
                for threads in [1, 3] {
                    let config = config.with_threads(threads);
                    let mut want = vec![0f32; m * d_out];
                    crate::gemm_xwt(&x, &dense, &mut want, m, d_in, d_out, &config).unwrap();
                    let mut got = vec![0f32; m * d_out];
                    crate::gemm_xwt_quant(&x, &q, &mut got, m, &config).unwrap();
                    let what = format!("{} {:?} at {threads} threads", kind.name(), config.mode);
                    assert_eq!(got, want, "{what}");
                    for rows in [1, 2, 3, 5, 8, 9] {
                        // Rows 0..rows alone: the bits they have in the batch of 17.
                        let mut few = vec![0f32; rows * d_out];
                        crate::gemm_xwt_quant(&x[..rows * d_in], &q, &mut few, rows, &config)
                            .unwrap();
                        assert_eq!(few, &want[..rows * d_out], "{what}, {rows} rows");
                    }
                }
            }
        }
    }

    #[test]
    fn rows_permute_as_whole_blocks() {
        let w = random_rows(4, 3 * 64);
        let q = QuantMatrix::quantize(QuantType::Q8_0, &w, 3, 64).unwrap();
        let p = q.permute_rows(&[2, 0, 1]).unwrap();
        let (a, b) = (q.to_f32(), p.to_f32());
        assert_eq!(&b[..64], &a[128..]);
        assert_eq!(&b[64..128], &a[..64]);
        assert!(q.permute_rows(&[0, 1, 3]).is_err());
    }
}
