//! Segmented gather-matmul (SGMV) for batched multi-adapter LoRA.
//!
//! A batch of rows (tokens) is cut into [`Segment`]s of consecutive rows that share an
//! adapter; each segment gathers its own adapter's `A` and `B` from the table it is given:
//!
//! ```text
//! y[i] += s_a · B_a · (A_a · x[i])        for every row i of a segment using adapter a
//!         expand   shrink
//! ```
//!
//! Ranks may differ between adapters: the intermediate `v = x·Aᵀ` of a segment has exactly
//! `len × rank` entries ([`ShrinkLayout`]), nothing is padded to a common rank.

use crate::cpu::{CpuConfig, SharedOut, expand_rows, for_each_item, nt_accumulate};
use crate::element::{Element, as_f32, widen_into};
use crate::error::{Error, Result, check_len};

/// Rows per work item: a segment longer than this is split so one adapter cannot serialise a
/// batch. Splitting by rows never changes a row's arithmetic.
const ROWS_PER_ITEM: usize = 8;

/// One LoRA adapter for one projection, prepared for the kernels.
///
/// Holds `A` (`rank × d_in`, as PEFT's `lora_A.weight`) and `B` transposed (`rank × d_out`;
/// PEFT's `lora_B.weight` is `d_out × rank`), so that both kernels read contiguous memory.
#[derive(Clone, Debug)]
pub struct LoraAdapter<T> {
    rank: usize,
    d_in: usize,
    d_out: usize,
    scale: f32,
    a: Vec<T>,
    b_t: Vec<T>,
}

impl<T: Element> LoraAdapter<T> {
    /// Builds an adapter from PEFT tensors with `scale = alpha / rank`.
    ///
    /// Shapes: `a` is `rank × d_in` (`lora_A.weight`), `b` is `d_out × rank` (`lora_B.weight`).
    pub fn from_peft(
        a: &[T],
        b: &[T],
        rank: usize,
        d_in: usize,
        d_out: usize,
        alpha: f32,
    ) -> Result<Self> {
        if rank == 0 {
            return Err(Error::Batch("adapter rank must be positive".into()));
        }
        Self::with_scale(a, b, rank, d_in, d_out, alpha / rank as f32)
    }

    /// Builds an adapter with an explicit scale `s`.
    ///
    /// Shapes: `a` is `rank × d_in`, `b` is `d_out × rank`.
    pub fn with_scale(
        a: &[T],
        b: &[T],
        rank: usize,
        d_in: usize,
        d_out: usize,
        scale: f32,
    ) -> Result<Self> {
        if rank == 0 || d_in == 0 || d_out == 0 {
            return Err(Error::Batch(
                "adapter rank, d_in and d_out must be positive".into(),
            ));
        }
        check_len("lora A (rank × d_in)", a.len(), rank * d_in)?;
        check_len("lora B (d_out × rank)", b.len(), d_out * rank)?;
        let mut b_t = Vec::with_capacity(rank * d_out);
        for k in 0..rank {
            b_t.extend((0..d_out).map(|j| b[j * rank + k]));
        }
        Ok(Self {
            rank,
            d_in,
            d_out,
            scale,
            a: a.to_vec(),
            b_t,
        })
    }

    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Input features.
    pub fn d_in(&self) -> usize {
        self.d_in
    }
    /// Output features.
    pub fn d_out(&self) -> usize {
        self.d_out
    }
    /// The scale `s` (PEFT: `alpha / r`).
    pub fn scale(&self) -> f32 {
        self.scale
    }
    /// `A`, `rank × d_in` row-major.
    pub fn a(&self) -> &[T] {
        &self.a
    }
    /// `Bᵀ`, `rank × d_out` row-major.
    pub fn b_transposed(&self) -> &[T] {
        &self.b_t
    }
    /// Bytes of weights a kernel reads for this adapter (`rank·(d_in + d_out)` elements).
    pub fn weight_bytes(&self) -> usize {
        (self.a.len() + self.b_t.len()) * std::mem::size_of::<T>()
    }

