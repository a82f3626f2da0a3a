//! CPU building blocks: run configuration, the work-sharing loop, and the two inner kernels
//! every public routine is made of.
//!
//! * [`nt_accumulate`]: `out[i][j] += Σ_k x[i][k]·w[j][k]` — both operands row-major along
//!   the reduction, which is how Hugging Face stores `Linear` weights (`W`, `lora_A`) and how
//!   the base GEMM, the LoRA shrink and the Freivalds products all look.
//! * [`expand_rows`]: `y[i][j] += s·Σ_k v[i][k]·bt[k][j]`, the LoRA expand with `B` stored
//!   transposed (`r × d_out`) so that the output dimension is the contiguous one.
//!
//! # Why the results are reproducible
//! Every output element is computed by the same sequence of float operations whatever tile,
//! thread or batch it lands in: the reduction runs over fixed blocks of [`KC`] elements, each
//! block in [`LANES`] interleaved partial sums folded by a fixed tree, blocks added in
//! ascending order. Work is split across threads by output rows/columns only, never along the
//! reduction. [`Mode::Deterministic`] additionally forbids fused multiply-add, whose
//! availability differs between CPUs, so the bits are the same on any machine.
//!
//! Long (~640 lines) because the blocked GEMM and its reproducibility argument above must be read
//! together: the tiling, the fixed reduction order and the scalar fallback are one design.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Interleaved partial sums per reduction (one AVX register of `f32`).
pub(crate) const LANES: usize = 8;
/// Reduction block length: the partial sums are folded and added to the output once per block.
pub(crate) const KC: usize = 512;
/// Output columns produced together by the expand kernel.
const EXPAND_COLS: usize = 32;

/// The kernel corpus of [`Mode::Deterministic`]: what a bundle names beside class D, since its
/// output bits are equal to those of other runs of this corpus only. Bump the version whenever a
/// change to the deterministic kernels (reduction order, blocking, rounding) changes any bit.
pub const DETERMINISTIC_CORPUS: &str = "cx-cpu-det-v2";

/// How the CPU kernels may trade reproducibility for speed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Uses fused multiply-add where the CPU has it. Results do not depend on batch
    /// composition or thread count either, but may differ in the last bits between CPUs
    /// with and without FMA.
    #[default]
    Fast,
    /// Fixed reduction order and no fused multiply-add: the same bits for the same row on
    /// any CPU, thread count, batch composition or segment order (determinism class D).
    Deterministic,
}

/// How a CPU call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuConfig {
    /// Worker threads (at least 1).
    pub threads: usize,
    /// Speed or reproducibility.
    pub mode: Mode,
    /// In [`Mode::Fast`], products over quantized weights in eight-bit integers, `x` rounded to
    /// eight bits per block of 32 as llama.cpp does (AVX-512 VNNI; other CPUs keep the `f32`
    /// kernels). Its results differ from the exact kernels' by that rounding, not only in the
    /// last bits, and a row's depend on whether its batch has more than four rows (a decode
    /// step's few rows and a prompt's take two kernels, `crate::cpu::int8`): off unless asked
    /// for.
    pub int8: bool,
    /// In [`Mode::Fast`], products over bf16 weights in bf16, `x` rounded to bf16 as llama.cpp
    /// does (AVX-512 BF16, `crate::cpu::bf16_dot`; other CPUs keep the `f32` kernels). Its
    /// results differ from the exact kernels' by that rounding: off unless asked for.
    pub bf16_dot: bool,
}

impl Default for CpuConfig {
    fn default() -> Self {
        Self {
            threads: default_threads(),
            mode: Mode::Fast,
            int8: false,
            bf16_dot: false,
        }
    }
}

impl CpuConfig {
    /// Deterministic mode with the default thread count.
    pub fn deterministic() -> Self {
        Self {
            mode: Mode::Deterministic,
            ..Self::default()
        }
    }

    /// The same configuration with `threads` workers.
    pub fn with_threads(self, threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            ..self
        }
    }
}

