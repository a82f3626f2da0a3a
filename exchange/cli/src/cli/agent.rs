//! `cx agent …`: what an agent (a buyer) does, from its own key file.
//!
//! Composition only: the HTTPS client, the key file and the request hash are cx-client's, the
//! signatures cx-protocol's, the on-chain calls cx-settlement's `EvmClient` acting with the
//! agent's own secp256k1 key. Each command prints a few lines for people and, with `--json`, one
//! JSON object as its last line; errors are one line (with the exchange's code and field when it
//! refused) and a non-zero exit.

use anyhow::{Context, anyhow, bail};
use cx_client::types::ChainInfo;
use cx_client::{AgentKeys, Client, Credential};
use cx_contracts::DeploymentsFile;
use cx_protocol::order::B256;
use cx_protocol::{DeterminismClass, Tier};
use cx_settlement::evm::EvmClient;
use serde_json::json;
use std::path::{Path, PathBuf};

mod jobs;
mod keys;
mod sessions;
mod standing;
mod tabs;
mod train;

/// The development CA's certificate, trusted by default when it exists (what `cx serve` makes).
const DEV_CA_PEM: &str = "runtime/ca/ca.pem";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The exchange's base URL (https://; http:// only for a server behind --insecure-http).
    #[arg(
        long,
        global = true,
        env = "CX_EXCHANGE",
        value_name = "URL",
        default_value = "https://127.0.0.1:8443"
    )]
    exchange: String,
    /// CA certificate(s) to trust for the exchange (PEM) [default: runtime/ca/ca.pem if it
    /// exists, else the public roots].
    #[arg(long, global = true, env = "CX_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// The agent's key file (made by `cx agent keygen`).
    #[arg(long, global = true, env = "CX_AGENT_KEYS", value_name = "FILE")]
    keys: Option<PathBuf>,
    /// The chain to sign for and pay on [default: the only one the exchange serves (the first,
    /// for `bind`) or the deployments file holds].
    #[arg(long, global = true, env = "CX_CHAIN", value_name = "ID")]
    chain: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Make a key file: a secp256k1 account key and an ML-DSA-65 identity (mode 0600).
    Keygen(keys::KeygenArgs),
    /// Bind the ML-DSA-65 key to the account at the exchange (both keys sign; once per account).
    Bind(keys::BindArgs),
    /// Open a tab on chain: sign its terms, deposit, and open an escrow whose ref is their hash.
    OpenTab(tabs::OpenTabArgs),
    /// An order of a workload, one command per kind (`intent`, `matmul`, `train`).
    #[command(flatten)]
    Workload(jobs::Workload),
    /// Store an adapter (a PEFT directory) in the exchange's store under its content id.
    PutAdapter(jobs::PutAdapterArgs),
    /// Store a training dataset (token sequences and loss masks, JSON) in the exchange's store
    /// under its content id, for train orders to name.
    PutDataset(train::PutDatasetArgs),
    /// Make a session key for the OpenAI-compatible door: sign a grant (tab, spend cap, expiry,
    /// the calls' defaults) naming the hash of a fresh secret, and print the secret (the key).
    Session(sessions::SessionArgs),
    /// Ask the OpenAI-compatible door for a chat completion, with a session key.
    Chat(sessions::ChatArgs),
    /// List this agent's jobs.
    Jobs(jobs::JobsArgs),
    /// Show a tab as the exchange's books mirror it.
    Tab(tabs::TabArgs),
    /// Reclaim a tab's escrow on chain after its deadline (and the contract's grace period).
    CloseTab(tabs::CloseTabArgs),
    /// Post a search: a nonce whose SHA-256 with the prefix falls below a target, priced on the
    /// work that finds one with probability `--success`, paid to the first provider whose
    /// witness checks for the work a witness implies (refunded at the deadline if none); with
    /// `--wait`, until it is filled or ends.
    Search(standing::SearchArgs),
    /// Post a reserve: compute for a model over a window, take-or-pay, priced below spot.
    /// Providers bid until the window starts and the lowest feasible bid commits it; this
    /// account's intents on the tab in the window draw on it first. With `--wait`, until it is
    /// committed (or ends with no bid).
    Reserve(standing::ReserveArgs),
    /// Rent residency: an adapter, a base or a conversation prefix kept loaded (pinned) for a
    /// term on as many of the bundles that hold it most cheaply as ε needs, at most
    /// `--max-rent-wei` together; a term whose measured misses exceed its share of ε is
    /// rebated. With `--wait`, until the term ends and its providers have claimed it.
    Rent(standing::RentArgs),
    /// Ask the exchange to settle a tab now: it takes no more jobs, and the next batch pays
    /// what its jobs were charged and credits the rest back (claim it with `cx agent claim`).
    SettleTab(tabs::SettleTabArgs),
    /// Withdraw what settled batches credited this account on a chain (the rest of its tabs,
    /// with `Escrow.claim` and the exchange's Merkle proof).
    Claim(tabs::ClaimArgs),
}

