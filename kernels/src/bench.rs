//! Benchmark figures as plain functions returning numbers; the provider's CLI prints them.
//!
//! Times are medians over `repeats` runs after one warm-up run, in seconds, wall clock.

pub mod matmul;

use std::cell::RefCell;
use std::time::Instant;

use crate::cpu::CpuConfig;
use crate::element::Element;
use crate::error::Result;
use crate::freivalds::{DEFAULT_REL_TOL, FreivaldsSketch};
use crate::gemm::gemm_xwt;
use crate::rng::{UniformVec, seeded};
use crate::sgmv::{LoraAdapter, Segment, sgmv};

/// Shape of an SGMV benchmark: one `d_in → d_out` projection, `tokens` rows spread evenly over
/// `adapters` distinct adapters of rank `rank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SgmvShape {
    /// Input features.
    pub d_in: usize,
    /// Output features.
    pub d_out: usize,
    /// Rows in the batch.
    pub tokens: usize,
    /// Distinct adapters (one segment each).
    pub adapters: usize,
    /// Rank of every adapter.
    pub rank: usize,
}

impl SgmvShape {
    /// The prefill case the provider reports: 4096×4096, rank 16, 256 tokens, 32 adapters.
    pub fn prefill() -> Self {
        Self {
            d_in: 4096,
            d_out: 4096,
            tokens: 256,
            adapters: 32,
            rank: 16,
        }
    }
    /// The decode case: 32 tokens from 32 adapters.
    pub fn decode() -> Self {
        Self {
            tokens: 32,
            ..Self::prefill()
        }
    }
}

/// Measured base GEMM and SGMV times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgmvFigures {
    /// Median seconds of the base `y = x·Wᵀ`.
    pub base_s: f64,
    /// Median seconds of the SGMV that adds the adapters' deltas.
    pub sgmv_s: f64,
    /// `(base + sgmv) / base`; the target at the prefill shape is ≤ 1.10.
    pub overhead: f64,
    /// `(base weight bytes + adapter bytes) / base weight bytes`: the ratio a purely
    /// memory-bound implementation could not beat (decode's floor).
    pub bytes_floor: f64,
    /// Base GEMM throughput, `2·m·d_in·d_out / base_s`, in GFLOP/s.
    pub base_gflops: f64,
}

/// Median of `repeats` timed runs of `f` after one warm-up.
pub fn median_seconds(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..repeats.max(1)).map(|_| seconds(&mut f)).collect();
    median(&mut times)
}

/// Medians of `repeats` runs of `a` and `b`, alternating `a, b, a, b, …` after one warm-up of
/// each, so that a change in machine load during the measurement hits both alike: the ratio
/// of the two is what the figures report.
pub fn interleaved_median_seconds(
    repeats: usize,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (f64, f64) {
    a();
    b();
    let mut times_a = Vec::with_capacity(repeats);
    let mut times_b = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        times_a.push(seconds(&mut a));
        times_b.push(seconds(&mut b));
    }
    (median(&mut times_a), median(&mut times_b))
}