    /// The dense delta `s·B·A`, `d_out × d_in`, for merged-weight comparisons.
    pub fn delta_dense(&self) -> Vec<f32> {
        let mut delta = vec![0f32; self.d_out * self.d_in];
        for j in 0..self.d_out {
            for k in 0..self.rank {
                let b = self.scale * self.b_t[k * self.d_out + j].to_f32();
                let a_row = &self.a[k * self.d_in..(k + 1) * self.d_in];
                for (d, a) in delta[j * self.d_in..(j + 1) * self.d_in]
                    .iter_mut()
                    .zip(a_row)
                {
                    *d += b * a.to_f32();
                }
            }
        }
        delta
    }
}

/// Rows `start..start + len` of the batch use adapter `adapter` (an index into the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First row.
    pub start: usize,
    /// Number of rows.
    pub len: usize,
    /// Index into the adapter table passed with the batch.
    pub adapter: usize,
}

/// Cuts a batch into segments from each row's adapter (`None`: base model only, no segment).
///
/// Consecutive rows with the same adapter form one segment; a scheduler that groups rows by
/// adapter gets one segment per adapter.
pub fn segments_from_row_adapters(row_adapter: &[Option<usize>]) -> Vec<Segment> {
    let mut segments: Vec<Segment> = Vec::new();
    for (row, adapter) in row_adapter.iter().enumerate() {
        let Some(adapter) = *adapter else { continue };
        match segments.last_mut() {
            Some(last) if last.adapter == adapter && last.start + last.len == row => last.len += 1,
            _ => segments.push(Segment {
                start: row,
                len: 1,
                adapter,
            }),
        }
    }
    segments
}

/// Where each segment's intermediate `v = x·Aᵀ` lives in the packed shrink output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShrinkLayout {
    /// Offset of segment `s`'s `len × rank` block; `offsets[segments.len()]` is the total.
    pub offsets: Vec<usize>,
}

impl ShrinkLayout {
    /// Total `f32` elements of the shrink output.
    pub fn total(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }
}

/// Checks a batch and returns its shrink layout.
///
/// Shapes: `x_len` must be `rows × d_in`, `y_len` `rows × d_out`; segments must be in
/// increasing row order, non-overlapping, inside `0..rows`, and name adapters of matching
/// `d_in`/`d_out`.
pub fn check_batch<T: Element>(
    rows: usize,
    d_in: usize,
    d_out: usize,
    segments: &[Segment],
    adapters: &[&LoraAdapter<T>],
) -> Result<ShrinkLayout> {
    layout(rows, d_in, d_out, segments, adapters.len(), |i| {
        let a = adapters[i];
        (a.d_in, a.d_out, a.rank)
    })
}

/// The checks of [`check_batch`] on shapes alone, so that every device's adapters (host or
/// GPU-resident) go through one set of rules: `shape(i)` is adapter `i`'s
/// `(d_in, d_out, rank)`, for `i < adapter_count`.
pub(crate) fn layout(
    rows: usize,
    d_in: usize,
    d_out: usize,
    segments: &[Segment],
    adapter_count: usize,
    shape: impl Fn(usize) -> (usize, usize, usize),
) -> Result<ShrinkLayout> {
    if d_in == 0 || d_out == 0 {
        return Err(Error::Batch("d_in and d_out must be positive".into()));
    }
    let mut offsets = Vec::with_capacity(segments.len() + 1);
    let mut total = 0;
    let mut next_free_row = 0;
    for (s, seg) in segments.iter().enumerate() {
        if seg.start < next_free_row {
            return Err(Error::Batch(format!(
                "segment {s} starts at row {} before the previous one ends (row {next_free_row}); \
                 segments must be sorted and disjoint",
                seg.start
            )));
        }
        if seg.start + seg.len > rows {
            return Err(Error::Batch(format!(
                "segment {s} covers rows {}..{} but the batch has {rows} rows",
                seg.start,
                seg.start + seg.len
            )));
        }
        next_free_row = seg.start + seg.len;
        if seg.adapter >= adapter_count {
            return Err(Error::UnknownAdapter {
                segment: s,
                adapter: seg.adapter,
                available: adapter_count,
            });
        }
        let (a_in, a_out, rank) = shape(seg.adapter);
        if a_in != d_in || a_out != d_out {
            return Err(Error::Batch(format!(
                "segment {s}: adapter {} is {a_in}→{a_out} but the layer is {d_in}→{d_out}",
                seg.adapter
            )));
        }
        offsets.push(total);
        total += seg.len * rank;
    }
    offsets.push(total);
    Ok(ShrinkLayout { offsets })
}

