//! cx-provider: a provider node of the compute exchange — one Llama base model serving many
//! LoRA adapters in one batched forward pass (SPEC §6), with a byte-budgeted residency cache
//! (SPEC §4) and an OpenAI-compatible API.
//!
//! # Parts, as a request flows through them
//! * [`server`] — axum router ([`server::app`]): `/v1/completions`, `/v1/chat/completions`
//!   (SSE streaming or not), `/v1/models`, vLLM's `/v1/load_lora_adapter` and
//!   `/v1/unload_lora_adapter`, Prometheus `/metrics`. It checks a request, asks the engine,
//!   and alone turns the crate's [`Error`] into a status ([`server::ApiError`]).
//! * [`engine`] — the one door to the residency cache and the alias registry
//!   ([`engine::Engine::load_adapter`], `resolve`, `unload_adapter`), and the batch scheduler
//!   on its own thread: continuous batching (sequences join and leave at token boundaries,
//!   whatever their adapter), adapter loads on loader threads beside the running batch, greedy
//!   or sampled decoding.
//! * [`cache`] — the residency cache: byte budget, least-value-per-byte or LRU eviction, pins,
//!   shadow price.
//! * [`adapter_files`] — where adapters may be read from (the configured roots) and how
//!   (regular files, bounded sizes).
//! * [`lora`] — PEFT adapters: parse, check against the base's shapes, content id; a seeded
//!   generator.
//! * [`model`] — the Llama-family forward by blocks (Llama, Mistral, Qwen2, Qwen3; `config`,
//!   `weights`, attention, MLP, decoder layer, rotary embedding; the seeded checkpoint
//!   generator in [`model::generate`]): base projections by cx-kernels' GEMM and each
//!   sequence's delta by cx-kernels' SGMV, never merged. Its `config.json` type is cx-protocol's
//!   [`ModelConfig`](cx_protocol::model_config::ModelConfig), the one parse of it in the
//!   project (`cx capacity` uses it too).
//! * [`exchange_link`] — the provider on an exchange's market: HTTPS out, a signed offer of
//!   one bundle, long-polled jobs run on the engine, results with signed receipts, adapters
//!   fetched by content id.
//! * [`training`] — `/v1/training/clients`: LoRA adapters trained on the served base
//!   (candle autograd through the Llama forward, AdamW), saved as PEFT files and loaded into
//!   the residency cache at once.
//! * [`tokenizer`] — `tokenizer.json` through the Hugging Face `tokenizers` crate (bytes for
//!   generated models), the ids a sequence stops at, streaming detokenization.
//! * [`chat_template`] — the model's own Jinja chat template, rendered as transformers does.
//! * [`bench`](mod@bench) — the figures of `cx-provider bench lora`.
//!
//! Dependencies inside the crate run one way: `server` → `engine` → `model` → `lora` →
//! cx-protocol's config (an adapter is checked against the base's shapes, never against the
//! forward).
//!
//! # Example: a tiny model, two adapters, one batch
//! ```
//! use std::sync::Arc;
//! use cx_kernels::CpuConfig;
//! use cx_provider::lora::{load_adapter, write_random_adapter};
//! use cx_provider::model::{
//!     DType, GenModelOptions, KvCache, Model, Projection, SeqInput, write_generated_model,
//! };
//!
//! let dir = std::env::temp_dir().join(format!("cx-provider-doc-{}", std::process::id()));
//! let options = GenModelOptions {
//!     hidden: 32, layers: 2, heads: 4, kv_heads: 2, intermediate: 64, vocab: 300,
//!     max_positions: 64, tie: false, dtype: DType::F32, seed: 1,
//! };
//! let config = write_generated_model(&dir.join("model"), &options)?;
//! write_random_adapter(&dir.join("a"), &config, 4, &[Projection::Q, Projection::V], 0.1, 2)?;
//! let model = Model::load(&dir.join("model"), CpuConfig::deterministic())?;
//! let adapter = load_adapter(&dir.join("a"), &config, 64)?;
//! let (mut c1, mut c2) = (KvCache::default(), KvCache::default());
//! let logits = model.forward(&mut [
//!     SeqInput { tokens: &[256, 72, 105], cache: &mut c1, adapter: Some(&adapter) },
//!     SeqInput { tokens: &[256, 33], cache: &mut c2, adapter: None },
//! ])?;
//! assert_eq!(logits.len(), 2);
//! assert_eq!(logits[0].len(), 300);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), cx_provider::Error>(())
//! ```
//!
//! # Features
//! * `cuda` — forwards to `cx-kernels/cuda`: SGMV on the GPU through NVRTC kernels (the
//!   base projections and attention stay on the CPU in this crate).

pub mod adapter_files;
pub mod bases;
pub mod bench;
pub mod cache;
pub mod chain;
pub mod chat_template;
pub mod engine;
pub mod error;
pub mod exchange_link;
pub mod lora;
pub mod model;
pub mod server;
pub mod tokenizer;
pub mod training;

pub use error::{Error, Result};
