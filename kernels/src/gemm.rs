//! The base projection `y = x·Wᵀ`, blocked and multi-threaded: what SGMV's overhead is
//! measured against, and what the provider runs for the frozen base weights.

use half::slice::HalfFloatSliceExt;

use crate::cpu::packed::{self, nt_packed, pack_w, pack_x};
use crate::cpu::{CpuConfig, SharedOut, Widened, nt_accumulate, nt_accumulate_widened};
use crate::cpu::{bf16_dot, int8};
use crate::element::{Element, as_f32, widen_into};
use crate::error::{Error, Result, check_len};
use crate::quant::QuantMatrix;

/// Output columns (rows of `W`) per work item: a `32 × d_in` panel of `W`, 512 KiB in `f32`
/// at `d_in = 4096`, stays in L2 while every row of `x` streams past it.
const PANEL_COLS: usize = 32;
// A panel is one item of the integer panel kernel too.
const _: () = assert!(PANEL_COLS == int8::PANEL_ROWS);

/// Rows of `x` up to which a bf16 or quantized `W` is widened in registers as the kernel reads
/// it ([`nt_accumulate_widened`]) rather than into a panel first: a decode step's rows (batches
/// of 8 measured; the crossover is not tuned). The widened kernel widens each weight once per
/// group of 8 rows (4 on AVX2), the panel once for all rows, which is what a prompt wants.
const WIDENED_MAX_ROWS: usize = 16;

/// A `d_out × d_in` row-major weight as the GEMM reads it: `f32`, `bf16` or `f16` (widened
/// exactly as it is read), or ggml blocks (dequantized exactly as they are read).
#[derive(Clone, Copy, Debug)]
pub enum WeightView<'a> {
    /// `f32` elements.
    F32(&'a [f32]),
    /// `bf16` elements.
    Bf16(&'a [half::bf16]),
    /// `f16` elements (every one exactly an `f32`: the products are those of the widened
    /// matrix, at half its memory).
    F16(&'a [half::f16]),
    /// ggml's blocks.
    Quant(&'a QuantMatrix),
}

impl WeightView<'_> {
    /// Output columns (rows of `W`) for inputs of `d_in`.
    fn d_out(&self, d_in: usize) -> usize {
        match self {
            WeightView::F32(w) => w.len() / d_in,
            WeightView::Bf16(w) => w.len() / d_in,
            WeightView::F16(w) => w.len() / d_in,
            WeightView::Quant(m) => m.d_out(),
        }
    }

    fn check(&self, d_in: usize, d_out: usize) -> Result<()> {
        match self {
            WeightView::F32(w) => check_len("w (d_out × d_in)", w.len(), d_out * d_in),
            WeightView::Bf16(w) => check_len("w (d_out × d_in)", w.len(), d_out * d_in),
            WeightView::F16(w) => check_len("w (d_out × d_in)", w.len(), d_out * d_in),
            WeightView::Quant(m) if m.d_in() != d_in => Err(Error::Batch(format!(
                "gemm: a quantized weight of d_in {} against inputs of {d_in}",
                m.d_in()
            ))),
            WeightView::Quant(_) => Ok(()),
        }
    }

    /// Rows `j0..j0 + cols` of `W` as `f32`: the weights themselves, or widened into `panel`.
    fn f32_rows<'s>(
        &'s self,
        d_in: usize,
        j0: usize,
        cols: usize,
        panel: &'s mut Vec<f32>,
    ) -> &'s [f32] {
        let range = j0 * d_in..(j0 + cols) * d_in;
        match *self {
            WeightView::F32(w) => return &w[range],
            WeightView::Bf16(w) => {
                panel.resize(cols * d_in, 0.0);
                widen_into(&w[range], panel);
            }
            WeightView::F16(w) => {
                panel.resize(cols * d_in, 0.0);
                w[range].convert_to_f32_slice(panel);
            }
            WeightView::Quant(w) => {
                panel.resize(cols * d_in, 0.0);
                w.dequantize_rows(j0, cols, panel);
            }
        }
        panel
    }

    /// Adds rows `0..m` of `x` times rows `j0..j0 + cols` of `W` (transposed) into the zeroed
    /// `m × cols` tile, widening into `panel` where the kernel cannot widen in registers.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        x: &[f32],
        m: usize,
        d_in: usize,
        j0: usize,
        cols: usize,
        panel: &mut Vec<f32>,
        tile: &mut [f32],
        mode: crate::Mode,
    ) {
        let in_registers = match *self {
            WeightView::F32(_) => None,
            WeightView::Bf16(w) => Some(Widened::Bf16(w)),
            WeightView::F16(w) => Some(Widened::F16(w)),
            WeightView::Quant(w) => Some(Widened::Quant(w)),
        };
        if let Some(w) = in_registers
            && m <= WIDENED_MAX_ROWS
            && nt_accumulate_widened(x, d_in, m, w, j0, cols, d_in, tile, mode)
        {
            return;
        }
        let rows = self.f32_rows(d_in, j0, cols, panel);
        nt_accumulate(x, d_in, m, rows, d_in, cols, d_in, tile, mode);
    }

    /// [`WeightView::product`] on `x` packed by [`pack_x`] (a prompt's rows): rows `j0..j0 +
    /// cols` of `W`, widened into `panel` where they are not `f32`, packed into `packed`, and
    /// multiplied into the zeroed `m × cols` tile padded to [`packed::COLS`] columns.
    #[allow(clippy::too_many_arguments)]
    fn packed_product(
        &self,
        xp: &[f32],
        m: usize,
        d_in: usize,
        j0: usize,
        cols: usize,
        panel: &mut Vec<f32>,
        packed: &mut Vec<f32>,
        tile: &mut [f32],
        mode: crate::Mode,
    ) {
        pack_w(self.f32_rows(d_in, j0, cols, panel), cols, d_in, packed);
        let padded = cols.next_multiple_of(packed::COLS);
        nt_packed(xp, m, packed, padded, d_in, tile, mode);
    }
}

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
    check_len("w (d_out × d_in)", w.len(), d_out * d_in)?;
    let w = match (W::as_f32_slice(w), W::as_bf16_slice(w)) {
        (Some(w), _) => WeightView::F32(w),
        (None, Some(w)) => WeightView::Bf16(w),
        (None, None) => unreachable!("Element is sealed to f32 and bf16"),
    };
    gemm_xwt_many(&as_f32(x), m, d_in, &mut [(w, y)], config)
}