/// Where the chain is: the deployments file, and optionally another RPC URL.
#[derive(Debug, clap::Args)]
struct ChainArgs {
    /// JSON-RPC URL of the chain [default: the deployments file's].
    #[arg(long, env = "CX_RPC", value_name = "URL")]
    rpc: Option<String>,
    /// The deployments file (contract addresses per chain).
    #[arg(long, value_name = "FILE", default_value = "runtime/deployments.json")]
    deployments: PathBuf,
}

fn parse_tier(text: &str) -> Result<Tier, String> {
    serde_json::from_value(json!(text)).map_err(|_| "one of T0, T1, T2, T3".to_owned())
}

fn parse_class(text: &str) -> Result<DeterminismClass, String> {
    serde_json::from_value(json!(text)).map_err(|_| "one of D, D_inf, S".to_owned())
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    if let Command::Keygen(keygen) = &args.command {
        // No network, no runtime.
        return keys::run_keygen(&args, keygen);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run_async(args))
}

async fn run_async(args: Args) -> anyhow::Result<()> {
    match &args.command {
        Command::Keygen(_) => unreachable!("handled before the runtime"),
        Command::Bind(bind) => keys::run_bind(&args, bind).await,
        Command::OpenTab(open) => tabs::run_open_tab(&args, open).await,
        Command::Workload(workload) => jobs::run(&args, workload).await,
        Command::PutAdapter(put) => jobs::run_put_adapter(&args, put).await,
        Command::PutDataset(put) => train::run_put_dataset(&args, put).await,
        Command::Session(session) => sessions::run_session(&args, session).await,
        Command::Chat(chat) => sessions::run_chat(&args, chat).await,
        Command::Jobs(list) => jobs::run_jobs(&args, list).await,
        Command::Tab(tab) => tabs::run_tab(&args, tab).await,
        Command::CloseTab(close) => tabs::run_close_tab(&args, close).await,
        Command::SettleTab(settle) => tabs::run_settle_tab(&args, settle).await,
        Command::Search(search) => standing::run_search(&args, search).await,
        Command::Reserve(reserve) => standing::run_reserve(&args, reserve).await,
        Command::Rent(rent) => standing::run_rent(&args, rent).await,
        Command::Claim(claim) => tabs::run_claim(&args, claim).await,
    }
}

// ---- inputs ---------------------------------------------------------------------------------

impl Args {
    fn key_path(&self) -> anyhow::Result<&Path> {
        self.keys.as_deref().ok_or_else(|| {
            anyhow!(
                "no key file: pass --keys FILE or set CX_AGENT_KEYS (make one with `cx agent keygen --out FILE`)"
            )
        })
    }

    fn load_keys(&self) -> anyhow::Result<AgentKeys> {
        Ok(AgentKeys::load(self.key_path()?)?)
    }

