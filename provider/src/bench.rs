//! The figures of `cx-provider bench lora`: what batched multi-adapter serving costs.
//!
//! * `sgmv_overhead` — (base GEMM + SGMV) / base GEMM, 4096×4096, rank 16, 256 tokens from 32
//!   adapters (cx-kernels' [`cx_kernels::bench::sgmv_overhead`]); target ≤ 1.10.
//! * `sgmv_overhead_decode` — the same for 32 tokens from 32 adapters, beside
//!   `sgmv_overhead_decode_floor`, the bound set by reading the adapters' bytes on top of the
//!   base weights; target ≤ 1.1 × floor.
//! * `hetero_vs_base` — decode tokens/s of 32 sequences with 32 distinct rank-16 adapters over
//!   the same batch with no adapter, full model forward; target ≥ 0.85.
//! * `batched_vs_sequential` — the same 32 adapted sequences in one batch vs one at a time,
//!   beside `batched_vs_sequential_bound`, what this machine allows: one sequence at a time
//!   reads every weight per token (bound by the one-row GEMV bandwidth, `gemv_gbps`), a batch
//!   of 32 reads them once and is bound by the larger of that read and its FLOPs at the GEMM
//!   rate (`base_gemm_gflops`), so the bound is `min(32, 2·FLOP/s ÷ bytes/s)` for `f32`
//!   weights (32 tokens alone read `32·4P` bytes; together they need `64P` FLOPs). Target ≥ 0.8 of the bound (the fixed 8× of earlier targets came from GPUs, whose
//!   FLOP/s-to-bandwidth ratio is far above a CPU's).
//! * `resident_adapters` vs `resident_expected` — adapters a byte budget holds after a stream
//!   of loads vs budget / adapter size (SPEC §5); target within 5 %.
//! * `freivalds_overhead` — 20 rounds over the 256×4096×4096 product they check; target ≤ 1.5 %.
//! * `step_overhead_ms` — the fixed cost of a batch-1 decode step through the whole engine
//!   (scheduler thread, forward, next-token choice, text, event channel) on a tiny model whose
//!   arithmetic is negligible; `single_stream_tokens_per_s` — one stream's decode rate through
//!   the engine on the hidden-512 model of the side-by-side comparisons. Both catch fixed-cost
//!   regressions without llama.cpp (`provider/bench/llama_cpp.py` is the comparison itself).
//!
//! And the figures of `cx-provider bench train` ([`train`]): `forward_backward` tokens/s at a
//! stated model size and rank, the AdamW step's time, a client's peak memory, and one training
//! step against three forward passes, the usual cost of forward + backward.
//!
//! And those of `cx-provider bench prefix` ([`prefix()`]): a continuation's time to first token with
//! its conversation prefix held and without, at a few prefix lengths.
//!
//! And those of `cx-provider bench real --model DIR` ([`real()`]): a real checkpoint's prefill and
//! decode tokens/s at batch 1 and 8, beside the bound reading its weights sets.

mod perplexity;
mod prefix;
mod real;

pub use perplexity::{PerplexityFigures, PerplexityOptions, perplexity};
pub use prefix::{PrefixBenchOptions, PrefixFigures, PrefixRow, prefix};
pub use real::{RealBenchOptions, RealFigures, RealRow, real};

pub use cx_kernels::bench::matmul::{MatmulBenchOptions, MatmulFigures, MatmulSize, matmul};

/// `cx-provider bench matmul --json`'s object: every figure of [`MatmulFigures`] by name.
pub fn matmul_json(figures: &MatmulFigures) -> serde_json::Value {
    let sizes: Vec<serde_json::Value> = figures
        .sizes
        .iter()
        .map(|s| {
            serde_json::json!({
                "n": s.n,
                "product_s": s.product_s,
                "product_gflops": s.product_gflops,
                "check_s": s.check_s,
                "rounds_s": s.rounds_s,
                "check_vs_product": s.check_vs_product,
                "rounds_vs_product": s.rounds_vs_product,
                "flop_ratio_bound": s.flop_ratio_bound,
                "rounds_gflops": s.rounds_gflops,
                "accepted": s.accepted,
            })
        })
        .collect();
    serde_json::json!({"rounds": figures.rounds, "threads": figures.threads, "sizes": sizes})
}

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cx_kernels::CpuConfig;
use cx_kernels::bench::{SgmvShape, freivalds_overhead, median_seconds, sgmv_overhead};
use serde::Serialize;