/// `y = x·Wᵀ` for a quantized `W` (`d_out × d_in` as [`QuantMatrix`] holds it), overwriting `y`.
///
/// Up to 16 rows of `x`, the kernel dequantizes the blocks in registers as it reads them; more
/// rows, each panel of 32 rows is dequantized into the worker's scratch as it is reached (`32 ×
/// d_in` floats, in L2) and multiplied by the f32 kernel. Either way the result is bit for bit
/// [`gemm_xwt`] on the dequantized matrix, with the same reduction order at any batch
/// composition or thread count — unless `config.int8` asks for the products in eight-bit
/// integers (`CpuConfig::int8`).
pub fn gemm_xwt_quant(
    x: &[f32],
    w: &QuantMatrix,
    y: &mut [f32],
    m: usize,
    config: &CpuConfig,
) -> Result<()> {
    gemm_xwt_many(x, m, w.d_in(), &mut [(WeightView::Quant(w), y)], config)
}

/// `yₚ = x·Wₚᵀ` for several weights that read the same `x` (a layer's q, k and v; its gate and
/// up), in one parallel pass over all their panels: one hand-off to the worker pool and one
/// join instead of one per product, which is most of a small product's cost at decode. Each
/// output is bit for bit what [`gemm_xwt`] alone gives (a panel's arithmetic does not depend
/// on which pass or thread runs it).
///
/// Shapes: `x` is `m × d_in`; each weight is `d_outₚ × d_in` and its `yₚ` `m × d_outₚ`
/// (overwritten).
pub fn gemm_xwt_many(
    x: &[f32],
    m: usize,
    d_in: usize,
    products: &mut [(WeightView<'_>, &mut [f32])],
    config: &CpuConfig,
) -> Result<()> {
    if d_in == 0 {
        return Err(Error::Batch("gemm_xwt: d_in must be positive".into()));
    }
    check_len("x (m × d_in)", x.len(), m * d_in)?;
    let mut parts = Vec::with_capacity(products.len());
    let mut first_panel = 0;
    for (w, y) in products.iter_mut() {
        let d_out = w.d_out(d_in);
        if d_out == 0 {
            return Err(Error::Batch(
                "gemm_xwt: d_in and d_out must be positive".into(),
            ));
        }
        w.check(d_in, d_out)?;
        check_len("y (m × d_out)", y.len(), m * d_out)?;
        parts.push(Part {
            w: *w,
            d_out,
            first_panel,
            out: SharedOut::new(y),
        });
        first_panel += d_out.div_ceil(PANEL_COLS);
    }
    if m == 0 || parts.is_empty() {
        return Ok(());
    }
    let mode = config.mode;
    // A prompt's rows over bf16 or quantized weights: `x` packed once for every panel of
    // every product (see `crate::cpu::packed`), as each panel is written to scratch anyway. A
    // decode step's few rows, and `f32` weights, are read as they are: packing an `f32` panel
    // is one more pass over weights the kernel would stream from memory with its prefetches
    // (SmolLM2-135M's shapes in f32 at 64 rows, AMD EPYC: 155 ms a step unpacked, 209 packed).
    // Rows over quantized weights where the fast mode asks for integers: `x` rounded to
    // eight-bit codes once for every product (see `crate::cpu::int8`); over bf16 weights where
    // it asks for bf16 products, `x` rounded to bf16 once (see `crate::cpu::bf16_dot`).
    let fast = mode == crate::Mode::Fast;
    let any = |f: fn(&WeightView<'_>) -> bool| parts.iter().any(|p| f(&p.w));
    let xq = if fast && config.int8 && any(|w| matches!(w, WeightView::Quant(_))) {
        int8::quantize_rows(x, m, d_in)
    } else {
        None
    };
    let xb = if fast && config.bf16_dot && any(|w| matches!(w, WeightView::Bf16(_))) {
        bf16_dot::round_rows(x, m, d_in)
    } else {
        None
    };
    // Whether a weight's products take one of those two kernels rather than the `f32` ones.
    let narrow = |w: &WeightView<'_>| match w {
        WeightView::Quant(_) => xq.is_some(),
        WeightView::Bf16(_) => xb.is_some(),
        WeightView::F32(_) | WeightView::F16(_) => false,
    };
    let packs = m > WIDENED_MAX_ROWS
        && !parts.iter().all(|p| narrow(&p.w))
        && packed::packs(d_in)
        && parts.iter().all(|p| !matches!(p.w, WeightView::F32(_)));
    let xp = if packs {
        pack_x(x, m, d_in)
    } else {
        Vec::new()
    };
    crate::cpu::for_each_item(
        config.threads,
        first_panel,
        |item, scratch: &mut Scratch| {
            let part = parts
                .iter()
                .rev()
                .find(|p| p.first_panel <= item)
                .expect("item 0 is the first part's");
            let j0 = (item - part.first_panel) * PANEL_COLS;
            let cols = PANEL_COLS.min(part.d_out - j0);
            let Scratch {
                panel,
                packed,
                int8_panel,
                tile,
            } = scratch;
            let stride = if packs && !narrow(&part.w) {
                cols.next_multiple_of(packed::COLS)
            } else {
                cols
            };
            tile.clear();
            tile.resize(m * stride, 0.0);
            match (part.w, &xq, &xb) {
                (WeightView::Quant(w), Some(xq), _) => {
                    int8::product(xq, m, w, j0, cols, int8_panel, tile);
                }
                (WeightView::Bf16(w), _, Some(xb)) => bf16_dot::product(xb, m, w, j0, cols, tile),
                _ if packs => {
                    part.w
                        .packed_product(&xp, m, d_in, j0, cols, panel, packed, tile, mode);
                }
                _ => part.w.product(x, m, d_in, j0, cols, panel, tile, mode),
            }
            for i in 0..m {
                // SAFETY: panel `item` alone writes columns j0..j0+cols of each row of its
                // product's output, and panels are disjoint; every `y` stays borrowed by the
                // caller for the whole parallel loop.
                let row = unsafe { part.out.part(i * part.d_out + j0, cols) };
                row.copy_from_slice(&tile[i * stride..i * stride + cols]);
            }
        },
    );
    Ok(())
}

/// One product of [`gemm_xwt_many`]: its weight, its panels' numbers from `first_panel` on,
/// its output.
struct Part<'a> {
    w: WeightView<'a>,
    d_out: usize,
    first_panel: usize,
    out: SharedOut,
}

#[derive(Default)]
struct Scratch {
    panel: Vec<f32>,
    /// A panel of `W` packed for [`nt_packed`].
    packed: Vec<f32>,
    /// A panel of `W` decoded for the integer panel kernel ([`int8::product`]).
    int8_panel: int8::Panel,
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
