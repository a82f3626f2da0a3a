//! Command-line parsing and the dispatch to each command.

mod agent;
mod bench;
mod bench_market;
mod capacity;
mod catalog;
mod chain;
mod chart;
mod clear;
mod devnet;
mod serve;
mod simulate;

use clap::{Parser, Subcommand};
use serde::Serialize;

/// compute-exchange: residency-aware clearing of inference work.
#[derive(Debug, Parser)]
#[command(name = "cx", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Clear one job against bundles read as JSON and explain the decision.
    Clear(clear::Args),
    /// Adapter and residency arithmetic (SPEC §5).
    #[command(subcommand)]
    Capacity(capacity::Command),
    /// The model catalog: learn a model from its directory's config.json.
    #[command(subcommand)]
    Catalog(catalog::Command),
    /// Chains: deploy the contracts to an EVM chain and write its deployments entry.
    #[command(subcommand)]
    Chain(chain::Command),
    /// Run the market simulation: allocators and eviction policies on one trace.
    Simulate(simulate::Args),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::Command),
    /// Serve the exchange over HTTPS (a development CA unless --tls-cert is given).
    Serve(serve::Args),
    /// What an agent does: keys, binding, tabs on chain, signed intents, jobs.
    Agent(agent::Args),
    /// The whole market on this machine: two Anvil chains, 5 signers, the exchange, providers
    /// and agents sending traffic, each its own process (Ctrl-C stops them all).
    Devnet(devnet::Args),
}

pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Clear(args) => clear::run(args),
        Command::Capacity(cmd) => capacity::run(cmd),
        Command::Catalog(cmd) => catalog::run(cmd),
        Command::Chain(cmd) => chain::run(cmd),
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Serve(args) => serve::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Devnet(args) => devnet::run(args),
    }
}

/// Prints the human table, then (with `--json`) the report as one JSON line, last.
fn emit<T: Serialize>(json: bool, table: &str, report: &T) -> anyhow::Result<()> {
    print!("{table}");
    if !table.is_empty() && !table.ends_with('\n') {
        println!();
    }
    if json {
        println!("{}", serde_json::to_string(report)?);
    }
    Ok(())
}
