//! `cx-provider`: serve a Llama base with many LoRA adapters, generate test models and
//! adapters, print logits, run the LoRA benchmarks.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cx_kernels::{CpuConfig, Mode, QuantType};
use cx_provider::bases::{BaseSource, Bases, ServeOptions, start_engine};
use cx_provider::cache::EvictionPolicy;
use cx_provider::engine::{Engine, EngineConfig};
use cx_provider::exchange_link::key_file::{read_identity, write_identity};
use cx_provider::exchange_link::{Link, LinkConfig};
use cx_provider::lora::{load_adapter, write_random_adapters};
use cx_provider::model::{
    DType, GenModelOptions, KvCache, Model, Projection, SeqInput, read_config,
    write_generated_model,
};
use cx_provider::server::{AppState, HttpLimits, app};
use cx_provider::training::{Trainer, TrainingOptions};

#[derive(Parser)]
#[command(
    name = "cx-provider",
    version,
    about = "A compute-exchange provider node"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a Hugging Face Llama directory with seeded random weights.
    GenModel {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Hidden size.
        #[arg(long, default_value_t = 64, value_parser = positive(65536))]
        hidden: usize,
        /// Decoder layers.
        #[arg(long, default_value_t = 2, value_parser = positive(1024))]
        layers: usize,
        /// Query heads.
        #[arg(long, default_value_t = 4, value_parser = positive(1024))]
        heads: usize,
        /// Key/value heads.
        #[arg(long, default_value_t = 2, value_parser = positive(1024))]
        kv_heads: usize,
        /// SwiGLU inner width.
        #[arg(long, default_value_t = 128, value_parser = positive(262144))]
        intermediate: usize,
        /// Vocabulary size (≥ 258: bytes, BOS, EOS).
        #[arg(long, default_value_t = 512, value_parser = positive(1048576))]
        vocab: usize,
        /// Context length.
        #[arg(long, default_value_t = 2048, value_parser = positive(1048576))]
        max_positions: usize,
        /// Tie lm_head to the embeddings.
        #[arg(long)]
        tie: bool,
        /// Storage dtype: f32, bf16 or f16.
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Write PEFT adapters with seeded random weights for a model directory.
    GenAdapters {
        /// The base model directory.
        #[arg(long)]
        model: PathBuf,
        /// Output directory (adapter-000, adapter-001, …).
        #[arg(long)]
        out: PathBuf,
        /// How many (1 to 10000).
        #[arg(long, default_value_t = 8, value_parser = positive(10_000))]
        count: usize,
        /// Ranks, cycled (each 1 to 65536; the adapter's bytes must also fit in memory).
        #[arg(long, default_value = "8,16", value_delimiter = ',', value_parser = positive(65_536))]
        ranks: Vec<usize>,
        /// Target modules.
        #[arg(
            long,
            default_value = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
            value_delimiter = ','
        )]
        targets: Vec<String>,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Print a checkpoint's content id (what offers report a held base by, and what `cx agent
    /// rent --base` names): a folder's top-level `*.json`, `*.jinja` and `*.safetensors` hashed,
    /// or a GGUF file with the tokenizer and template files beside it that are read with it.
    ContentId {
        /// The checkpoint folder or GGUF file.
        model: PathBuf,
    },
    /// Print the logits of the last position (f32).
    Logits {
        /// The model: a checkpoint folder or a GGUF file.
        #[arg(long)]
        model: PathBuf,
        /// A PEFT adapter directory.
        #[arg(long)]
        adapter: Option<PathBuf>,
        /// Token ids, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        tokens: Vec<u32>,
        /// Print `{"logits": [...]}`.
        #[arg(long)]
        json: bool,
        /// Worker threads (1 to 1024).
        #[arg(long, value_parser = positive(1024))]
        threads: Option<usize>,
        /// Quantize the weight matrices as they load: q8_0, q4_0, q5_0 or q4_k.
        #[arg(long, value_parser = quant_type)]
        quantize: Option<QuantType>,
    },
    /// Serve the OpenAI-compatible API.
    Serve {
        /// The model: a checkpoint folder or a GGUF file.
        #[arg(long)]
        model: PathBuf,
        /// A directory of PEFT adapters (one sub-directory each, named by folder).
        #[arg(long)]
        adapters: Option<PathBuf>,
        /// Port on 127.0.0.1.
        #[arg(long, default_value_t = 9001, env = "CX_PROVIDER_PORT")]
        port: u16,
        /// Address to bind.
        #[arg(long, default_value = "127.0.0.1", env = "CX_PROVIDER_HOST")]
        host: String,
        /// Name the base answers to (default: the model folder's name).
        #[arg(long)]
        served_model_name: Option<String>,
        /// Directories `POST /v1/load_lora_adapter` may load from (besides `--adapters`);
        /// repeat or comma-separate. Without any, loading by path is off.
        #[arg(long, value_delimiter = ',', env = "CX_PROVIDER_ADAPTER_ROOTS")]
        adapter_root: Vec<PathBuf>,
        /// Byte budget of the adapter cache (at least 1).
        #[arg(long, default_value_t = 1_000_000_000, env = "CX_PROVIDER_CACHE_BYTES",
              value_parser = clap::value_parser!(u64).range(1..))]
        cache_bytes: u64,
        /// Eviction policy: value-per-byte or lru.
        #[arg(long, default_value = "value-per-byte")]
        eviction: EvictionPolicy,
        /// Largest LoRA rank accepted (1 to 65536).
        #[arg(long, default_value_t = 64, value_parser = positive(65_536))]
        max_lora_rank: usize,
        /// Sequences per batch at most (1 to 4096).
        #[arg(long, default_value_t = 64, value_parser = positive(4096))]
        max_batch: usize,
        /// Worker threads of the kernels (1 to 1024).
        #[arg(long, value_parser = positive(1024))]
        threads: Option<usize>,
        #[command(flatten)]
        speed: Speed,
        /// Quantize the weight matrices as they load (the served and every stored base): q8_0,
        /// q4_0, q5_0 or q4_k (rows that are not whole 256-element super-blocks fall back to
        /// q5_0, as llama.cpp's llama-quantize does). A GGUF's quantized tensors stay as stored.
        #[arg(long, value_parser = quant_type)]
        quantize: Option<QuantType>,
        /// Run SGMV on GPU 0 (needs a build with `--features cuda` and a CUDA driver).
        #[arg(long, conflicts_with_all = ["int8", "bf16_dot"])]
        gpu: bool,
        /// Where `/v1/training/clients/{id}/save_weights` writes adapters (one folder per
        /// content id) [default: a folder in the temp dir].
        #[arg(long, env = "CX_PROVIDER_TRAINING_DIR", value_name = "DIR")]
        training_dir: Option<PathBuf>,
        /// Training clients at once at most (1 to 1024).
        #[arg(long, default_value_t = 8, value_parser = positive(1024))]
        max_training_clients: usize,
        /// Padded positions (sequences × longest) of one forward_backward at most (1 to 2²⁰).
        #[arg(long, default_value_t = 8192, value_parser = positive(1 << 20))]
        max_training_tokens: usize,
        /// Requests a second from one client IP address (0: no limit); over it, 429
        /// `rate_limited` with Retry-After, before the body is read.
        #[arg(long, default_value_t = HttpLimits::default().rate_per_ip_s,
              env = "CX_PROVIDER_RATE_PER_IP")]
        rate_per_ip: u32,
        /// Requests one client IP address may send at once, above the rate.
        #[arg(long, default_value_t = HttpLimits::default().rate_burst_ip,
              env = "CX_PROVIDER_RATE_BURST_IP")]
        rate_burst_ip: u32,
        /// Requests in flight at most, streams included (0: no bound); past it, 503
        /// `overloaded` with Retry-After at once. /health and /metrics are exempt.
        #[arg(long, default_value_t = HttpLimits::default().max_in_flight,
              env = "CX_PROVIDER_MAX_IN_FLIGHT")]
        max_in_flight: usize,
        // Boxed: the market flags would make every other command's variant as large.
        #[command(flatten)]
        market: Box<MarketArgs>,
    },
    /// Write a new ML-DSA-65 provider identity (mode 0600); prints its key hash.
    Keygen {
        /// The identity file to write.
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Register the identity's key and stake on every chain (ProviderRegistry): the exchange
    /// admits only providers staked at least the minimum under their offers' key.
    Stake {
        #[command(flatten)]
        chain: cx_provider::chain::ChainOpts,
        /// Wei to add to the stake.
        #[arg(long, value_parser = cx_provider::chain::parse_wei)]
        amount: alloy::primitives::U256,
        /// The identity file whose key is registered (`cx-provider keygen`).
        #[arg(long)]
        identity: PathBuf,
        /// The endpoint published beside the key.
        #[arg(long, default_value = "")]
        endpoint: String,
    },
    /// Start unbonding stake (withdrawable after the registry's delay).
    Unbond {
        #[command(flatten)]
        chain: cx_provider::chain::ChainOpts,
        /// Wei to unbond.
        #[arg(long, value_parser = cx_provider::chain::parse_wei)]
        amount: alloy::primitives::U256,
    },
    /// Withdraw stake that finished unbonding.
    Withdraw {
        #[command(flatten)]
        chain: cx_provider::chain::ChainOpts,
    },
    /// Withdraw what settled batches credited the account, with the exchange's proof.
    Claim {
        #[command(flatten)]
        chain: cx_provider::chain::ChainOpts,
        /// The exchange's base URL.
        #[arg(long)]
        exchange: String,
        /// The CA to trust for it (PEM) [default: Mozilla's roots].
        #[arg(long)]
        exchange_ca: Option<PathBuf>,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

/// `serve --exchange …`: the provider on an exchange's market.
#[derive(clap::Args)]
struct MarketArgs {
    /// The exchange to register at and pull jobs from (https://…; http:// only if it says so).
    #[arg(long, env = "CX_EXCHANGE", value_name = "URL",
          requires_all = ["identity", "payout", "operator", "ask_wei_per_s", "bundle_id", "model_name"])]
    exchange: Option<String>,
    /// Trust exactly the CA certificates in this PEM file [default: Mozilla's roots].
    #[arg(
        long,
        env = "CX_EXCHANGE_CA",
        value_name = "PEM",
        requires = "exchange"
    )]
    exchange_ca: Option<PathBuf>,
    /// The exchange's ML-DSA-65 key hash (0x-hex, as `GET /v1/exchange` and `cx serve` show
    /// it): assignments must be signed by exactly that key [default: the key the exchange
    /// publishes at start, pinned for the run].
    #[arg(
        long,
        env = "CX_EXCHANGE_KEY_HASH",
        value_name = "HASH",
        requires = "exchange"
    )]
    exchange_key_hash: Option<cx_protocol::order::B256>,
    /// The provider's ML-DSA-65 identity (`cx-provider keygen --out FILE`; mode 0600).
    #[arg(
        long,
        env = "CX_PROVIDER_IDENTITY",
        value_name = "FILE",
        requires = "exchange"
    )]
    identity: Option<PathBuf>,
    /// The EVM account receipts are paid to (0x…, 20 bytes).
    #[arg(long, value_name = "0xADDRESS", requires = "exchange")]
    payout: Option<cx_protocol::order::Address>,
    /// The operator's name (T3 committees are diverse in it).
    #[arg(long, value_name = "NAME", requires = "exchange")]
    operator: Option<String>,
    /// The ask, integer wei per compute-second (with `--ask-follow`, the floor the ask never
    /// goes under).
    #[arg(long, value_name = "N", requires = "exchange")]
    ask_wei_per_s: Option<u64>,
    /// Let the asks follow the market's quote: every 5 s, the model's ask becomes its market's
    /// ask plus `--ask-margin-bps`, never under `--ask-wei-per-s` nor over `--ask-max-wei-per-s`
    /// (each tier priced apart follows its own tier's quote).
    #[arg(long, requires = "exchange")]
    ask_follow: bool,
    /// With `--ask-follow`: basis points added to the quote's ask (negative undercuts it, so the
    /// bundle stays eligible for market orders).
    #[arg(long, default_value_t = -200, value_name = "BPS", allow_hyphen_values = true,
          requires = "ask_follow", value_parser = clap::value_parser!(i32).range(-5000..=5000))]
    ask_margin_bps: i32,
    /// With `--ask-follow`: the most the ask may rise to [default: 4 × --ask-wei-per-s].
    #[arg(long, value_name = "N", requires = "ask_follow")]
    ask_max_wei_per_s: Option<u64>,
    /// A tier priced apart, `TIER=WEI` (T0, T1 or T3; repeatable): offered as its own bundle
    /// `<bundle-id>-<tier>` at that ask (an ask per model and tier; `PUT /v1/exchange/ask`
    /// changes any of them while running).
    #[arg(long = "tier-ask", value_name = "TIER=WEI", requires = "exchange",
          value_parser = parse_tier_ask)]
    tier_asks: Vec<(cx_protocol::Tier, u64)>,
    /// Bid on the exchange's open reserves for this model this far below the ask, basis points
    /// (1000 = 10 %; 0: never bid); a reserve won is claimed take-or-pay at its window's end.
    #[arg(long, default_value_t = 1000, value_name = "BPS",
          value_parser = clap::value_parser!(u32).range(0..=9999))]
    reserve_discount_bps: u32,
    /// The bundle's id on the exchange.
    #[arg(long, value_name = "ID", requires = "exchange")]
    bundle_id: Option<String>,
    /// The catalog model the loaded weights are registered as (the resident base).
    #[arg(long, value_name = "NAME", requires = "exchange")]
    model_name: Option<String>,
    /// Ingress bandwidth stated in the offer, bits per second.
    #[arg(long, default_value_t = 1e9, value_name = "BPS")]
    bandwidth_bps: f64,
    /// A base this provider can load when a job needs it, `NAME=DIR` (the catalog name, a
    /// checkpoint folder; repeatable): offered as fetchable, loaded on the first job for it
    /// within `--base-memory-bytes`, the least valuable held bases evicted first.
    #[arg(long = "base-store", value_name = "NAME=DIR", requires = "exchange",
          value_parser = parse_base_store)]
    base_store: Vec<(String, PathBuf)>,
    /// Memory every base held at once may take, bytes [default: the served model's and the
    /// largest stored base's: room for one more].
    #[arg(long, value_name = "BYTES", requires = "exchange")]
    base_memory_bytes: Option<u64>,
    /// Where adapters fetched from the exchange are kept [default: a folder in the temp dir].
    #[arg(long, value_name = "DIR")]
    fetched_adapters: Option<PathBuf>,
    /// A testing aid that makes this provider CHEAT, so that tests can show the exchange's
    /// verification catches it (and the committee slashes it): never set it on a real market.
    #[arg(long, value_enum, value_name = "FAULT", requires = "exchange")]
    fault: Option<Fault>,
}

