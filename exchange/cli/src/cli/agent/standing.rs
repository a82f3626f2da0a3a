//! `cx agent search`, `reserve` and `rent`: standing orders, which rest at the exchange until
//! providers fill them.

use super::{Args, fresh_nonce, now_s, parse_tier, pick_chain};
use anyhow::{Context, anyhow};
use cx_client::Client;
use cx_client::types::StandingAccepted;
use cx_protocol::Tier;
use cx_protocol::order::{B256, Order, Rent, RentTarget, Reserve, Search, Signed};
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub(super) struct SearchArgs {
    /// The bytes every candidate is prefixed with (0x-hex).
    #[arg(long, value_name = "HEX")]
    prefix: String,
    /// Leading zero bits the digest must have (the target is 2^(256 − bits)), 1 to 64.
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u32).range(1..=64))]
    zero_bits: u32,
    /// The probability, in (0, 1), that the work paid for finds a witness: the search is
    /// priced on the trials that reach it.
    #[arg(long, value_name = "P", default_value_t = 0.99)]
    success: f64,
    /// The most the search may cost, wei: refused when the market prices its work above it.
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
    #[arg(long, value_name = "ID", conflicts_with_all = ["base", "prefix"])]
    adapter: Option<B256>,
    /// A base model's content id (as providers report it: the checkpoint's files' content id).
    #[arg(long, value_name = "ID", conflicts_with = "prefix")]
    base: Option<B256>,
    /// A conversation prefix's id (`cx_protocol::prefix`): its KV kept where it is held.
    #[arg(long, value_name = "ID")]
    prefix: Option<B256>,
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

/// A kind of standing order: the door it is submitted at and the status it rests in while it
/// waits for a provider (its name in messages is its [`Order::KIND`]).
trait StandingOrder: Order {
    /// The status `--wait` waits out: a search or reserve is `open` until a witness or a bid
    /// fills it; a rent is `committed` at once and stays so until its term is claimed.
    const WAITING: &'static str;
    /// How often `--wait` asks (a rent's term is seconds long, so it asks less often).
    const POLL: Duration;

    /// Submits the signed order; the exchange answers with the standing order it accepted.
    async fn submit(client: &Client, signed: &Signed<Self>) -> cx_client::Result<StandingAccepted>;
}

/// A kind's door and waiting status: `standing_order!(Kind, client method, status, poll ms)`.
macro_rules! standing_order {
    ($order:ty, $submit:ident, $waiting:literal, $poll_ms:literal) => {
        impl StandingOrder for $order {
            const WAITING: &'static str = $waiting;
            const POLL: Duration = Duration::from_millis($poll_ms);

            async fn submit(
                client: &Client,
                signed: &Signed<Self>,
            ) -> cx_client::Result<StandingAccepted> {
                client.$submit(signed).await
            }
        }
    };
}

standing_order!(Search, submit_search, "open", 250);
standing_order!(Reserve, submit_reserve, "open", 250);
standing_order!(Rent, submit_rent, "committed", 500);

/// A standing order as the exchange has it after [`place`].
struct Placed<O> {
    /// Its id (its EIP-712 digest).
    id: B256,
    /// What was signed.
    signed: Signed<O>,
    /// `GET /v1/orders/{id}`: its status, what it holds, and its fill.
    order: serde_json::Value,
}

/// Places a standing order for the agent: `build` makes it once the chain is known, the agent's
/// keys sign it for that chain, the exchange takes it, and it is read back by the id the
/// exchange answered with; with `wait`, until it leaves [`StandingOrder::WAITING`].
async fn place<O: StandingOrder>(
    args: &Args,
    wait: bool,
    build: impl FnOnce() -> anyhow::Result<O>,
) -> anyhow::Result<Placed<O>> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, false).await?;
    let signed = keys.sign(build()?, &chain.domain())?;
    let accepted = O::submit(&client, &signed)
        .await
        .with_context(|| format!("submitting the {}", O::KIND.as_str()))?;
    let id = accepted.order_id;
    let mut order = client.standing_order(id).await?;
    while wait && order["status"] == O::WAITING {
        tokio::time::sleep(O::POLL).await;
        order = client.standing_order(id).await?;
    }
    Ok(Placed { id, signed, order })
}

