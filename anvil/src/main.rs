//! `cx-devnet`: the local devnet's command line — deploy the contracts to the chains of a
//! registry, and the benchmarks that need real processes and a chain (`bench gas`, `bench sign`).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cx_contracts::{ChainRegistry, DeploymentsFile};
use cx_devnet::deploy::{deploy_all, devnet_params};
use cx_settlement::frost::DealerCommittee;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

#[derive(Parser)]
#[command(name = "cx-devnet", about = "compute-exchange local devnet")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Deploys every contract to every chain of the registry and writes the addresses.
    Deploy {
        /// Chain registry (id, RPC URL per chain).
        #[arg(long, env = "CX_CHAINS", default_value = "anvil/chains.json")]
        chains: PathBuf,
        /// Where to write the deployed addresses (git-ignored runtime folder).
        #[arg(
            long,
            env = "CX_DEPLOYMENTS",
            default_value = "runtime/deployments.json"
        )]
        out: PathBuf,
        /// Deployer key (default: Anvil's first deterministic account).
        #[arg(
            long,
            env = "CX_DEPLOYER_KEY",
            default_value = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
        )]
        deployer_key: String,
        /// Seed of the devnet's trusted-dealer committee key (a DKG among signers replaces it).
        #[arg(long, default_value_t = 1)]
        dealer_seed: u8,
    },
    /// Benchmarks over real processes and a fresh Anvil.
    Bench {
        #[command(subcommand)]
        what: BenchKind,
    },
}

#[derive(Subcommand)]
enum BenchKind {
    /// Handshake, DKG and signing latency of a committee of real signer processes on loopback.
    Sign {
        /// Signers.
        #[arg(long, default_value_t = 5)]
        n: u16,
        /// Threshold.
        #[arg(long, default_value_t = 3)]
        t: u16,
        /// Signing rounds to measure.
        #[arg(long, default_value_t = 50)]
        rounds: usize,
        /// Receipts in the signed batch.
        #[arg(long, default_value_t = 8)]
        receipts: usize,
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
    },
    /// Gas of FROST verification, settlement per job and a claim, on a fresh Anvil.
    Gas {
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Bench {
            what:
                BenchKind::Sign {
                    n,
                    t,
                    rounds,
                    receipts,
                    json,
                },
        } => {
            let binary = cx_devnet::signer_binary()?;
            let report = cx_devnet::bench::sign_bench(&binary, n, t, rounds, receipts)
                .await
                .context("sign bench")?;
            print!("{}", report.table());
            if json {
                println!("{}", serde_json::to_string(&report)?);
            }
        }
        Command::Bench {
            what: BenchKind::Gas { json },
        } => {
            let report = cx_devnet::bench::gas_bench().await.context("gas bench")?;
            print!("{}", report.table());
            if json {
                println!("{}", serde_json::to_string(&report)?);
            }
        }
        Command::Deploy {
            chains,
            out,
            deployer_key,
            dealer_seed,
        } => {
            let registry = ChainRegistry::load(&chains)?;
            let deployer = deployer_key.parse().context("parsing --deployer-key")?;
            let mut rng = ChaCha20Rng::from_seed([dealer_seed; 32]);
            let committee = DealerCommittee::generate(5, 3, &mut rng)?;
            let deployed =
                deploy_all(&registry, &deployer, devnet_params(committee.group_key()?)).await?;
            let file = DeploymentsFile { chains: deployed };
            file.write(&out)?;
            for d in &file.chains {
                println!(
                    "chain {} at {}: settlement {} registry {} asset {}",
                    d.chain.chain_id,
                    d.chain.rpc_url,
                    d.deployment.settlement,
                    d.deployment.registry,
                    d.deployment.asset
                );
            }
            println!("addresses written to {}", out.display());
        }
    }
    Ok(())
}
