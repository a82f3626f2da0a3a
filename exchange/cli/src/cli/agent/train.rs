//! `cx agent put-dataset` and `cx agent train`: fine-tuning as an order
//! ([`cx_protocol::train`]). The dataset is stored at the exchange under its content id; the
//! train order, an intent in the `cx/train/<base>` market whose `request_hash` commits to every
//! setting, is cleared onto a provider holding the base, which trains, stores the adapter and
//! names it in its receipt. With `--wait` the command checks that name against the receipt and
//! prints the adapter id the agent's next intents can use (`cx agent intent --adapter ID`).

use super::{Args, fresh_nonce, job_once_ended, now_s, pick_chain};
use anyhow::{Context, anyhow, bail};
use cx_protocol::order::Intent;
use cx_protocol::train::{
    Dataset, MAX_DATASET_BYTES, TrainLora, TrainOptimizer, TrainRequest, dataset_id, train_market,
};
use cx_protocol::{DeterminismClass, Tier};
use serde_json::json;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(super) struct PutDatasetArgs {
    /// The dataset file: JSON `{"sequences": [[token id, ...], ...], "loss_mask": [[weight,
    /// ...], ...]}`, one weight per token (entry 0 of each row 0), stored as it is.
    file: PathBuf,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(super) struct TrainArgs {
    /// The base to train on (a catalog model; the order goes to the cx/train/<base> market).
    #[arg(long)]
    base: String,
    /// The dataset's content id (from `cx agent put-dataset`).
    #[arg(long, value_name = "ID")]
    data: String,
    /// Optimizer steps.
    #[arg(long, default_value_t = 30)]
    steps: u32,
    /// Sequences per step (cycled through the data in order).
    #[arg(long, default_value_t = 16)]
    batch_size: u32,
    /// LoRA rank.
    #[arg(long, default_value_t = 8)]
    rank: u32,
    /// LoRA alpha [default: twice the rank].
    #[arg(long)]
    alpha: Option<f64>,
    /// Adapted projections, comma separated (q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj) [default: all].
    #[arg(long, value_delimiter = ',')]
    target_modules: Vec<String>,
    /// rsLoRA (scale alpha/√r).
    #[arg(long)]
    rslora: bool,
    /// Seed of A's initialisation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// AdamW β₁.
    #[arg(long, default_value_t = 0.9)]
    beta1: f64,
    /// AdamW β₂.
    #[arg(long, default_value_t = 0.999)]
    beta2: f64,
    /// AdamW ε.
    #[arg(long, default_value_t = 1e-8)]
    eps: f64,
    /// Decoupled weight decay.
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    /// Clip the gradients' global L2 norm to this [default: no clipping].
    #[arg(long)]
    max_grad_norm: Option<f64>,
    /// The most the job may cost, wei.
    #[arg(long, value_name = "WEI")]
    max_price_wei: u128,
    /// The tab (escrow id) that pays.
    #[arg(long, value_name = "ID")]
    tab: u64,
    /// Seconds from now until the adapter must be trained.
    #[arg(long, value_name = "S", default_value_t = 300)]
    deadline_in: u64,
    /// The intent's nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    /// Wait until the job is done (or failed, or its deadline passed), then check the adapter
    /// id against the receipt.
    #[arg(long)]
    wait: bool,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

pub(super) async fn run_put_dataset(args: &Args, cmd: &PutDatasetArgs) -> anyhow::Result<()> {
    let path = &cmd.file;
    let size = std::fs::metadata(path)
        .with_context(|| format!("{}", path.display()))?
        .len();
    if size > MAX_DATASET_BYTES as u64 {
        bail!(
            "{}: {size} bytes, above {MAX_DATASET_BYTES}",
            path.display()
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    // Refused here as the exchange would refuse it, before anything is sent.
    Dataset::parse(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let id = dataset_id(&bytes);
    let stored = args
        .account_client()?
        .put_dataset(&bytes)
        .await
        .context("storing the dataset")?;
    if stored.id != id {
        bail!(
            "the exchange stored the dataset as {}, not its content id {id}",
            stored.id
        );
    }
    let table = format!(
        "dataset          {}\nsequences        {}\ntokens           {}\nstored           {}\n",
        stored.id,
        stored.sequences,
        stored.tokens,
        if stored.created { "now" } else { "already" }
    );
    super::super::emit(cmd.json, &table, &stored)
}

pub(super) async fn run_train(args: &Args, cmd: &TrainArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args
        .client()?
        .with_credential(cx_client::Credential::Account(keys.signing_key().clone()));
    let chain = pick_chain(&client, args.chain, false).await?;
    let target_modules = if cmd.target_modules.is_empty() {
        cx_protocol::model_config::Projection::ALL
            .iter()
            .map(|p| p.name().to_owned())
            .collect()
    } else {
        cmd.target_modules.clone()
    };
    let request = TrainRequest {
        data: cmd.data.trim_start_matches("0x").to_ascii_lowercase(),
        steps: cmd.steps,
        batch_size: cmd.batch_size,
        lora: TrainLora {
            rank: cmd.rank,
            lora_alpha: cmd.alpha.unwrap_or(2.0 * f64::from(cmd.rank)),
            target_modules,
            use_rslora: cmd.rslora,
            seed: cmd.seed,
        },
        optimizer: TrainOptimizer {
            lr: cmd.lr,
            betas: [cmd.beta1, cmd.beta2],
            eps: cmd.eps,
            weight_decay: cmd.weight_decay,
            max_grad_norm: cmd.max_grad_norm,
        },
    };
    // Refused here as the exchange would refuse it, before anything is signed.
    request.validate().map_err(|e| anyhow!("{e}"))?;
    let now = now_s();
    let intent = Intent {
        want: train_market(&cmd.base),
        adapter_id: None,
        request_hash: request.hash(),
        deadline_s: now.saturating_add(cmd.deadline_in),
        max_price_wei: cmd.max_price_wei,
        market_limit: false,
        min_tier: Tier::T0,
        determinism: DeterminismClass::S,
        tab_id: cmd.tab,
        nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
        expiry_s: now.saturating_add(cmd.deadline_in),
    };
    let signed = keys.sign(intent, &chain.domain())?;
    let accepted = client
        .submit_train(&signed, &request)
        .await
        .context("submitting the train order")?;
    let job = job_once_ended(
        &client,
        accepted.job_id,
        cmd.wait.then_some(cmd.deadline_in),
    )
    .await?;
    let trained = job.trained().context("the trained adapter")?;
    let mut table = format!(
        "job              {}\nstatus           {}\nbundle           {}\nheld_wei         {}\n",
        job.id,
        job.status,
        job.bundle_id.as_deref().unwrap_or("-"),
        job.held_wei
    );
    if let Some(t) = &trained {
        let _ = writeln!(
            table,
            "adapter          {} (the receipt names it)\nloss             {:.4} → {:.4} in {} steps",
            t.adapter_id, t.loss_first, t.loss_last, t.steps
        );
    }
    let report = json!({
        "job_id": job.id,
        "status": job.status,
        "bundle_id": job.bundle_id,
        "held_wei": job.held_wei.to_string(),
        "chain_id": chain.chain_id,
        "nonce": signed.order.nonce,
        "trained": trained,
    });
    super::super::emit(cmd.json, &table, &report)?;
    if cmd.wait && !matches!(job.status.as_str(), "done" | "settled") {
        bail!("job {} ended {}", job.id, job.status);
    }
    Ok(())
}