/// `NAME=DIR` of `--base-store`.
fn parse_base_store(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(dir)))
        }
        _ => Err(format!(
            "`{s}` is not NAME=DIR (a catalog name, a checkpoint folder)"
        )),
    }
}

/// Faults a provider can inject on purpose (`serve --fault`): testing aids that make it
/// misbehave the way a dishonest or broken provider would, never for production.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Fault {
    /// Return altered output text with a receipt correctly signed over the altered bytes (T1
    /// and T3 replication must catch it).
    WrongOutput,
    /// Return every `cx/matmul-f32` product with one entry moved far beyond Freivalds'
    /// tolerance, under an honest receipt over the wrong bytes (T2's check must catch it).
    WrongProduct,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// SGMV overhead, heterogeneous batching, residency and Freivalds figures.
    Lora {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Timed repeats per figure (median; 1 to 1000).
        #[arg(long, default_value_t = 5, value_parser = positive(1000))]
        repeats: usize,
        /// Worker threads (1 to 1024).
        #[arg(long, value_parser = positive(1024))]
        threads: Option<usize>,
        /// Smaller shapes (a quick smoke run; the figures are not the reported ones).
        #[arg(long)]
        quick: bool,
        /// Fast mode (FMA in the kernels; class D∞).
        #[arg(long)]
        fast: bool,
    },
    /// Conversation prefixes: a continuation's time to first token with its prefix held and
    /// without, at a few prefix lengths.
    Prefix {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Timed repeats per figure (median; 1 to 1000).
        #[arg(long, default_value_t = 5, value_parser = positive(1000))]
        repeats: usize,
        /// Worker threads (1 to 1024).
        #[arg(long, value_parser = positive(1024))]
        threads: Option<usize>,
        /// Smaller shapes (a quick smoke run; the figures are not the reported ones).
        #[arg(long)]
        quick: bool,
    },
    /// Matmul (tier T2): the product C = A·B against the Freivalds check the exchange runs on
    /// it, side by side at 512³ and 1024³, with the ratio and its FLOP bound.
    Matmul {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Timed repeats per figure (median; 1 to 1000).
        #[arg(long, default_value_t = 5, value_parser = positive(1000))]
        repeats: usize,
        /// Freivalds rounds (1 to 256).
        #[arg(long, default_value_t = 20, value_parser = positive(256))]
        rounds: usize,
        /// Worker threads (1 to 1024).
        #[arg(long, value_parser = positive(1024))]
        threads: Option<usize>,
        /// Smaller sizes, 128³ and 256³ (a quick smoke run; not the reported figures).
        #[arg(long)]
        quick: bool,
    },
    /// Prefill and decode tokens/s of a real checkpoint at batch 1 and 8, beside the bound
    /// reading its weights sets.
    Real {
        /// The model (a Hugging Face checkpoint folder or a GGUF file).
        #[arg(long)]
        model: PathBuf,
        /// Quantize the weight matrices as they load: q8_0, q4_0, q5_0 or q4_k.
        #[arg(long, value_parser = quant_type)]
        quantize: Option<QuantType>,
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Timed repeats per figure (median; 1 to 1000).
        #[arg(long, default_value_t = 3, value_parser = positive(1000))]
        repeats: usize,
        /// Prompt tokens per sequence.
        #[arg(long, default_value_t = 128, value_parser = positive(4096))]
        prompt_tokens: usize,
        /// Decode steps per timed repeat.
        #[arg(long, default_value_t = 32, value_parser = positive(4096))]
        decode_steps: usize,
        /// Worker threads (1 to 1024).
        #[arg(long, value_parser = positive(1024))]
        threads: Option<usize>,
        #[command(flatten)]
        speed: Speed,
    },
    /// The perplexity of a fixed text, scored as llama.cpp's llama-perplexity scores it
    /// (chunks of --ctx tokens, the second half of each scored); with --fast, --int8 or
    /// --bf16-dot, as a server started with that flag prefills it.
    Perplexity {
        /// The model (a Hugging Face checkpoint folder or a GGUF file).
        #[arg(long)]
        model: PathBuf,
        /// The text file.
        #[arg(long)]
        text: PathBuf,
        /// Tokens per chunk (even, 4 to 65536).
        #[arg(long, default_value_t = 128, value_parser = positive(65_536))]
        ctx: usize,
        /// Chunks at most (0: all).
        #[arg(long, default_value_t = 0)]
        chunks: usize,
        /// Worker threads (1 to 1024).
        #[arg(long, value_parser = positive(1024))]
        threads: Option<usize>,
        /// Quantize the weight matrices as they load: q8_0, q4_0, q5_0 or q4_k.
        #[arg(long, value_parser = quant_type)]
        quantize: Option<QuantType>,
        #[command(flatten)]
        speed: Speed,
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
    },
    /// Training: forward_backward tokens/s, optimizer step time, peak memory per client, and
    /// one step against three forwards.
    Train {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Timed repeats per figure (median; 1 to 1000).
        #[arg(long, default_value_t = 3, value_parser = positive(1000))]
        repeats: usize,
        /// Worker threads (1 to 1024; also candle's, through RAYON_NUM_THREADS).
        #[arg(long, value_parser = positive(1024))]
        threads: Option<usize>,
        /// Smaller shapes (a quick smoke run; the figures are not the reported ones).
        #[arg(long)]
        quick: bool,
    },
}

