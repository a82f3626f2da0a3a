//! `cx-provider bench real --model DIR`: prefill and decode tokens/s of a real checkpoint at
//! batch 1 and 8, beside the bound reading the weights sets. A decode step reads every weight
//! once whatever the batch (batch 1 is bound by it; a batch of 8 shares the read), so the bound
//! is `rows × read GB/s ÷ bytes held`, with the read rate measured in the same run as a one-row
//! product over the largest projection of the model (`lm_head`'s shape), through the class D
//! kernel and candle's matmul, whichever is faster.

use std::path::PathBuf;
use std::time::Instant;

use cx_kernels::CpuConfig;
use cx_kernels::bench::median_seconds;
use serde::Serialize;

use super::{decode_seconds, gemv_gbps};
use crate::error::Result;
use crate::model::{KvCache, Model, SeqInput};

/// What to measure.
#[derive(Clone, Debug)]
pub struct RealBenchOptions {
    /// The model directory.
    pub model: PathBuf,
    /// Timed repeats per figure (the median is reported).
    pub repeats: usize,
    /// Prompt tokens per sequence for prefill.
    pub prompt_tokens: usize,
    /// Decode steps per timed repeat.
    pub decode_steps: usize,
    /// Threads and mode of the kernels.
    pub cpu: CpuConfig,
    /// Quantize at load (`--quantize`).
    pub quantize: Option<cx_kernels::QuantType>,
}

/// One batch size's figures.
#[derive(Clone, Debug, Serialize)]
pub struct RealRow {
    /// Sequences in the batch.
    pub batch: usize,
    /// Prompt tokens per second (all sequences' prompts in one forward).
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second over the batch.
    pub decode_tokens_per_s: f64,
    /// What reading the weights once per step allows: `batch × read_gbps ÷ weight GB`.
    pub decode_bound_tokens_per_s: f64,
    /// `decode_tokens_per_s / decode_bound_tokens_per_s`.
    pub decode_vs_bound: f64,
}

/// The figures.
#[derive(Clone, Debug, Serialize)]
pub struct RealFigures {
    /// The model directory.
    pub model: String,
    /// `hidden, intermediate, layers, heads, kv_heads, vocab`.
    pub shape: [usize; 6],
    /// Kernel threads.
    pub threads: usize,
    /// Bytes of weights as held in memory (read once per decode step).
    pub weight_bytes: usize,
    /// Seconds to load the checkpoint (read, widen, check).
    pub load_s: f64,
    /// One-row product read rate over `lm_head`'s shape, GB/s.
    pub read_gbps: f64,
    /// Bytes of weights read per generated token at batch 1.
    pub bytes_per_token: usize,
    /// Batch 1 and 8.
    pub rows: Vec<RealRow>,
}

impl RealFigures {
    /// The human table.
    pub fn table(&self) -> String {
        let [hidden, inner, layers, heads, kv_heads, vocab] = self.shape;
        let mut out = format!(
            "cx-provider bench real — {}: hidden {hidden}, intermediate {inner}, {layers} layers, \
             {heads}/{kv_heads} heads, vocab {vocab}; {} threads; {:.0} MB of weights held \
             (loaded in {:.2} s); read {:.1} GB/s\n",
            self.model,
            self.threads,
            self.weight_bytes as f64 / 1e6,
            self.load_s,
            self.read_gbps
        );
        out.push_str(&format!(
            "{:>6} {:>16} {:>16} {:>16} {:>10}\n",
            "batch", "prefill tok/s", "decode tok/s", "bound tok/s", "vs bound"
        ));
        for r in &self.rows {
            out.push_str(&format!(
                "{:>6} {:>16.1} {:>16.1} {:>16.1} {:>10.2}\n",
                r.batch,
                r.prefill_tokens_per_s,
                r.decode_tokens_per_s,
                r.decode_bound_tokens_per_s,
                r.decode_vs_bound
            ));
        }
        out
    }
}

/// Runs the benchmark.
pub fn real(options: &RealBenchOptions) -> Result<RealFigures> {
    let started = Instant::now();
    let model = Model::load_quantized(&options.model, options.cpu, options.quantize)?;
    let load_s = started.elapsed().as_secs_f64();
    let config = model.config().clone();
    let weight_bytes = model.weight_bytes();
    let read_gbps = gemv_gbps(
        config.hidden_size,
        config.vocab_size,
        options.repeats,
        &options.cpu,
    )?;
    let prompt = |seq: usize| -> Vec<u32> {
        // Ordinary ids away from the specials at the start of most vocabularies.
        (0..options.prompt_tokens)
            .map(|k| (1000 + (seq * 131 + k * 17) % (config.vocab_size - 1000)) as u32)
            .collect()
    };
    let mut rows = Vec::new();
    for batch in [1usize, 8] {
        let prompts: Vec<Vec<u32>> = (0..batch).map(prompt).collect();
        let mut failed = None;
        let prefill_s = median_seconds(options.repeats, || {
            let mut caches = vec![KvCache::default(); batch];
            let mut inputs: Vec<SeqInput<'_>> = caches
                .iter_mut()
                .zip(&prompts)
                .map(|(cache, tokens)| SeqInput {
                    tokens,
                    cache,
                    adapter: None,
                })
                .collect();
            if let Err(e) = model.forward(&mut inputs) {
                failed = Some(e);
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let mut group = Vec::with_capacity(batch);
        for tokens in &prompts {
            let mut cache = KvCache::default();
            model.forward(&mut [SeqInput {
                tokens,
                cache: &mut cache,
                adapter: None,
            }])?;
            group.push((cache, None));
        }
        let decode_s = decode_seconds(&model, &[group], options.decode_steps, options.repeats)?;
        let decode_tokens_per_s = (batch * options.decode_steps) as f64 / decode_s;
        let bound = batch as f64 * read_gbps * 1e9 / weight_bytes as f64;
        rows.push(RealRow {
            batch,
            prefill_tokens_per_s: (batch * options.prompt_tokens) as f64 / prefill_s,
            decode_tokens_per_s,
            decode_bound_tokens_per_s: bound,
            decode_vs_bound: decode_tokens_per_s / bound,
        });
    }
    Ok(RealFigures {
        model: options.model.display().to_string(),
        shape: [
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.kv_heads(),
            config.vocab_size,
        ],
        threads: options.cpu.threads,
        weight_bytes,
        load_s,
        read_gbps,
        bytes_per_token: weight_bytes,
        rows,
    })
}
