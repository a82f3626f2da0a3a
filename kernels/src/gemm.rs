//! The base projection `y = x·Wᵀ`, blocked and multi-threaded: what SGMV's overhead is
//! measured against, and what the provider runs for the frozen base weights.

use crate::cpu::{CpuConfig, SharedOut, nt_accumulate};
use crate::element::{Element, as_f32, widen_into};
use crate::error::{Error, Result, check_len};
use crate::quant::QuantMatrix;

/// Output columns (rows of `W`) per work item: a `32 × d_in` panel of `W`, 512 KiB in `f32`
/// at `d_in = 4096`, stays in L2 while every row of `x` streams past it.
const PANEL_COLS: usize = 32;

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
    let w_f32 = W::as_f32_slice(w);
    panel_gemm(
        &x,
        y,
        m,
        d_in,
        d_out,
        config,
        |j0, cols, scratch| match w_f32 {
            Some(w) => Some(&w[j0 * d_in..(j0 + cols) * d_in]),
            None => {
                scratch.resize(cols * d_in, 0.0);
                widen_into(&w[j0 * d_in..(j0 + cols) * d_in], scratch);
                None
            }
        },
    );
    Ok(())
}

/// `y = x·Wᵀ` for a quantized `W` (`d_out × d_in` as [`QuantMatrix`] holds it), overwriting `y`.
///
/// Each panel of [`PANEL_COLS`] rows is dequantized into the worker's scratch as it is reached
/// (`32 × d_in` floats, in L2), then multiplied by the f32 kernel: the result is bit for bit
/// [`gemm_xwt`] on the dequantized matrix, with the same reduction order at any batch
/// composition or thread count.
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
    panel_gemm(x, y, m, d_in, d_out, config, |j0, cols, scratch| {
        scratch.resize(cols * d_in, 0.0);
        w.dequantize_rows(j0, cols, scratch);
        None
    });
    Ok(())
}

/// The blocked product both entry points share: threads take panels of `PANEL_COLS` output
/// columns; `panel(j0, cols, scratch)` gives rows `j0..j0 + cols` of `W` as `f32`: borrowed
/// (`Some`), or written into the scratch (`None`).
fn panel_gemm<'w>(
    x: &[f32],
    y: &mut [f32],
    m: usize,
    d_in: usize,
    d_out: usize,
    config: &CpuConfig,
    panel: impl Fn(usize, usize, &mut Vec<f32>) -> Option<&'w [f32]> + Sync,
) {
    let panels = d_out.div_ceil(PANEL_COLS);
    let out = SharedOut::new(y);
    let mode = config.mode;
    crate::cpu::for_each_item(config.threads, panels, |p, scratch: &mut Scratch| {
        let j0 = p * PANEL_COLS;
        let cols = PANEL_COLS.min(d_out - j0);
        let Scratch { panel: buf, tile } = scratch;
        let w_panel = match panel(j0, cols, buf) {
            Some(w) => w,
            None => &buf[..],
        };
        tile.clear();
        tile.resize(m * cols, 0.0);
        nt_accumulate(x, d_in, m, w_panel, d_in, cols, d_in, tile, mode);
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