/// The machine's available parallelism (1 if unknown).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `work(item, scratch)` for every item in `0..items` on up to `threads` threads (the
/// caller and the persistent workers of [`crate::pool`]; scoped threads when the pool is busy),
/// handing items out dynamically. Which thread runs an item never changes its arithmetic.
pub(crate) fn for_each_item<S: Default>(
    threads: usize,
    items: usize,
    work: impl Fn(usize, &mut S) + Sync,
) {
    let threads = threads.max(1).min(items);
    if threads <= 1 {
        let mut scratch = S::default();
        for item in 0..items {
            work(item, &mut scratch);
        }
        return;
    }
    let next = AtomicUsize::new(0);
    let run = || {
        let mut scratch = S::default();
        loop {
            let item = next.fetch_add(1, Ordering::Relaxed);
            if item >= items {
                break;
            }
            work(item, &mut scratch);
        }
    };
    if crate::pool::run_on_pool(threads - 1, &run).is_some() {
        return;
    }
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(run);
        }
        run();
    });
}

/// A mutable `f32` buffer that worker threads write in disjoint parts.
pub(crate) struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: `SharedOut` only hands out sub-slices through `part`, whose contract makes callers
// guarantee that concurrently used parts never overlap; `f32` is `Send`.
unsafe impl Sync for SharedOut {}
// SAFETY: as above.
unsafe impl Send for SharedOut {}

impl SharedOut {
    pub(crate) fn new(buffer: &mut [f32]) -> Self {
        Self {
            ptr: buffer.as_mut_ptr(),
            len: buffer.len(),
        }
    }

    /// The sub-slice `start..start + len`.
    ///
    /// # Safety
    /// No two parts in use at the same time may overlap, and the buffer passed to
    /// [`SharedOut::new`] must outlive every part (it is borrowed by the caller for the whole
    /// parallel section).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len, "SharedOut part out of bounds");
        // SAFETY: in bounds (checked above); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, acc: f32) -> f32 {
    if FMA { a.mul_add(b, acc) } else { acc + a * b }
}

