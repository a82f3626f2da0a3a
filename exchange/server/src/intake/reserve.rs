//! Reserves filled by providers (SPEC §3): signed bids until the window starts, the award to
//! the lowest feasible bid at its start, the buyer's intents in the window drawing on it first,
//! and take-or-pay at its end.
//!
//! An intent drawn on a reserve is cleared onto the committed bundle only (feasible by its
//! deadline there, no price gate: the reserve pays for it) and **priced zero**: it holds nothing
//! on the tab, its assignment and receipt say 0 wei, and it is not paid at settlement — the
//! reserve's take-or-pay voucher ([`cx_protocol::voucher::Authority::Reserve`]) pays the
//! provider rate × compute_ms for the whole commitment, drawn or not. An intent that the
//! reserve's remainder cannot wholly cover goes to spot as usual.

use super::state::Intake;
use crate::books::{Drawable, Provider, StandingOrder};
use crate::error::{Error, Result};
use crate::jobs::placement::{Drawn, Placed, Want};
use alloy::primitives::{Address, B256};
use cx_exchange::lifecycle::reserve::{Bid, Reserve as Commitment, ReserveState, award};
use cx_protocol::bid::SignedBid;
use cx_protocol::order::InferenceRequest;
use cx_protocol::order::{Reserve, Signed};
use cx_protocol::receipt::SignedReceipt;

/// Seconds after a reserve's window ends that its provider has to claim the take-or-pay (at
/// most half the settle margin, so the tab still settles before its buyer may reclaim it);
/// unclaimed by then, the hold returns to the tab.
pub const RESERVE_CLAIM_GRACE_S: u64 = 60;

fn signed_reserve(order: &StandingOrder) -> Result<Signed<Reserve>> {
    Ok(serde_json::from_value(
        order.order.get("reserve").cloned().ok_or(Error::Corrupt {
            what: "a reserve order",
            value: order.id.to_string(),
        })?,
    )?)
}

impl Intake {
    /// How long a committed reserve's provider has to claim its take-or-pay after the window.
    pub fn reserve_claim_grace_s(&self) -> u64 {
        RESERVE_CLAIM_GRACE_S.min(self.settle_margin_s / 2)
    }

    /// Takes `provider`'s signed bid on open reserve `id` at `now_s`: signed by its registered
    /// key and naming this reserve, for one of its live bundles that could win now (serves the
    /// model and tier, the compute fits, the rate within the buyer's limit and below the
    /// bundle's spot ask). A later bid of the same provider replaces it until the window starts.
    pub async fn bid_reserve(
        &self,
        provider: &Provider,
        id: B256,
        signed: &SignedBid,
        now_s: u64,
    ) -> Result<()> {
        let key = cx_protocol::pq::PublicIdentity::from_bytes(&provider.mldsa_key)?;
        signed.verify(&key)?;
        let bid = &signed.bid;
        if bid.reserve_id != id {
            return Err(Error::BidRefused {
                field: "reserve_id",
                reason: format!("names reserve {}, not {id}", bid.reserve_id),
            });
        }
        let order = self
            .books()
            .standing_order(id)
            .await?
            .filter(|o| o.kind == "reserve" && o.status == "open")
            .ok_or(Error::ReserveNotOpen {
                reason: "no open reserve has this id",
            })?;
        let reserve = signed_reserve(&order)?.order;
        if now_s >= reserve.window_start_s {
            return Err(Error::ReserveNotOpen {
                reason: "its window has started: bids are taken until then",
            });
        }
        if self.books().bundle_owner(&bid.bundle_id).await? != Some(provider.key_hash) {
            return Err(Error::BidRefused {
                field: "bundle_id",
                reason: format!("`{}` is not a bundle of this provider", bid.bundle_id),
            });
        }
        let bundles = self.market().bundles();
        let bundle = bundles.iter().find(|b| b.id == bid.bundle_id);
        let elsewhere = self
            .books()
            .committed_ms(&bid.bundle_id, reserve.window_start_s, reserve.window_end_s)
            .await?;
        let key_hex = provider.key_hash.to_string();
        let probe = [Bid {
            bidder: &key_hex,
            bundle,
            rate_wei_per_s: bid.rate_wei_per_s,
            committed_elsewhere_ms: elsewhere,
        }];
        let (model, base_bytes) = self.base_of(&reserve)?;
        if let Some((_, why)) = award(&id.to_string(), &reserve, (&model, base_bytes), &probe)
            .refused
            .first()
        {
            return Err(Error::BidRefused {
                field: "bundle_id",
                reason: format!("could not win: {}", serde_json::to_string(why)?),
            });
        }
        if !self
            .books()
            .place_bid(
                id,
                provider.key_hash,
                &bid.bundle_id,
                bid.rate_wei_per_s,
                &serde_json::to_value(signed)?,
                now_s,
            )
            .await?
        {
            return Err(Error::ReserveNotOpen {
                reason: "its window has started: bids are taken until then",
            });
        }
        Ok(())
    }

