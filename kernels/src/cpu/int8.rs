//! Products over quantized weights in integers, as llama.cpp computes them
//! ([`crate::CpuConfig::int8`], in [`crate::Mode::Fast`] only): each row of `x` is rounded to
//! eight-bit codes with one scale per block of 32 (ggml's `Q8_0` activations), the weights are
//! decoded to eight-bit codes in registers, and one AVX-512 VNNI instruction (`vpdpbusd`) takes
//! 64 products at once; the block scales are applied in `f32`. The weights' own floats are
//! never built. Two kernels ([`product`]): the row kernel for a decode step's few rows
//! (SmolLM2-135M at Q4_K, one row, Intel Xeon: 73–75 tokens/s on the fast mode's `f32`
//! kernels, 91–97 this way), the panel kernel for more (a prompt's rows, larger batches).
//!
//! # What it gives up, and what it keeps
//! Rounding `x` to eight bits changes the result by up to half a code per element (`|x|max/254`
//! of each block), as it does in llama.cpp; the deterministic mode (class D) therefore keeps the
//! exact `f32` kernels, and this path is an opt-in of the fast mode (D∞). Within each kernel it
//! keeps the fast mode's promise: each output is the same operations in the same order
//! whatever the batch composition or the thread count (a row is quantized alone; the integer
//! sums are exact; the scales fold in block order; a worker computes whole outputs).

use crate::quant::QuantMatrix;
#[cfg(doc)]
use crate::quant::QuantType;

/// Elements per activation block: one scale.
pub(crate) const BLOCK: usize = 32;
/// Elements per chunk: two blocks, one AVX-512 register of codes.
pub(crate) const CHUNK: usize = 64;
/// Floats per chunk in [`Q8Rows::scales`] and [`Q8Rows::sums`]: one register's lanes.
pub(crate) const LANES: usize = 16;

/// Rows of `x` rounded to eight-bit codes, laid out per chunk of [`CHUNK`] elements as the
/// kernel reads them: chunk-major (chunk `c` of row `i` at `c·rows + i`), so a chunk's rows
/// lie one register apart and the kernel addresses them by constant offsets.
pub(crate) struct Q8Rows {
    /// Rows of `x`.
    pub(crate) rows: usize,
    /// Chunks per row (`k / 64`).
    pub(crate) chunks: usize,
    /// Per chunk and row, the 64 codes (signed bytes, `vpdpbusd`'s second operand).
    pub(crate) codes: Vec<u8>,
    /// [`Q8Rows::codes`] plus 128 (unsigned, `vpdpbusd`'s first operand), for the kernel's way
    /// with the weights signed (see `cpu::x86::int8`).
    pub(crate) biased: Vec<u8>,
    /// Per chunk and row, minus the sum of each lane's four codes (the kernel's start for
    /// weights stored with an offset: `−off·Σq_x`, exactly in integers).
    pub(crate) neg_lane_sums: Vec<i32>,
    /// Per chunk and row, each block's scale in its eight lanes.
    pub(crate) scales: Vec<f32>,
    /// Per chunk and row, each block's scale × the sum of its codes in lanes 0 and 8, zero
    /// elsewhere (the term of a format's minimum; the lanes are summed at the end).
    pub(crate) sums: Vec<f32>,
}

/// `x`'s `m` rows of `k` quantized for [`product`], or `None` where the path does not apply:
/// not x86-64 with AVX-512 BW, VNNI and FMA, `k` not whole chunks, `CX_KERNELS_NO_INT8=1`
/// (for comparing the two paths in one binary), or a value of `x` not finite (the `f32`
/// kernels propagate it; a code cannot).
pub(crate) fn quantize_rows(x: &[f32], m: usize, k: usize) -> Option<Q8Rows> {
    if !available()
        || k == 0
        || !k.is_multiple_of(CHUNK)
        || !x[..m * k].iter().all(|v| v.is_finite())
    {
        return None;
    }
    let chunks = k / CHUNK;
    let mut codes = vec![0u8; m * k];
    let mut scales = vec![0f32; m * chunks * LANES];
    let mut sums = vec![0f32; m * chunks * LANES];
    let mut neg_lane_sums = vec![0i32; m * chunks * LANES];
    for (b, block) in x[..m * k].chunks_exact(BLOCK).enumerate() {
        let (i, c, half) = (b / (2 * chunks), b / 2 % chunks, b % 2);
        let at = c * m + i;
        let codes: &mut [u8; BLOCK] = (&mut codes[at * CHUNK + half * BLOCK..][..BLOCK])
            .try_into()
            .unwrap();
        let block: &[f32; BLOCK] = block.try_into().unwrap();
        let lanes = &mut neg_lane_sums[at * LANES + half * 8..][..8];
        let (d, sum) = quantize_block(block, codes, lanes);
        scales[at * LANES + half * 8..][..8].fill(d);
        sums[at * LANES + half * 8] = d * sum as f32;
    }
    let biased = codes.iter().map(|c| c ^ 0x80).collect();
    Some(Q8Rows {
        rows: m,
        chunks,
        codes,
        biased,
        neg_lane_sums,
        scales,
        sums,
    })
}