/// A parser of integers in `1..=max`: zero and absurd values are startup errors that name the
/// flag (clap's message), not a server that accepts nothing or allocates without bound.
fn positive(max: u64) -> impl clap::builder::TypedValueParser<Value = usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=max)
}

/// `--quantize`: the block formats weights can be quantized to.
fn quant_type(name: &str) -> Result<QuantType, String> {
    match QuantType::from_name(name) {
        Some(q @ (QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q4K)) => Ok(q),
        _ => Err(format!("`{name}`: expected q8_0, q4_0, q5_0 or q4_k")),
    }
}

/// How the kernels trade exactness for speed (`serve`, `bench real`, `bench perplexity`).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
struct Speed {
    /// Use FMA where the CPU has it (faster; loses bit-equality across CPUs, class D∞).
    #[arg(long)]
    fast: bool,
    /// Fast mode, and products over quantized weights (prompts and decode steps) in
    /// eight-bit integers as llama.cpp computes them (activations rounded to 8 bits per
    /// block of 32; AVX-512 VNNI, else the f32 kernels): faster again, further from the
    /// exact kernels (class D∞).
    #[arg(long)]
    int8: bool,
    /// Fast mode, and products over bf16 weights in bf16 as llama.cpp computes them
    /// (activations rounded to bf16, one AVX-512 BF16 instruction per 32 weights; else the
    /// f32 kernels): faster where 512-bit instructions run in two halves (AMD's Zen 4),
    /// further from the exact kernels (class D∞).
    #[arg(long)]
    bf16_dot: bool,
}

