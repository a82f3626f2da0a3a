//! `cx agent search`, `reserve` and `rent`: standing orders, which rest at the exchange until
//! providers fill them.

use super::{Args, fresh_nonce, now_s, parse_tier, pick_chain};
use anyhow::{Context, anyhow};
use cx_protocol::Tier;
use cx_protocol::order::B256;

#[derive(Debug, clap::Args)]
pub(super) struct SearchArgs {
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
pub(super) struct ReserveArgs {
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
pub(super) struct RentArgs {
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

pub(super) async fn run_search(args: &Args, cmd: &SearchArgs) -> anyhow::Result<()> {
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
    super::super::emit(cmd.json, &table, &order)
}

pub(super) async fn run_reserve(args: &Args, cmd: &ReserveArgs) -> anyhow::Result<()> {
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
    super::super::emit(cmd.json, &table, &order)
}

pub(super) async fn run_rent(args: &Args, cmd: &RentArgs) -> anyhow::Result<()> {
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
    super::super::emit(cmd.json, &table, &order)
}
