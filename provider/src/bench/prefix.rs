//! `cx-provider bench prefix`: what a held conversation prefix saves a continuation (SPEC §4).
//!
//! For each prefix length, a first chat turn whose history is that long runs through the engine
//! (the real scheduler, continuous batching and all) and is held; then its continuation is timed
//! to its first token twice, side by side in one run: once finding the prefix held (it prefills
//! only the new message), once with nothing held (the whole prompt). The bound beside the figure
//! is what prefill arithmetic allows: time to first token is prefill, about linear in the tokens
//! prefilled, so a hit can be at most `prompt tokens / tokens prefilled` times faster (attention
//! over the held positions still runs, so the measured speedup stays under it).

use std::sync::Arc;
use std::time::Instant;

use cx_kernels::CpuConfig;
use cx_protocol::order::chat_prompt;
use serde::Serialize;

use crate::cache::{CacheConfig, EvictionPolicy, ResidencyCache};
use crate::engine::{Conversation, Engine, EngineConfig, Event, GenerateRequest, Sampling};
use crate::error::{Error, Result};
use crate::model::{DType, GenModelOptions, Model, generated_config, generated_tensors};
use crate::tokenizer::Tokenizer;

/// How to run `cx-provider bench prefix`.
#[derive(Clone, Copy, Debug)]
pub struct PrefixBenchOptions {
    /// Timed repeats per figure (median).
    pub repeats: usize,
    /// Kernel threads and mode.
    pub cpu: CpuConfig,
    /// Smaller shapes for a smoke run.
    pub quick: bool,
}

/// One prefix length's figures.
#[derive(Clone, Debug, Serialize)]
pub struct PrefixRow {
    /// Tokens of the held prefix the continuation reused.
    pub prefix_tokens: usize,
    /// Tokens of the continuation's prompt.
    pub prompt_tokens: usize,
    /// Median time to first token with the prefix held, seconds.
    pub ttft_hit_s: f64,
    /// Median time to first token with nothing held, seconds.
    pub ttft_miss_s: f64,
    /// `ttft_miss_s / ttft_hit_s`.
    pub speedup: f64,
    /// `prompt_tokens / (prompt_tokens − prefix_tokens)`: the most a hit can save.
    pub bound: f64,
}

/// The figures, as `--json` prints them.
#[derive(Clone, Debug, Serialize)]
pub struct PrefixFigures {
    /// Whether this was a `--quick` run.
    pub quick: bool,
    /// The model (hidden, intermediate, layers, heads, kv heads, vocab).
    pub model: [usize; 6],
    /// Kernel threads.
    pub threads: usize,
    /// One row per prefix length.
    pub rows: Vec<PrefixRow>,
}

impl PrefixFigures {
    /// The human table.
    pub fn table(&self) -> String {
        let [hidden, inner, layers, heads, kv_heads, vocab] = self.model;
        let mut out = format!(
            "cx-provider bench prefix{} — hidden {hidden}, intermediate {inner}, {layers} layers, \
             {heads}/{kv_heads} heads, vocab {vocab}; {} threads; time to first token of a \
             continuation\n",
            if self.quick { " (QUICK shapes)" } else { "" },
            self.threads,
        );
        out.push_str(&format!(
            "{:>8} {:>8} {:>12} {:>12} {:>8} {:>8}\n",
            "prefix", "prompt", "hit (ms)", "miss (ms)", "speedup", "bound"
        ));
        for r in &self.rows {
            out.push_str(&format!(
                "{:>8} {:>8} {:>12.2} {:>12.2} {:>8.2} {:>8.2}\n",
                r.prefix_tokens,
                r.prompt_tokens,
                r.ttft_hit_s * 1e3,
                r.ttft_miss_s * 1e3,
                r.speedup,
                r.bound
            ));
        }
        out
    }
}

/// The name conversations are held under here.
const MODEL: &str = "bench";