/// Folds the lane sums in a fixed tree (the order an AVX horizontal add uses).
#[inline(always)]
pub(crate) fn fold(l: &[f32; LANES]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// One `MR × NR` tile over one reduction block of length `k`.
#[inline(always)]
fn tile<const MR: usize, const NR: usize, const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    w: &[f32],
    w_stride: usize,
    k: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let xs: [&[f32]; MR] = std::array::from_fn(|i| &x[i * x_stride..i * x_stride + k]);
    let ws: [&[f32]; NR] = std::array::from_fn(|j| &w[j * w_stride..j * w_stride + k]);
    let mut acc = [[[0f32; LANES]; NR]; MR];
    let full = k / LANES * LANES;
    let mut o = 0;
    while o < full {
        let xv: [&[f32; LANES]; MR] =
            std::array::from_fn(|i| xs[i][o..o + LANES].try_into().expect("lane chunk"));
        let wv: [&[f32; LANES]; NR] =
            std::array::from_fn(|j| ws[j][o..o + LANES].try_into().expect("lane chunk"));
        for i in 0..MR {
            for j in 0..NR {
                for l in 0..LANES {
                    acc[i][j][l] = madd::<FMA>(xv[i][l], wv[j][l], acc[i][j][l]);
                }
            }
        }
        o += LANES;
    }
    for t in full..k {
        let l = t - full;
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j][l] = madd::<FMA>(xs[i][t], ws[j][t], acc[i][j][l]);
            }
        }
    }
    for i in 0..MR {
        for j in 0..NR {
            out[i * out_stride + j] += fold(&acc[i][j]);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn nt_generic<const FMA: bool>(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    kc: usize,
) {
    const MR: usize = 4;
    const NR: usize = 2;
    let mut k0 = 0;
    while k0 < k {
        let kl = kc.min(k - k0);
        let mut i = 0;
        while i < m {
            let mr = MR.min(m - i);
            let xb = &x[i * x_stride + k0..];
            let mut j = 0;
            while j < n {
                let nr = NR.min(n - j);
                let wb = &w[j * w_stride + k0..];
                let ob = &mut out[i * n + j..];
                match (mr, nr) {
                    (4, 2) => tile::<4, 2, FMA>(xb, x_stride, wb, w_stride, kl, ob, n),
                    (4, _) => tile::<4, 1, FMA>(xb, x_stride, wb, w_stride, kl, ob, n),
                    (3, 2) => tile::<3, 2, FMA>(xb, x_stride, wb, w_stride, kl, ob, n),
                    (3, _) => tile::<3, 1, FMA>(xb, x_stride, wb, w_stride, kl, ob, n),
                    (2, 2) => tile::<2, 2, FMA>(xb, x_stride, wb, w_stride, kl, ob, n),
                    (2, _) => tile::<2, 1, FMA>(xb, x_stride, wb, w_stride, kl, ob, n),
                    (_, 2) => tile::<1, 2, FMA>(xb, x_stride, wb, w_stride, kl, ob, n),
                    _ => tile::<1, 1, FMA>(xb, x_stride, wb, w_stride, kl, ob, n),
                }
                j += nr;
            }
            i += mr;
        }
        k0 += kl;
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn expand_generic<T: crate::Element, const FMA: bool>(
    v: &[f32],
    bt: &[T],
    rank: usize,
    d_out: usize,
    scale: f32,
    y: &mut [f32],
    rows: usize,
) {
    let full = d_out / EXPAND_COLS * EXPAND_COLS;
    let mut j0 = 0;
    while j0 < full {
        for i in 0..rows {
            let vi = &v[i * rank..(i + 1) * rank];
            let mut acc = [0f32; EXPAND_COLS];
            for (kk, &vk) in vi.iter().enumerate() {
                let b: &[T; EXPAND_COLS] = bt[kk * d_out + j0..kk * d_out + j0 + EXPAND_COLS]
                    .try_into()
                    .expect("chunk");
                for l in 0..EXPAND_COLS {
                    acc[l] = madd::<FMA>(vk, b[l].to_f32(), acc[l]);
                }
            }
            let yi: &mut [f32; EXPAND_COLS] = (&mut y
                [i * d_out + j0..i * d_out + j0 + EXPAND_COLS])
                .try_into()
                .expect("chunk");
            for l in 0..EXPAND_COLS {
                yi[l] += scale * acc[l];
            }
        }
        j0 += EXPAND_COLS;
    }
    for i in 0..rows {
        let vi = &v[i * rank..(i + 1) * rank];
        for j in full..d_out {
            let mut acc = 0f32;
            for (kk, &vk) in vi.iter().enumerate() {
                acc = madd::<FMA>(vk, bt[kk * d_out + j].to_f32(), acc);
            }
            y[i * d_out + j] += scale * acc;
        }
    }
}

/// Output columns produced together by the thin "transposed-left" kernel.
const TN_COLS: usize = 16;
/// Rows of `r` (Freivalds rounds) produced together; `r` is padded to a multiple of this.
pub(crate) const TN_ROUNDS: usize = 5;
/// Rows of `w` per packed block (`128 × cols` floats, 128 KiB at 256 columns).
const TN_ROWS: usize = 128;

/// One packed block: `out[t][c] += Σ_{j<p} r[t*r_stride + j] · w[j*cols + c]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tn_generic<const FMA: bool>(
    r: &[f32],
    r_stride: usize,
    k: usize,
    p: usize,
    w: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let full = cols / TN_COLS * TN_COLS;
    // Column chunk outside, round groups inside: the p × 16 strip of the packed block and the
    // rounds' slice of `r` stay in L1 while every round group passes over them.
    let mut c0 = 0;
    while c0 < full {
        let mut t0 = 0;
        while t0 < k {
            let rs: [&[f32]; TN_ROUNDS] =
                std::array::from_fn(|t| &r[(t0 + t) * r_stride..(t0 + t) * r_stride + p]);
            let mut acc = [[0f32; TN_COLS]; TN_ROUNDS];
            for j in 0..p {
                let wv: &[f32; TN_COLS] = w[j * cols + c0..j * cols + c0 + TN_COLS]
                    .try_into()
                    .expect("chunk");
                for t in 0..TN_ROUNDS {
                    let rv = rs[t][j];
                    for l in 0..TN_COLS {
                        acc[t][l] = madd::<FMA>(rv, wv[l], acc[t][l]);
                    }
                }
            }
            for (t, acc_t) in acc.iter().enumerate() {
                let o = &mut out[(t0 + t) * cols + c0..(t0 + t) * cols + c0 + TN_COLS];
                for l in 0..TN_COLS {
                    o[l] += acc_t[l];
                }
            }
            t0 += TN_ROUNDS;
        }
        c0 += TN_COLS;
    }
    for c in full..cols {
        for t in 0..k {
            let mut acc = 0f32;
            for j in 0..p {
                acc = madd::<FMA>(r[t * r_stride + j], w[j * cols + c], acc);
            }
            out[t * cols + c] += acc;
        }
    }
}

pub(crate) mod bf16_dot;
pub use bf16_dot::available as bf16_dot_available;
pub(crate) mod int8;
pub use int8::available as int8_decode_available;
pub(crate) mod packed;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Whether the CPU has AVX2 (the quantized blocks' dequantization is compiled for it too).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    x86::has_avx2()
}

/// `CX_KERNELS_NO_AVX512=1` keeps the deterministic kernels on AVX2 (for comparing the two;
/// the bits are the same).
#[cfg(target_arch = "x86_64")]
fn no_avx512() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("CX_KERNELS_NO_AVX512").is_some_and(|v| v == "1"))
}

/// Whether one row of `x` reads `w` one row at a time (a single sequential stream per thread)
/// rather than [`x86`]'s tiles of eight rows read side by side: on AMD's Zen 4 the single
/// stream is the faster (a small model's bf16 decode step, 269 MB over 30 layers on 2 threads:
/// 11.7–12.2 ms against 14.3–16.8; f32 at hidden 576 20.4–20.6 against 22.0–22.1, at 2048
/// even), although each output is then one chain of dependent adds; on the Intel Xeon measured
/// so far, tiles of eight prefetched rows read 38–42 GB/s where one stream read 23. Only the
/// order memory is read in changes, never an output's operations. `CX_KERNELS_ONE_STREAM=1`
/// or `=0` overrides the vendor's default (for measuring both on one machine).
#[cfg(target_arch = "x86_64")]
fn one_stream() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("CX_KERNELS_ONE_STREAM").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => amd(),
    })
}

