//! `cx devnet`: the whole market on this machine, each party its own supervised process. The
//! orchestration is cx-devnet's ([`cx_devnet::devnet`]); this file holds the flags and hands
//! them over with the two things only the `cx` binary has: itself (the exchange runs as
//! `cx serve`) and `cx catalog add` (for `--model`).

use super::catalog::{RETAIL_WEI_PER_MTOK, append_model};
use anyhow::Context;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Start the market without the agents' traffic (they are bound, with tabs, and idle).
    #[arg(long, conflicts_with = "exit_after_settled")]
    no_traffic: bool,
    /// Providers to start (1 to 20), each its own process, identity and account.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=20))]
    providers: u16,
    /// Seeded agents sending traffic (1 to 50).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=50))]
    agents: u16,
    /// Exit 0 once this many jobs are settled on chain and a batch has landed on each chain,
    /// printing a summary (its JSON last).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    exit_after_settled: Option<u64>,
    /// Fail --exit-after-settled if it takes longer than this, seconds.
    #[arg(long, default_value_t = 600, value_name = "S")]
    timeout_s: u64,
    /// Added to every port (Anvil 8545 and 8546, exchange 8443, providers 9001.., signers
    /// 9101..): a second devnet beside a running one.
    #[arg(long, env = "CX_DEVNET_PORT_OFFSET", default_value_t = 0, value_name = "N",
          value_parser = clap::value_parser!(u16).range(0..=50_000))]
    port_offset: u16,
    /// Where logs, keys and configs go (emptied at start, but for the CA in ca/).
    #[arg(
        long,
        env = "CX_DEVNET_DIR",
        default_value = "runtime/devnet",
        value_name = "DIR"
    )]
    dir: PathBuf,
    /// The exchange's database: dropped and created afresh at every start (its chains are
    /// fresh too) [default: postgres://postgres@127.0.0.1:5432/cx].
    #[arg(long, env = "DATABASE_URL", value_name = "URL", hide_env_values = true)]
    database_url: Option<String>,
    /// How the exchange ranks feasible bundles (`cx serve --clearing`): `residency_aware` or
    /// `cheapest_capable`.
    #[arg(long, default_value = "residency_aware")]
    clearing: cx_exchange::clearing::Policy,
    /// Serve this checkpoint (a Hugging Face model directory: config.json, safetensors,
    /// tokenizer.json, its chat template) instead of the generated model: the exchange's catalog
    /// learns it from its config.json (`cx catalog add`), every provider serves it, the adapters
    /// are generated for its shape and the agents' chats get its answers.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// The name the checkpoint of --model is served and asked for by (as on the Hub, e.g.
    /// `HuggingFaceTB/SmolLM2-135M-Instruct`) [default: its directory's name].
    #[arg(long, value_name = "NAME", requires = "model")]
    model_name: Option<String>,
    /// Bases on the market (1 to 3): beside the generated model, `tiny-llama-b` and
    /// `tiny-llama-c` of the same shape and other weights; provider i serves base i mod N and
    /// stores the others, loading one when a job needs it (room for one beside its own).
    #[arg(long, default_value_t = 1, value_name = "N", conflicts_with = "model",
          value_parser = clap::value_parser!(u8).range(1..=3))]
    bases: u8,
    /// Mine a block every S seconds on both chains (1 to 60), as a real network does:
    /// transactions wait in the pool, fees follow the base fee, a stuck one is replaced
    /// [default: a block per transaction].
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..=60))]
    block_time: Option<u64>,
    /// `cx serve` processes on the exchange's database and address (1 to 5): one writer and
    /// N − 1 standbys, each waiting for the writer lease and taking over when the writer dies.
    /// (Markets are not sharded across nodes yet: one writes, the others stand by.)
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u8).range(1..=5))]
    exchanges: u8,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let config = cx_devnet::devnet::Config {
        no_traffic: args.no_traffic,
        providers: args.providers,
        agents: args.agents,
        exit_after_settled: args.exit_after_settled,
        timeout_s: args.timeout_s,
        port_offset: args.port_offset,
        dir: args.dir,
        database_url: args.database_url,
        clearing: args.clearing,
        model: args.model,
        model_name: args.model_name,
        bases: args.bases,
        block_time_s: args.block_time,
        exchanges: args.exchanges,
        exchange_bin: std::env::current_exe().context("the running executable")?,
        add_to_catalog,
    };
    cx_devnet::devnet::run(config, super::serve::stop_signal())
}

/// `--model`'s checkpoint into the devnet's catalog, as `cx catalog add` adds one.
fn add_to_catalog(model: &Path, catalog: &Path, name: Option<String>) -> anyhow::Result<String> {
    Ok(append_model(model, catalog, name, &[], RETAIL_WEI_PER_MTOK)?.name)
}