fn rows_of(x_len: usize, d_in: usize) -> Result<usize> {
    if d_in == 0 || !x_len.is_multiple_of(d_in) {
        return Err(Error::Shape {
            what: "x (rows × d_in)",
            expected: d_in,
            got: x_len,
        });
    }
    Ok(x_len / d_in)
}

/// Work items: (segment, first row within it, rows).
fn items(segments: &[Segment]) -> Vec<(usize, usize, usize)> {
    let mut items = Vec::new();
    for (s, seg) in segments.iter().enumerate() {
        let mut r = 0;
        while r < seg.len {
            let n = ROWS_PER_ITEM.min(seg.len - r);
            items.push((s, r, n));
            r += n;
        }
    }
    items
}

#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    v: Vec<f32>,
}

fn adapter_a_f32<'s, T: Element>(adapter: &'s LoraAdapter<T>, buf: &'s mut Vec<f32>) -> &'s [f32] {
    match T::as_f32_slice(&adapter.a) {
        Some(a) => a,
        None => {
            buf.resize(adapter.a.len(), 0.0);
            widen_into(&adapter.a, buf);
            buf
        }
    }
}

/// Fused SGMV: `y[i] += s_a · (x[i]·A_aᵀ)·B_aᵀ` for every row `i` of every segment.
///
/// Shapes: `x` is `rows × d_in`, `y` is `rows × d_out` (holding the base output, which is
/// added to), each adapter `A` is `r_a × d_in` and `B` is `d_out × r_a`. Rows outside every
/// segment are left untouched.
pub fn sgmv<X: Element, T: Element>(
    x: &[X],
    y: &mut [f32],
    d_in: usize,
    d_out: usize,
    segments: &[Segment],
    adapters: &[&LoraAdapter<T>],
    config: &CpuConfig,
) -> Result<()> {
    let rows = rows_of(x.len(), d_in)?;
    check_len("y (rows × d_out)", y.len(), rows * d_out)?;
    check_batch(rows, d_in, d_out, segments, adapters)?;
    let x = as_f32(x);
    let work = items(segments);
    let out = SharedOut::new(y);
    let mode = config.mode;
    for_each_item(config.threads, work.len(), |item, scratch: &mut Scratch| {
        let (s, r0, n) = work[item];
        let seg = segments[s];
        let adapter = adapters[seg.adapter];
        let rank = adapter.rank;
        let row = seg.start + r0;
        let a = adapter_a_f32(adapter, &mut scratch.a);
        scratch.v.clear();
        scratch.v.resize(n * rank, 0.0);
        nt_accumulate(
            &x[row * d_in..],
            d_in,
            n,
            a,
            d_in,
            rank,
            d_in,
            &mut scratch.v,
            mode,
        );
        // SAFETY: work items cover disjoint row ranges (segments are checked disjoint and
        // items split a segment without overlap); `y` stays borrowed for the whole loop.
        let y_rows = unsafe { out.part(row * d_out, n * d_out) };
        expand_rows(
            &scratch.v,
            &adapter.b_t,
            rank,
            d_out,
            adapter.scale,
            y_rows,
            n,
            mode,
        );
    });
    Ok(())
}