/// The CPU's vendor is AMD (`cpuid` leaf 0: "AuthenticAMD").
#[cfg(target_arch = "x86_64")]
fn amd() -> bool {
    let id = std::arch::x86_64::__cpuid(0);
    let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    vendor == b"AuthenticAMD"
}

/// `out[i*n + j] += Σ_{k<k_len} x[i*x_stride + k] · w[j*w_stride + k]`.
///
/// Shapes: `x` is `m × k_len` with row stride `x_stride`, `w` is `n × k_len` with row stride
/// `w_stride`, `out` is dense `m × n`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn nt_accumulate(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k_len: usize,
    out: &mut [f32],
    mode: Mode,
) {
    nt_accumulate_blocked(x, x_stride, m, w, w_stride, n, k_len, out, mode, KC)
}

/// [`nt_accumulate`] with reduction blocks of `kc` instead of [`KC`]: other bits, so only for
/// products outside the determinism contract (the Freivalds check, whose thin `w` should stay
/// in L1 with the block of `x`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn nt_accumulate_blocked(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: &[f32],
    w_stride: usize,
    n: usize,
    k_len: usize,
    out: &mut [f32],
    mode: Mode,
    kc: usize,
) {
    if m == 0 || n == 0 || k_len == 0 {
        return;
    }
    assert!(
        x.len() >= (m - 1) * x_stride + k_len,
        "nt_accumulate: x too short"
    );
    assert!(
        w.len() >= (n - 1) * w_stride + k_len,
        "nt_accumulate: w too short"
    );
    assert!(out.len() >= m * n, "nt_accumulate: out too short");
    #[cfg(target_arch = "x86_64")]
    {
        if mode == Mode::Fast && x86::has_fma() && x86::has_avx512f() && !no_avx512() {
            // SAFETY: AVX2, FMA and AVX-512F were detected at run time.
            return unsafe { x86::nt_fma_avx512(x, x_stride, m, w, w_stride, n, k_len, out, kc) };
        }
        if mode == Mode::Fast && x86::has_fma() {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { x86::nt_fma(x, x_stride, m, w, w_stride, n, k_len, out, kc) };
        }
        if x86::has_avx512f() && !no_avx512() {
            // SAFETY: AVX2 and AVX-512F were detected at run time. The same lane arithmetic as
            // `nt_nofma`, two columns per register.
            return unsafe { x86::nt_nofma_avx512(x, x_stride, m, w, w_stride, n, k_len, out, kc) };
        }
        if x86::has_avx2() {
            // SAFETY: AVX2 was detected at run time. Without FMA the arithmetic is exactly the
            // portable path's (Rust never contracts `a + b * c`), only wider.
            return unsafe { x86::nt_nofma(x, x_stride, m, w, w_stride, n, k_len, out, kc) };
        }
    }
    // Portable path: fused multiply-add only where the target is known to have it in hardware
    // (a software `fmaf` would be slower than anything).
    if mode == Mode::Fast && cfg!(target_feature = "fma") {
        nt_generic::<true>(x, x_stride, m, w, w_stride, n, k_len, out, kc)
    } else {
        nt_generic::<false>(x, x_stride, m, w, w_stride, n, k_len, out, kc)
    }
}

