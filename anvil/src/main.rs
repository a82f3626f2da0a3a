//! `cx-devnet`: the local devnet's command line — deploy the contracts to the chains of a
//! registry (`anvil/start.sh`). The benchmarks over real processes and chains are `cx bench gas`
//! and `cx bench sign`.

use std::path::PathBuf;

use alloy::providers::Provider;
use anyhow::Context;
use clap::{Parser, Subcommand};
use cx_contracts::{ChainRegistry, DeploymentsFile};
use cx_devnet::deploy::{deploy_all, devnet_params};
use cx_settlement::frost::DealerCommittee;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

/// Test asset minted to each of the devnet's other accounts: a million units of a 6-decimal
/// stablecoin.
const TEST_FUNDS: u64 = 1_000_000_000_000;

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
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
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
            // Fund the chain's other unlocked accounts (Anvil's test accounts) with the test
            // asset, so agents on the devnet can deposit and open tabs at once.
            for chain in &deployed {
                if chain.deployment.is_native() {
                    continue;
                }
                let operator = cx_settlement::evm::EvmClient::connect(
                    &chain.chain.rpc_url,
                    deployer.clone(),
                    chain.deployment,
                )?;
                let accounts = operator
                    .provider()
                    .get_accounts()
                    .await
                    .context("listing the chain's test accounts")?;
                for account in accounts.into_iter().filter(|a| *a != deployer.address()) {
                    cx_devnet::deploy::mint_test_tokens(
                        &operator,
                        account,
                        alloy::primitives::U256::from(TEST_FUNDS),
                    )
                    .await?;
                }
            }
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
