//! `cx agent …`: what an agent (a buyer) does, from its own key file.
//!
//! Composition only: the HTTPS client, the key file and the request hash are cx-client's, the
//! signatures cx-protocol's, the on-chain calls cx-settlement's `EvmClient` acting with the
//! agent's own secp256k1 key. Each command prints a few lines for people and, with `--json`, one
//! JSON object as its last line; errors are one line (with the exchange's code and field when it
//! refused) and a non-zero exit.

use anyhow::{Context, anyhow, bail};
use cx_client::types::{ChainInfo, JobsQuery};
use cx_client::{AgentKeys, Client, Credential, InferenceRequest, request_hash};
use cx_contracts::DeploymentsFile;
use cx_protocol::order::{self, Address, B256, Intent, TabTerms, U256};
use cx_protocol::pq::Identity;
use cx_protocol::{DeterminismClass, Tier};
use cx_settlement::evm::EvmClient;
use serde_json::json;
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};

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
    Keygen(KeygenArgs),
    /// Bind the ML-DSA-65 key to the account at the exchange (both keys sign; once per account).
    Bind(BindArgs),
    /// Open a tab on chain: sign its terms, deposit, and open an escrow whose ref is their hash.
    OpenTab(OpenTabArgs),
    /// Sign an intent for a request, submit it, and print the job the exchange cleared.
    Intent(IntentArgs),
    /// Order a product C = A·B in the cx/matmul-f32 market (operands generated from seeds,
    /// verified by Freivalds' check at T2); with `--wait`, until it is done or fails, checking
    /// the returned product's SHA-256 against the provider's receipt.
    Matmul(MatmulArgs),
    /// Store an adapter (a PEFT directory) in the exchange's store under its content id.
    PutAdapter(PutAdapterArgs),
    /// Store a training dataset (token sequences and loss masks, JSON) in the exchange's store
    /// under its content id, for train orders to name.
    PutDataset(train::PutDatasetArgs),
    /// Order a LoRA adapter trained on a base (the cx/train/<base> market) on a stored dataset;
    /// with `--wait`, until it is trained, printing the adapter id (checked against the
    /// provider's receipt) that the agent's intents can then use.
    Train(train::TrainArgs),
    /// Make a session key for the OpenAI-compatible door: sign a grant (tab, spend cap, expiry,
    /// the calls' defaults) naming the hash of a fresh secret, and print the secret (the key).
    Session(SessionArgs),
    /// Ask the OpenAI-compatible door for a chat completion, with a session key.
    Chat(ChatArgs),
    /// List this agent's jobs.
    Jobs(JobsArgs),
    /// Show a tab as the exchange's books mirror it.
    Tab(TabArgs),
    /// Reclaim a tab's escrow on chain after its deadline (and the contract's grace period).
    CloseTab(CloseTabArgs),
    /// Post a search: a nonce whose SHA-256 with the prefix falls below a target, paid to the
    /// first provider whose witness checks (refunded at the deadline if none); with `--wait`,
    /// until it is filled or ends.
    Search(SearchArgs),
    /// Post a reserve: compute for a model over a window, take-or-pay, priced below spot.
    /// Providers bid until the window starts and the lowest feasible bid commits it; this
    /// account's intents on the tab in the window draw on it first. With `--wait`, until it is
    /// committed (or ends with no bid).
    Reserve(ReserveArgs),
    /// Rent residency: an adapter kept loaded (pinned) for a term on the bundle that holds it
    /// most cheaply, at most `--max-rent-wei`; a term whose measured misses exceed ε is rebated.
    /// With `--wait`, until the term ends and its provider has claimed it.
    Rent(RentArgs),
    /// Ask the exchange to settle a tab now: it takes no more jobs, and the next batch pays
    /// what its jobs were charged and credits the rest back (claim it with `cx agent claim`).
    SettleTab(SettleTabArgs),
    /// Withdraw what settled batches credited this account on a chain (the rest of its tabs,
    /// with `Escrow.claim` and the exchange's Merkle proof).
    Claim(ClaimArgs),
}