/// A weight matrix that [`nt_accumulate_widened`] widens to `f32` in registers as it reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Widened<'a> {
    /// Rows of `k` bf16 elements, row-major.
    Bf16(&'a [half::bf16]),
    /// Rows of `k` f16 elements, row-major.
    F16(&'a [half::f16]),
    /// ggml's blocks.
    Quant(&'a crate::QuantMatrix),
}

/// `out[i*n + j] += Σ_{c<k} x[i*x_stride + c] · w[j0 + j][c]` for `i < m`, `j < n`: the bits
/// of [`nt_accumulate`] on `w`'s rows widened to `f32`, without writing them anywhere (a
/// quantized row is reduced whole: `k` is its `d_in`). `false`, touching nothing, where this
/// CPU has no such kernel (no AVX2 and F16C): the caller widens into a panel instead.
#[allow(clippy::too_many_arguments)]
pub(crate) fn nt_accumulate_widened(
    x: &[f32],
    x_stride: usize,
    m: usize,
    w: Widened<'_>,
    j0: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    mode: Mode,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::widen::nt(x, x_stride, m, w, j0, n, k, out, mode, KC)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, x_stride, m, w, j0, n, k, out, mode);
        false
    }
}

/// `y[i][j] += scale · Σ_k v[i][k] · bt[k][j]` for `i < rows`, the reduction over `k` in
/// ascending order.
///
/// Shapes: `v` is `rows × rank`, `bt` is `rank × d_out`, `y` is `rows × d_out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn expand_rows<T: crate::Element>(
    v: &[f32],
    bt: &[T],
    rank: usize,
    d_out: usize,
    scale: f32,
    y: &mut [f32],
    rows: usize,
    mode: Mode,
) {
    assert!(v.len() >= rows * rank && bt.len() >= rank * d_out && y.len() >= rows * d_out);
    #[cfg(target_arch = "x86_64")]
    {
        if mode == Mode::Fast && x86::has_fma() {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { x86::expand_fma(v, bt, rank, d_out, scale, y, rows) };
        }
        if x86::has_avx2() {
            // SAFETY: AVX2 was detected at run time.
            return unsafe { x86::expand_nofma(v, bt, rank, d_out, scale, y, rows) };
        }
    }
    if mode == Mode::Fast && cfg!(target_feature = "fma") {
        expand_generic::<T, true>(v, bt, rank, d_out, scale, y, rows)
    } else {
        expand_generic::<T, false>(v, bt, rank, d_out, scale, y, rows)
    }
}