    /// The client acting for the key file's account (its own signed credentials: reading its
    /// jobs, storing content under its quota).
    fn account_client(&self) -> anyhow::Result<Client> {
        let keys = self.load_keys()?;
        Ok(self
            .client()?
            .with_credential(Credential::Account(keys.signing_key().clone())))
    }

    fn client(&self) -> anyhow::Result<Client> {
        let ca = match &self.ca {
            Some(path) => Some(path.clone()),
            None => Some(PathBuf::from(DEV_CA_PEM)).filter(|p| p.exists()),
        };
        Client::new(&self.exchange, ca.as_deref()).context("--exchange/--ca")
    }
}

/// The chain to sign for: `--chain` if the exchange serves it, else its only chain (or, for a
/// binding, which any served chain can carry, the first).
async fn pick_chain(client: &Client, chain: Option<u64>, any: bool) -> anyhow::Result<ChainInfo> {
    let chains = client
        .chains()
        .await
        .context("reading the exchange's chains")?;
    let ids = || {
        chains
            .iter()
            .map(|c| c.chain_id.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match chain {
        Some(id) => chains
            .iter()
            .find(|c| c.chain_id == id)
            .cloned()
            .ok_or_else(|| anyhow!("--chain {id}: the exchange serves chains {}", ids())),
        None if chains.len() == 1 || (any && !chains.is_empty()) => Ok(chains[0].clone()),
        None if chains.is_empty() => bail!("the exchange serves no chain yet"),
        None => bail!("the exchange serves chains {}: pass --chain", ids()),
    }
}

/// The chain's deployment, its RPC URL and its EIP-712 domain, and an `EvmClient` acting with
/// the agent's own key.
fn evm(
    keys: &AgentKeys,
    args: &ChainArgs,
    chain: Option<u64>,
) -> anyhow::Result<(EvmClient, u64, String)> {
    let file = DeploymentsFile::load(&args.deployments).context("--deployments")?;
    let entry = match chain {
        Some(id) => file.chain(id).ok_or_else(|| {
            anyhow!(
                "--chain {id}: not in {} (it has {})",
                args.deployments.display(),
                file.chains
                    .iter()
                    .map(|c| c.chain.chain_id.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
        None => match file.chains.as_slice() {
            [only] => only,
            [] => bail!("{}: no chain deployed", args.deployments.display()),
            _ => bail!(
                "{}: several chains deployed: pass --chain",
                args.deployments.display()
            ),
        },
    };
    let rpc = args
        .rpc
        .clone()
        .unwrap_or_else(|| entry.chain.rpc_url.clone());
    let secret = keys.secp256k1_secret();
    let signer = alloy::signers::local::PrivateKeySigner::from_bytes(&(*secret).into())
        .context("the key file's secp256k1 secret")?;
    // The registry's URLs (failing over in order) unless --rpc names one; its fee policy either way.
    let client = match &args.rpc {
        Some(url) => {
            EvmClient::connect(url, signer, entry.deployment).map(|c| c.with_fees(entry.chain.fees))
        }
        None => EvmClient::for_chain(entry, signer),
    }
    .with_context(|| format!("chain {} at {rpc}", entry.chain.chain_id))?;
    Ok((client, entry.chain.chain_id, rpc))
}

/// Job `id` as the exchange has it now; with `wait_s` (its deadline, seconds from now), once it
/// has ended, or a little past that deadline (the sweep ends it by then).
async fn job_once_ended(
    client: &Client,
    id: B256,
    wait_s: Option<u64>,
) -> anyhow::Result<cx_client::JobRecord> {
    let mut job = client.job(id).await?;
    if let Some(wait_s) = wait_s {
        let give_up =
            std::time::Instant::now() + std::time::Duration::from_secs(wait_s.saturating_add(10));
        while !job.status.is_terminal() && std::time::Instant::now() < give_up {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            job = client.job(id).await?;
        }
    }
    Ok(job)
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh nonce: the current time in microseconds (unique per account for any agent that does
/// not sign two orders in one microsecond; pass --nonce to choose).
fn fresh_nonce() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
