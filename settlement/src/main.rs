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
        /// Replace an existing identity at `--out` (its key is lost).
        #[arg(long)]
        force: bool,
    },
}

/// Errors print on one line (`{:#}`, as README promises), each cause once: a cause whose text
/// its parent's message already ends with is not repeated.
fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

fn one_line(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run { config } => {
            let config = cx_settlement::config::SignerConfig::load(&config)?;
            let address = config.me()?.address.clone();
            let signer = std::sync::Arc::new(cx_settlement::signer::Signer::new(config)?);
            let listener = tokio::net::TcpListener::bind(&address)
                .await
                .with_context(|| format!("listening on {address} (is the port in use?)"))?;
            tracing::info!("signer {} listening on {address}", signer.id());
            signer.serve(listener).await?;
        }
        Command::Keygen { out, force } => {
            let identity = cx_protocol::pq::Identity::generate();
            let written = if force {
                cx_settlement::keyfile::write_identity(&out, &identity)
            } else {
                cx_settlement::keyfile::create_identity(&out, &identity)
            };
            written.with_context(|| format!("keygen --out {}", out.display()))?;
            println!("{}", hex::encode(identity.public().to_bytes()));
        }
    }
    Ok(())
}