#[derive(Debug, clap::Args)]
struct KeygenArgs {
    /// Where to write the key file [default: --keys].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Replace an existing key file (its keys are lost).
    #[arg(long)]
    force: bool,
    /// Use an existing secp256k1 secret (32 bytes of hex) read from standard input, instead of
    /// a fresh one (a funded wallet's, say); the ML-DSA-65 identity is always fresh.
    #[arg(long)]
    import_secp256k1: bool,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct BindArgs {
    /// The binding's nonce (a rotation binds with a higher one).
    #[arg(long, default_value_t = 0)]
    nonce: u64,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
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

#[derive(Debug, clap::Args)]
struct OpenTabArgs {
    /// What the tab holds, wei.
    #[arg(long, value_name = "WEI")]
    amount: u128,
    /// Seconds from now until the buyer alone may reclaim the escrow (intents' deadlines must
    /// end before it, with the exchange's settlement margin).
    #[arg(long, value_name = "S")]
    deadline_in: u64,
    /// The terms' nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    #[command(flatten)]
    chain: ChainArgs,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct IntentArgs {
    /// The catalog model (or a task the router maps to one).
    #[arg(long)]
    model: String,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Most tokens to generate.
    #[arg(long, value_name = "N")]
    max_tokens: u32,
    /// The most the job may cost, wei.
    #[arg(long, value_name = "WEI")]
    max_price_wei: u128,
    /// The tab (escrow id) that pays.
    #[arg(long, value_name = "ID")]
    tab: u64,
    /// Seconds from now until the result must be ready.
    #[arg(long, value_name = "S", default_value_t = 60)]
    deadline_in: u64,
    /// Seconds from now after which the signed intent is refused [default: the deadline's].
    #[arg(long, value_name = "S")]
    expiry_in: Option<u64>,
    /// The lowest verification tier accepted: T0, T1, T2 or T3.
    #[arg(long, default_value = "T1", value_parser = parse_tier)]
    tier: Tier,
    /// The determinism class: D, D_inf or S.
    #[arg(long, default_value = "D", value_parser = parse_class)]
    class: DeterminismClass,
    /// The buyer's adapter, by content id (what `put-adapter` printed), run on the model.
    #[arg(long, value_name = "ID")]
    adapter: Option<B256>,
    /// Wait until the job ends (done, expired, failed, …) and print its output and receipt.
    #[arg(long)]
    wait: bool,
    /// The intent's nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct MatmulArgs {
    /// Rows of A and C.
    #[arg(long)]
    m: u32,
    /// Columns of A, rows of B.
    #[arg(long)]
    k: u32,
    /// Columns of B and C.
    #[arg(long)]
    n: u32,
    /// Seed of A (entries uniform in [-1, 1] from ChaCha20).
    #[arg(long, value_name = "SEED")]
    seed_a: u64,
    /// Seed of B.
    #[arg(long, value_name = "SEED")]
    seed_b: u64,
    /// The most the job may cost, wei.
    #[arg(long, value_name = "WEI")]
    max_price_wei: u128,
    /// The tab (escrow id) that pays.
    #[arg(long, value_name = "ID")]
    tab: u64,
    /// Seconds from now until the product must be ready.
    #[arg(long, value_name = "S", default_value_t = 60)]
    deadline_in: u64,
    /// The determinism class: D_inf (equal up to rounding, what Freivalds' check accepts) or S.
    #[arg(long, default_value = "D_inf", value_parser = parse_class)]
    class: DeterminismClass,
    /// The intent's nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    /// Wait until the job is done (or failed, or its deadline passed), then check the product.
    #[arg(long)]
    wait: bool,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct PutAdapterArgs {
    /// The directory with adapter_config.json and adapter_model.safetensors (what PEFT's
    /// save_pretrained writes).
    dir: PathBuf,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct SessionArgs {
    /// The tab (escrow id) its calls draw on.
    #[arg(long, value_name = "ID")]
    tab: u64,
    /// The most all its calls together may spend, wei.
    #[arg(long, value_name = "WEI")]
    cap_wei: u128,
    /// Seconds from now until the key stops working.
    #[arg(long, value_name = "S", default_value_t = 3600)]
    expires_in: u64,
    /// A call's deadline, seconds after it arrives, unless the call says otherwise.
    #[arg(long, value_name = "S", default_value_t = 60)]
    deadline_in: u64,
    /// A call's price limit unless it says otherwise, wei.
    #[arg(long, value_name = "WEI")]
    max_price_wei: u128,
    /// A call's lowest verification tier unless it says otherwise: T0, T1, T2 or T3.
    #[arg(long, default_value = "T1", value_parser = parse_tier)]
    tier: Tier,
    /// A call's determinism class unless it says otherwise: D, D_inf or S.
    #[arg(long, default_value = "D", value_parser = parse_class)]
    class: DeterminismClass,
    /// The grant's nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    /// Also write the key to this file (mode 0600) instead of only printing it.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ChatArgs {
    /// The session key (made by `cx agent session`).
    #[arg(long, env = "CX_API_KEY", value_name = "KEY", hide_env_values = true)]
    api_key: String,
    /// A catalog model, or an adapter's content id.
    #[arg(long)]
    model: String,
    /// The user's message.
    message: String,
    /// Most tokens to generate.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_tokens: u32,
    /// Seconds the call may take [default: the session's].
    #[arg(long, value_name = "S")]
    deadline_in: Option<u64>,
    /// Also print the whole completion as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct JobsArgs {
    /// Only jobs in this state (assigned, …).
    #[arg(long)]
    status: Option<String>,
    /// At most this many.
    #[arg(long)]
    limit: Option<u32>,
    /// Also print the list as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct TabArgs {
    /// The tab's escrow id.
    id: u64,
    /// Also print the tab as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct CloseTabArgs {
    /// The tab's escrow id.
    id: u64,
    #[command(flatten)]
    chain: ChainArgs,
    /// Also withdraw the free deposit (the reclaimed escrow included) to the account.
    #[arg(long)]
    withdraw: bool,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct SearchArgs {
    /// The bytes every candidate is prefixed with (0x-hex).
    #[arg(long, value_name = "HEX")]
    prefix: String,
    /// Leading zero bits the digest must have (the target is 2^(256 − bits)), 1 to 64.
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u32).range(1..=64))]
    zero_bits: u32,
    /// What the witness is paid, wei (held on the tab until then).
    #[arg(long, value_name = "WEI")]
    max_price_wei: u128,
    /// The tab (escrow id) that pays.
    #[arg(long, value_name = "ID")]
    tab: u64,
    /// Seconds from now until a witness must be found.
    #[arg(long, value_name = "S", default_value_t = 60)]
    deadline_in: u64,
    /// Wait until a provider fills it (or it ends) and print the witness's job.
    #[arg(long)]
    wait: bool,
    /// The search's nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ReserveArgs {
    /// The catalog model the capacity serves.
    #[arg(long, value_name = "NAME")]
    model: String,
    /// The verification tier of the reserved work: T0, T1, T2 or T3.
    #[arg(long, default_value = "T1", value_parser = parse_tier)]
    tier: Tier,
    /// Seconds from now until the window starts (bids are taken until then).
    #[arg(long, value_name = "S", default_value_t = 10)]
    start_in: u64,
    /// The window's length, seconds.
    #[arg(long, value_name = "S", default_value_t = 60)]
    window_s: u64,
    /// Compute reserved over the window, milliseconds (on the winning bundle).
    #[arg(long, value_name = "MS")]
    compute_ms: u64,
    /// The most paid per compute-second, wei (the whole `compute_ms` × it is held).
    #[arg(long, value_name = "WEI")]
    max_price_wei_per_s: u64,
    /// The tab (escrow id) that pays.
    #[arg(long, value_name = "ID")]
    tab: u64,
    /// Wait until a provider's bid commits it (or it ends with none) and print the outcome.
    #[arg(long)]
    wait: bool,
    /// The reserve's nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct RentArgs {
    /// The adapter's content id (as `cx agent put-adapter` printed it).
    #[arg(long, value_name = "ID")]
    adapter: B256,
    /// The term, seconds from now.
    #[arg(long, value_name = "S")]
    term_s: u64,
    /// The most paid for the whole term, wei (held on the tab until it ends).
    #[arg(long, value_name = "WEI")]
    max_rent_wei: u128,
    /// ε: the share of residency observations that may find it absent, parts per million.
    #[arg(long, value_name = "PPM", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(0..1_000_000))]
    epsilon_ppm: u32,
    /// The tab (escrow id) that pays.
    #[arg(long, value_name = "ID")]
    tab: u64,
    /// Wait until the term ends and its provider claims it (or the claim lapses).
    #[arg(long)]
    wait: bool,
    /// The rent's nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct SettleTabArgs {
    /// The tab's escrow id.
    id: u64,
    /// Also print the tab as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ClaimArgs {
    #[command(flatten)]
    chain: ChainArgs,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
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
        return run_keygen(&args, keygen);
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
        Command::Bind(bind) => run_bind(&args, bind).await,
        Command::OpenTab(open) => run_open_tab(&args, open).await,
        Command::Intent(intent) => run_intent(&args, intent).await,
        Command::Matmul(matmul) => run_matmul(&args, matmul).await,
        Command::PutAdapter(put) => run_put_adapter(&args, put).await,
        Command::PutDataset(put) => train::run_put_dataset(&args, put).await,
        Command::Train(train) => train::run_train(&args, train).await,
        Command::Session(session) => run_session(&args, session).await,
        Command::Chat(chat) => run_chat(&args, chat).await,
        Command::Jobs(jobs) => run_jobs(&args, jobs).await,
        Command::Tab(tab) => run_tab(&args, tab).await,
        Command::CloseTab(close) => run_close_tab(&args, close).await,
        Command::SettleTab(settle) => run_settle_tab(&args, settle).await,
        Command::Search(search) => run_search(&args, search).await,
        Command::Reserve(reserve) => run_reserve(&args, reserve).await,
        Command::Rent(rent) => run_rent(&args, rent).await,
        Command::Claim(claim) => run_claim(&args, claim).await,
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
    let client = EvmClient::connect(&rpc, signer, entry.deployment)
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

// ---- commands -------------------------------------------------------------------------------

fn run_keygen(args: &Args, keygen: &KeygenArgs) -> anyhow::Result<()> {
    let out = keygen
        .out
        .as_deref()
        .or(args.keys.as_deref())
        .ok_or_else(|| {
            anyhow!("no output file: pass --out FILE (or --keys FILE / CX_AGENT_KEYS)")
        })?;
    let keys = if keygen.import_secp256k1 {
        let mut text = zeroize::Zeroizing::new(String::new());
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the secp256k1 secret from standard input")?;
        let secret = cx_client::keys::parse_secret(&text)
            .map_err(|reason| anyhow!("the secp256k1 secret on standard input: {reason}"))?;
        AgentKeys::from_secrets(&secret, Identity::generate())?
    } else {
        AgentKeys::generate()
    };
    keys.write(out, keygen.force)?;
    let table = format!(
        "account          {}\nmldsa_key_hash   {}\nkey file         {} (0600)\n",
        keys.account(),
        keys.mldsa_key_hash(),
        out.display()
    );
    let report = json!({
        "account": keys.account(),
        "mldsa_key_hash": keys.mldsa_key_hash(),
        "path": out,
    });
    super::emit(keygen.json, &table, &report)
}

async fn run_bind(args: &Args, bind: &BindArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, true).await?;
    let binding = keys.binding(&chain.domain(), bind.nonce)?;
    let bound = client
        .bind(&binding)
        .await
        .context("binding the ML-DSA-65 key")?;
    let table = format!(
        "account          {}\nmldsa_key_hash   {}\nbound on         chain {} (Settlement {})\n",
        bound.account, bound.mldsa_key_hash, chain.chain_id, chain.verifying_contract
    );
    super::emit(
        bind.json,
        &table,
        &json!({
            "account": bound.account,
            "mldsa_key_hash": bound.mldsa_key_hash,
            "chain_id": chain.chain_id,
            "verifying_contract": chain.verifying_contract,
        }),
    )
}

async fn run_open_tab(args: &Args, open: &OpenTabArgs) -> anyhow::Result<()> {
    if open.amount == 0 {
        bail!("--amount: must be > 0 wei");
    }
    let keys = args.load_keys()?;
    let (evm, chain_id, rpc) = evm(&keys, &open.chain, args.chain)?;
    let domain = order::domain(chain_id, evm.deployment().settlement);
    let terms = TabTerms {
        buyer: keys.account(),
        amount_wei: open.amount,
        deadline_s: now_s().saturating_add(open.deadline_in),
        nonce: open.nonce.unwrap_or_else(fresh_nonce),
    };
    // The escrow's ref commits to the signed terms: the EIP-712 hash of TabTerms under this
    // chain's domain, so the ref names the buyer, amount, deadline and nonce on this deployment.
    let signed = keys.sign(terms.clone(), &domain)?;
    let reference = terms.tab_ref(&domain);
    let at = format!("on chain {chain_id} ({rpc})");
    evm.approve_all()
        .await
        .with_context(|| format!("approving the Settlement contract {at}"))?;
    let free = evm
        .escrow_balance(keys.account())
        .await
        .with_context(|| format!("reading the free deposit {at}"))?;
    let amount = U256::from(open.amount);
    let deposit_tx = if free < amount {
        Some(
            evm.deposit(amount - free)
                .await
                .with_context(|| format!("depositing {at}"))?
                .tx_hash,
        )
    } else {
        None
    };
    let (escrow_id, opened) = evm
        .open_job(open.amount, terms.deadline_s, reference)
        .await
        .with_context(|| format!("opening the escrow {at}"))?;
    let table = format!(
        "tab              {escrow_id} on chain {chain_id}\namount_wei       {}\ndeadline_s       {}\nref              {reference}\ntx               {}\n",
        open.amount, terms.deadline_s, opened.tx_hash
    );
    super::emit(
        open.json,
        &table,
        &json!({
            "chain_id": chain_id,
            "escrow_id": escrow_id,
            "amount_wei": open.amount.to_string(),
            "deadline_s": terms.deadline_s,
            "ref": reference,
            "deposit_tx": deposit_tx,
            "open_tx": opened.tx_hash,
            "terms": signed,
        }),
    )
}

/// Most bytes read of an adapter's files (the exchange's own limit is 96 MiB).
const MAX_ADAPTER_FILE_BYTES: u64 = 96 << 20;

async fn run_put_adapter(args: &Args, cmd: &PutAdapterArgs) -> anyhow::Result<()> {
    let read = |name: &str| -> anyhow::Result<Vec<u8>> {
        let path = cmd.dir.join(name);
        let size = std::fs::metadata(&path)
            .with_context(|| format!("{}", path.display()))?
            .len();
        if size > MAX_ADAPTER_FILE_BYTES {
            bail!(
                "{}: {size} bytes, above {MAX_ADAPTER_FILE_BYTES}",
                path.display()
            );
        }
        std::fs::read(&path).with_context(|| format!("{}", path.display()))
    };
    let config = read("adapter_config.json")?;
    let weights = read("adapter_model.safetensors")?;
    let config_text = std::str::from_utf8(&config).map_err(|_| {
        anyhow!(
            "{}: not UTF-8 text",
            cmd.dir.join("adapter_config.json").display()
        )
    })?;
    // The id the provider computes for the same files; the exchange checks it.
    let id = cx_protocol::content_id(&[
        ("adapter_config.json", &config),
        ("adapter_model.safetensors", &weights),
    ]);
    let stored = args
        .account_client()?
        .put_adapter(config_text, &weights, Some(&id))
        .await
        .context("storing the adapter")?;
    let table = format!(
        "adapter          {}\nbytes            {}\nstored           {}\n",
        stored.id,
        stored.bytes,
        if stored.created { "now" } else { "already" }
    );
    super::emit(cmd.json, &table, &stored)
}

async fn run_session(args: &Args, cmd: &SessionArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, false).await?;
    // The key is a fresh 256-bit secret; only its SHA-256 is signed and stored.
    let mut secret = zeroize::Zeroizing::new([0u8; 32]);
    getrandom::fill(&mut *secret).map_err(|e| anyhow!("no randomness from the OS: {e}"))?;
    let key = zeroize::Zeroizing::new(format!("cxs_{}", hex::encode(*secret)));
    let grant = order::SessionGrant {
        tab_id: cmd.tab,
        spend_cap_wei: cmd.cap_wei,
        expiry_s: now_s().saturating_add(cmd.expires_in),
        default_deadline_s: cmd.deadline_in,
        default_tier: cmd.tier,
        default_determinism: cmd.class,
        default_max_price_wei: cmd.max_price_wei,
        bearer_hash: order::SessionGrant::bearer_hash_of(key.as_bytes()),
        nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
    };
    let signed = keys.sign(grant, &chain.domain())?;
    let opened = client
        .open_session(&signed)
        .await
        .context("storing the session grant")?;
    if let Some(path) = &cmd.out {
        write_secret(path, key.as_bytes()).with_context(|| format!("--out {}", path.display()))?;
    }
    let table = format!(
        "session          {}
tab              {} on chain {}
spend_cap_wei    {}
expiry_s         {}
api_key          {}
try              OPENAI_BASE_URL={}/v1 OPENAI_API_KEY=<api_key> (any OpenAI client)
",
        opened.session_id,
        opened.tab_id,
        opened.chain_id,
        opened.spend_cap_wei,
        opened.expiry_s,
        key.as_str(),
        client.base_url()
    );
    super::emit(
        cmd.json,
        &table,
        &json!({
            "session_id": opened.session_id,
            "chain_id": opened.chain_id,
            "tab_id": opened.tab_id,
            "spend_cap_wei": opened.spend_cap_wei.to_string(),
            "expiry_s": opened.expiry_s,
            "api_key": key.as_str(),
        }),
    )
}

/// Writes a secret to a new file readable by its owner alone (0600), refusing to replace one.
fn write_secret(path: &Path, secret: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow!("already exists; choose another file")
        } else {
            anyhow!("{e}")
        }
    })?;
    file.write_all(secret)?;
    file.write_all(b"\n")?;
    Ok(())
}