pub(super) async fn run_search(args: &Args, cmd: &SearchArgs) -> anyhow::Result<()> {
    let Placed { id, order, .. } = place(args, cmd.wait, || {
        let prefix = hex::decode(cmd.prefix.trim_start_matches("0x"))
            .map_err(|_| anyhow!("--prefix: not hex"))?;
        if !(cmd.success > 0.0 && cmd.success < 1.0) {
            return Err(anyhow!("--success: a probability strictly between 0 and 1"));
        }
        let now = now_s();
        Ok(Search {
            prefix: prefix.into(),
            target: B256::from(cx_exchange::lifecycle::search::target_for_zero_bits(
                cmd.zero_bits,
            )),
            success_ppm: ((cmd.success * 1e6).round() as u32).clamp(1, 999_999),
            deadline_s: now.saturating_add(cmd.deadline_in),
            max_price_wei: cmd.max_price_wei,
            tab_id: cmd.tab,
            nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
            expiry_s: now.saturating_add(cmd.deadline_in),
        })
    })
    .await?;
    let price = &order["order"]["price"];
    let table = format!(
        "search           {id}\nstatus           {}\nheld_wei         {}\nends_s           {}\n\
         budget_trials    {}\nwitness_trials   {}\nwitness_wei      {}\n",
        order["status"].as_str().unwrap_or("?"),
        order["held_wei"].as_str().unwrap_or("?"),
        order["ends_s"],
        price["budget_trials"].as_str().unwrap_or("?"),
        price["witness_trials"].as_str().unwrap_or("?"),
        price["witness_wei"].as_str().unwrap_or("?"),
    );
    super::super::emit(cmd.json, &table, &order)
}

pub(super) async fn run_reserve(args: &Args, cmd: &ReserveArgs) -> anyhow::Result<()> {
    let Placed { id, signed, order } = place(args, cmd.wait, || {
        let start = now_s().saturating_add(cmd.start_in);
        Ok(Reserve {
            model: cmd.model.clone(),
            tier: cmd.tier,
            window_start_s: start,
            window_end_s: start.saturating_add(cmd.window_s),
            compute_ms: cmd.compute_ms,
            max_price_wei_per_s: cmd.max_price_wei_per_s,
            tab_id: cmd.tab,
            nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
            expiry_s: start,
        })
    })
    .await?;
    let fill = &order["reserve"];
    let table = format!(
        "reserve          {id}\nstatus           {}\nheld_wei         {}\nwindow           {} .. {}\n\
         bundle           {}\nrate_wei_per_s   {}\nbids             {}\n",
        order["status"].as_str().unwrap_or("?"),
        order["held_wei"].as_str().unwrap_or("?"),
        signed.order.window_start_s,
        order["ends_s"],
        fill["bundle_id"].as_str().unwrap_or("-"),
        fill["rate_wei_per_s"],
        fill["bids"].as_array().map_or(0, Vec::len),
    );
    super::super::emit(cmd.json, &table, &order)
}

pub(super) async fn run_rent(args: &Args, cmd: &RentArgs) -> anyhow::Result<()> {
    let Placed { id, order, .. } = place(args, cmd.wait, || {
        let (target_kind, target) = match (cmd.adapter, cmd.base, cmd.prefix) {
            (Some(adapter), _, _) => (RentTarget::Adapter, adapter),
            (None, Some(base), _) => (RentTarget::Base, base),
            (None, None, Some(prefix)) => (RentTarget::Prefix, prefix),
            (None, None, None) => {
                return Err(anyhow!(
                    "--adapter, --base or --prefix names what is rented"
                ));
            }
        };
        Ok(Rent {
            target_kind,
            target,
            term_s: cmd.term_s,
            max_rent_wei: cmd.max_rent_wei,
            epsilon_ppm: cmd.epsilon_ppm,
            tab_id: cmd.tab,
            nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
            expiry_s: now_s().saturating_add(60),
        })
    })
    .await?;
    let mut table = format!(
        "rent             {id}\nstatus           {}\nheld_wei         {}\nends_s           {}\n",
        order["status"].as_str().unwrap_or("?"),
        order["held_wei"].as_str().unwrap_or("?"),
        order["ends_s"],
    );
    let none = Vec::new();
    for h in order["rent"]["holders"].as_array().unwrap_or(&none) {
        table += &format!(
            "holder {}         bundle {}, ε share {} ppm, rent {} wei, {} resident / {} absent / \
             {} missed deadlines, rebate {} wei, charged {} wei\n",
            h["holder"],
            h["bundle_id"].as_str().unwrap_or("-"),
            h["epsilon_ppm"],
            h["rent_wei"].as_str().unwrap_or("-"),
            h["resident_reports"],
            h["absent_reports"],
            h["missed_deadlines"],
            h["rebate_wei"].as_str().unwrap_or("-"),
            h["charged_wei"].as_str().unwrap_or("-"),
        );
    }
    super::super::emit(cmd.json, &table, &order)
}
