//! Rents (SPEC §3): the exchange commits a buyer's adapter rent to one of this provider's
//! bundles, as one of the rent's holders (as many as the buyer's ε needs, each on its own
//! provider); the provider reads its pins (`GET /v1/providers/pins`), fetches the adapter if it
//! does not hold it, keeps it loaded **pinned** (never evicted, reported in the offer's
//! `pinned_adapters`) until the term ends, then unpins it and claims its own term's rent with
//! a receipt it signs under its holder's job id — the rent less the rebate the exchange
//! measured (the exchange refuses any other amount; a claim refused because a late observation
//! moved the rebate is retried). A rent on a base it holds, by content id, pins the base: never
//! evicted to load another ([`crate::bases`]) while the term runs. A rent on a conversation
//! prefix it holds pins the prefix's KV: never evicted, and each continuation takes a copy of it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use cx_protocol::DeterminismClass;
use cx_protocol::order::{B256, Rent, RentTarget, Signed};
use cx_protocol::receipt::{Receipt, SignedReceipt};
use serde::Deserialize;

use super::Link;
use crate::error::{Error, Result};

/// How often the pins are read.
const POLL_EVERY: Duration = Duration::from_secs(2);

/// Seconds after a term's end before it is claimed: the exchange's deadline sweep has counted
/// the term's last missed jobs by then.
const CLAIM_AFTER_S: u64 = 3;

/// `GET /v1/providers/pins`.
#[derive(Debug, Deserialize)]
struct Pins {
    pins: Vec<Pin>,
}

/// One committed rent as the exchange lists it.
#[derive(Debug, Deserialize)]
struct Pin {
    id: B256,
    account: cx_protocol::order::Address,
    chain_id: u64,
    escrow_id: u64,
    ends_s: u64,
    order: serde_json::Value,
    rent: Option<Fill>,
}

/// The rent's holders, as the exchange measured their terms.
#[derive(Debug, Deserialize)]
struct Fill {
    holders: Vec<Holding>,
}

/// One holder's part: this provider claims its own.
#[derive(Debug, Deserialize)]
struct Holding {
    job_id: B256,
    provider_key_hash: B256,
    #[serde(with = "cx_protocol::price::wei_string")]
    rent_wei: u128,
    #[serde(default, with = "cx_protocol::price::wei_string_opt")]
    rebate_wei: Option<u128>,
    claimed: bool,
}

/// Keeps the pinned adapters loaded and claims ended terms, until the process ends.
pub(super) async fn run(link: Arc<Link>) {
    let mut pinned: HashSet<String> = HashSet::new();
    let mut pinned_prefixes: HashSet<String> = HashSet::new();
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        let listed: Result<Pins> = link
            .https
            .get_with_token(
                "/v1/providers/pins",
                link.token.as_str(),
                Duration::from_secs(20),
            )
            .await;
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!("reading pins failed (retrying): {e}");
                continue;
            }
        };
        let now = link.now_s();
        let mut live: HashSet<String> = HashSet::new();
        let mut live_prefixes: HashSet<String> = HashSet::new();
        let mut live_bases: HashSet<String> = HashSet::new();
        for pin in &listed.pins {
            let result = match rent(pin) {
                Ok(rent) if now < pin.ends_s => match rent.target_kind {
                    RentTarget::Adapter => {
                        let adapter = hex::encode(rent.target);
                        live.insert(adapter.clone());
                        keep(&link, &adapter).await
                    }
                    // A held base: never evicted while its term runs.
                    RentTarget::Base if link.bases.holds(&hex::encode(rent.target)) => {
                        live_bases.insert(hex::encode(rent.target));
                        Ok(())
                    }
                    // A held conversation prefix: pinned, continuations take copies of it.
                    RentTarget::Prefix => {
                        let id = hex::encode(rent.target);
                        if link.engine().set_prefix_pinned(&id, true) {
                            live_prefixes.insert(id);
                            Ok(())
                        } else {
                            Err(Error::Exchange(format!("prefix {id} is no longer held")))
                        }
                    }
                    other => Err(Error::Exchange(format!(
                        "a rent on a {other:?} this provider does not hold"
                    ))),
                },
                Ok(rent) if now >= pin.ends_s + CLAIM_AFTER_S => claim(&link, pin, &rent).await,
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!("rent {}: {e}", pin.id);
            }
        }
        let mut changed = false;
        for id in pinned.difference(&live) {
            changed |= link.engine().set_pinned(id, false);
            tracing::info!("adapter {id}: its rent ended, unpinned");
        }
        for id in live.difference(&pinned) {
            changed |= link.engine().set_pinned(id, true);
        }
        pinned = live;
        for id in pinned_prefixes.difference(&live_prefixes) {
            changed |= link.engine().set_prefix_pinned(id, false);
        }
        changed |= live_prefixes != pinned_prefixes;
        pinned_prefixes = live_prefixes;
        changed |= link.bases.set_pins(&live_bases);
        if changed {
            link.residency_changed.notify_one();
        }
    }
}