async fn run_chat(args: &Args, cmd: &ChatArgs) -> anyhow::Result<()> {
    let mut body = json!({
        "model": cmd.model,
        "messages": [{"role": "user", "content": cmd.message}],
        "max_tokens": cmd.max_tokens,
    });
    if let Some(s) = cmd.deadline_in {
        body["cx"] = json!({"deadline_in_s": s});
    }
    // The answer comes when a provider's result is in: wait past the longest deadline a call
    // may have.
    let client = args.client()?.with_timeout(std::time::Duration::from_secs(
        cmd.deadline_in.unwrap_or(600) + 10,
    ));
    let completion = client
        .chat(cmd.api_key.trim(), &body)
        .await
        .context("chat completion")?;
    let text = completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    let table = format!(
        "{text}\n-- job {} on {}, {} tokens\n",
        completion["cx"]["job_id"].as_str().unwrap_or("?"),
        completion["cx"]["bundle_id"].as_str().unwrap_or("?"),
        completion["usage"]["completion_tokens"]
    );
    super::emit(cmd.json, &table, &completion)
}

async fn run_intent(args: &Args, cmd: &IntentArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args
        .client()?
        .with_credential(Credential::Account(keys.signing_key().clone()));
    let chain = pick_chain(&client, args.chain, false).await?;
    let domain = chain.domain();
    let request = InferenceRequest {
        prompt: cmd.prompt.clone(),
        max_tokens: cmd.max_tokens,
        ..Default::default()
    };
    let now = now_s();
    let intent = Intent {
        want: cmd.model.clone(),
        adapter_id: cmd.adapter,
        request_hash: request_hash(&request),
        deadline_s: now.saturating_add(cmd.deadline_in),
        max_price_wei: cmd.max_price_wei,
        min_tier: cmd.tier,
        determinism: cmd.class,
        tab_id: cmd.tab,
        nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
        expiry_s: now.saturating_add(cmd.expiry_in.unwrap_or(cmd.deadline_in)),
    };
    let signed = keys.sign(intent, &domain)?;
    let accepted = client
        .submit_intent(&signed, &request)
        .await
        .context("submitting the intent")?;
    let t = &accepted.terms;
    let mut table = format!(
        "job              {}\nstatus           {}\nbundle           {}\nheld_wei         {}\n",
        accepted.job_id, accepted.status, accepted.bundle_id, accepted.held_wei
    );
    let _ = writeln!(table, "tier             {}", accepted.tier);
    let _ = writeln!(
        table,
        "terms            total {:.6} = compute {:.6} + latency {:.6} + failure {:.6} + verification {:.6} + deadline_risk {:.6} + base_load {:.6} + adapter_load {:.6}\ncompletion_s     {:.3}",
        t.total,
        t.compute,
        t.latency,
        t.failure,
        t.verification,
        t.deadline_risk,
        t.base_load,
        t.adapter_load,
        t.completion_s
    );
    let mut report = serde_json::to_value(&accepted)?;
    report["chain_id"] = json!(chain.chain_id);
    report["nonce"] = json!(signed.order.nonce);
    if cmd.wait {
        let job = job_once_ended(&client, accepted.job_id, Some(cmd.deadline_in)).await?;
        let _ = writeln!(table, "final status     {}", job.status);
        if let Some(text) = job.result.as_ref().and_then(|r| r["text"].as_str()) {
            let _ = writeln!(table, "output           {text:?}");
        }
        if let Some(receipt) = &job.receipt {
            let _ = writeln!(
                table,
                "receipt          {} wei owed to {}",
                receipt.receipt.amount_owed_wei,
                Address::from(receipt.receipt.provider)
            );
        }
        report["final_status"] = json!(job.status);
        report["bundle_id"] = json!(job.bundle_id);
        report["result"] = json!(job.result);
        report["receipt"] = serde_json::to_value(&job.receipt)?;
    }
    super::emit(cmd.json, &table, &report)
}

