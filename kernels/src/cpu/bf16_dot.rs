//! Products over bf16 weights in bf16, as llama.cpp computes them
//! ([`crate::CpuConfig::bf16_dot`], in [`crate::Mode::Fast`] only): each row of `x` is rounded
//! to bf16 once (nearest, ties to even: ggml's `GGML_TYPE_BF16` activations), and one AVX-512
//! BF16 instruction (`vdpbf16ps`) multiplies 32 weights as stored by 32 activations and adds
//! them in pairs into sixteen `f32` sums. The fast mode's `f32` kernels instead widen each
//! weight to `f32` in registers (a zero-extend and a shift per sixteen) and take one FMA per
//! sixteen products: four instructions where this takes one, which is what a one-row decode
//! step on a CPU that splits 512-bit instructions in two (AMD's Zen 4) pays for.
//!
//! # What it gives up, and what it keeps
//! Rounding `x` to bf16 changes each product by up to 2⁻⁹ of it, and `vdpbf16ps` flushes
//! subnormal inputs and outputs to zero; the deterministic mode (class D) therefore keeps the
//! exact kernels, and this path is an opt-in of the fast mode (D∞). It keeps the fast mode's
//! promise: each output is one chain of `vdpbf16ps` over the chunks in ascending order, then
//! one fixed sum of its sixteen lanes, whatever the tile, the batch composition or the thread
//! count.

/// Elements per chunk: one register of bf16, one `vdpbf16ps`.
pub(crate) const CHUNK: usize = 32;

/// Rows of `x` rounded to bf16, row-major, each row zero-padded to whole chunks (so the
/// kernel reads a last partial chunk of `x` whole and masks only the weights').
pub(crate) struct Bf16Rows {
    /// Rows of `x`.
    pub(crate) rows: usize,
    /// Elements per row (`d_in`).
    pub(crate) k: usize,
    /// Elements between rows: `k` rounded up to [`CHUNK`].
    pub(crate) stride: usize,
    /// The bits of each element (`rows × stride`).
    pub(crate) bits: Vec<u16>,
}

/// `x`'s `m` rows of `k` rounded for [`product`], or `None` where the path does not apply: not
/// x86-64 with AVX-512 BF16, or `CX_KERNELS_NO_BF16_DOT=1` (for comparing the two paths in one
/// binary).
pub(crate) fn round_rows(x: &[f32], m: usize, k: usize) -> Option<Bf16Rows> {
    if !available() || k == 0 {
        return None;
    }
    let stride = k.next_multiple_of(CHUNK);
    let mut bits = vec![0u16; m * stride];
    for (row, out) in x[..m * k]
        .chunks_exact(k)
        .zip(bits.chunks_exact_mut(stride))
    {
        for (v, o) in row.iter().zip(out) {
            *o = half::bf16::from_f32(*v).to_bits();
        }
    }
    Some(Bf16Rows {
        rows: m,
        k,
        stride,
        bits,
    })
}

/// Adds `x`'s rows (rounded in `xb`) times rows `j0..j0 + cols` of the `d_out × k` bf16 matrix
/// `w` (transposed) into the `m × cols` tile.
pub(crate) fn product(
    xb: &Bf16Rows,
    m: usize,
    w: &[half::bf16],
    j0: usize,
    cols: usize,
    tile: &mut [f32],
) {
    assert!(m == xb.rows && xb.bits.len() >= m * xb.stride);
    assert!((j0 + cols) * xb.k <= w.len() && tile.len() >= m * cols);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `round_rows` built `xb` only where the CPU has the kernel's features; the
        // asserts above bound every read and write.
        unsafe {
            super::x86::bf16_dot::product(xb, m, w, j0, cols, tile, super::one_stream());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("round_rows builds no rows off x86-64: {:p}", tile.as_ptr())
    }
}