/// `out[t][c] += Σ_j r[t][j] · w[j][c]` for `t < k`, `c < cols`: a thin product whose
/// reduction runs down the rows of `w` (the Freivalds `Rᵀ·W`).
///
/// Shapes: `r` is `k × p` with `k` a multiple of [`TN_ROUNDS`], `w` is `p × cols` with row
/// stride `w_stride`, `out` is dense `k × cols`. Blocks of `w` are first packed (and widened)
/// into contiguous `f32`: walking a strip of a wide matrix row by row would touch a new page
/// per row and miss the TLB on every load.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tn_accumulate<T: crate::Element>(
    r: &[f32],
    k: usize,
    p: usize,
    w: &[T],
    w_stride: usize,
    cols: usize,
    out: &mut [f32],
    packed: &mut Vec<f32>,
    mode: Mode,
) {
    assert!(k.is_multiple_of(TN_ROUNDS) && r.len() >= k * p && out.len() >= k * cols);
    if p == 0 || cols == 0 {
        return;
    }
    assert!(
        w.len() >= (p - 1) * w_stride + cols,
        "tn_accumulate: w too short"
    );
    let mut j0 = 0;
    while j0 < p {
        let rows = TN_ROWS.min(p - j0);
        packed.clear();
        for j in j0..j0 + rows {
            packed.extend(
                w[j * w_stride..j * w_stride + cols]
                    .iter()
                    .map(|v| v.to_f32()),
            );
        }
        tn_block(&r[j0..], p, k, rows, packed, cols, out, mode);
        j0 += rows;
    }
}