async fn run_matmul(args: &Args, cmd: &MatmulArgs) -> anyhow::Result<()> {
    use cx_protocol::matmul::{MATMUL_MODEL, MatmulRequest};
    let keys = args.load_keys()?;
    let client = args
        .client()?
        .with_credential(Credential::Account(keys.signing_key().clone()));
    let chain = pick_chain(&client, args.chain, false).await?;
    let request = MatmulRequest {
        m: cmd.m,
        k: cmd.k,
        n: cmd.n,
        seed_a: cmd.seed_a,
        seed_b: cmd.seed_b,
    };
    // Refused here as the exchange would refuse it, before anything is signed.
    request.validate().map_err(|e| anyhow::anyhow!("--{e}"))?;
    let now = now_s();
    let intent = Intent {
        want: MATMUL_MODEL.to_owned(),
        adapter_id: None,
        request_hash: request.hash(),
        deadline_s: now.saturating_add(cmd.deadline_in),
        max_price_wei: cmd.max_price_wei,
        min_tier: Tier::T2,
        determinism: cmd.class,
        tab_id: cmd.tab,
        nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
        expiry_s: now.saturating_add(cmd.deadline_in),
    };
    let signed = keys.sign(intent, &chain.domain())?;
    let accepted = client
        .submit_matmul(&signed, &request)
        .await
        .context("submitting the matmul intent")?;
    let job = job_once_ended(
        &client,
        accepted.job_id,
        cmd.wait.then_some(cmd.deadline_in),
    )
    .await?;
    let product = job.checked_product().context("the returned product")?;
    let verification = job
        .events
        .iter()
        .rev()
        .find(|e| e.status == "verified" || e.status == "verification_failed");
    let mut table = format!(
        "job              {}
status           {}
bundle           {}
held_wei         {}
",
        job.id,
        job.status,
        job.bundle_id.as_deref().unwrap_or("-"),
        job.held_wei
    );
    if let Some(event) = verification {
        let _ = writeln!(table, "verification     {} {}", event.status, event.detail);
    }
    if let Some(bytes) = &product {
        let _ = writeln!(
            table,
            "product          {} bytes ({} × {} f32), SHA-256 matches the receipt",
            bytes.len(),
            cmd.m,
            cmd.n
        );
    }
    let report = json!({
        "job_id": job.id,
        "status": job.status,
        "bundle_id": job.bundle_id,
        "held_wei": job.held_wei.to_string(),
        "chain_id": chain.chain_id,
        "nonce": signed.order.nonce,
        "verification": verification.map(|e| json!({"status": e.status, "detail": e.detail})),
        "product_bytes": product.as_ref().map(Vec::len),
        "product_checked": product.is_some(),
    });
    super::emit(cmd.json, &table, &report)?;
    if cmd.wait && !matches!(job.status.as_str(), "done" | "settled") {
        anyhow::bail!("job {} ended {}", job.id, job.status);
    }
    Ok(())
}