impl Speed {
    const FAST: Self = Self {
        fast: true,
        int8: false,
        bf16_dot: false,
    };
}

/// The kernels' configuration: `--int8` and `--bf16-dot` are the fast mode with narrower
/// products.
fn cpu(threads: Option<usize>, speed: Speed) -> CpuConfig {
    let mut config = CpuConfig::deterministic();
    if speed.fast || speed.int8 || speed.bf16_dot {
        config.mode = Mode::Fast;
        config.int8 = speed.int8;
        config.bf16_dot = speed.bf16_dot;
        // candle's ops (the training forward) size their thread pool from
        // RAYON_NUM_THREADS (else every core): `--threads` must reach them too.
        if let Some(t) = threads {
            // SAFETY: called from `main` before the runtime, the scheduler or any other
            // thread exists, so nothing reads the environment concurrently.
            unsafe { std::env::set_var("RAYON_NUM_THREADS", t.to_string()) };
        }
    }
    match threads {
        Some(t) => config.with_threads(t),
        None => config,
    }
}

/// Errors print on one line with their causes (`{:#}`), as the README promises, not as
/// A small runtime for one command's chain calls.
fn chain_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// anyhow's multi-line `Debug` report.
fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's first paragraph (it may list the missing arguments below its first line).
            let text = e.render().to_string();
            let first: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            eprintln!("{} (see --help)", first.join(" "));
            return std::process::ExitCode::from(2);
        }
    };
    // What it does as it runs goes to stderr through `tracing` (one line an event, level and
    // target first); a failure that ends it stays the single `error:` line below.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .try_init();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::GenModel {
            out,
            hidden,
            layers,
            heads,
            kv_heads,
            intermediate,
            vocab,
            max_positions,
            tie,
            dtype,
            seed,
        } => {
            let options = GenModelOptions {
                hidden,
                layers,
                heads,
                kv_heads,
                intermediate,
                vocab,
                max_positions,
                tie,
                dtype: DType::parse(&dtype)?,
                seed,
            };
            write_generated_model(&out, &options)?;
            println!("wrote {}", out.display());
        }
        Command::GenAdapters {
            model,
            out,
            count,
            ranks,
            targets,
            seed,
        } => {
            let config = read_config(&model)?;
            let targets: Vec<Projection> = targets
                .iter()
                .map(|t| Projection::from_name(t).with_context(|| format!("unknown target {t}")))
                .collect::<anyhow::Result<_>>()?;
            let dirs = write_random_adapters(&out, &config, count, &ranks, &targets, seed)?;
            for dir in dirs {
                println!("{}", dir.display());
            }
        }
        Command::ContentId { model } => {
            let id = cx_provider::model::content::checkpoint_id(&model)
                .with_context(|| format!("{}", model.display()))?;
            println!("0x{id}");
        }
        Command::Logits {
            model,
            adapter,
            tokens,
            json,
            threads,
            quantize,
        } => logits(
            &model,
            adapter.as_deref(),
            &tokens,
            json,
            cpu(threads, Speed::default()),
            quantize,
        )?,
        Command::Serve {
            model,
            adapters,
            port,
            host,
            served_model_name,
            adapter_root,
            cache_bytes,
            eviction,
            max_lora_rank,
            max_batch,
            threads,
            speed,
            quantize,
            gpu,
            training_dir,
            max_training_clients,
            max_training_tokens,
            rate_per_ip,
            rate_burst_ip,
            max_in_flight,
            market,
        } => {
            let cpu = cpu(threads, speed);
            let device = if gpu {
                let device = cx_kernels::Device::cuda(0).context("--gpu")?;
                tracing::info!("SGMV on {}", device.name());
                Some(device)
            } else {
                None
            };
            let options = ServeOptions {
                cpu,
                device,
                cache_bytes,
                eviction,
                engine: EngineConfig {
                    max_batch_seqs: max_batch,
                    max_rank: max_lora_rank,
                    ..EngineConfig::default()
                },
                adapter_roots: adapter_root.clone(),
                quantize,
            };
            let started = std::time::Instant::now();
            let engine = start_engine(&model, &options)
                .with_context(|| format!("loading the model in {}", model.display()))?;
            let load_s = started.elapsed().as_secs_f64();
            if speed.int8 && !cx_kernels::int8_decode_available() {
                tracing::warn!(
                    "--int8: this CPU lacks AVX-512 VNNI; the fast mode's f32 kernels run"
                );
            } else if speed.int8 && engine.model().quant_type().is_none() {
                tracing::warn!(
                    "--int8: the model holds no quantized weights; the fast mode's f32 kernels run"
                );
            }
            if speed.bf16_dot && !cx_kernels::bf16_dot_available() {
                tracing::warn!(
                    "--bf16-dot: this CPU lacks AVX-512 BF16; the fast mode's f32 kernels run"
                );
            } else if speed.bf16_dot && !engine.model().holds_bf16() {
                tracing::warn!(
                    "--bf16-dot: the model holds no bf16 weights; the fast mode's f32 kernels run"
                );
            }
            // Default: the folder's name, or a GGUF file's without `.gguf`.
            let name = served_model_name.unwrap_or_else(|| {
                std::fs::canonicalize(&model)
                    .ok()
                    .and_then(|p| {
                        let name = if p.is_file() {
                            p.file_stem()
                        } else {
                            p.file_name()
                        };
                        name.map(|n| n.to_string_lossy().into_owned())
                    })
                    .unwrap_or_else(|| "base".into())
            });
            if let Some(dir) = adapters {
                let aliases = engine
                    .register_dir(&dir)
                    .with_context(|| format!("--adapters {}", dir.display()))?;
                tracing::info!(
                    "registered {} adapters from {}",
                    aliases.len(),
                    dir.display()
                );
            }
            // The exchange link is prepared before the port binds: a bad identity, CA or URL
            // stops the start with its one-line error.
            let link = match market.exchange.clone() {
                None => None,
                Some(exchange) => {
                    Some(link(exchange, *market, (&engine, &model, load_s), options)?)
                }
            };
            let training_dir = training_dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("cx-provider-{}-trained", std::process::id()))
            });
            let trainer = Trainer::new(
                engine.clone(),
                name.clone(),
                TrainingOptions {
                    max_clients: max_training_clients,
                    max_tokens_per_call: max_training_tokens,
                    ..TrainingOptions::new(training_dir.clone())
                },
            )
            .with_context(|| format!("--training-dir {}", training_dir.display()))?;
            let trainer = Arc::new(trainer);
            // The link trains its train orders with the same clients the API serves.
            let link = link.map(|link| link.with_trainer(trainer.clone()));
            let mut state = AppState::new(engine, name.clone())
                .with_training(trainer)
                .with_limits(HttpLimits {
                    rate_per_ip_s: rate_per_ip,
                    rate_burst_ip,
                    max_in_flight,
                });
            if let Some(link) = &link {
                state = state.with_ask(link.ask());
            }
            let addr: SocketAddr = format!("{host}:{port}").parse().context("--host/--port")?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
                    format!("binding {addr}: is another provider running? pick --port")
                })?;
                // The address bound (`--port 0` picks a free one).
                let addr = listener.local_addr().unwrap_or(addr);
                tracing::info!(
                    "cx-provider serving `{name}` on http://{addr} ({} threads, {:?})",
                    cpu.threads,
                    cpu.mode
                );
                // Each request carries its peer address: the per-IP rate limit keys on it.
                let serve = axum::serve(
                    listener,
                    app(state).into_make_service_with_connect_info::<SocketAddr>(),
                );
                match link {
                    None => serve.await?,
                    Some(link) => tokio::select! {
                        served = serve => served?,
                        linked = link.run() => linked?,
                    },
                }
                anyhow::Ok(())
            })?;
        }
        Command::Stake {
            chain,
            amount,
            identity,
            endpoint,
        } => {
            let key = alloy::primitives::B256::from(read_identity(&identity)?.id().0);
            chain_runtime()?.block_on(cx_provider::chain::run_stake(
                &chain, amount, key, &endpoint,
            ))?;
        }
        Command::Unbond { chain, amount } => {
            chain_runtime()?.block_on(cx_provider::chain::run_unbond(&chain, amount))?;
        }
        Command::Withdraw { chain } => {
            chain_runtime()?.block_on(cx_provider::chain::run_withdraw(&chain))?;
        }
        Command::Claim {
            chain,
            exchange,
            exchange_ca,
        } => {
            chain_runtime()?.block_on(cx_provider::chain::run_claim(
                &chain,
                &exchange,
                exchange_ca.as_deref(),
            ))?;
        }
        Command::Keygen { out, force } => {
            let identity = cx_protocol::pq::Identity::generate();
            write_identity(&out, &identity, force)?;
            println!("wrote {} (key {})", out.display(), identity.id());
        }
        Command::Bench {
            which:
                BenchCommand::Train {
                    json,
                    repeats,
                    threads,
                    quick,
                },
        } => {
            if let Some(t) = threads {
                // SAFETY: called from `main` before any other thread exists, so nothing reads
                // the environment concurrently; candle's matmul sizes its pool from it.
                unsafe { std::env::set_var("RAYON_NUM_THREADS", t.to_string()) };
            }
            let figures = cx_provider::bench::train(&cx_provider::bench::TrainBenchOptions {
                repeats,
                cpu: cpu(threads, Speed::default()),
                quick,
            })?;
            print!("{}", figures.table());
            if json {
                println!("{}", serde_json::to_string(&figures)?);
            }
        }
        Command::Bench {
            which:
                BenchCommand::Prefix {
                    json,
                    repeats,
                    threads,
                    quick,
                },
        } => {
            let figures = cx_provider::bench::prefix(&cx_provider::bench::PrefixBenchOptions {
                repeats,
                cpu: cpu(threads, Speed::default()),
                quick,
            })?;
            print!("{}", figures.table());
            if json {
                println!("{}", serde_json::to_string(&figures)?);
            }
        }
        Command::Bench {
            which:
                BenchCommand::Real {
                    model,
                    quantize,
                    json,
                    repeats,
                    prompt_tokens,
                    decode_steps,
                    threads,
                    speed,
                },
        } => {
            let figures = cx_provider::bench::real(&cx_provider::bench::RealBenchOptions {
                model,
                repeats,
                prompt_tokens,
                decode_steps,
                cpu: cpu(threads, speed),
                quantize,
            })?;
            print!("{}", figures.table());
            if json {
                println!("{}", serde_json::to_string(&figures)?);
            }
        }
        Command::Bench {
            which:
                BenchCommand::Perplexity {
                    model,
                    text,
                    ctx,
                    chunks,
                    threads,
                    quantize,
                    speed,
                    json,
                },
        } => {
            let f = cx_provider::bench::perplexity(&cx_provider::bench::PerplexityOptions {
                model,
                text,
                ctx,
                chunks,
                cpu: cpu(threads, speed),
                quantize,
            })?;
            println!(
                "perplexity {:.4} over {} positions ({} chunks of {}), {:.1} s",
                f.perplexity, f.scored, f.chunks, f.ctx, f.seconds
            );
            if json {
                println!("{}", serde_json::to_string(&f)?);
            }
        }
        Command::Bench {
            which:
                BenchCommand::Matmul {
                    json,
                    repeats,
                    rounds,
                    threads,
                    quick,
                },
        } => {
            // The provider's product kernels run in fast mode (class D∞), as served.
            let figures = cx_provider::bench::matmul(&cx_provider::bench::MatmulBenchOptions {
                repeats,
                rounds,
                cpu: cpu(threads, Speed::FAST),
                sizes: if quick {
                    vec![128, 256]
                } else {
                    vec![512, 1024]
                },
            })?;
            print!("{}", figures.table());
            if json {
                println!("{}", cx_provider::bench::matmul_json(&figures));
            }
        }
        Command::Bench {
            which:
                BenchCommand::Lora {
                    json,
                    repeats,
                    threads,
                    quick,
                    fast,
                },
        } => {
            let figures = cx_provider::bench::lora(&cx_provider::bench::LoraBenchOptions {
                repeats,
                cpu: cpu(
                    threads,
                    Speed {
                        fast,
                        ..Speed::default()
                    },
                ),
                quick,
            })?;
            print!("{}", figures.table());
            if json {
                println!("{}", serde_json::to_string(&figures)?);
            }
        }
    }
    Ok(())
}

