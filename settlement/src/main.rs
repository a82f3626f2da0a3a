//! `cx-signer`: the settlement signer's command line. In this issue: the gas bench and the devnet
//! deployment (the committee issue adds DKG and signing sessions).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cx_settlement::devnet::{ChainRegistry, deploy_all, devnet_params, write_deployments};
use cx_settlement::frost::DealerCommittee;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

#[derive(Parser)]
#[command(name = "cx-signer", about = "compute-exchange settlement signer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchKind,
    },
    /// The local devnet.
    Devnet {
        #[command(subcommand)]
        what: DevnetCommand,
    },
    /// Runs a committee signer (answers DKG, commitment and signing requests over PQ sessions).
    Run {
        /// Signer configuration (JSON: index, identity file, data dir, committee, coordinator key).
        #[arg(long, env = "CX_SIGNER_CONFIG")]
        config: PathBuf,
    },
    /// Creates an ML-DSA-65 identity key file (0600) and prints its public key (hex).
    Keygen {
        /// Where to write the seed.
        #[arg(long)]
        out: PathBuf,
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

#[derive(Subcommand)]
enum DevnetCommand {
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
        /// Seed of the devnet's trusted-dealer committee key (the DKG replaces it).
        #[arg(long, default_value_t = 1)]
        dealer_seed: u8,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => {
            let config = cx_settlement::config::SignerConfig::load(&config)
                .with_context(|| format!("reading {}", config.display()))?;
            let address = config.me()?.address.clone();
            let signer = std::sync::Arc::new(cx_settlement::signer::Signer::new(config)?);
            let listener = tokio::net::TcpListener::bind(&address)
                .await
                .with_context(|| format!("listening on {address} (is the port in use?)"))?;
            eprintln!("signer {} listening on {address}", signer.id());
            signer.serve(listener).await?;
        }
        Command::Keygen { out } => {
            let identity = cx_protocol::pq::Identity::generate();
            cx_settlement::keyfile::write_identity(&out, &identity)?;
            println!("{}", hex::encode(identity.public().to_bytes()));
        }
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
            let binary = std::env::current_exe().context("locating cx-signer")?;
            let r = cx_settlement::sign_bench::sign_bench(&binary, n, t, rounds, receipts)
                .await
                .context("sign bench")?;
            println!("{:<16} {:>10} {:>10}", "metric", "value", "target");
            println!(
                "{:<16} {:>10.3} {:>10}",
                "handshake_ms", r.handshake_ms, "<= 2"
            );
            println!("{:<16} {:>10.3} {:>10}", "dkg_ms", r.dkg_ms, "");
            println!(
                "{:<16} {:>10.3} {:>10}",
                "sign_p50_ms", r.sign_p50_ms, "<= 20"
            );
            println!("{:<16} {:>10.3} {:>10}", "sign_p99_ms", r.sign_p99_ms, "");
            println!(
                "({} of {} signers, {} receipts per batch, {} rounds, settled on chain: {})",
                r.t, r.n, r.receipts, r.rounds, r.settled_on_chain
            );
            if json {
                println!("{}", serde_json::to_string(&r)?);
            }
        }
        Command::Bench {
            what: BenchKind::Gas { json },
        } => {
            let report = cx_settlement::bench::gas_bench()
                .await
                .context("gas bench")?;
            println!("{:<22} {:>10} {:>10}", "metric", "gas", "target");
            println!(
                "{:<22} {:>10} {:>10}",
                "frost_verify_gas", report.frost_verify_gas, "<= 5000"
            );
            println!(
                "{:<22} {:>10} {:>10}",
                "settle_gas_per_job", report.settle_gas_per_job, "<= 500"
            );
            println!(
                "{:<22} {:>10} {:>10}",
                "settle_tx_gas", report.settle_tx_gas, ""
            );
            println!(
                "{:<22} {:>10} {:>10}",
                "settle_partial_word", report.settle_gas_per_job_partial_word, ""
            );
            println!(
                "{:<22} {:>10} {:>10}",
                "claim_gas", report.claim_gas, "<= 60000"
            );
            println!(
                "{:<22} {:>10} {:>10}",
                "claim_first_gas", report.claim_first_gas, ""
            );
            if json {
                println!("{}", serde_json::to_string(&report)?);
            }
        }
        Command::Devnet {
            what:
                DevnetCommand::Deploy {
                    chains,
                    out,
                    deployer_key,
                    dealer_seed,
                },
        } => {
            let registry = ChainRegistry::load(&chains)
                .with_context(|| format!("reading {}", chains.display()))?;
            let deployer = deployer_key.parse().context("parsing --deployer-key")?;
            let mut rng = ChaCha20Rng::from_seed([dealer_seed; 32]);
            let committee = DealerCommittee::generate(5, 3, &mut rng)?;
            let deployed =
                deploy_all(&registry, &deployer, devnet_params(committee.group_key()?)).await?;
            write_deployments(&out, &deployed)?;
            for d in &deployed {
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