async fn run_jobs(args: &Args, cmd: &JobsArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args
        .client()?
        .with_credential(Credential::Account(keys.signing_key().clone()));
    let jobs = client
        .jobs(&JobsQuery {
            account: keys.account(),
            status: cmd.status.clone(),
            limit: cmd.limit,
        })
        .await
        .context("listing jobs")?;
    let mut table = format!(
        "{:<66}  {:<10}  {:<24}  {:>10}  {:<16}  {:>12}\n",
        "job", "status", "model", "tab", "bundle", "held_wei"
    );
    for job in &jobs {
        let _ = writeln!(
            table,
            "{:<66}  {:<10}  {:<24}  {:>10}  {:<16}  {:>12}",
            job.id.to_string(),
            job.status,
            job.model,
            format!("{}/{}", job.chain_id, job.escrow_id),
            job.bundle_id.as_deref().unwrap_or("-"),
            job.held_wei
        );
    }
    if jobs.is_empty() {
        table.push_str("(no jobs)\n");
    }
    super::emit(cmd.json, &table, &jobs)
}

async fn run_tab(args: &Args, cmd: &TabArgs) -> anyhow::Result<()> {
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, false).await?;
    let tab = client
        .tab(chain.chain_id, cmd.id)
        .await
        .with_context(|| format!("reading tab {} on chain {}", cmd.id, chain.chain_id))?;
    let table = format!(
        "tab              {} on chain {}\nbuyer            {}\nstatus           {}\namount_wei       {}\nheld_wei         {}\navailable_wei    {}\ndeadline_s       {}\nref              {}\n",
        tab.escrow_id,
        tab.chain_id,
        tab.buyer,
        tab.status,
        tab.amount_wei,
        tab.held_wei,
        tab.available_wei(),
        tab.deadline_s,
        tab.reference
    );
    super::emit(cmd.json, &table, &tab)
}

