//! The base projection `y = x·Wᵀ`, blocked and multi-threaded: what SGMV's overhead is
//! measured against, and what the provider runs for the frozen base weights.

use crate::cpu::{CpuConfig, SharedOut, Widened, nt_accumulate, nt_accumulate_widened};
use crate::element::{Element, as_f32, widen_into};
use crate::error::{Error, Result, check_len};
use crate::quant::QuantMatrix;

/// Output columns (rows of `W`) per work item: a `32 × d_in` panel of `W`, 512 KiB in `f32`
/// at `d_in = 4096`, stays in L2 while every row of `x` streams past it.
const PANEL_COLS: usize = 32;

/// Rows of `x` up to which a bf16 or quantized `W` is widened in registers as the kernel reads
/// it ([`nt_accumulate_widened`]) rather than into a panel first: a decode step's rows (batches
/// of 8 measured; the crossover is not tuned). The widened kernel widens each weight once per
/// group of 8 rows (4 on AVX2), the panel once for all rows, which is what a prompt wants.
const WIDENED_MAX_ROWS: usize = 16;

/// `y = x·Wᵀ` (overwrites `y`).
///
/// Shapes: `x` is `m × d_in` row-major, `w` is `d_out × d_in` row-major (a Hugging Face
/// `Linear` weight as stored), `y` is `m × d_out` row-major.
///
/// Threads split the output columns; the reduction over `d_in` is never split, so the result
/// does not depend on the thread count (see [`crate::Mode`]).
pub fn gemm_xwt<X: Element, W: Element>(
    x: &[X],
    w: &[W],
    y: &mut [f32],
    m: usize,
    d_in: usize,
    d_out: usize,
    config: &CpuConfig,
) -> Result<()> {
    if d_in == 0 || d_out == 0 {
        return Err(Error::Batch(
            "gemm_xwt: d_in and d_out must be positive".into(),
        ));
    }
    check_len("x (m × d_in)", x.len(), m * d_in)?;
    check_len("w (d_out × d_in)", w.len(), d_out * d_in)?;
    check_len("y (m × d_out)", y.len(), m * d_out)?;
    if m == 0 {
        return Ok(());
    }
    let x = as_f32(x);
    let mode = config.mode;
    match (W::as_f32_slice(w), W::as_bf16_slice(w)) {
        (Some(w), _) => panel_gemm(&x, y, m, d_in, d_out, config, |j0, cols, _, tile| {
            let panel = &w[j0 * d_in..(j0 + cols) * d_in];
            nt_accumulate(&x, d_in, m, panel, d_in, cols, d_in, tile, mode);
        }),
        (None, bf16) => panel_gemm(&x, y, m, d_in, d_out, config, |j0, cols, panel, tile| {
            let widened = m <= WIDENED_MAX_ROWS
                && bf16.is_some_and(|w| {
                    nt_accumulate_widened(&x, d_in, m, Widened::Bf16(w), j0, cols, d_in, tile, mode)
                });
            if !widened {
                panel.resize(cols * d_in, 0.0);
                widen_into(&w[j0 * d_in..(j0 + cols) * d_in], panel);
                nt_accumulate(&x, d_in, m, panel, d_in, cols, d_in, tile, mode);
            }
        }),
    }
    Ok(())
}

/// `y = x·Wᵀ` for a quantized `W` (`d_out × d_in` as [`QuantMatrix`] holds it), overwriting `y`.
///
/// Up to [`WIDENED_MAX_ROWS`] rows of `x`, the kernel dequantizes the blocks in registers as it
/// reads them; more rows, each panel of [`PANEL_COLS`] rows is dequantized into the worker's
/// scratch as it is reached (`32 × d_in` floats, in L2) and multiplied by the f32 kernel.
/// Either way the result is bit for bit [`gemm_xwt`] on the dequantized matrix, with the same
/// reduction order at any batch composition or thread count.
pub fn gemm_xwt_quant(
    x: &[f32],
    w: &QuantMatrix,
    y: &mut [f32],
    m: usize,
    config: &CpuConfig,
) -> Result<()> {
    let (d_in, d_out) = (w.d_in(), w.d_out());
    if d_in == 0 || d_out == 0 {
        return Err(Error::Batch(
            "gemm_xwt_quant: d_in and d_out must be positive".into(),
        ));
    }
    check_len("x (m × d_in)", x.len(), m * d_in)?;
    check_len("y (m × d_out)", y.len(), m * d_out)?;
    if m == 0 {
        return Ok(());
    }
    let mode = config.mode;
    panel_gemm(x, y, m, d_in, d_out, config, |j0, cols, panel, tile| {
        let widened = m <= WIDENED_MAX_ROWS
            && nt_accumulate_widened(x, d_in, m, Widened::Quant(w), j0, cols, d_in, tile, mode);
        if !widened {
            panel.resize(cols * d_in, 0.0);
            w.dequantize_rows(j0, cols, panel);
            nt_accumulate(x, d_in, m, panel, d_in, cols, d_in, tile, mode);
        }
    });
    Ok(())
}

/// The blocked product both entry points share: threads take panels of `PANEL_COLS` output
/// columns; `product(j0, cols, panel, tile)` adds rows `0..m` of `x` times rows `j0..j0 + cols`
/// of `W` (transposed) into the zeroed `m × cols` tile, with the worker's panel scratch at hand
/// for widening `W`'s rows.
fn panel_gemm(
    x: &[f32],
    y: &mut [f32],
    m: usize,
    d_in: usize,
    d_out: usize,
    config: &CpuConfig,
    product: impl Fn(usize, usize, &mut Vec<f32>, &mut [f32]) + Sync,
) {
    debug_assert_eq!(x.len(), m * d_in);
    let panels = d_out.div_ceil(PANEL_COLS);
    let out = SharedOut::new(y);
    crate::cpu::for_each_item(config.threads, panels, |p, scratch: &mut Scratch| {
        let j0 = p * PANEL_COLS;
        let cols = PANEL_COLS.min(d_out - j0);
        let Scratch { panel, tile } = scratch;
        tile.clear();
        tile.resize(m * cols, 0.0);
        product(j0, cols, panel, tile);
        for i in 0..m {
            // SAFETY: panel `p` alone writes columns j0..j0+cols of each row, and panels are
            // disjoint; `y` stays borrowed by the caller for the whole parallel loop.
            let row = unsafe { out.part(i * d_out + j0, cols) };
            row.copy_from_slice(&tile[i * cols..(i + 1) * cols]);
        }
    });
}

#[derive(Default)]
struct Scratch {
    panel: Vec<f32>,
    tile: Vec<f32>,
}

/// Plain triple loop in `f64`, the yardstick for tests.
///
/// Shapes: `x` is `m × d_in`, `w` is `d_out × d_in`; returns `m × d_out`.
pub fn gemm_xwt_reference<X: Element, W: Element>(
    x: &[X],
    w: &[W],
    m: usize,
    d_in: usize,
    d_out: usize,
) -> Vec<f32> {
    let mut y = vec![0f32; m * d_out];
    for i in 0..m {
        for j in 0..d_out {
            let mut acc = 0f64;
            for k in 0..d_in {
                acc += f64::from(x[i * d_in + k].to_f32()) * f64::from(w[j * d_in + k].to_f32());
            }
            y[i * d_out + j] = acc as f32;
        }
    }
    y
}