/// Whether this CPU runs [`crate::CpuConfig::bf16_dot`]'s kernel (x86-64 with AVX-512 BW and
/// BF16, and `CX_KERNELS_NO_BF16_DOT` not `1`); elsewhere the fast mode's `f32` kernels run.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            super::x86::bf16_dot::supported()
                && !super::no_avx512()
                && std::env::var_os("CX_KERNELS_NO_BF16_DOT").is_none_or(|v| v != "1")
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
    use crate::rng::seeded;
    use rand::Rng;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = seeded(seed);
        (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
    }

    fn weights(seed: u64, n: usize) -> Vec<half::bf16> {
        values(seed, n)
            .into_iter()
            .map(half::bf16::from_f32)
            .collect()
    }

    /// [`product`] panel by panel, as the GEMM calls it.
    fn dot_product(x: &[f32], m: usize, w: &[half::bf16], k: usize) -> Option<Vec<f32>> {
        let xb = round_rows(x, m, k)?;
        let d_out = w.len() / k;
        let mut out = vec![0f32; m * d_out];
        for j0 in (0..d_out).step_by(32) {
            let cols = 32.min(d_out - j0);
            let mut tile = vec![0f32; m * cols];
            product(&xb, m, w, j0, cols, &mut tile);
            for i in 0..m {
                out[i * d_out + j0..][..cols].copy_from_slice(&tile[i * cols..][..cols]);
            }
        }
        Some(out)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    /// Each output is within `x`'s rounding to bf16 (2⁻⁹ of each product) and the sums'
    /// rounding in `f32` of the exact product: a chunk, a lane pair or a tail out of place
    /// would be far outside it. `k` of 576 (whole chunks) and 581 (a masked tail); rows 1 to 4
    /// and 9 (tiles of one and two rows); 37 rows of `w` (whole tiles of eight and a remainder).
    #[test]
    fn the_bf16_product_is_within_the_rounding_of_x() {
        for k in [576, 581] {
            for m in [1, 2, 3, 4, 9] {
                let w = weights(7, 37 * k);
                let x = values(11, m * k);
                let Some(got) = dot_product(&x, m, &w, k) else {
                    eprintln!("no AVX-512 BF16 here: the bf16 path is not taken");
                    return;
                };
                for i in 0..m {
                    for j in 0..37 {
                        let (xi, wj) = (&x[i * k..][..k], &w[j * k..][..k]);
                        let terms = xi
                            .iter()
                            .zip(wj)
                            .map(|(a, b)| f64::from(*a) * f64::from(b.to_f32()));
                        let exact: f64 = terms.clone().sum();
                        let size: f64 = terms.map(f64::abs).sum();
                        let err = (f64::from(got[i * 37 + j]) - exact).abs();
                        assert!(
                            err <= size * (1.0 / 512.0 + k as f64 * f64::from(f32::EPSILON)),
                            "k {k}, {m} rows: row {i} column {j}: {} against {exact}",
                            got[i * 37 + j]
                        );
                    }
                }
            }
        }
    }

    /// The kernel multiplies the rounded `x`: with `x` already bf16 the only error left is the
    /// sums' (far tighter than the bound above), so a rounding step skipped or doubled shows.
    #[test]
    fn x_already_in_bf16_is_multiplied_exactly_but_for_the_sums() {
        let k = 640;
        let w = weights(3, 5 * k);
        let x: Vec<f32> = weights(4, 2 * k).iter().map(|v| v.to_f32()).collect();
        let Some(got) = dot_product(&x, 2, &w, k) else {
            return;
        };
        for i in 0..2 {
            for j in 0..5 {
                let terms =
                    (0..k).map(|e| f64::from(x[i * k + e]) * f64::from(w[j * k + e].to_f32()));
                let exact: f64 = terms.clone().sum();
                let size: f64 = terms.map(f64::abs).sum();
                let err = (f64::from(got[i * 5 + j]) - exact).abs();
                assert!(
                    err <= size * 40.0 * f64::from(f32::EPSILON),
                    "{i} {j}: {err}"
                );
            }
        }
    }

    /// A row's outputs do not depend on the rows beside it, on the tile that took it, nor on
    /// the thread count (the GEMM's), with or without the single stream.
    #[test]
    fn a_row_gives_the_same_bits_whatever_rows_are_beside_it() {
        let k = 581;
        let w = weights(5, 45 * k);
        let x = values(6, 11 * k);
        let Some(all) = dot_product(&x, 11, &w, k) else {
            return;
        };
        for (from, rows) in [(0, 1), (3, 1), (10, 1), (1, 2), (4, 3), (2, 4), (0, 9)] {
            let some = dot_product(&x[from * k..(from + rows) * k], rows, &w, k).unwrap();
            assert_eq!(
                bits(&some),
                bits(&all[from * 45..(from + rows) * 45]),
                "{rows} rows from {from}"
            );
        }
        #[cfg(target_arch = "x86_64")]
        for one_stream in [false, true] {
            let xb = round_rows(&x[..k], 1, k).unwrap();
            let mut tile = vec![0f32; 29];
            // SAFETY: `round_rows` checked the CPU; the shapes are the asserted ones.
            unsafe {
                crate::cpu::x86::bf16_dot::product(&xb, 1, &w, 16, 29, &mut tile, one_stream);
            }
            assert_eq!(bits(&tile), bits(&all[16..45]), "one stream: {one_stream}");
        }
    }

    /// The GEMM takes this kernel where the configuration asks for it (the same bits at any
    /// thread count, prompts' rows as decode steps') and the `f32` kernels otherwise.
    #[test]
    fn the_gemm_multiplies_in_bf16_only_when_asked() {
        for m in [3, 20] {
            let k = 576;
            let w = weights(9, 70 * k);
            let x = values(13, m * k);
            let Some(direct) = dot_product(&x, m, &w, k) else {
                return;
            };
            for threads in [1, 3] {
                let mut config = crate::CpuConfig::default().with_threads(threads);
                let mut exact = vec![0f32; m * 70];
                crate::gemm_xwt(&x, &w, &mut exact, m, k, 70, &config).unwrap();
                assert_ne!(bits(&exact), bits(&direct));
                config.bf16_dot = true;
                let mut got = vec![0f32; m * 70];
                crate::gemm_xwt(&x, &w, &mut got, m, k, 70, &config).unwrap();
                assert_eq!(bits(&got), bits(&direct), "{m} rows, {threads} threads");
                config.mode = crate::Mode::Deterministic;
                crate::gemm_xwt(&x, &w, &mut got, m, k, 70, &config).unwrap();
                assert_ne!(bits(&got), bits(&direct), "class D keeps the exact kernels");
            }
        }
    }
}