    /// A reserve's catalog model and its base's bytes (what a bundle must hold to serve it).
    fn base_of(&self, reserve: &Reserve) -> Result<(String, u64)> {
        let model = self
            .market()
            .catalog()
            .resolve(&reserve.model)
            .map_err(|_| Error::UnknownModel(reserve.model.clone()))?;
        let shape = model
            .shape
            .ok_or_else(|| Error::NotClearable(model.name.clone()))?;
        Ok((model.name.clone(), shape.base_bytes))
    }

    /// Awards every open reserve whose window has started by `now_s` to its lowest feasible bid
    /// (on the bundles live now), or expires it with its hold returned when none is. Returns
    /// each reserve with its winning bundle, if any.
    pub async fn award_reserves(&self, now_s: u64) -> Result<Vec<(B256, Option<String>)>> {
        let mut out = Vec::new();
        let bundles = self.market().bundles();
        for order in self.books().reserves_due(now_s, 32).await? {
            let reserve = signed_reserve(&order)?.order;
            let stored = order.reserve.map(|f| f.bids).unwrap_or_default();
            let keys: Vec<String> = stored
                .iter()
                .map(|b| b.provider_key_hash.to_string())
                .collect();
            let mut bids = Vec::with_capacity(stored.len());
            for (bid, key) in stored.iter().zip(&keys) {
                bids.push(Bid {
                    bidder: key,
                    bundle: bundles.iter().find(|b| b.id == bid.bundle_id),
                    rate_wei_per_s: bid.rate_wei_per_s,
                    committed_elsewhere_ms: self
                        .books()
                        .committed_ms(&bid.bundle_id, reserve.window_start_s, reserve.window_end_s)
                        .await?,
                });
            }
            // A model that left the catalog can be served by no bundle.
            let base = self
                .base_of(&reserve)
                .unwrap_or_else(|_| (reserve.model.clone(), u64::MAX));
            let won = award(&order.id.to_string(), &reserve, (&base.0, base.1), &bids);
            let refusals = won
                .refused
                .iter()
                .map(|(i, why)| Ok((stored[*i].provider_key_hash, serde_json::to_value(why)?)))
                .collect::<Result<Vec<_>>>()?;
            let winner = won.winner.as_ref().map(|(i, _)| {
                let bid = &stored[*i];
                (
                    bid.provider_key_hash,
                    bid.bundle_id.as_str(),
                    bid.rate_wei_per_s,
                )
            });
            if self
                .books()
                .award_reserve(order.id, winner, &refusals)
                .await?
            {
                out.push((order.id, winner.map(|(_, bundle, _)| bundle.to_owned())));
            }
        }
        Ok(out)
    }