/// Submits `text` and waits for its first token (`hold`: as a conversation, so a held prefix is
/// found and the turn held); returns the seconds to the first token and the reply.
fn turn(engine: &Engine, text: &str, max_tokens: usize, hold: bool) -> Result<(f64, String)> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    engine.submit(GenerateRequest {
        prompt: engine.tokenizer().encode(text)?,
        adapter: None,
        max_tokens,
        stop: Vec::new(),
        sampling: Sampling::default(),
        events: tx,
        stream: true,
        conversation: hold.then(|| Conversation {
            model: MODEL.into(),
            prompt_text: text.to_string(),
        }),
    });
    let mut first = None;
    let mut reply = String::new();
    while let Some(event) = rx.blocking_recv() {
        match event {
            Event::Text { delta, .. } => {
                first.get_or_insert_with(|| started.elapsed().as_secs_f64());
                reply.push_str(&delta);
            }
            Event::Done { .. } => {
                return Ok((
                    first.unwrap_or_else(|| started.elapsed().as_secs_f64()),
                    reply,
                ));
            }
            Event::Failed(e) => {
                return Err(Error::BadRequest(format!("bench prefix: generation: {e}")));
            }
        }
    }
    Err(Error::SchedulerStopped)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs the benchmark.
pub fn prefix(options: &PrefixBenchOptions) -> Result<PrefixFigures> {
    let (lengths, model_options): (&[usize], _) = if options.quick {
        (
            &[64, 256],
            GenModelOptions {
                hidden: 64,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                intermediate: 128,
                vocab: 512,
                max_positions: 1024,
                tie: false,
                dtype: DType::F32,
                seed: 5,
            },
        )
    } else {
        (
            &[128, 512, 1024],
            GenModelOptions {
                hidden: 256,
                layers: 4,
                heads: 8,
                kv_heads: 4,
                intermediate: 768,
                vocab: 512,
                max_positions: 2048,
                tie: false,
                dtype: DType::F32,
                seed: 5,
            },
        )
    };
    let config = generated_config(&model_options)?;
    let model = Arc::new(Model::new(
        config.clone(),
        generated_tensors(&config, model_options.seed),
        options.cpu,
    )?);
    let engine = Engine::start(
        model,
        Arc::new(Tokenizer::generated()),
        ResidencyCache::new(CacheConfig::new(
            8_000_000_000,
            EvictionPolicy::ValuePerByte,
        )),
        EngineConfig {
            max_prefill_tokens: 4096,
            ..EngineConfig::default()
        },
    );
    let follow_up = "Go on, please.";
    let mut rows = Vec::new();
    for &length in lengths {
        let (mut hits, mut misses) = (Vec::new(), Vec::new());
        let mut prefix_tokens = 0;
        let mut prompt_tokens = 0;
        for repeat in 0..options.repeats.max(1) {
            // A history of about `length` tokens (one byte each), new each repeat so no turn
            // finds another's prefix.
            let history: String = (0..length.saturating_sub(24))
                .map(|i| char::from(b'a' + ((i * 7 + repeat * 3) % 26) as u8))
                .collect();
            let first = chat_prompt([("user", history.as_str())]);
            let (_, reply) = turn(&engine, &first, 1, true)?;
            let next = chat_prompt([
                ("user", history.as_str()),
                ("assistant", reply.as_str()),
                ("user", follow_up),
            ]);
            let reused_before = engine.metrics().stats.prefix_reused_tokens;
            let (hit, _) = turn(&engine, &next, 1, true)?;
            let reused = engine.metrics().stats.prefix_reused_tokens - reused_before;
            if reused == 0 {
                return Err(Error::BadRequest(
                    "bench prefix: the continuation did not find its prefix held".into(),
                ));
            }
            let (miss, _) = turn(&engine, &next, 1, false)?;
            hits.push(hit);
            misses.push(miss);
            prefix_tokens = reused as usize;
            prompt_tokens = engine.tokenizer().encode(&next)?.len();
        }
        let (ttft_hit_s, ttft_miss_s) = (median(hits), median(misses));
        rows.push(PrefixRow {
            prefix_tokens,
            prompt_tokens,
            ttft_hit_s,
            ttft_miss_s,
            speedup: ttft_miss_s / ttft_hit_s,
            bound: prompt_tokens as f64 / (prompt_tokens - prefix_tokens).max(1) as f64,
        });
    }
    Ok(PrefixFigures {
        quick: options.quick,
        model: [
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.kv_heads(),
            config.vocab_size,
        ],
        threads: options.cpu.threads,
        rows,
    })
}