/// Rows of `x` up to which [`product`] takes the row kernel; more take the panel kernel
/// (decoding a panel costs about what the row kernel spends on two rows: measured crossover
/// between four rows and six, `cpu::x86::int8::panel`).
pub(crate) const ROW_KERNEL_ROWS: usize = 4;

/// Rows of `w` per panel: [`product`]'s `cols` at most.
pub(crate) const PANEL_ROWS: usize = 32;

/// A panel of `w` decoded for the panel kernel: a worker's scratch, reused from panel to panel
/// (see `cpu::x86::int8::panel` for the layout).
#[derive(Default)]
pub(crate) struct Panel {
    /// Per group of four elements, the panel's rows' signed codes side by side.
    pub(crate) codes: Vec<u8>,
    /// Sixteen rows' codes per chunk as decoded, before they are turned across.
    pub(crate) staged: Vec<u8>,
    /// Per block of the weights' scale, each row's scale.
    pub(crate) scales: Vec<f32>,
    /// Per block, each row's minimum (formats with one).
    pub(crate) mins: Vec<f32>,
    /// Per block, each row's `−128·Σq` (what the activations' bias adds to the integer sum).
    pub(crate) starts: Vec<i32>,
}

/// Adds `x`'s rows (quantized in `xq`) times rows `j0..j0 + cols` (at most [`PANEL_ROWS`]) of
/// `w` (transposed) into the `m × cols` tile (every ggml format [`QuantType`] names).
///
/// Up to [`ROW_KERNEL_ROWS`] rows (a decode step of a few sequences), the **row kernel**
/// decodes each chunk of 64 weights into one register and multiplies it by each row of `x` in
/// one instruction, the per-block floats applied per row and chunk. More rows (a prompt, a
/// larger batch), the **panel kernel** decodes the panel once into `panel` with the codes laid
/// across sixteen rows of `w`, so that one instruction adds four elements of a row of `x` into
/// sixteen outputs and the floats are applied once per block and output. Both round `x` the
/// same way and give the same exact integer sums per block; they fold the floats differently,
/// so a row's bits depend on which kernel its batch took (more than four rows or not), never on
/// the rows beside it within either, nor on the thread count.
pub(crate) fn product(
    xq: &Q8Rows,
    m: usize,
    w: &QuantMatrix,
    j0: usize,
    cols: usize,
    panel: &mut Panel,
    tile: &mut [f32],
) {
    assert_eq!(
        w.d_in(),
        xq.chunks * CHUNK,
        "int8 product: x and w disagree on d_in"
    );
    assert!(cols <= PANEL_ROWS && j0 + cols <= w.d_out() && tile.len() >= m * cols);
    assert!(m == xq.rows && xq.codes.len() >= m * xq.chunks * CHUNK);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `quantize_rows` built `xq` only where the CPU has the kernels' features;
        // the asserts above bound every read and write.
        unsafe { super::x86::int8::product(xq, m, w, j0, cols, panel, tile) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("quantize_rows builds no rows off x86-64: {panel:p}")
    }
}

/// One block of 32 as codes (nearest, ties to even) with the scale `|x|max/127` (rounded to
/// f16, as ggml's `Q8_0` stores it), and minus the sum of each four: the scale and the sum of
/// the codes.
fn quantize_block(
    block: &[f32; BLOCK],
    codes: &mut [u8; BLOCK],
    neg_lane_sums: &mut [i32],
) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: only `quantize_rows` calls it, after `available` checked the CPU.
        unsafe { super::x86::int8::quantize_block(block, codes, neg_lane_sums) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!(
            "quantize_rows quantizes nothing off x86-64: {block:?} {codes:?} {neg_lane_sums:?}"
        )
    }
}