use crate::cache::{CacheConfig, EvictionPolicy, ResidencyCache};
use crate::error::Result;
use crate::lora::{Adapter, load_adapter, write_random_adapter};
use crate::model::{
    DType, GenModelOptions, KvCache, Model, ModelConfig, Projection, SeqInput, generated_config,
    generated_tensors,
};

/// A prefilled sequence and its adapter.
type Sequence = (KvCache, Option<Arc<Adapter>>);

/// How to run the benchmark.
#[derive(Clone, Copy, Debug)]
pub struct LoraBenchOptions {
    /// Timed repeats per figure (median).
    pub repeats: usize,
    /// Kernel threads and mode.
    pub cpu: CpuConfig,
    /// Small shapes for a smoke run.
    pub quick: bool,
}

/// The figures, as `--json` prints them.
#[derive(Clone, Debug, Serialize)]
pub struct LoraFigures {
    /// Kernel threads.
    pub threads: usize,
    /// Kernel mode.
    pub mode: String,
    /// Whether this was a `--quick` run (not the reported shapes).
    pub quick: bool,
    /// (base GEMM + SGMV) / base GEMM at the prefill shape.
    pub sgmv_overhead: f64,
    /// Base GEMM GFLOP/s at the prefill shape.
    pub base_gemm_gflops: f64,
    /// The same at the decode shape.
    pub sgmv_overhead_decode: f64,
    /// (base bytes + adapter bytes) / base bytes at the decode shape.
    pub sgmv_overhead_decode_floor: f64,
    /// Decode tokens/s with 32 distinct adapters over no adapter.
    pub hetero_vs_base: f64,
    /// Decode tokens/s, 32 sequences, 32 distinct adapters.
    pub hetero_tokens_per_s: f64,
    /// Decode tokens/s, 32 sequences, no adapter.
    pub base_tokens_per_s: f64,
    /// One batch over one sequence at a time (same 32 adapted sequences).
    pub batched_vs_sequential: f64,
    /// Decode tokens/s one sequence at a time.
    pub sequential_tokens_per_s: f64,
    /// The most `batched_vs_sequential` can be on this machine (see the module doc).
    pub batched_vs_sequential_bound: f64,
    /// `batched_vs_sequential / batched_vs_sequential_bound`; target ≥ 0.8.
    pub batched_vs_sequential_of_bound: f64,
    /// One-row `x·Wᵀ` (GEMV) bandwidth over the weight, GB/s: the best of cx-kernels' GEMM
    /// and candle's matmul at one row, on a weight larger than the caches.
    pub gemv_gbps: f64,
    /// The model of the forward figures (hidden, intermediate, layers, heads, kv heads).
    pub forward_model: [usize; 5],
    /// Adapters resident after the load stream.
    pub resident_adapters: usize,
    /// Budget / adapter bytes.
    pub resident_expected: f64,
    /// `|resident − expected| / expected`.
    pub residency_error: f64,
    /// The fixed cost of one decode step at batch 1, ms: a step of one sequence through the
    /// engine (scheduler thread, forward, next-token choice, text, event channel) on a model so
    /// small (`step_overhead_model`) that its arithmetic is a few microseconds. What a user
    /// comparing single-stream speed with llama.cpp sees on small models.
    pub step_overhead_ms: f64,
    /// The tiny model of `step_overhead_ms` (hidden, intermediate, layers, heads, kv heads,
    /// vocab).
    pub step_overhead_model: [usize; 6],
    /// Decode tokens/s of one stream through the engine, no adapter (`single_stream_model`).
    pub single_stream_tokens_per_s: f64,
    /// The model of `single_stream_tokens_per_s` (as `step_overhead_model`): the side-by-side
    /// comparisons' hidden-512 model (smaller with `--quick`).
    pub single_stream_model: [usize; 6],
    /// Freivalds (20 rounds) time over the product's time.
    pub freivalds_overhead: f64,
    /// The honest product passed every check.
    pub freivalds_accepted: bool,
}

