//! `cx agent open-tab`, `tab`, `settle-tab`, `claim` and `close-tab`: a tab's life, from the
//! escrow the agent opens on chain, through the exchange's books and its settlement, to the
//! credit claimed and the escrow reclaimed.

use super::{Args, ChainArgs, evm, fresh_nonce, now_s, pick_chain};
use anyhow::{Context, bail};
use cx_protocol::order::{self, TabTerms, U256};
use serde_json::json;
use std::fmt::Write as _;

#[derive(Debug, clap::Args)]
pub(super) struct OpenTabArgs {
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
pub(super) struct TabArgs {
    /// The tab's escrow id.
    id: u64,
    /// Also print the tab as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(super) struct CloseTabArgs {
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
pub(super) struct SettleTabArgs {
    /// The tab's escrow id.
    id: u64,
    /// Also print the tab as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(super) struct ClaimArgs {
    #[command(flatten)]
    chain: ChainArgs,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

pub(super) async fn run_open_tab(args: &Args, open: &OpenTabArgs) -> anyhow::Result<()> {
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
    super::super::emit(
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

pub(super) async fn run_tab(args: &Args, cmd: &TabArgs) -> anyhow::Result<()> {
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
    super::super::emit(cmd.json, &table, &tab)
}

pub(super) async fn run_settle_tab(args: &Args, cmd: &SettleTabArgs) -> anyhow::Result<()> {
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
    super::super::emit(cmd.json, &table, &tab)
}

pub(super) async fn run_claim(args: &Args, cmd: &ClaimArgs) -> anyhow::Result<()> {
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
    super::super::emit(
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

pub(super) async fn run_close_tab(args: &Args, cmd: &CloseTabArgs) -> anyhow::Result<()> {
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
    super::super::emit(
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
