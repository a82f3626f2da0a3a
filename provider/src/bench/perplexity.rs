//! `cx-provider bench perplexity --model M --text FILE`: the perplexity of a fixed text, scored
//! as llama.cpp's `llama-perplexity` scores it, so the two are compared on the same file: the
//! text tokenized whole (special tokens as the tokenizer adds them), cut into chunks of `ctx`
//! tokens, each chunk run from an empty cache, and only the second half of each chunk's
//! positions scored (each has at least `ctx / 2` tokens of context), `−log p` of the next token
//! averaged over all chunks; PPL = exp of the mean.

use std::path::PathBuf;
use std::time::Instant;

use cx_kernels::{CpuConfig, QuantType};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::{KvCache, Model, SeqInput};
use crate::tokenizer::Tokenizer;

/// What to measure.
#[derive(Clone, Debug)]
pub struct PerplexityOptions {
    /// The model (folder or GGUF).
    pub model: PathBuf,
    /// The text file.
    pub text: PathBuf,
    /// Tokens per chunk (even, at least 4).
    pub ctx: usize,
    /// Chunks at most (0: every whole chunk of the text).
    pub chunks: usize,
    /// Threads and mode of the kernels.
    pub cpu: CpuConfig,
    /// Quantize at load (`--quantize`).
    pub quantize: Option<QuantType>,
}

/// The figure.
#[derive(Clone, Debug, Serialize)]
pub struct PerplexityFigures {
    /// The model.
    pub model: String,
    /// Tokens per chunk.
    pub ctx: usize,
    /// Chunks scored.
    pub chunks: usize,
    /// Positions scored.
    pub scored: usize,
    /// exp(mean −log p).
    pub perplexity: f64,
    /// Seconds spent.
    pub seconds: f64,
}

/// `log Σ exp(logits) − logits[target]`, in `f64`.
fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + sum.ln() - logits[target as usize] as f64
}

/// Runs the measurement.
pub fn perplexity(options: &PerplexityOptions) -> Result<PerplexityFigures> {
    if options.ctx < 4 || !options.ctx.is_multiple_of(2) {
        return Err(Error::BadRequest(
            "--ctx must be even and at least 4".into(),
        ));
    }
    let started = Instant::now();
    let model = Model::load_quantized(&options.model, options.cpu, options.quantize)?;
    let tokenizer = Tokenizer::for_model(&options.model, model.config())?;
    let text = std::fs::read_to_string(&options.text).map_err(|e| Error::io(&options.text, e))?;
    let tokens = tokenizer.encode(&text)?;
    let mut chunks = tokens.len() / options.ctx;
    if options.chunks > 0 {
        chunks = chunks.min(options.chunks);
    }
    if chunks == 0 {
        return Err(Error::BadRequest(format!(
            "the text is {} tokens, less than one chunk of {}",
            tokens.len(),
            options.ctx
        )));
    }
    let first = options.ctx / 2;
    let (mut total, mut scored) = (0f64, 0usize);
    for c in 0..chunks {
        let chunk = &tokens[c * options.ctx..(c + 1) * options.ctx];
        let mut cache = KvCache::default();
        // The first half as one prefill (its predictions are not scored).
        model.forward(&mut [SeqInput {
            tokens: &chunk[..first],
            cache: &mut cache,
            adapter: None,
        }])?;
        for j in first..options.ctx - 1 {
            // Position j's logits predict token j + 1.
            let logits = model
                .forward(&mut [SeqInput {
                    tokens: &chunk[j..j + 1],
                    cache: &mut cache,
                    adapter: None,
                }])?
                .remove(0);
            total += nll(&logits, chunk[j + 1]);
            scored += 1;
        }
    }
    Ok(PerplexityFigures {
        model: options.model.display().to_string(),
        ctx: options.ctx,
        chunks,
        scored,
        perplexity: (total / scored as f64).exp(),
        seconds: started.elapsed().as_secs_f64(),
    })
}