async fn run_search(args: &Args, cmd: &SearchArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, false).await?;
    let prefix = hex::decode(cmd.prefix.trim_start_matches("0x"))
        .map_err(|_| anyhow!("--prefix: not hex"))?;
    let now = now_s();
    let search = cx_protocol::order::Search {
        prefix: prefix.into(),
        target: cx_protocol::order::B256::from(
            cx_exchange::lifecycle::search::target_for_zero_bits(cmd.zero_bits),
        ),
        deadline_s: now.saturating_add(cmd.deadline_in),
        max_price_wei: cmd.max_price_wei,
        tab_id: cmd.tab,
        nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
        expiry_s: now.saturating_add(cmd.deadline_in),
    };
    let signed = keys.sign(search, &chain.domain())?;
    let accepted = client
        .submit_search(&signed)
        .await
        .context("submitting the search")?;
    let id: cx_protocol::order::B256 = accepted["order_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| {
            anyhow!("the exchange accepted the search without an order_id: {accepted}")
        })?;
    let mut order = client.standing_order(id).await?;
    while cmd.wait && order["status"] == "open" {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        order = client.standing_order(id).await?;
    }
    let table = format!(
        "search           {id}\nstatus           {}\nheld_wei         {}\nends_s           {}\n",
        order["status"].as_str().unwrap_or("?"),
        order["held_wei"].as_str().unwrap_or("?"),
        order["ends_s"]
    );
    super::emit(cmd.json, &table, &order)
}

