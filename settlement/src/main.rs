//! `cx-signer`: the settlement signer's command line — run a committee signer, make its identity.
//! (Benchmarks and the devnet's deployment are `cx-devnet bench …` / `cx-devnet deploy`.)

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cx-signer", about = "compute-exchange settlement signer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => {
            let config = cx_settlement::config::SignerConfig::load(&config)?;
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
    }
    Ok(())
}
