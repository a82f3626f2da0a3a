//! Reserves (SPEC §3): the provider reads the exchange's open reserves and bids on those for
//! the model it serves at a tier it offers — its ask less `--reserve-discount-bps` (a reserve
//! is priced below spot), within the buyer's limit — signed by its ML-DSA identity. Once a
//! reserve it won is past its window, it claims the take-or-pay with a receipt it signs: the
//! committed rate × the reserved compute, drawn or not (the buyer's intents in the window come
//! to it as ordinary jobs priced zero). Each reserve is bid on once and claimed once per run.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use cx_protocol::DeterminismClass;
use cx_protocol::bid::{ReserveBid, SignedBid};
use cx_protocol::order::{B256, Reserve, Signed};
use cx_protocol::receipt::{Receipt, SignedReceipt};
use serde::Deserialize;

use super::Link;
use crate::error::{Error, Result};

/// How often the reserves are read.
const POLL_EVERY: Duration = Duration::from_secs(2);

/// `GET /v1/providers/reserves`.
#[derive(Debug, Deserialize)]
struct Reserves {
    reserves: Vec<OpenReserve>,
}

/// One reserve as the exchange lists it.
#[derive(Debug, Deserialize)]
struct OpenReserve {
    id: B256,
    account: cx_protocol::order::Address,
    chain_id: u64,
    escrow_id: u64,
    status: String,
    order: serde_json::Value,
    reserve: Option<Fill>,
}

/// What became of it.
#[derive(Debug, Deserialize)]
struct Fill {
    provider_key_hash: Option<B256>,
    rate_wei_per_s: Option<u64>,
}

/// Bids on open reserves and claims won ones, until the process ends.
pub(super) async fn run(link: Arc<Link>) {
    let mut bid_on: HashSet<B256> = HashSet::new();
    let mut claimed: HashSet<B256> = HashSet::new();
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        let listed: Result<Reserves> = link
            .https
            .get_with_token(
                "/v1/providers/reserves",
                link.token.as_str(),
                Duration::from_secs(20),
            )
            .await;
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!("reading reserves failed (retrying): {e}");
                continue;
            }
        };
        for reserve in listed.reserves {
            let result = match reserve.status.as_str() {
                "open" if bid_on.insert(reserve.id) => bid(&link, &reserve).await,
                "committed" if !claimed.contains(&reserve.id) => {
                    match claim(&link, &reserve).await {
                        Ok(true) => {
                            claimed.insert(reserve.id);
                            Ok(())
                        }
                        Ok(false) => Ok(()),
                        Err(e) => {
                            claimed.insert(reserve.id);
                            Err(e)
                        }
                    }
                }
                _ => Ok(()),
            };
            if let Err(e) = result {
                tracing::warn!("reserve {}: {e}", reserve.id);
            }
        }
    }
}

fn order(reserve: &OpenReserve) -> Result<Reserve> {
    let signed: Signed<Reserve> =
        serde_json::from_value(reserve.order.get("reserve").cloned().unwrap_or_default())
            .map_err(|e| Error::Exchange(format!("a reserve's order: {e}")))?;
    Ok(signed.order)
}

/// Bids on `reserve` when it is for this provider's model and tier and a discounted ask fits.
async fn bid(link: &Arc<Link>, reserve: &OpenReserve) -> Result<()> {
    let order = order(reserve)?;
    if order.model != link.config.model_name {
        return Ok(());
    }
    // The inference bundle that offers the reserve's tier (its own when priced apart), at its ask.
    let Some(bundle) = link
        .bundles()
        .into_iter()
        .filter(|b| !b.id.ends_with(super::matmul::BUNDLE_SUFFIX))
        .find(|b| b.tiers.contains(order.tier))
    else {
        return Ok(());
    };
    let ask = u128::from(bundle.price_wei_per_s);
    let discount = u128::from(link.config.reserve_discount_bps.min(10_000));
    let rate = u64::try_from(ask * (10_000 - discount) / 10_000)
        .unwrap_or(u64::MAX)
        .min(order.max_price_wei_per_s);
    if rate == 0 || u128::from(rate) >= ask {
        return Ok(());
    }
    let signed = SignedBid::sign(
        ReserveBid {
            reserve_id: reserve.id,
            bundle_id: bundle.id,
            rate_wei_per_s: rate,
            provider_key: B256::from(link.identity.id().0),
        },
        &link.identity,
    )?;
    let _: serde_json::Value = link
        .https
        .post(
            &format!("/v1/reserves/{}/bids", reserve.id),
            Some(link.token.as_str()),
            &serde_json::json!({ "bid": signed }),
            Duration::from_secs(20),
        )
        .await?;
    tracing::info!(
        "reserve {}: bid {rate} wei/s for {} ms",
        reserve.id,
        order.compute_ms
    );
    Ok(())
}

/// Claims the take-or-pay of `reserve`, committed to this provider, once its window is over;
/// false while it is not yet due (or not this provider's).
async fn claim(link: &Arc<Link>, reserve: &OpenReserve) -> Result<bool> {
    let order = order(reserve)?;
    let Some(Fill {
        provider_key_hash: Some(key),
        rate_wei_per_s: Some(rate),
    }) = &reserve.reserve
    else {
        return Ok(false);
    };
    if key.0 != link.identity.id().0 || link.now_s() < order.window_end_s {
        return Ok(false);
    }
    // Take-or-pay: the committed rate × the reserved compute, rounded down to the wei.
    let owed = u128::from(*rate) * u128::from(order.compute_ms) / 1000;
    let receipt = Receipt {
        job_id: reserve.id.0,
        chain_id: reserve.chain_id,
        escrow_id: reserve.escrow_id,
        input_hash: reserve.id.0,
        output_hash: [0; 32],
        adapter_hash: [0; 32],
        tokens: 0,
        compute_ms: order.compute_ms,
        class: DeterminismClass::D,
        provider: link.config.payout.0.0,
        provider_key: link.identity.id().0,
        amount_owed_wei: owed,
        buyer: reserve.account.0.0,
    };
    let _: serde_json::Value = link
        .https
        .post(
            &format!("/v1/reserves/{}/take_or_pay", reserve.id),
            Some(link.token.as_str()),
            &serde_json::json!({ "receipt": SignedReceipt::sign(receipt, &link.identity)? }),
            Duration::from_secs(20),
        )
        .await?;
    tracing::info!("reserve {}: take-or-pay claimed, {owed} wei", reserve.id);
    Ok(true)
}