async fn run_reserve(args: &Args, cmd: &ReserveArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, false).await?;
    let now = now_s();
    let start = now.saturating_add(cmd.start_in);
    let reserve = cx_protocol::order::Reserve {
        model: cmd.model.clone(),
        tier: cmd.tier,
        window_start_s: start,
        window_end_s: start.saturating_add(cmd.window_s),
        compute_ms: cmd.compute_ms,
        max_price_wei_per_s: cmd.max_price_wei_per_s,
        tab_id: cmd.tab,
        nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
        expiry_s: start,
    };
    let signed = keys.sign(reserve, &chain.domain())?;
    let accepted = client
        .submit_reserve(&signed)
        .await
        .context("submitting the reserve")?;
    let id: cx_protocol::order::B256 = accepted["order_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| {
            anyhow!("the exchange accepted the reserve without an order_id: {accepted}")
        })?;
    let mut order = client.standing_order(id).await?;
    while cmd.wait && order["status"] == "open" {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        order = client.standing_order(id).await?;
    }
    let fill = &order["reserve"];
    let table = format!(
        "reserve          {id}\nstatus           {}\nheld_wei         {}\nwindow           {} .. {}\n\
         bundle           {}\nrate_wei_per_s   {}\nbids             {}\n",
        order["status"].as_str().unwrap_or("?"),
        order["held_wei"].as_str().unwrap_or("?"),
        start,
        order["ends_s"],
        fill["bundle_id"].as_str().unwrap_or("-"),
        fill["rate_wei_per_s"],
        fill["bids"].as_array().map_or(0, Vec::len),
    );
    super::emit(cmd.json, &table, &order)
}