/// `TIER=WEI` of `--tier-ask`.
fn parse_tier_ask(text: &str) -> Result<(cx_protocol::Tier, u64), String> {
    let (tier, wei) = text
        .split_once('=')
        .ok_or_else(|| "TIER=WEI, say T1=1200000".to_owned())?;
    let tier = match tier.trim() {
        "T0" => cx_protocol::Tier::T0,
        "T1" => cx_protocol::Tier::T1,
        "T3" => cx_protocol::Tier::T3,
        other => {
            return Err(format!(
                "{other}: one of T0, T1, T3 (T2 is the matmul bundle's)"
            ));
        }
    };
    let wei: u64 = wei
        .trim()
        .parse()
        .ok()
        .filter(|w| *w > 0)
        .ok_or_else(|| format!("{wei}: an integer number of wei above zero"))?;
    Ok((tier, wei))
}

/// The exchange link of `serve --exchange`, its flags checked (clap made the others required).
fn link(
    exchange: String,
    market: MarketArgs,
    (engine, model_dir, load_s): (&Engine, &Path, f64),
    mut options: ServeOptions,
) -> anyhow::Result<Link> {
    let required = |name: &str| anyhow::anyhow!("--exchange needs {name}");
    let identity_path = market.identity.ok_or_else(|| required("--identity"))?;
    let identity = read_identity(&identity_path).context("--identity")?;
    if !(market.bandwidth_bps.is_finite() && market.bandwidth_bps > 0.0) {
        anyhow::bail!("--bandwidth-bps must be a positive number");
    }
    let floor = market
        .ask_wei_per_s
        .ok_or_else(|| required("--ask-wei-per-s"))?;
    let ask_follow = if market.ask_follow {
        let cap = market
            .ask_max_wei_per_s
            .unwrap_or_else(|| floor.saturating_mul(4));
        if cap < floor {
            anyhow::bail!("--ask-max-wei-per-s {cap} is under --ask-wei-per-s {floor} (the floor)");
        }
        Some(cx_provider::exchange_link::follow::Follow {
            margin_bps: market.ask_margin_bps,
            floor_wei_per_s: floor,
            cap_wei_per_s: cap,
        })
    } else {
        None
    };
    let model_name = market.model_name.ok_or_else(|| required("--model-name"))?;
    let fetched_adapters = market.fetched_adapters.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("cx-provider-{}-fetched", std::process::id()))
    });
    let primary = BaseSource::open(&model_name, model_dir)
        .with_context(|| format!("the content id of {}", model_dir.display()))?;
    let store = market
        .base_store
        .iter()
        .map(|(name, dir)| BaseSource::open(name, dir).context("--base-store"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let budget = market.base_memory_bytes.unwrap_or_else(|| {
        engine.model().weight_bytes() as u64 + store.iter().map(|s| s.bytes).max().unwrap_or(0)
    });
    // A base loaded later takes the adapters the exchange serves from the same folder.
    options.adapter_roots.push(fetched_adapters.clone());
    let cache_bytes = options.cache_bytes;
    let bases = Bases::new((primary, engine.clone(), load_s), store, budget, options)
        .context("--base-store")?;
    let config = LinkConfig {
        exchange,
        exchange_ca: market.exchange_ca,
        exchange_key_hash: market.exchange_key_hash,
        operator: market.operator.ok_or_else(|| required("--operator"))?,
        payout: market.payout.ok_or_else(|| required("--payout"))?,
        ask_wei_per_s: floor,
        tier_asks: market.tier_asks,
        reserve_discount_bps: market.reserve_discount_bps,
        bundle_id: market.bundle_id.ok_or_else(|| required("--bundle-id"))?,
        model_name: model_name.clone(),
        memory_bytes: cache_bytes,
        bandwidth_bps: market.bandwidth_bps,
        // Stated, not measured: a provider beside its buyers' exchange.
        rtt_s: 0.005,
        fetched_adapters,
        fault: market.fault.map(|f| match f {
            Fault::WrongOutput => cx_provider::exchange_link::Fault::WrongOutput,
            Fault::WrongProduct => cx_provider::exchange_link::Fault::WrongProduct,
        }),
        ask_follow,
    };
    if let Some(fault) = market.fault {
        tracing::warn!("testing aid: --fault {fault:?} (this provider misbehaves on purpose)");
    }
    let link = Link::new(config, identity, Arc::new(bases))?;
    tracing::info!("self-benchmark: {:.3e} FLOP/s", link.flops_per_s());
    Ok(link)
}

fn logits(
    model_dir: &Path,
    adapter: Option<&Path>,
    tokens: &[u32],
    json: bool,
    cpu: CpuConfig,
    quantize: Option<QuantType>,
) -> anyhow::Result<()> {
    let model = Model::load_quantized(model_dir, cpu, quantize)?;
    let adapter = adapter
        .map(|dir| load_adapter(dir, model.config(), usize::MAX))
        .transpose()?;
    let mut cache = KvCache::default();
    let logits = model
        .forward(&mut [SeqInput {
            tokens,
            cache: &mut cache,
            adapter: adapter.as_ref(),
        }])?
        .remove(0);
    if json {
        println!("{}", serde_json::json!({ "logits": logits }));
    } else {
        let mut best: Vec<(usize, f32)> = logits.iter().copied().enumerate().collect();
        best.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        println!("{} logits; top 10:", logits.len());
        for (id, v) in best.iter().take(10) {
            println!("{id:>8} {v:>12.6}");
        }
    }
    Ok(())
}
