//! Operands laid out for the `nt` kernel of a prompt's many rows (`x86::packed`): a row of `x`
//! with each chunk of eight elements written twice side by side, and rows of `w` two by two,
//! chunk by chunk — what one AVX-512 register of each holds in the tiles of
//! [`super::nt_accumulate`], so that the kernel loads each with one plain load instead of a
//! broadcast or two loads and an insert. [`nt_packed`] gives the bits of
//! [`super::nt_accumulate`] on the same rows.

use super::{KC, LANES, Mode};

/// Columns (rows of `w`) per tile; [`pack_w`] pads a panel to a multiple of it.
pub(crate) const COLS: usize = 8;

/// Floats of a packed row of `x` or pair of rows of `w` with `k` elements per row.
pub(crate) fn packed_len(k: usize) -> usize {
    2 * k
}

/// `x`'s `m` rows of `k` (row-major) with each chunk of eight written twice side by side.
/// `k` must be a multiple of eight.
pub(crate) fn pack_x(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    debug_assert_eq!(k % LANES, 0);
    let mut out = Vec::with_capacity(m * packed_len(k));
    for chunk in x[..m * k].chunks_exact(LANES) {
        out.extend_from_slice(chunk);
        out.extend_from_slice(chunk);
    }
    out
}

/// The `n` row-major rows of `k` of `w` as pairs of rows, chunk by chunk (row `2p`'s eight
/// elements, then row `2p + 1`'s), padded with rows of zeros to a multiple of [`COLS`] rows,
/// into `out` (a panel's scratch, reused). `k` must be a multiple of eight.
pub(crate) fn pack_w(w: &[f32], n: usize, k: usize, out: &mut Vec<f32>) {
    debug_assert_eq!(k % LANES, 0);
    let padded = n.next_multiple_of(COLS);
    out.clear();
    out.reserve(padded / 2 * packed_len(k));
    let zeros = [0f32; LANES];
    let row = |j: usize, c: usize| {
        if j < n {
            &w[j * k + c..j * k + c + LANES]
        } else {
            &zeros[..]
        }
    };
    for p in 0..padded / 2 {
        for c in (0..k).step_by(LANES) {
            out.extend_from_slice(row(2 * p, c));
            out.extend_from_slice(row(2 * p + 1, c));
        }
    }
}

/// `CX_KERNELS_NO_PACK=1` keeps a prompt's products on the row-major kernel (for comparing the
/// two in one binary; the bits are the same).
#[cfg(target_arch = "x86_64")]
fn no_pack() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("CX_KERNELS_NO_PACK").is_some_and(|v| v == "1"))
}

/// Whether [`nt_packed`] runs on this CPU for rows of `k` elements (AVX-512, `k` a multiple of
/// eight): where it does not, a product calls [`super::nt_accumulate`] on its rows as they are.
pub(crate) fn packs(k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        k.is_multiple_of(LANES) && super::x86::has_avx512f() && !super::no_avx512() && !no_pack()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = k;
        false
    }
}

/// `out[i*n + j] += Σ_c x[i][c]·w[j][c]` for the `m` rows of `k` packed by [`pack_x`] and the
/// `n` rows (a multiple of [`COLS`]) packed by [`pack_w`] into the `m × n` `out`: the bits of
/// [`super::nt_accumulate`] on the rows unpacked, in either mode.
///
/// # Panics
/// Where [`packs`] is false for `k`, or a slice is too short.
pub(crate) fn nt_packed(
    xp: &[f32],
    m: usize,
    wp: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
    mode: Mode,
) {
    assert!(
        packs(k),
        "nt_packed: no packed kernel on this CPU for rows of {k}"
    );
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::{has_fma, packed};
        if mode == Mode::Fast && has_fma() {
            // SAFETY: AVX2, FMA and AVX-512F were detected at run time (`packs`, `has_fma`).
            unsafe { packed::nt_fma(xp, m, wp, n, k, out, KC) }
        } else {
            // SAFETY: AVX2 and AVX-512F were detected at run time (`packs`).
            unsafe { packed::nt_nofma(xp, m, wp, n, k, out, KC) }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (xp, m, wp, n, out, mode, KC);
        unreachable!("packs is false off x86_64");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::seeded;
    use rand::Rng;

    /// Packed products against the row-major kernel, bit for bit, in both modes: rows past a
    /// tile's six, columns past a panel's multiple of eight (the padding), reductions of one
    /// block, of a block and a part (SmolLM2's 576), of several.
    #[test]
    fn packed_products_have_the_bits_of_the_row_major_kernel() {
        for k in [8, 576, 1032, 1536] {
            if !packs(k) {
                return;
            }
            let mut rng = seeded(k as u64);
            for (m, n) in [(1, 8), (17, 32), (23, 13), (40, 1)] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                let w: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                let xp = pack_x(&x, m, k);
                let mut wp = Vec::new();
                pack_w(&w, n, k, &mut wp);
                let padded = n.next_multiple_of(COLS);
                for mode in [Mode::Deterministic, Mode::Fast] {
                    let mut want = vec![0f32; m * n];
                    super::super::nt_accumulate(&x, k, m, &w, k, n, k, &mut want, mode);
                    let mut got = vec![0f32; m * padded];
                    nt_packed(&xp, m, &wp, padded, k, &mut got, mode);
                    for i in 0..m {
                        assert_eq!(
                            &got[i * padded..i * padded + n],
                            &want[i * n..(i + 1) * n],
                            "{mode:?}, k {k}, {m} × {n}, row {i}"
                        );
                        assert!(
                            got[i * padded + n..(i + 1) * padded]
                                .iter()
                                .all(|v| *v == 0.0)
                        );
                    }
                }
            }
        }
    }
}