impl LoraFigures {
    /// A human table.
    pub fn table(&self) -> String {
        let rows: Vec<(&str, String, &str)> = vec![
            (
                "sgmv_overhead",
                format!("{:.4}", self.sgmv_overhead),
                "≤ 1.10",
            ),
            (
                "base_gemm_gflops",
                format!("{:.1}", self.base_gemm_gflops),
                "",
            ),
            (
                "sgmv_overhead_decode",
                format!("{:.4}", self.sgmv_overhead_decode),
                "≤ 1.1 × floor",
            ),
            (
                "sgmv_overhead_decode_floor",
                format!("{:.4}", self.sgmv_overhead_decode_floor),
                "",
            ),
            (
                "hetero_vs_base",
                format!("{:.4}", self.hetero_vs_base),
                "≥ 0.85",
            ),
            (
                "hetero_tokens_per_s",
                format!("{:.1}", self.hetero_tokens_per_s),
                "",
            ),
            (
                "base_tokens_per_s",
                format!("{:.1}", self.base_tokens_per_s),
                "",
            ),
            (
                "batched_vs_sequential",
                format!("{:.2}", self.batched_vs_sequential),
                "≥ 0.8 × bound",
            ),
            (
                "batched_vs_sequential_bound",
                format!("{:.2}", self.batched_vs_sequential_bound),
                "",
            ),
            ("gemv_gbps", format!("{:.2}", self.gemv_gbps), ""),
            (
                "sequential_tokens_per_s",
                format!("{:.1}", self.sequential_tokens_per_s),
                "",
            ),
            (
                "step_overhead_ms",
                format!("{:.3}", self.step_overhead_ms),
                "",
            ),
            (
                "single_stream_tokens_per_s",
                format!("{:.1}", self.single_stream_tokens_per_s),
                "",
            ),
            ("resident_adapters", self.resident_adapters.to_string(), ""),
            (
                "resident_expected",
                format!("{:.2}", self.resident_expected),
                "within 5 %",
            ),
            (
                "freivalds_overhead",
                format!("{:.4}", self.freivalds_overhead),
                "≤ 0.015",
            ),
        ];
        let mut out = format!(
            "cx-provider bench lora ({} threads, {}{})\n",
            self.threads,
            self.mode,
            if self.quick { ", QUICK shapes" } else { "" }
        );
        out.push_str(&format!("{:<28} {:>12}  {}\n", "figure", "value", "target"));
        for (name, value, target) in rows {
            out.push_str(&format!("{name:<28} {value:>12}  {target}\n"));
        }
        out
    }
}

/// A temp directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("cx-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| crate::Error::io(&dir, e))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Generated adapters for `config`, written to `dir` and loaded back (distinct seeds, so
/// distinct ids).
fn adapters(
    dir: &std::path::Path,
    config: &ModelConfig,
    count: usize,
    rank: usize,
    seed: u64,
) -> Result<Vec<Arc<Adapter>>> {
    (0..count)
        .map(|i| {
            let path = dir.join(format!("a{seed}-{i}"));
            write_random_adapter(
                &path,
                config,
                rank,
                &Projection::ALL,
                0.5 / rank as f32,
                seed + i as u64,
            )?;
            Ok(Arc::new(load_adapter(&path, config, usize::MAX)?))
        })
        .collect()
}

/// Median seconds of `steps` decode steps over `groups` (each group one forward batch),
/// starting every repeat from the same prefilled caches.
fn decode_seconds(
    model: &Model,
    groups: &[Vec<Sequence>],
    steps: usize,
    repeats: usize,
) -> Result<f64> {
    let mut error = None;
    let seconds = median_seconds(repeats, || {
        for group in groups {
            let mut caches: Vec<KvCache> = group.iter().map(|(c, _)| c.clone()).collect();
            for step in 0..steps {
                let token = [(65 + step % 26) as u32];
                let mut inputs: Vec<SeqInput<'_>> = caches
                    .iter_mut()
                    .zip(group)
                    .map(|(cache, (_, adapter))| SeqInput {
                        tokens: &token,
                        cache,
                        adapter: adapter.as_deref(),
                    })
                    .collect();
                if let Err(e) = model.forward(&mut inputs) {
                    error = Some(e);
                }
            }
        }
    });
    match error {
        Some(e) => Err(e),
        None => Ok(seconds),
    }
}