/// SGMV shrink alone: `v_seg = x_seg·A_aᵀ`, packed per [`ShrinkLayout`] (segment `s` at
/// `offsets[s]`, `len × r_a` row-major). Returns the packed `v` and its layout.
///
/// Shapes: `x` is `rows × d_in`, each `A` is `r_a × d_in`.
pub fn sgmv_shrink<X: Element, T: Element>(
    x: &[X],
    d_in: usize,
    d_out: usize,
    segments: &[Segment],
    adapters: &[&LoraAdapter<T>],
    config: &CpuConfig,
) -> Result<(Vec<f32>, ShrinkLayout)> {
    let rows = rows_of(x.len(), d_in)?;
    let layout = check_batch(rows, d_in, d_out, segments, adapters)?;
    let x = as_f32(x);
    let mut v = vec![0f32; layout.total()];
    let work = items(segments);
    let out = SharedOut::new(&mut v);
    let mode = config.mode;
    for_each_item(config.threads, work.len(), |item, scratch: &mut Scratch| {
        let (s, r0, n) = work[item];
        let seg = segments[s];
        let adapter = adapters[seg.adapter];
        let a = adapter_a_f32(adapter, &mut scratch.a);
        let row = seg.start + r0;
        // SAFETY: items own disjoint row ranges of disjoint segment blocks of `v`.
        let v_part = unsafe { out.part(layout.offsets[s] + r0 * adapter.rank, n * adapter.rank) };
        nt_accumulate(
            &x[row * d_in..],
            d_in,
            n,
            a,
            d_in,
            adapter.rank,
            d_in,
            v_part,
            mode,
        );
    });
    Ok((v, layout))
}

/// SGMV expand alone: `y_seg += s_a · v_seg·B_aᵀ`, with `v` packed as [`sgmv_shrink`] returns.
///
/// Shapes: `v` is the packed shrink output (`Σ len·r_a`), `y` is `rows × d_out`, each `B` is
/// `d_out × r_a`.
pub fn sgmv_expand<T: Element>(
    v: &[f32],
    y: &mut [f32],
    d_in: usize,
    d_out: usize,
    segments: &[Segment],
    adapters: &[&LoraAdapter<T>],
    config: &CpuConfig,
) -> Result<()> {
    if d_out == 0 || !y.len().is_multiple_of(d_out) {
        return Err(Error::Shape {
            what: "y (rows × d_out)",
            expected: d_out,
            got: y.len(),
        });
    }
    let rows = y.len() / d_out;
    let layout = check_batch(rows, d_in, d_out, segments, adapters)?;
    check_len("v (packed shrink output)", v.len(), layout.total())?;
    let work = items(segments);
    let out = SharedOut::new(y);
    let mode = config.mode;
    for_each_item(config.threads, work.len(), |item, _: &mut ()| {
        let (s, r0, n) = work[item];
        let seg = segments[s];
        let adapter = adapters[seg.adapter];
        let rank = adapter.rank;
        let v_part = &v[layout.offsets[s] + r0 * rank..][..n * rank];
        // SAFETY: items own disjoint row ranges of `y`.
        let y_rows = unsafe { out.part((seg.start + r0) * d_out, n * d_out) };
        expand_rows(
            v_part,
            &adapter.b_t,
            rank,
            d_out,
            adapter.scale,
            y_rows,
            n,
            mode,
        );
    });
    Ok(())
}

/// Naive reference in `f64`: `y[i] += s·B·(A·x[i])` row by row, for tests.
///
/// Shapes as [`sgmv`].
pub fn sgmv_reference<X: Element, T: Element>(
    x: &[X],
    y: &mut [f32],
    d_in: usize,
    d_out: usize,
    segments: &[Segment],
    adapters: &[&LoraAdapter<T>],
) -> Result<()> {
    let rows = rows_of(x.len(), d_in)?;
    check_len("y (rows × d_out)", y.len(), rows * d_out)?;
    check_batch(rows, d_in, d_out, segments, adapters)?;
    for seg in segments {
        let ad = adapters[seg.adapter];
        for i in seg.start..seg.start + seg.len {
            let v: Vec<f64> = (0..ad.rank)
                .map(|k| {
                    (0..d_in)
                        .map(|d| {
                            f64::from(x[i * d_in + d].to_f32())
                                * f64::from(ad.a[k * d_in + d].to_f32())
                        })
                        .sum()
                })
                .collect();
            for j in 0..d_out {
                let delta: f64 = (0..ad.rank)
                    .map(|k| v[k] * f64::from(ad.b_t[k * d_out + j].to_f32()))
                    .sum();
                y[i * d_out + j] =
                    (f64::from(y[i * d_out + j]) + f64::from(ad.scale) * delta) as f32;
            }
        }
    }
    Ok(())
}