    /// The buyer's take-or-pay on reserve `id`, claimed by `provider` (its committed provider)
    /// at or after the window's end with `receipt`: signed by its registered key, naming this
    /// reserve (its digest as job id and input, zero output and adapter, the tab, the buyer,
    /// the payout account, the reserved compute) and claiming exactly what the commitment
    /// closes at — rate × compute_ms, drawn or not. The rest of the hold returns to the tab.
    pub async fn claim_reserve(
        &self,
        provider: &Provider,
        id: B256,
        receipt: &SignedReceipt,
        now_s: u64,
    ) -> Result<()> {
        let order = self
            .books()
            .standing_order(id)
            .await?
            .filter(|o| o.kind == "reserve" && o.status == "committed")
            .ok_or(Error::ReserveNotOpen {
                reason: "no committed reserve has this id",
            })?;
        let fill = order.reserve.clone().ok_or(Error::Corrupt {
            what: "a reserve without its fill",
            value: id.to_string(),
        })?;
        let (Some(key_hash), Some(bundle_id), Some(rate)) =
            (fill.provider_key_hash, fill.bundle_id, fill.rate_wei_per_s)
        else {
            return Err(Error::Corrupt {
                what: "a committed reserve without its commitment",
                value: id.to_string(),
            });
        };
        if key_hash != provider.key_hash {
            return Err(Error::ReserveNotOpen {
                reason: "it is committed to another provider",
            });
        }
        let reserve = signed_reserve(&order)?.order;
        let mut commitment = commitment(id, &reserve, rate, fill.used_ms);
        let ReserveState::Closed {
            charge_wei,
            unused_ms,
        } = commitment
            .close(now_s as f64)
            .map_err(|_| Error::ReserveNotOpen {
                reason: "its window is not over: the take-or-pay is claimed at its end",
            })?
        else {
            return Err(Error::ReserveNotOpen {
                reason: "it is not open",
            });
        };
        let key = cx_protocol::pq::PublicIdentity::from_bytes(&provider.mldsa_key)?;
        receipt.verify(&key).map_err(|e| e.within("receipt"))?;
        let r = &receipt.receipt;
        let checks: [(&'static str, bool); 10] = [
            ("job_id", r.job_id == id.0),
            ("input_hash", r.input_hash == id.0),
            ("output_hash", r.output_hash == [0; 32]),
            ("adapter_hash", r.adapter_hash == [0; 32]),
            ("chain_id", r.chain_id == order.chain_id),
            ("escrow_id", r.escrow_id == order.escrow_id),
            ("buyer", r.buyer == order.account.0.0),
            ("provider", r.provider == provider.payout.0.0),
            ("compute_ms", r.compute_ms == reserve.compute_ms),
            ("amount_owed_wei", r.amount_owed_wei == charge_wei),
        ];
        if let Some((field, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(Error::ReceiptMismatch {
                field,
                reason: format!(
                    "is not what this reserve's take-or-pay makes it (job id and input: the \
                     reserve's digest; output and adapter: zero; the tab, buyer and payout \
                     account; compute_ms: the {} ms reserved; amount: {charge_wei} wei, the \
                     committed {rate} wei/s × the reserved compute)",
                    reserve.compute_ms
                ),
            });
        }
        let decision = serde_json::json!({
            "kind": "reserve",
            "bundle_id": bundle_id,
            "rate_wei_per_s": rate.to_string(),
            "committed_ms": reserve.compute_ms,
            "used_ms": fill.used_ms,
            "unused_ms": unused_ms,
        });
        if !self
            .books()
            .fill_reserve(
                id,
                provider.key_hash,
                charge_wei,
                &serde_json::to_value(receipt)?,
                &decision,
            )
            .await?
        {
            return Err(Error::ReserveNotOpen {
                reason: "no committed reserve has this id",
            });
        }
        Ok(())
    }

    /// Where an intent of `account` on tab `tab` goes when one of the tab's committed reserves
    /// in its window serves its model at a tier at least the intent's minimum and has compute
    /// left for it: onto the committed bundle (feasible by its deadline there), at no price.
    /// `None`: it goes to spot.
    pub(crate) async fn drawn(
        &self,
        want: &Want,
        request: &InferenceRequest,
        account: Address,
        tab: (u64, u64),
        now_s: u64,
    ) -> Result<Option<Placed>> {
        if !self.reserve_tabs.may_hold(self.books(), tab, now_s).await? {
            return Ok(None);
        }
        let reserves = self.books().drawable_reserves(account, tab, now_s).await?;
        if reserves.is_empty() {
            return Ok(None);
        }
        let catalog = self.market().catalog();
        let Ok(wanted) = catalog.resolve(&want.model) else {
            return Ok(None);
        };
        for Drawable {
            id,
            order,
            bundle_id,
            rate_wei_per_s,
            used_ms,
        } in reserves
        {
            let serves = catalog
                .resolve(&order.model)
                .is_ok_and(|m| m.name == wanted.name);
            if !serves || want.min_tier > order.tier {
                continue;
            }
            let mut job = self.job_of(want, request, account, now_s).await?;
            // The reserved capacity is verified at the reserve's tier.
            job.tier = order.tier;
            let Some(bundle) = self
                .market()
                .bundles()
                .into_iter()
                .find(|b| b.id == bundle_id)
            else {
                continue;
            };
            let decision = self.market().clear_on(&job, &bundle_id)?;
            let (Some(_), Some(terms)) = (decision.chosen.as_ref(), decision.terms) else {
                continue;
            };
            let need_ms = (job.compute_flops / bundle.flops_per_s * 1000.0).ceil() as u64;
            let mut commitment = commitment(id, &order, rate_wei_per_s, used_ms);
            let draw = commitment.draw(now_s as f64, need_ms.max(1))?;
            if draw.from_spot_ms > 0 {
                // The rest of the reserve cannot cover it whole: spot, as usual.
                continue;
            }
            return Ok(Some(Placed {
                decision: crate::jobs::placement::decision_record(decision, &job),
                job,
                bundle_id,
                terms,
                held_wei: 0,
                deadline_s: want.deadline_s,
                drawn: Some(Drawn {
                    reserve: id,
                    compute_ms: draw.from_reserve_ms,
                }),
            }));
        }
        Ok(None)
    }
}

/// The pure core's reserve, committed at `rate` with `used_ms` drawn.
fn commitment(id: B256, reserve: &Reserve, rate: u64, used_ms: u64) -> Commitment {
    Commitment {
        id: id.to_string(),
        window_start_s: reserve.window_start_s as f64,
        window_end_s: reserve.window_end_s as f64,
        committed_ms: reserve.compute_ms,
        price_wei_per_s: rate,
        used_ms,
        state: ReserveState::Open,
    }
}