fn seconds(f: &mut impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Random adapters and evenly sized segments for `shape` (seeded).
pub fn random_batch<T: Element>(
    shape: &SgmvShape,
    seed: u64,
) -> (Vec<LoraAdapter<T>>, Vec<Segment>) {
    let mut rng = seeded(seed);
    let adapters: Vec<LoraAdapter<T>> = (0..shape.adapters)
        .map(|_| {
            let a: Vec<T> = rng
                .vec_f32(shape.rank * shape.d_in, 0.05)
                .into_iter()
                .map(T::from_f32)
                .collect();
            let b: Vec<T> = rng
                .vec_f32(shape.d_out * shape.rank, 0.05)
                .into_iter()
                .map(T::from_f32)
                .collect();
            LoraAdapter::from_peft(
                &a,
                &b,
                shape.rank,
                shape.d_in,
                shape.d_out,
                2.0 * shape.rank as f32,
            )
            .expect("shapes are consistent by construction")
        })
        .collect();
    let per = shape.tokens / shape.adapters.max(1);
    let extra = shape.tokens % shape.adapters.max(1);
    let mut segments = Vec::new();
    let mut start = 0;
    for a in 0..shape.adapters {
        let len = per + usize::from(a < extra);
        if len > 0 {
            segments.push(Segment {
                start,
                len,
                adapter: a,
            });
        }
        start += len;
    }
    (adapters, segments)
}

/// Times the base GEMM and the SGMV at `shape` with weights of type `T` (f32 activations).
pub fn sgmv_overhead<T: Element>(
    shape: &SgmvShape,
    repeats: usize,
    config: &CpuConfig,
) -> Result<SgmvFigures> {
    let mut rng = seeded(7);
    let x = rng.vec_f32(shape.tokens * shape.d_in, 1.0);
    let w: Vec<T> = rng
        .vec_f32(shape.d_out * shape.d_in, 0.02)
        .into_iter()
        .map(T::from_f32)
        .collect();
    let (adapters, segments) = random_batch::<T>(shape, 11);
    let table: Vec<&LoraAdapter<T>> = adapters.iter().collect();
    let mut y_base = vec![0f32; shape.tokens * shape.d_out];
    let mut y_lora = vec![0f32; shape.tokens * shape.d_out];
    let error = RefCell::new(None);
    let (base_s, sgmv_s) = interleaved_median_seconds(
        repeats,
        || {
            let (m, d_in, d_out) = (shape.tokens, shape.d_in, shape.d_out);
            if let Err(e) = gemm_xwt(&x, &w, &mut y_base, m, d_in, d_out, config) {
                *error.borrow_mut() = Some(e);
            }
        },
        || {
            if let Err(e) = sgmv(
                &x,
                &mut y_lora,
                shape.d_in,
                shape.d_out,
                &segments,
                &table,
                config,
            ) {
                *error.borrow_mut() = Some(e);
            }
        },
    );
    if let Some(e) = error.into_inner() {
        return Err(e);
    }
    let base_bytes = (w.len() * std::mem::size_of::<T>()) as f64;
    let adapter_bytes: usize = adapters.iter().map(LoraAdapter::weight_bytes).sum();
    Ok(SgmvFigures {
        base_s,
        sgmv_s,
        overhead: (base_s + sgmv_s) / base_s,
        bytes_floor: (base_bytes + adapter_bytes as f64) / base_bytes,
        base_gflops: 2.0 * (shape.tokens * shape.d_in * shape.d_out) as f64 / base_s / 1e9,
    })
}

/// Measured cost of a Freivalds check relative to the product it checks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FreivaldsFigures {
    /// Median seconds of `y = x·Wᵀ`.
    pub gemm_s: f64,
    /// Median seconds of one `rounds`-round check with the verifier's sketch of `W` kept
    /// ([`crate::FreivaldsSketch::check`]: `x·(Wᵀ·R)` and `y·R`).
    pub check_s: f64,
    /// `check_s / gemm_s`; the target for 20 rounds is ≤ 0.015.
    pub overhead: f64,
    /// Median seconds to build the sketch (`Wᵀ·R`, once per weight matrix and secret).
    pub sketch_s: f64,
    /// `sketch_s / gemm_s`: the one-off cost, spread over every product checked against `W`.
    pub sketch_overhead: f64,
    /// `(sketch_s + check_s) / gemm_s`: a check that builds a fresh sketch for one product
    /// ([`crate::freivalds_check_xwt`]).
    pub fresh_overhead: f64,
    /// The honest product passed every time (it must).
    pub accepted: bool,
}

/// Times `y = x·Wᵀ` (`m × d_in` by `d_out × d_in`, f32), building a `rounds`-round
/// Freivalds sketch of `W`, and checking the product with it.
pub fn freivalds_overhead(
    m: usize,
    d_in: usize,
    d_out: usize,
    rounds: usize,
    repeats: usize,
    config: &CpuConfig,
) -> Result<FreivaldsFigures> {
    let mut rng = seeded(3);
    let x = rng.vec_f32(m * d_in, 1.0);
    let w = rng.vec_f32(d_out * d_in, 0.02);
    let mut y = vec![0f32; m * d_out];
    gemm_xwt(&x, &w, &mut y, m, d_in, d_out, config)?;
    let sketch = FreivaldsSketch::new(&w, d_in, d_out, rounds, 1, config)?;
    let mut y_timed = vec![0f32; m * d_out];
    let error = RefCell::new(None);
    let mut accepted = true;
    let gemm = |y_out: &mut [f32]| {
        if let Err(e) = gemm_xwt(&x, &w, y_out, m, d_in, d_out, config) {
            *error.borrow_mut() = Some(e);
        }
    };
    // A check is ~1 % of the product: time several per sample so that timer and scheduling
    // noise do not dominate it.
    const CHECKS_PER_SAMPLE: usize = 10;
    let (gemm_s, check_s) = interleaved_median_seconds(
        repeats,
        || gemm(&mut y_timed),
        || {
            for _ in 0..CHECKS_PER_SAMPLE {
                match sketch.check(&x, &y, m, DEFAULT_REL_TOL, config) {
                    Ok(report) => accepted &= report.accepted,
                    Err(e) => *error.borrow_mut() = Some(e),
                }
            }
        },
    );
    let check_s = check_s / CHECKS_PER_SAMPLE as f64;
    let mut seed = 1;
    let (_, sketch_s) = interleaved_median_seconds(
        repeats,
        || gemm(&mut y_timed),
        || {
            seed += 1;
            if let Err(e) = FreivaldsSketch::new(&w, d_in, d_out, rounds, seed, config) {
                *error.borrow_mut() = Some(e);
            }
        },
    );
    if let Some(e) = error.into_inner() {
        return Err(e);
    }
    Ok(FreivaldsFigures {
        gemm_s,
        check_s,
        overhead: check_s / gemm_s,
        sketch_s,
        sketch_overhead: sketch_s / gemm_s,
        fresh_overhead: (sketch_s + check_s) / gemm_s,
        accepted,
    })
}
