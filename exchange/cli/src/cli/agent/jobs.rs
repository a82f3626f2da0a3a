//! `cx agent intent`, `matmul`, `put-adapter` and `jobs`: jobs the agent orders one at a time
//! (an inference, a matrix product), the adapter its intents may name, and the list of its jobs.

use super::{Args, fresh_nonce, job_once_ended, now_s, parse_class, parse_tier, pick_chain};
use anyhow::{Context, anyhow, bail};
use cx_client::types::JobsQuery;
use cx_client::{Credential, InferenceRequest, request_hash};
use cx_protocol::order::{Address, B256, Intent};
use cx_protocol::{DeterminismClass, Tier};
use serde_json::json;
use std::fmt::Write as _;
use std::path::PathBuf;

/// The commands that order a workload, one per kind: a new kind's command is a variant here
/// and its arm in [`run`].
#[derive(Debug, clap::Subcommand)]
pub(super) enum Workload {
    /// Sign an intent for a request, submit it, and print the job the exchange cleared.
    Intent(IntentArgs),
    /// Order a product C = A·B in the cx/matmul-f32 market (operands generated from seeds,
    /// verified by Freivalds' check at T2); with `--wait`, until it is done or fails, checking
    /// the returned product's SHA-256 against the provider's receipt.
    Matmul(MatmulArgs),
    /// Order a LoRA adapter trained on a base (the cx/train/<base> market) on a stored dataset;
    /// with `--wait`, until it is trained, printing the adapter id (checked against the
    /// provider's receipt) that the agent's intents can then use.
    Train(super::train::TrainArgs),
}

/// Runs one workload command.
pub(super) async fn run(args: &Args, cmd: &Workload) -> anyhow::Result<()> {
    match cmd {
        Workload::Intent(intent) => run_intent(args, intent).await,
        Workload::Matmul(matmul) => run_matmul(args, matmul).await,
        Workload::Train(train) => super::train::run_train(args, train).await,
    }
}

#[derive(Debug, clap::Args)]
pub(super) struct IntentArgs {
    /// The catalog model, or a task the router maps to one (`task:chat`, `task:code`,
    /// `task:reasoning`, `task:extraction`).
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
    /// Leave the price to the market: only bundles asking at most the market's quote for the
    /// job are eligible (`--max-price-wei` stays the most it may cost).
    #[arg(long)]
    market: bool,
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
pub(super) struct MatmulArgs {
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
pub(super) struct PutAdapterArgs {
    /// The directory with adapter_config.json and adapter_model.safetensors (what PEFT's
    /// save_pretrained writes).
    dir: PathBuf,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(super) struct JobsArgs {
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
        market_limit: cmd.market,
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
    if let Some(model) = &accepted.routed_to {
        let _ = writeln!(table, "routed to        {model}");
    }
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
    super::super::emit(cmd.json, &table, &report)
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
        market_limit: false,
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
    super::super::emit(cmd.json, &table, &report)?;
    if cmd.wait && !matches!(job.status.as_str(), "done" | "settled") {
        anyhow::bail!("job {} ended {}", job.id, job.status);
    }
    Ok(())
}

/// Most bytes read of an adapter's files (the exchange's own limit is 96 MiB).
const MAX_ADAPTER_FILE_BYTES: u64 = 96 << 20;

pub(super) async fn run_put_adapter(args: &Args, cmd: &PutAdapterArgs) -> anyhow::Result<()> {
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
    super::super::emit(cmd.json, &table, &stored)
}

pub(super) async fn run_jobs(args: &Args, cmd: &JobsArgs) -> anyhow::Result<()> {
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
    super::super::emit(cmd.json, &table, &jobs)
}
