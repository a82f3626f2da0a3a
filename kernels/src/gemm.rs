//! The base projection `y = x·Wᵀ`, blocked and multi-threaded: what SGMV's overhead is
//! measured against, and what the provider runs for the frozen base weights.

use crate::cpu::{CpuConfig, SharedOut, nt_accumulate};
use crate::element::{Element, as_f32, widen_into};
use crate::error::{Error, Result, check_len};

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
    let panels = d_out.div_ceil(PANEL_COLS);
    let out = SharedOut::new(y);
    let mode = config.mode;
    crate::cpu::for_each_item(config.threads, panels, |panel, scratch: &mut Scratch| {
        let j0 = panel * PANEL_COLS;
        let cols = PANEL_COLS.min(d_out - j0);
        let w_panel: &[f32] = match w_f32 {
            Some(w) => &w[j0 * d_in..(j0 + cols) * d_in],
            None => {
                scratch.panel.resize(cols * d_in, 0.0);
                widen_into(&w[j0 * d_in..(j0 + cols) * d_in], &mut scratch.panel);
                &scratch.panel
            }
        };
        scratch.tile.clear();
        scratch.tile.resize(m * cols, 0.0);
        nt_accumulate(
            &x,
            d_in,
            m,
            w_panel,
            d_in,
            cols,
            d_in,
            &mut scratch.tile,
            mode,
        );
        for i in 0..m {
            // SAFETY: panel `panel` alone writes columns j0..j0+cols of each row, and panels
            // are disjoint; `y` stays borrowed by this function for the whole parallel loop.
            let row = unsafe { out.part(i * d_out + j0, cols) };
            row.copy_from_slice(&scratch.tile[i * cols..(i + 1) * cols]);
        }
    });
    Ok(())
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