/// Prefills `sequences` with a short prompt each; returns (cache, adapter) per sequence.
fn prefill(model: &Model, adapters: &[Option<Arc<Adapter>>]) -> Result<Vec<Sequence>> {
    let mut out = Vec::new();
    for (i, adapter) in adapters.iter().enumerate() {
        let mut cache = KvCache::default();
        let prompt: Vec<u32> = (0..8).map(|k| (32 + (i * 7 + k) % 90) as u32).collect();
        model.forward(&mut [SeqInput {
            tokens: &prompt,
            cache: &mut cache,
            adapter: adapter.as_deref(),
        }])?;
        out.push((cache, adapter.clone()));
    }
    Ok(out)
}

/// One-row GEMV bandwidth, GB/s, over a `d_out × d_in` `f32` weight: the faster of
/// cx-kernels' GEMM (the class D path) and candle's matmul (fast mode's few-row path), so the
/// bound is what this machine can do, not what one kernel does.
fn gemv_gbps(d_in: usize, d_out: usize, repeats: usize, cpu: &CpuConfig) -> Result<f64> {
    let mut rng = cx_kernels::rng::seeded(17);
    use cx_kernels::rng::UniformVec;
    let w = rng.vec_f32(d_in * d_out, 0.1);
    let x = rng.vec_f32(d_in, 1.0);
    let mut y = vec![0f32; d_out];
    let mut failed = None;
    let ours = median_seconds(repeats, || {
        if let Err(e) = cx_kernels::gemm_xwt(&x, &w, &mut y, 1, d_in, d_out, cpu) {
            failed = Some(e);
        }
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    let device = candle_core::Device::Cpu;
    let wt = candle_core::Tensor::from_vec(w, (d_out, d_in), &device)?.t()?;
    let xt = candle_core::Tensor::from_vec(x, (1, d_in), &device)?;
    let mut failed = None;
    let theirs = median_seconds(repeats, || {
        if let Err(e) = xt.matmul(&wt) {
            failed = Some(e);
        }
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    let bytes = (d_in * d_out * 4) as f64;
    Ok(bytes / ours.min(theirs) / 1e9)
}

/// The shape of `o` as the figures state it (hidden, intermediate, layers, heads, kv heads,
/// vocab).
fn shape_of(o: &GenModelOptions) -> [usize; 6] {
    [
        o.hidden,
        o.intermediate,
        o.layers,
        o.heads,
        o.kv_heads,
        o.vocab,
    ]
}

/// Seconds per decoded token of one stream through a whole [`Engine`] over a model of shape
/// `o`: the time from the first token's event (after prefill) to the last, over the tokens in
/// between; the median of `repeats` requests of `new_tokens` each.
fn engine_stream_seconds_per_token(
    o: &GenModelOptions,
    cpu: CpuConfig,
    new_tokens: usize,
    repeats: usize,
) -> Result<f64> {
    use crate::engine::{Engine, EngineConfig, Event, GenerateRequest, Sampling};
    let config = generated_config(o)?;
    let model = Arc::new(Model::new(
        config.clone(),
        generated_tensors(&config, o.seed),
        cpu,
    )?);
    let engine = Engine::start(
        model,
        Arc::new(crate::tokenizer::Tokenizer::generated()),
        ResidencyCache::new(CacheConfig::new(1 << 30, EvictionPolicy::ValuePerByte)),
        EngineConfig::default(),
    );
    let mut per_token = Vec::new();
    // One untimed request first: the first step of a process pays for page faults and the
    // kernels' worker threads.
    for repeat in 0..=repeats {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        engine.submit(GenerateRequest {
            prompt: (0..8)
                .map(|k| (32 + (repeat * 5 + k) % 90) as u32)
                .collect(),
            adapter: None,
            max_tokens: new_tokens,
            stop: Vec::new(),
            sampling: Sampling::default(),
            events: tx,
            stream: true,
            conversation: None,
        });
        let (mut first, mut tokens) = (None, 0usize);
        loop {
            match rx.blocking_recv() {
                Some(Event::Text { .. }) => {
                    tokens += 1;
                    first.get_or_insert_with(Instant::now);
                }
                Some(Event::Done { .. }) => break,
                Some(Event::Failed(e)) => {
                    return Err(crate::Error::BadRequest(format!(
                        "bench lora: single stream: {e}"
                    )));
                }
                None => return Err(crate::Error::SchedulerStopped),
            }
        }
        if let (Some(first), true, true) = (first, tokens > 1, repeat > 0) {
            per_token.push(first.elapsed().as_secs_f64() / (tokens - 1) as f64);
        }
    }
    per_token.sort_by(f64::total_cmp);
    per_token.get(per_token.len() / 2).copied().ok_or_else(|| {
        crate::Error::BadRequest("bench lora: single stream: every request ended at once".into())
    })
}

/// Runs every figure.
pub fn lora(options: &LoraBenchOptions) -> Result<LoraFigures> {
    let cpu = options.cpu;
    let repeats = options.repeats.max(1);
    let (prefill_shape, decode_shape) = if options.quick {
        let small = SgmvShape {
            d_in: 1024,
            d_out: 1024,
            ..SgmvShape::prefill()
        };
        (
            small,
            SgmvShape {
                tokens: 32,
                ..small
            },
        )
    } else {
        (SgmvShape::prefill(), SgmvShape::decode())
    };
    let prefill_figures = sgmv_overhead::<f32>(&prefill_shape, repeats, &cpu)?;
    let decode_figures = sgmv_overhead::<f32>(&decode_shape, repeats, &cpu)?;

    // Full forward: a generated model wide enough that a 32-row decode step is compute-bound.
    let options_model = if options.quick {
        GenModelOptions {
            hidden: 256,
            layers: 2,
            heads: 8,
            kv_heads: 8,
            intermediate: 704,
            vocab: 512,
            max_positions: 256,
            tie: false,
            dtype: DType::F32,
            seed: 5,
        }
    } else {
        // Llama-3-8B's layer shapes (d = 4096, GQA 32/8, SwiGLU 14336 → 11008 here to keep
        // the bench's memory small), one layer: per-token adapter work is r·(d_in + d_out)
        // against d_in·d_out, so the width is what sets the adapters' share.
        GenModelOptions {
            hidden: 4096,
            layers: 1,
            heads: 32,
            kv_heads: 8,
            intermediate: 11008,
            vocab: 1024,
            max_positions: 256,
            tie: false,
            dtype: DType::F32,
            seed: 5,
        }
    };
    let config = generated_config(&options_model)?;
    let model = Model::new(config.clone(), generated_tensors(&config, 5), cpu)?;
    let tmp = TempDir::new("bench-lora")?;
    let batch_adapters = adapters(&tmp.0, &config, 32, 16, 100)?;
    let with: Vec<Option<Arc<Adapter>>> = batch_adapters.iter().cloned().map(Some).collect();
    let without: Vec<Option<Arc<Adapter>>> = vec![None; 32];
    let steps = 4;
    let hetero_group = prefill(&model, &with)?;
    let base_group = prefill(&model, &without)?;
    let hetero_s = decode_seconds(&model, std::slice::from_ref(&hetero_group), steps, repeats)?;
    let base_s = decode_seconds(&model, std::slice::from_ref(&base_group), steps, repeats)?;
    let singles: Vec<Vec<Sequence>> = hetero_group.iter().map(|s| vec![s.clone()]).collect();
    let sequential_s = decode_seconds(&model, &singles, steps, 1)?;
    let tokens = (32 * steps) as f64;
    let gemv = gemv_gbps(config.hidden_size, config.intermediate_size, repeats, &cpu)?;
    // 32 tokens one at a time read 32 × 4P bytes; one batch of 32 needs 64P FLOPs (and one
    // 4P read): the ratio is at most min(32, 2·FLOP/s ÷ bytes/s). See the module doc.
    let bound = (2.0 * prefill_figures.base_gflops / gemv).min(32.0);

    // Residency: a budget of 20.5 adapters, a stream of 40 distinct loads.
    let small = generated_config(&GenModelOptions {
        hidden: 128,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 256,
        vocab: 300,
        max_positions: 64,
        tie: true,
        dtype: DType::F32,
        seed: 1,
    })?;
    let stream = adapters(&tmp.0, &small, 40, 16, 1000)?;
    let size = stream[0].bytes();
    let budget = size * 41 / 2;
    let mut cache = ResidencyCache::new(CacheConfig::new(budget, EvictionPolicy::ValuePerByte));
    let t0 = Instant::now();
    for adapter in &stream {
        let now = t0.elapsed().as_secs_f64();
        let _ = cache.lookup(adapter.id(), now);
        cache.insert(adapter.clone(), false, now)?;
    }
    let resident = cache.stats().resident_adapters;
    let expected = budget as f64 / size as f64;

    // Single stream through the engine: the fixed cost of a step on a tiny model, and the
    // tokens/s of the side-by-side comparisons' model.
    let tiny = GenModelOptions {
        hidden: 64,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        intermediate: 176,
        vocab: 512,
        max_positions: 512,
        tie: false,
        dtype: DType::F32,
        seed: 3,
    };
    let stream_model = if options.quick {
        GenModelOptions {
            hidden: 256,
            layers: 2,
            heads: 8,
            kv_heads: 4,
            intermediate: 704,
            ..tiny
        }
    } else {
        GenModelOptions {
            hidden: 512,
            layers: 4,
            heads: 8,
            kv_heads: 4,
            intermediate: 1408,
            ..tiny
        }
    };
    let stream_repeats = repeats.max(3);
    let step_overhead_s = engine_stream_seconds_per_token(&tiny, cpu, 64, stream_repeats)?;
    let stream_s = engine_stream_seconds_per_token(&stream_model, cpu, 64, stream_repeats)?;

    let (m, d) = if options.quick {
        (64, 1024)
    } else {
        (256, 4096)
    };
    let freivalds = freivalds_overhead(m, d, d, 20, repeats, &cpu)?;

    Ok(LoraFigures {
        threads: cpu.threads,
        mode: format!("{:?}", cpu.mode),
        quick: options.quick,
        sgmv_overhead: prefill_figures.overhead,
        base_gemm_gflops: prefill_figures.base_gflops,
        sgmv_overhead_decode: decode_figures.overhead,
        sgmv_overhead_decode_floor: decode_figures.bytes_floor,
        hetero_vs_base: base_s / hetero_s,
        hetero_tokens_per_s: tokens / hetero_s,
        base_tokens_per_s: tokens / base_s,
        batched_vs_sequential: sequential_s / hetero_s,
        sequential_tokens_per_s: tokens / sequential_s,
        batched_vs_sequential_bound: bound,
        batched_vs_sequential_of_bound: sequential_s / hetero_s / bound,
        gemv_gbps: gemv,
        forward_model: [
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.kv_heads(),
        ],
        resident_adapters: resident,
        resident_expected: expected,
        residency_error: (resident as f64 - expected).abs() / expected,
        step_overhead_ms: step_overhead_s * 1e3,
        step_overhead_model: shape_of(&tiny),
        single_stream_tokens_per_s: 1.0 / stream_s,
        single_stream_model: shape_of(&stream_model),
        freivalds_overhead: freivalds.overhead,
        freivalds_accepted: freivalds.accepted,
    })
}

/// How to run `cx-provider bench train`.
#[derive(Clone, Copy, Debug)]
pub struct TrainBenchOptions {
    /// Timed repeats per figure (median).
    pub repeats: usize,
    /// Kernel threads (the serving forward; candle's matmul takes `RAYON_NUM_THREADS`).
    pub cpu: CpuConfig,
    /// Small shapes for a smoke run.
    pub quick: bool,
}

/// The figures of `cx-provider bench train`, as `--json` prints them.
///
/// * `forward_backward_tokens_per_s` — tokens of one `forward_backward` (forward, loss,
///   backward through every layer, gradients of A and B) over its median time.
/// * `step_over_three_forwards` — one training step (`forward_backward` + `optim_step`) over
///   three forward passes of the same batch in the same ops without a graph: the usual
///   bound, a backward pass costing about two forwards (≤ 1 is at the bound).
/// * `optim_step_s` — one AdamW step over every A and B.
/// * `peak_memory_bytes` — the process's peak resident set while one client is created and
///   runs one `forward_backward` and one `optim_step`, over its resident set before (Linux's
///   `VmHWM` after `clear_refs`; 0 where unavailable), beside `state_bytes` (parameters,
///   gradients, moments) and `activation_bytes_bound` (what the trainer reserves for the batch).
#[derive(Clone, Debug, Serialize)]
pub struct TrainFigures {
    /// Whether this was a `--quick` run.
    pub quick: bool,
    /// The model (hidden, intermediate, layers, heads, kv heads, vocab).
    pub model: [usize; 6],
    /// Base parameters.
    pub base_parameters: u64,
    /// LoRA rank (every projection adapted).
    pub rank: usize,
    /// Trainable parameters.
    pub trainable_parameters: u64,
    /// Sequences × tokens of the batch.
    pub batch: [usize; 2],
    /// Median seconds of one `forward_backward`.
    pub forward_backward_s: f64,
    /// Tokens per second of `forward_backward`.
    pub forward_backward_tokens_per_s: f64,
    /// Median seconds of the same forward without a graph (the loss only).
    pub forward_s: f64,
    /// Median seconds of one `optim_step`.
    pub optim_step_s: f64,
    /// `(forward_backward_s + optim_step_s) / (3 · forward_s)`; ≈ 1 is the usual bound.
    pub step_over_three_forwards: f64,
    /// Median seconds of the serving forward's prefill of the same batch with the adapter.
    pub serving_prefill_s: f64,
    /// Measured peak memory of one client and one step, bytes.
    pub peak_memory_bytes: u64,
    /// Parameters, gradients and both moments, bytes.
    pub state_bytes: u64,
    /// The trainer's reservation for the batch's activations, bytes.
    pub activation_bytes_bound: u64,
}

impl TrainFigures {
    /// A human table.
    pub fn table(&self) -> String {
        let [hidden, inner, layers, heads, kv_heads, vocab] = self.model;
        let mut out = format!(
            "cx-provider bench train{} — hidden {hidden}, intermediate {inner}, {layers} layers, \
             {heads}/{kv_heads} heads, vocab {vocab} ({:.1} M parameters); rank {} on every \
             projection ({:.2} M trainable); batch {} × {}\n",
            if self.quick { " (QUICK shapes)" } else { "" },
            self.base_parameters as f64 / 1e6,
            self.rank,
            self.trainable_parameters as f64 / 1e6,
            self.batch[0],
            self.batch[1],
        );
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
        let rows = [
            (
                "forward_backward_tokens_per_s",
                format!("{:.1}", self.forward_backward_tokens_per_s),
                "",
            ),
            (
                "forward_backward_s",
                format!("{:.4}", self.forward_backward_s),
                "",
            ),
            ("forward_s", format!("{:.4}", self.forward_s), ""),
            ("optim_step_s", format!("{:.5}", self.optim_step_s), ""),
            (
                "step_over_three_forwards",
                format!("{:.3}", self.step_over_three_forwards),
                "≈ 1 (backward ≈ 2 forwards)",
            ),
            (
                "serving_prefill_s",
                format!("{:.4}", self.serving_prefill_s),
                "",
            ),
            ("peak_memory", mib(self.peak_memory_bytes), ""),
            ("state", mib(self.state_bytes), ""),
            (
                "activation_bound",
                mib(self.activation_bytes_bound),
                "≥ peak − state",
            ),
        ];
        out.push_str(&format!("{:<30} {:>12}  {}\n", "figure", "value", "bound"));
        for (name, value, target) in rows {
            out.push_str(&format!("{name:<30} {value:>12}  {target}\n"));
        }
        out
    }
}

/// `VmHWM` and `VmRSS` of this process, bytes (Linux; `None` elsewhere).
fn memory_status() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// Runs `cx-provider bench train`.
pub fn train(options: &TrainBenchOptions) -> Result<TrainFigures> {
    use crate::training::{AdamWParams, LoraSpec, Precision, TrainingClient, activation_bytes};
    let repeats = options.repeats.max(1);
    let (model_options, rank, batch) = if options.quick {
        (
            GenModelOptions {
                hidden: 128,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                intermediate: 344,
                vocab: 512,
                max_positions: 256,
                tie: false,
                dtype: DType::F32,
                seed: 7,
            },
            8,
            [2, 32],
        )
    } else {
        (
            GenModelOptions {
                hidden: 512,
                layers: 4,
                heads: 8,
                kv_heads: 4,
                intermediate: 1376,
                vocab: 2048,
                max_positions: 512,
                tie: false,
                dtype: DType::F32,
                seed: 7,
            },
            16,
            [4, 128],
        )
    };
    let config = generated_config(&model_options)?;
    let model = Model::new(
        config.clone(),
        generated_tensors(&config, model_options.seed),
        options.cpu,
    )?;
    let base_parameters = model.parameters() as u64;
    let [sequences, len] = batch;
    let tokens: Vec<Vec<u32>> = (0..sequences)
        .map(|s| {
            (0..len)
                .map(|k| ((s * 31 + k * 7) % (config.vocab_size - 2)) as u32)
                .collect()
        })
        .collect();
    let mask: Vec<Vec<f32>> = (0..sequences)
        .map(|_| (0..len).map(|k| if k == 0 { 0.0 } else { 1.0 }).collect())
        .collect();
    let spec = LoraSpec {
        seed: 1,
        ..LoraSpec::new(rank, 2.0 * rank as f64, &Projection::ALL)
    };
    let adam = AdamWParams {
        lr: 1e-4,
        ..AdamWParams::default()
    };
    // A throwaway client first: thread pools and the matmul's packing buffers are the
    // process's, not a client's.
    {
        let mut warm = TrainingClient::new(&model, &spec, Precision::F32)?;
        warm.forward_backward(&tokens, &mask)?;
        warm.optim_step(&adam)?;
    }
    // The peak is measured over the client's creation and its first step only.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = memory_status();
    let mut client = TrainingClient::new(&model, &spec, Precision::F32)?;
    client.forward_backward(&tokens, &mask)?;
    client.optim_step(&adam)?;
    let peak_memory_bytes = match (before, memory_status()) {
        (Some((_, rss_before)), Some((peak, _))) => peak.saturating_sub(rss_before),
        _ => 0,
    };
    // Each step is one forward_backward then one optim_step (which needs its gradients), timed
    // apart; medians of `repeats` steps.
    let mut fb_times = Vec::with_capacity(repeats);
    let mut step_times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let t = Instant::now();
        client.forward_backward(&tokens, &mask)?;
        fb_times.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        client.optim_step(&adam)?;
        step_times.push(t.elapsed().as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let forward_backward_s = median(&mut fb_times);
    let optim_step_s = median(&mut step_times);
    let mut failed = None;
    let forward_s = median_seconds(repeats, || {
        if let Err(e) = client.loss(&tokens, &mask) {
            failed = Some(e);
        }
    });
    let adapter = client.to_adapter("bench".into())?;
    let serving_prefill_s = median_seconds(repeats, || {
        let mut caches: Vec<KvCache> = (0..sequences).map(|_| KvCache::default()).collect();
        let mut batch: Vec<SeqInput<'_>> = caches
            .iter_mut()
            .zip(&tokens)
            .map(|(cache, t)| SeqInput {
                tokens: t,
                cache,
                adapter: Some(&adapter),
            })
            .collect();
        if let Err(e) = model.forward(&mut batch) {
            failed = Some(e);
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(TrainFigures {
        quick: options.quick,
        model: [
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.kv_heads(),
            config.vocab_size,
        ],
        base_parameters,
        rank,
        trainable_parameters: client.parameter_count(),
        batch,
        forward_backward_s,
        forward_backward_tokens_per_s: (sequences * len) as f64 / forward_backward_s,
        forward_s,
        optim_step_s,
        step_over_three_forwards: (forward_backward_s + optim_step_s) / (3.0 * forward_s),
        serving_prefill_s,
        peak_memory_bytes,
        state_bytes: client.state_bytes(),
        activation_bytes_bound: activation_bytes(&config, sequences, len),
    })
}