async fn run_rent(args: &Args, cmd: &RentArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, false).await?;
    let rent = cx_protocol::order::Rent {
        target_kind: cx_protocol::order::RentTarget::Adapter,
        target: cmd.adapter,
        term_s: cmd.term_s,
        max_rent_wei: cmd.max_rent_wei,
        epsilon_ppm: cmd.epsilon_ppm,
        tab_id: cmd.tab,
        nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
        expiry_s: now_s().saturating_add(60),
    };
    let signed = keys.sign(rent, &chain.domain())?;
    let accepted = client
        .submit_rent(&signed)
        .await
        .context("submitting the rent")?;
    let id: B256 = accepted["order_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| anyhow!("the exchange accepted the rent without an order_id: {accepted}"))?;
    let mut order = client.standing_order(id).await?;
    while cmd.wait && order["status"] == "committed" {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        order = client.standing_order(id).await?;
    }
    let fill = &order["rent"];
    let table = format!(
        "rent             {id}\nstatus           {}\nheld_wei         {}\nends_s           {}\n\
         bundle           {}\nrent_wei         {}\nresidency        {} resident, {} absent, {} missed deadlines\n\
         rebate_wei       {}\ncharged_wei      {}\n",
        order["status"].as_str().unwrap_or("?"),
        order["held_wei"].as_str().unwrap_or("?"),
        order["ends_s"],
        fill["bundle_id"].as_str().unwrap_or("-"),
        fill["rent_wei"].as_str().unwrap_or("-"),
        fill["resident_reports"],
        fill["absent_reports"],
        fill["missed_deadlines"],
        fill["rebate_wei"].as_str().unwrap_or("-"),
        fill["charged_wei"].as_str().unwrap_or("-"),
    );
    super::emit(cmd.json, &table, &order)
}

async fn run_settle_tab(args: &Args, cmd: &SettleTabArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, false).await?;
    let tab = client
        .close_tab(&keys, chain.chain_id, chain.verifying_contract, cmd.id)
        .await
        .with_context(|| format!("closing tab {} on chain {}", cmd.id, chain.chain_id))?;
    let table = format!(
        "tab              {} on chain {}\nstatus           {}\nspent_wei        {}\n",
        tab.escrow_id, tab.chain_id, tab.status, tab.held_wei
    );
    super::emit(cmd.json, &table, &tab)
}

async fn run_claim(args: &Args, cmd: &ClaimArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let (evm, chain_id, rpc) = evm(&keys, &cmd.chain, args.chain)?;
    let at = format!("on chain {chain_id} ({rpc})");
    let client = args.client()?;
    let claim = client
        .claim(chain_id, keys.account())
        .await
        .with_context(|| format!("asking the exchange for {}'s claim {at}", keys.account()))?;
    let cumulative: U256 = claim
        .cumulative_wei
        .parse()
        .with_context(|| format!("the exchange's cumulative_wei {:?}", claim.cumulative_wei))?;
    let already = evm
        .claimed(keys.account())
        .await
        .with_context(|| format!("reading what was claimed {at}"))?;
    if cumulative <= already {
        bail!("nothing to claim {at}: credited {cumulative} wei, already claimed {already}");
    }
    let out = evm
        .claim(cumulative, claim.proof.clone())
        .await
        .with_context(|| format!("claiming {at}"))?;
    let paid = cumulative - already;
    let table = format!(
        "claimed_wei      {paid} on chain {chain_id}\ncumulative_wei   {cumulative}\ntx               {}\n",
        out.tx_hash
    );
    super::emit(
        cmd.json,
        &table,
        &json!({
            "chain_id": chain_id,
            "account": keys.account(),
            "claimed_wei": paid.to_string(),
            "cumulative_wei": cumulative.to_string(),
            "tx": out.tx_hash,
        }),
    )
}

async fn run_close_tab(args: &Args, cmd: &CloseTabArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let (evm, chain_id, rpc) = evm(&keys, &cmd.chain, args.chain)?;
    let at = format!("on chain {chain_id} ({rpc})");
    let reclaimed = evm
        .reclaim(cmd.id)
        .await
        .with_context(|| format!("reclaiming tab {} {at}", cmd.id))?;
    let free = evm
        .escrow_balance(keys.account())
        .await
        .with_context(|| format!("reading the free deposit {at}"))?;
    let mut table = format!(
        "tab              {} on chain {chain_id} reclaimed\ntx               {}\nfree_deposit_wei {free}\n",
        cmd.id, reclaimed.tx_hash
    );
    let mut withdraw_tx = None;
    if cmd.withdraw && free > U256::ZERO {
        let out = evm
            .withdraw(free)
            .await
            .with_context(|| format!("withdrawing the free deposit {at}"))?;
        let _ = writeln!(table, "withdrawn_wei    {free} (tx {})", out.tx_hash);
        withdraw_tx = Some(out.tx_hash);
    }
    super::emit(
        cmd.json,
        &table,
        &json!({
            "chain_id": chain_id,
            "escrow_id": cmd.id,
            "reclaim_tx": reclaimed.tx_hash,
            "free_deposit_wei": free.to_string(),
            "withdraw_tx": withdraw_tx,
        }),
    )
}