#[allow(clippy::too_many_arguments)]
fn tn_block(
    r: &[f32],
    r_stride: usize,
    k: usize,
    p: usize,
    w: &[f32],
    cols: usize,
    out: &mut [f32],
    mode: Mode,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if mode == Mode::Fast && x86::has_fma() {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { x86::tn_fma(r, r_stride, k, p, w, cols, out) };
        }
        if x86::has_avx2() {
            // SAFETY: AVX2 was detected at run time.
            return unsafe { x86::tn_nofma(r, r_stride, k, p, w, cols, out) };
        }
    }
    if mode == Mode::Fast && cfg!(target_feature = "fma") {
        tn_generic::<true>(r, r_stride, k, p, w, cols, out)
    } else {
        tn_generic::<false>(r, r_stride, k, p, w, cols, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{UniformVec, seeded};

    /// Deterministic mode promises the same bits on every CPU: the AVX2 build of the kernels
    /// (what `nt_accumulate` dispatches to here) must match the portable one bit for bit.
    #[test]
    fn deterministic_dispatch_matches_portable_kernels_bitwise() {
        let mut rng = seeded(81);
        // Every row-group and column-remainder shape of the AVX2 `nt` tiling, reductions of
        // whole lanes, with a ragged tail, and over several blocks with a ragged last one.
        for (m, n, k) in [
            (7, 5, 1300),
            (1, 9, 8),
            (2, 7, 13),
            (3, 3, 1024),
            (9, 11, 517),
            // Past the row count up to which the x86 kernels put column tiles outermost.
            (261, 11, 600),
        ] {
            let x = rng.vec_f32(m * k, 1.0);
            let w = rng.vec_f32(n * k, 1.0);
            let mut dispatched = vec![0f32; m * n];
            nt_accumulate(&x, k, m, &w, k, n, k, &mut dispatched, Mode::Deterministic);
            let mut portable = vec![0f32; m * n];
            nt_generic::<false>(&x, k, m, &w, k, n, k, &mut portable, KC);
            assert_eq!(dispatched, portable, "m {m} n {n} k {k}");
        }

        let (rows, rank, d_out) = (3, 13, 77);
        let v = rng.vec_f32(rows * rank, 1.0);
        let bt: Vec<half::bf16> = rng
            .vec_f32(rank * d_out, 1.0)
            .into_iter()
            .map(half::bf16::from_f32)
            .collect();
        let mut y_dispatched = rng.vec_f32(rows * d_out, 1.0);
        let mut y_portable = y_dispatched.clone();
        expand_rows(
            &v,
            &bt,
            rank,
            d_out,
            0.7,
            &mut y_dispatched,
            rows,
            Mode::Deterministic,
        );
        expand_generic::<half::bf16, false>(&v, &bt, rank, d_out, 0.7, &mut y_portable, rows);
        assert_eq!(y_dispatched, y_portable);
    }

    /// The AVX-512 kernels (two columns per register) must give the AVX2 ones' bits, fused and
    /// not, on every row-group and column-remainder shape.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn deterministic_avx512_matches_avx2_bitwise() {
        if !x86::has_avx512f() {
            return;
        }
        let mut rng = seeded(84);
        for (m, n, k) in [
            (1, 32, 512),
            (8, 32, 1300),
            (3, 13, 517),
            (2, 9, 8),
            (5, 7, 13),
            (4, 4, 1024),
            // Several column tiles with a ragged last one, over several blocks.
            (6, 19, 1100),
            (261, 11, 600),
            // Groups of five to eight rows (four columns per pass), alone and after a full one.
            (7, 21, 1030),
            (12, 17, 700),
        ] {
            let x = rng.vec_f32(m * k, 1.0);
            let w = rng.vec_f32(n * k, 1.0);
            let mut wide = vec![0f32; m * n];
            let mut narrow = vec![0f32; m * n];
            // SAFETY: AVX2 and AVX-512F were detected above.
            unsafe {
                x86::nt_nofma_avx512(&x, k, m, &w, k, n, k, &mut wide, KC);
                x86::nt_nofma(&x, k, m, &w, k, n, k, &mut narrow, KC);
            }
            assert_eq!(wide, narrow, "m {m} n {n} k {k}");
            if x86::has_fma() {
                let mut wide = vec![0f32; m * n];
                let mut narrow = vec![0f32; m * n];
                // SAFETY: AVX2, FMA and AVX-512F were detected above.
                unsafe {
                    x86::nt_fma_avx512(&x, k, m, &w, k, n, k, &mut wide, KC);
                    x86::nt_fma(&x, k, m, &w, k, n, k, &mut narrow, KC);
                }
                assert_eq!(wide, narrow, "fused: m {m} n {n} k {k}");
            }
        }
    }

    /// The fast mode's AVX2 `nt` kernel is hand-written too: with FMA on the CPU it must give
    /// the portable fused kernel's bits (a fused multiply-add is exactly rounded everywhere).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fast_dispatch_matches_portable_fused_kernel_bitwise() {
        if !x86::has_fma() {
            return;
        }
        let mut rng = seeded(83);
        for (m, n, k) in [(7, 5, 1300), (1, 9, 8), (2, 7, 13), (4, 2, 600)] {
            let x = rng.vec_f32(m * k, 1.0);
            let w = rng.vec_f32(n * k, 1.0);
            let mut dispatched = vec![0f32; m * n];
            nt_accumulate(&x, k, m, &w, k, n, k, &mut dispatched, Mode::Fast);
            let mut portable = vec![0f32; m * n];
            nt_generic::<true>(&x, k, m, &w, k, n, k, &mut portable, KC);
            assert_eq!(dispatched, portable, "m {m} n {n} k {k}");
        }
    }

    #[test]
    fn thin_transposed_product_matches_reference() {
        let mut rng = seeded(82);
        let (k, p, cols, stride) = (10, 300, 37, 50);
        let r: Vec<f32> = (0..k * p)
            .map(|i| ((i * 7) % 3 == 0) as u8 as f32)
            .collect();
        let w = rng.vec_f32(p * stride, 1.0);
        let mut out = vec![0f32; k * cols];
        let mut packed = Vec::new();
        tn_accumulate(
            &r,
            k,
            p,
            &w,
            stride,
            cols,
            &mut out,
            &mut packed,
            Mode::Fast,
        );
        for t in 0..k {
            for c in 0..cols {
                let want: f64 = (0..p)
                    .map(|j| f64::from(r[t * p + j]) * f64::from(w[j * stride + c]))
                    .sum();
                assert!(
                    (f64::from(out[t * cols + c]) - want).abs() < 1e-4,
                    "t {t} c {c}"
                );
            }
        }
    }
}