fn rent(pin: &Pin) -> Result<Rent> {
    let signed: Signed<Rent> =
        serde_json::from_value(pin.order.get("rent").cloned().unwrap_or_default())
            .map_err(|e| Error::Exchange(format!("a rent's order: {e}")))?;
    Ok(signed.order)
}

/// Makes rented adapter `id` resident (fetched from the exchange if unknown) and pinned.
async fn keep(link: &Arc<Link>, id: &str) -> Result<()> {
    // Kept on the served base's engine: a pin does not name the adapter's base, so an adapter
    // of a base loaded from the store is not kept under rent yet.
    let loaded = link.ensure_adapter(link.engine(), id).await?;
    if !link.engine().set_pinned(&loaded.id, true) {
        return Err(Error::Exchange(format!(
            "adapter {id} is loaded but not resident: it cannot be pinned"
        )));
    }
    Ok(())
}

/// Claims the rent of `pin`'s ended term: what the exchange measured it at, signed.
async fn claim(link: &Arc<Link>, pin: &Pin, rent: &Rent) -> Result<()> {
    let me = B256::from(link.identity.id().0);
    let Some(Holding {
        job_id,
        rent_wei,
        rebate_wei: Some(rebate_wei),
        ..
    }) = pin.rent.as_ref().and_then(|f| {
        f.holders
            .iter()
            .find(|h| h.provider_key_hash == me && !h.claimed)
    })
    else {
        return Ok(());
    };
    // The job id is this holder's (the exchange names it; a signer re-derives it).
    if cx_protocol::holders::holder_of(pin.id.0, job_id.0).is_none() {
        return Err(Error::Exchange(format!(
            "rent {}: job id {job_id} is none of its holders'",
            pin.id
        )));
    }
    if rebate_wei > rent_wei || *rent_wei > rent.max_rent_wei {
        return Err(Error::Exchange(format!(
            "rent {}: the exchange's term ({rent_wei} wei, rebate {rebate_wei}) is not within \
             the buyer's limit of {} wei",
            pin.id, rent.max_rent_wei
        )));
    }
    let owed = rent_wei - rebate_wei;
    let receipt = Receipt {
        job_id: job_id.0,
        chain_id: pin.chain_id,
        escrow_id: pin.escrow_id,
        input_hash: pin.id.0,
        output_hash: [0; 32],
        adapter_hash: if rent.target_kind == RentTarget::Adapter {
            rent.target.0
        } else {
            [0; 32]
        },
        tokens: 0,
        compute_ms: 0,
        class: DeterminismClass::D,
        provider: link.config.payout.0.0,
        provider_key: link.identity.id().0,
        amount_owed_wei: owed,
        buyer: pin.account.0.0,
    };
    let _: serde_json::Value = link
        .https
        .post(
            &format!("/v1/rents/{}/claim", pin.id),
            Some(link.token.as_str()),
            &serde_json::json!({ "receipt": SignedReceipt::sign(receipt, &link.identity)? }),
            Duration::from_secs(20),
        )
        .await?;
    tracing::info!(
        "rent {}: claimed {owed} wei ({rent_wei} less a {rebate_wei} wei rebate)",
        pin.id
    );
    Ok(())
}