/// Whether this CPU runs [`crate::CpuConfig::int8`]'s integer kernel (x86-64 with AVX-512 BW,
/// VNNI and FMA, and `CX_KERNELS_NO_INT8` not `1`); elsewhere the fast mode's `f32` kernels run.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            super::x86::int8::supported()
                && !super::no_avx512()
                && std::env::var_os("CX_KERNELS_NO_INT8").is_none_or(|v| v != "1")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantType;
    use crate::quant::tests::random_matrix;
    use crate::rng::seeded;
    use rand::Rng;

    fn rows(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = seeded(seed);
        (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
    }

    /// [`product`] panel by panel, as the GEMM calls it.
    fn int8_product(x: &[f32], m: usize, w: &QuantMatrix) -> Option<Vec<f32>> {
        let xq = quantize_rows(x, m, w.d_in())?;
        let mut out = vec![0f32; m * w.d_out()];
        let mut panel = Panel::default();
        for j0 in (0..w.d_out()).step_by(PANEL_ROWS) {
            let cols = PANEL_ROWS.min(w.d_out() - j0);
            let mut tile = vec![0f32; m * cols];
            product(&xq, m, w, j0, cols, &mut panel, &mut tile);
            for i in 0..m {
                out[i * w.d_out() + j0..][..cols].copy_from_slice(&tile[i * cols..][..cols]);
            }
        }
        Some(out)
    }

    /// Each format's integer product is within the bound of `x`'s rounding (half a code per
    /// element: `|x|max/254` of its block times `|w|`; and its scale's rounding to f16, 2⁻¹¹ of
    /// the block's `Σ|x·w|`) of the exact product of `x` and the dequantized weights: a code, a
    /// scale or an offset out of place would be far outside it.
    /// Two rows: the row kernel (weights unsigned, or signed for Q8_0); seven and twenty: the
    /// panel kernel (tiles of six rows and fewer; 37 rows of `w`: a whole panel and a part of
    /// one).
    #[test]
    fn the_integer_product_is_within_half_a_code_of_the_exact_one() {
        for (kind, m) in QuantType::ALL
            .into_iter()
            .flat_map(|k| [(k, 2), (k, 7), (k, 20)])
        {
            let (d_out, d_in) = (
                37,
                if kind.block_elements() == 256 {
                    768
                } else {
                    576
                },
            );
            let w = random_matrix(kind, d_out, d_in, 7);
            let wf = w.to_f32();
            let x = rows(11, m * d_in);
            let Some(got) = int8_product(&x, m, &w) else {
                eprintln!("no AVX-512 VNNI here: the int8 path is not taken");
                return;
            };
            for i in 0..m {
                let xi = &x[i * d_in..(i + 1) * d_in];
                for j in 0..d_out {
                    let wj = &wf[j * d_in..(j + 1) * d_in];
                    let exact: f64 = xi
                        .iter()
                        .zip(wj)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let mut bound = 0f64;
                    let mut size = 0f64;
                    for (xb, wb) in xi.chunks(BLOCK).zip(wj.chunks(BLOCK)) {
                        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                        let wsum: f64 = wb.iter().map(|v| f64::from(v.abs())).sum();
                        let block: f64 = xb
                            .iter()
                            .zip(wb)
                            .map(|(a, b)| f64::from((a * b).abs()))
                            .sum();
                        bound += f64::from(amax) / 254.0 * wsum + block / 2048.0;
                        size += block;
                    }
                    let err = (f64::from(got[i * d_out + j]) - exact).abs();
                    assert!(
                        err <= bound * 1.001 + size * 1e-5,
                        "{}: row {i} column {j}: {} against {exact} (bound {bound})",
                        kind.name(),
                        got[i * d_out + j]
                    );
                }
            }
        }
    }

    /// A row's outputs do not depend on the rows beside it (fast mode's promise) within either
    /// kernel: in the row kernel alone or among four (one row of `w` or two side by side: 19 is
    /// odd); in the panel kernel among 17 or 23 (tiles of six: the seventeenth row is in a tile
    /// of five, then of six).
    #[test]
    fn a_row_gives_the_same_bits_whatever_rows_are_beside_it() {
        for kind in QuantType::ALL {
            let d_in = 512;
            let w = random_matrix(kind, 19, d_in, 3);
            let x = rows(5, 23 * d_in);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let Some(four) = int8_product(&x[..4 * d_in], 4, &w) else {
                return;
            };
            for i in [0, 3] {
                let alone = int8_product(&x[i * d_in..(i + 1) * d_in], 1, &w).unwrap();
                assert_eq!(
                    bits(&alone),
                    bits(&four[i * 19..(i + 1) * 19]),
                    "{} row {i}",
                    kind.name()
                );
            }
            let all = int8_product(&x, 23, &w).unwrap();
            let some = int8_product(&x[..17 * d_in], 17, &w).unwrap();
            assert_eq!(bits(&some), bits(&all[..17 * 19]), "{}", kind.name());
        }
    }

    /// The GEMM takes the integer kernels where the configuration asks for it (the same bits
    /// at any thread count; each kernel's rows) and the `f32` kernels otherwise.
    #[test]
    fn the_gemm_multiplies_in_integers_only_when_asked() {
        for m in [3, 20] {
            gemm_in_integers(m);
        }
    }

    fn gemm_in_integers(m: usize) {
        let d_in = 512;
        let w = random_matrix(QuantType::Q4K, 70, d_in, 9);
        let x = rows(13, m * d_in);
        let Some(direct) = int8_product(&x, m, &w) else {
            return;
        };
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for threads in [1, 3] {
            let mut config = crate::CpuConfig::default().with_threads(threads);
            let mut exact = vec![0f32; m * 70];
            crate::gemm_xwt_quant(&x, &w, &mut exact, m, &config).unwrap();
            assert_ne!(bits(&exact), bits(&direct));
            config.int8 = true;
            let mut got = vec![0f32; m * 70];
            crate::gemm_xwt_quant(&x, &w, &mut got, m, &config).unwrap();
            assert_eq!(bits(&got), bits(&direct), "{threads} threads");
        }
    }

    #[test]
    fn rows_that_are_not_finite_or_whole_chunks_stay_on_the_f32_kernels() {
        assert!(quantize_rows(&[f32::NAN; 64], 1, 64).is_none());
        assert!(quantize_rows(&[1.0; 96], 1, 96).is_none());
    }
}
