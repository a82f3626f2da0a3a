//! Rents on state filled by providers (SPEC §3): a rent on an adapter or a base is committed
//! when it is accepted to the live bundles that can keep it resident most cheaply, as many as
//! its ε needs, each observed every sweep and claiming its own term at the end — the rent less
//! the rebate a missed term earns, a job of the tab paid by
//! [`cx_protocol::voucher::Authority::Rent`].
//!
//! **Who can hold it.** An adapter: a bundle serving its base (its `adapter_config.json`'s
//! `base_model_name_or_path`) whose provider reports a residency that can make room for it, or
//! holds it already. A base: a bundle serving it whose provider reports it resident by content
//! id (`offer.residency.bases`); the holder pins it, so it is never evicted to load another base
//! while the term runs, and reports it pinned. A conversation prefix: the bundles whose
//! provider reports its KV held (`offer.residency.prefixes`, with `prefix_bytes`), the only
//! memory that has it; the holder pins it (never evicted) and each continuation takes a copy.
//!
//! **ε maps to holders.** Each provider's probability of being found absent is estimated from
//! its observed residency on rents of the last week (absent observations — reports and missed
//! deadlines, as the SLA counts them — over all, under a prior of one in twenty,
//! [`crate::books::Books::rent_miss_rates`]); the cheapest capable bundles, one per
//! provider, are taken until all of them missing together is at most ε ([`place_holders`], at
//! most [`cx_protocol::holders::MAX_RENT_HOLDERS`]), and each holder's SLA bound is ε^(1/k).
//!
//! **The price is the holder's shadow price of the bytes** (SPEC §4), not its ask. A provider
//! reports the shadow price of a residency slot of `slot_bytes`: the loading seconds its
//! occupants would save over the cache's horizon `H` (an hour, [`Discount::default`]), which is
//! what pinning those bytes gives up. At the bundle's ask `p` (wei per device-second) that is
//! `ρ = shadow × p × 10⁹ / slot_bytes × 3600 / H` wei per GB-hour, and rent = `ρ·|a|·term`
//! ([`cx_exchange::lifecycle::rent::Rent::accrue`]). Bytes that fit in what is free have a
//! shadow price of zero; the rent of those never falls below a floor, a hundredth of the bytes'
//! share of the device-hour (`p × 3600 × 10⁹ / M / 100`), so idle memory cannot be pinned for a
//! month for nothing and then priced to every later buyer. A provider that reports no residency,
//! or whose cache can make no slot (shadow price absent) and does not hold the target, cannot
//! hold a rent. The holders' terms together must be at most the buyer's `max_rent_wei`.

use super::state::Intake;
use crate::books::{Provider, RentCommitment};
use crate::error::{Error, Result};
use alloy::primitives::B256;
use cx_exchange::lifecycle::rent::{PinObject, Rent as Term, RentState};
use cx_protocol::inventory::Discount;
use cx_protocol::offer::Residency;
use cx_protocol::order::{Rent, RentTarget, Signed};
use cx_protocol::receipt::SignedReceipt;
use std::collections::HashMap;

/// How recent a provider's report must be for a sweep to believe it, seconds: three of the
/// provider's 30 s re-signings (an offer changed by a load or eviction is re-signed at once).
pub const RENT_REPORT_FRESH_S: u64 = 90;

/// A live bundle that can keep a rented adapter resident, at its ρ.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Candidate {
    pub(super) provider_key_hash: B256,
    pub(super) bundle_id: String,
    pub(super) rho_wei_per_gb_hour: u128,
}

/// What a rent keeps resident, as its holders are found.
#[derive(Debug, Clone, Copy)]
pub(super) enum Held<'a> {
    /// An adapter (content id) on catalog base `base`.
    Adapter { id: &'a str, base: &'a str },
    /// A base model by content id.
    Base { id: &'a str },
    /// A conversation prefix's KV by prefix id.
    Prefix { id: &'a str },
}

impl Held<'_> {
    /// What the core's term pins.
    fn pin(&self) -> PinObject {
        match self {
            Held::Adapter { id, .. } => crate::books::pin_of(RentTarget::Adapter, id),
            Held::Base { id } => crate::books::pin_of(RentTarget::Base, id),
            Held::Prefix { id } => crate::books::pin_of(RentTarget::Prefix, id),
        }
    }
}

/// How ε maps to holders: `candidates` cheapest ρ first, one per provider, are taken until the
/// probability that all of them miss at once — each provider's estimated miss probability
/// `miss`, independent of the others' — is at most ε, at most
/// [`cx_protocol::holders::MAX_RENT_HOLDERS`]. Returns how many and each one's share of ε,
/// `ε^(1/k)` (so that holders each within their share miss together within ε); or, when
/// every candidate taken still misses more often than ε, how many that was and their
/// probability of missing together.
pub(super) fn place_holders(
    candidates: &[Candidate],
    miss: impl Fn(&B256) -> f64,
    epsilon: f64,
) -> std::result::Result<(usize, f64), (usize, f64)> {
    let mut all_miss = 1.0;
    let most = usize::from(cx_protocol::holders::MAX_RENT_HOLDERS).min(candidates.len());
    for (k, c) in candidates.iter().take(most).enumerate() {
        all_miss *= miss(&c.provider_key_hash).clamp(0.0, 1.0);
        if all_miss <= epsilon {
            return Ok((k + 1, epsilon.powf(1.0 / (k + 1) as f64)));
        }
    }
    Err((most, all_miss))
}

/// The floor of ρ, as a fraction of the bytes' share of the device-hour: a hundredth.
const IDLE_FLOOR_DIVISOR: u128 = 100;

/// ρ of a bundle asking `ask_wei_per_s` with `memory_bytes`, whose slots of `slot_bytes` have
/// a shadow price of `shadow_s` loading seconds over the horizon, wei per GB-hour (see the
/// module).
fn rho_of(ask_wei_per_s: u64, memory_bytes: u64, shadow_s: f64, slot_bytes: u64) -> u128 {
    let horizon_h = Discount::default().horizon_s / 3_600.0;
    let shadow = if slot_bytes == 0 {
        0.0
    } else {
        shadow_s * ask_wei_per_s as f64 * 1e9 / slot_bytes as f64 / horizon_h
    };
    let floor = u128::from(ask_wei_per_s) * 3_600 * 1_000_000_000
        / u128::from(memory_bytes.max(1))
        / IDLE_FLOOR_DIVISOR;
    // `as` saturates: a shadow price past u128 is refused on price anyway.
    (shadow.ceil() as u128).max(floor)
}

fn signed_rent(order: &crate::books::StandingOrder) -> Result<Signed<Rent>> {
    Ok(serde_json::from_value(
        order.order.get("rent").cloned().ok_or(Error::Corrupt {
            what: "a rent order",
            value: order.id.to_string(),
        })?,
    )?)
}

impl Intake {
    /// The catalog model an adapter's `adapter_config.json` names as its base
    /// (`base_model_name_or_path`), if it names one.
    pub fn adapter_base(&self, config: &[u8]) -> Option<String> {
        let config: serde_json::Value = serde_json::from_slice(config).ok()?;
        let base = config.get("base_model_name_or_path")?.as_str()?;
        self.market()
            .catalog()
            .resolve(base)
            .ok()
            .map(|m| m.name.clone())
    }

    /// What `rent` keeps resident, its bytes and the holders that keep it (see the module);
    /// the error names what is unknown or what no set of holders met.
    pub(super) async fn rent_terms(
        &self,
        rent: &Rent,
        now_s: u64,
    ) -> Result<(Vec<RentCommitment>, u64)> {
        let target = hex::encode(rent.target);
        // One read of the providers' reports: sizes and holders both come from it.
        let reports = self.reports().await?;
        let base;
        let (held, size_bytes) = match rent.target_kind {
            RentTarget::Adapter => {
                let size_bytes = self
                    .books()
                    .adapter_bytes(&target)
                    .await?
                    .ok_or(Error::UnknownAdapter)?;
                let stored = self
                    .books()
                    .adapter(&target)
                    .await?
                    .ok_or(Error::UnknownAdapter)?;
                base = self
                    .adapter_base(&stored.config)
                    .ok_or(Error::NoRentHolder {
                        field: "rent.order.target",
                        reason: "its adapter_config.json names no catalog model as \
                                 base_model_name_or_path"
                            .into(),
                    })?;
                let held = Held::Adapter {
                    id: &target,
                    base: &base,
                };
                (held, size_bytes)
            }
            RentTarget::Base => {
                // Its bytes as its holders report them (the most any reports: one base may be
                // held at different widths).
                let size_bytes = reports
                    .values()
                    .flat_map(|(_, report)| &report.bases)
                    .filter(|b| b.id == target)
                    .map(|b| b.bytes)
                    .max()
                    .ok_or_else(|| Error::NoRentHolder {
                        field: "rent.order.target",
                        reason: format!("no live provider reports base {target} resident"),
                    })?;
                (Held::Base { id: &target }, size_bytes)
            }
            RentTarget::Prefix => {
                // Its KV's bytes as its holder reports them.
                let size_bytes = reports
                    .values()
                    .flat_map(|(_, report)| report.prefixes.iter().zip(&report.prefix_bytes))
                    .filter(|(id, _)| **id == target)
                    .map(|(_, bytes)| *bytes)
                    .max()
                    .ok_or_else(|| Error::NoRentHolder {
                        field: "rent.order.target",
                        reason: format!(
                            "no live provider reports prefix {target} held (with its bytes)"
                        ),
                    })?;
                (Held::Prefix { id: &target }, size_bytes)
            }
        };
        let holders = self
            .rent_holders(rent, held, size_bytes, &reports, now_s)
            .await?;
        Ok((holders, size_bytes))
    }

    /// The live bundles that keep `held` (`size_bytes`) resident for `rent`'s term most
    /// cheaply, as many as its ε needs (see [`place_holders`]), on distinct providers, their
    /// terms' rent together within the buyer's limit. An adapter's holder serves its base and
    /// reports a residency that can make room for it (or holds it already); a base's reports it
    /// resident by content id and serves it. The error names what no set of bundles met.
    pub(super) async fn rent_holders(
        &self,
        rent: &Rent,
        held: Held<'_>,
        size_bytes: u64,
        owners: &HashMap<String, (B256, Residency)>,
        now_s: u64,
    ) -> Result<Vec<RentCommitment>> {
        let catalog = self.market().catalog();
        let mut serving = 0;
        let mut candidates: Vec<Candidate> = Vec::new();
        for bundle in self.market().bundles() {
            let Some((key, report)) = owners.get(&bundle.id) else {
                continue;
            };
            let holds = match held {
                Held::Adapter { base, id } => {
                    let serves = bundle
                        .resident_bases
                        .iter()
                        .any(|b| catalog.resolve(b).is_ok_and(|m| m.name == base));
                    if !serves {
                        continue;
                    }
                    bundle.resident_adapters.iter().any(|a| a == id)
                }
                Held::Base { id } => {
                    let serves = report
                        .bases
                        .iter()
                        .any(|b| b.id == id && bundle.resident_bases.contains(&b.name));
                    if !serves {
                        continue;
                    }
                    true
                }
                // Only the provider whose memory holds the conversation's KV can keep it.
                Held::Prefix { id } => {
                    if !bundle.resident_prefixes.iter().any(|p| p == id) {
                        continue;
                    }
                    true
                }
            };
            serving += 1;
            // A cache that can make no slot can still pin what it holds: that makes no room.
            let Some(shadow_s) = report.slot_shadow_price.or(holds.then_some(0.0)) else {
                continue;
            };
            if !holds && bundle.memory_bytes < size_bytes {
                continue;
            }
            candidates.push(Candidate {
                provider_key_hash: *key,
                bundle_id: bundle.id.clone(),
                rho_wei_per_gb_hour: rho_of(
                    bundle.price_wei_per_s,
                    bundle.memory_bytes,
                    shadow_s,
                    report.slot_bytes,
                ),
            });
        }
        if candidates.is_empty() {
            return Err(Error::NoRentHolder {
                field: "rent.order.target",
                reason: match held {
                    Held::Adapter { base, .. } if serving == 0 => {
                        format!("none serves its base model `{base}` and reports its residency")
                    }
                    Held::Adapter { base, .. } => format!(
                        "none of the {serving} serving `{base}` reports a residency that can \
                         make {size_bytes} bytes of room for it"
                    ),
                    Held::Base { id } => {
                        format!("no live provider reports base {id} resident")
                    }
                    Held::Prefix { id } => {
                        format!("no live provider reports prefix {id} held")
                    }
                },
            });
        }
        // Cheapest first, one bundle per provider: two bundles of one provider share its
        // memory, and miss together.
        candidates.sort_by(|a, b| {
            (a.rho_wei_per_gb_hour, &a.bundle_id).cmp(&(b.rho_wei_per_gb_hour, &b.bundle_id))
        });
        let mut seen = std::collections::HashSet::new();
        candidates.retain(|c| seen.insert(c.provider_key_hash));
        let rates = self
            .books()
            .rent_miss_rates(now_s.saturating_sub(crate::books::MISS_WINDOW_S))
            .await?;
        let miss = |key: &B256| {
            rates
                .get(key)
                .copied()
                .unwrap_or_else(crate::books::Books::prior_miss_rate)
        };
        let epsilon = f64::from(rent.epsilon_ppm) / 1e6;
        let (k, share) =
            place_holders(&candidates, miss, epsilon).map_err(|(k, all)| Error::NoRentHolder {
                field: "rent.order.epsilon_ppm",
                reason: format!(
                    "the {k} cheapest capable providers (of {} capable; at most {} holders) all \
                     miss together with probability {all:.2e} by their observed residency, \
                     above ε = {epsilon:.2e}",
                    candidates.len(),
                    cx_protocol::holders::MAX_RENT_HOLDERS
                ),
            })?;
        // Floor to ppm: a holder's share is never looser than ε^(1/k).
        let share_ppm = ((share * 1e6).floor() as u32).min(999_999);
        let holders = candidates
            .into_iter()
            .take(k)
            .map(|c| {
                Ok(RentCommitment {
                    rent_wei: term_rent(rent, held.pin(), size_bytes, c.rho_wei_per_gb_hour)?,
                    provider_key_hash: c.provider_key_hash,
                    bundle_id: c.bundle_id,
                    rho_wei_per_gb_hour: c.rho_wei_per_gb_hour,
                    epsilon_ppm: share_ppm,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let total: u128 = holders.iter().map(|h| h.rent_wei).sum();
        if total > rent.max_rent_wei {
            return Err(Error::NoRentHolder {
                field: "rent.order.max_rent_wei",
                reason: format!(
                    "the {k} cheapest holders that ε needs ask {total} wei for the term ({}; \
                     {size_bytes} bytes × {} s), above max_rent_wei {}",
                    holders
                        .iter()
                        .map(|h| format!("ρ = {} wei per GB-hour", h.rho_wei_per_gb_hour))
                        .collect::<Vec<_>>()
                        .join(", "),
                    rent.term_s,
                    rent.max_rent_wei
                ),
            });
        }
        Ok(holders)
    }

    /// Each live provider's residency report by its bundles' ids, with the provider's key.
    async fn reports(&self) -> Result<HashMap<String, (B256, Residency)>> {
        Ok(self
            .books()
            .provider_offers()
            .await?
            .into_iter()
            .filter_map(|(key, offer)| {
                let report = offer.residency?;
                Some(
                    offer
                        .bundles
                        .into_iter()
                        .map(move |b| (b.id, (key, report.clone()))),
                )
            })
            .flatten()
            .collect())
    }

    /// One residency observation of every running rent at `now_s`: resident when its
    /// provider's report is fresh (within [`RENT_REPORT_FRESH_S`]), its bundle is live and the
    /// report lists the adapter resident. Returns how many rents were observed.
    pub async fn observe_rents(&self, now_s: u64) -> Result<usize> {
        let rents = self
            .books()
            .running_rents(now_s, RENT_REPORT_FRESH_S, 1_000)
            .await?;
        if rents.is_empty() {
            return Ok(0);
        }
        let bundles = self.market().bundles();
        let reports = if rents.iter().any(|r| r.target_kind == RentTarget::Base) {
            self.reports().await?
        } else {
            HashMap::new()
        };
        for rent in &rents {
            let live = bundles.iter().find(|b| b.id == rent.bundle_id);
            let resident = rent.fresh
                && match rent.target_kind {
                    RentTarget::Adapter => {
                        live.is_some_and(|b| b.resident_adapters.contains(&rent.target))
                    }
                    RentTarget::Base => {
                        live.is_some()
                            && reports.get(&rent.bundle_id).is_some_and(|(_, report)| {
                                report.bases.iter().any(|b| b.id == rent.target)
                            })
                    }
                    RentTarget::Prefix => {
                        live.is_some_and(|b| b.resident_prefixes.contains(&rent.target))
                    }
                };
            self.books()
                .observe_rent(rent.id, rent.holder, resident)
                .await?;
        }
        Ok(rents.len())
    }

    /// The rent of committed rent `id`, claimed by `provider` (its holder) at or after the
    /// term's end with `receipt`: signed by its registered key, naming this rent (its digest
    /// as job id and input, zero output and compute, the rented adapter, the tab, the buyer,
    /// the payout account) and claiming exactly what the term ends at — ρ·|a|·term less the
    /// rebate a missed SLA earns. The rest of the hold returns to the tab.
    pub async fn claim_rent(
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
            .filter(|o| o.kind == "rent" && o.status == "committed")
            .ok_or(Error::RentNotOpen {
                reason: "no committed rent has this id",
            })?;
        let fill = order.rent.clone().ok_or(Error::Corrupt {
            what: "a rent without its fill",
            value: id.to_string(),
        })?;
        let holding = fill
            .holders
            .iter()
            .find(|h| h.provider_key_hash == provider.key_hash && !h.claimed)
            .ok_or(Error::RentNotOpen {
                reason: "this provider holds no unclaimed part of it",
            })?;
        let rent = signed_rent(&order)?.order;
        let target = hex::encode(rent.target);
        let mut term = fill
            .size_bytes
            .zip(fill.starts_s)
            .and_then(|(size, starts)| {
                holding.term(
                    id,
                    crate::books::pin_of(rent.target_kind, &target),
                    size,
                    (starts, order.ends_s),
                )
            })
            .ok_or(Error::Corrupt {
                what: "a committed rent without its commitment",
                value: id.to_string(),
            })?;
        let Ok(RentState::Ended {
            paid_wei,
            rebate_wei,
        }) = term.end(now_s as f64)
        else {
            return Err(Error::RentNotOpen {
                reason: "its term is not over: the rent is claimed at its end",
            });
        };
        let owed = paid_wei - rebate_wei;
        let key = cx_protocol::pq::PublicIdentity::from_bytes(&provider.mldsa_key)?;
        receipt.verify(&key).map_err(|e| e.within("receipt"))?;
        let r = &receipt.receipt;
        let checks: [(&'static str, bool); 10] = [
            ("job_id", r.job_id == holding.job_id.0),
            ("input_hash", r.input_hash == id.0),
            ("output_hash", r.output_hash == [0; 32]),
            (
                "adapter_hash",
                r.adapter_hash
                    == match rent.target_kind {
                        RentTarget::Adapter => rent.target.0,
                        _ => [0; 32],
                    },
            ),
            ("chain_id", r.chain_id == order.chain_id),
            ("escrow_id", r.escrow_id == order.escrow_id),
            ("buyer", r.buyer == order.account.0.0),
            ("provider", r.provider == provider.payout.0.0),
            ("compute_ms", r.compute_ms == 0),
            ("amount_owed_wei", r.amount_owed_wei == owed),
        ];
        if let Some((field, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(Error::ReceiptMismatch {
                field,
                reason: format!(
                    "is not what this holder's term makes it (job id: holder {}'s, {}; input: \
                     the rent's digest; output zero; adapter: the rented one, zero for a base; \
                     the tab, buyer \
                     and payout account; compute_ms 0; amount: {owed} wei, the term's \
                     {paid_wei} wei less a {rebate_wei} wei rebate)",
                    holding.holder, holding.job_id
                ),
            });
        }
        let decision = serde_json::json!({
            "kind": "rent",
            "holder": holding.holder,
            "holders": fill.holders.len(),
            "bundle_id": holding.bundle_id,
            "rho_wei_per_gb_hour": holding.rho_wei_per_gb_hour.to_string(),
            "epsilon_ppm": holding.epsilon_ppm,
            "size_bytes": fill.size_bytes,
            "rent_wei": paid_wei.to_string(),
            "rebate_wei": rebate_wei.to_string(),
            "resident_observations": term.resident_observations,
            "absent_observations": term.absent_observations,
        });
        if !self
            .books()
            .fill_rent(
                id,
                provider.key_hash,
                owed,
                &serde_json::to_value(receipt)?,
                &decision,
            )
            .await?
        {
            return Err(Error::RentNotOpen {
                reason: "this provider holds no unclaimed part of it",
            });
        }
        Ok(())
    }
}

/// The rent of `rent`'s whole term at ρ for `size_bytes`: the core's accrual, so the quote and
/// the claim agree.
fn term_rent(rent: &Rent, pin: PinObject, size_bytes: u64, rho: u128) -> Result<u128> {
    let mut term = Term::new(
        "quote",
        pin,
        size_bytes,
        rho,
        (0.0, rent.term_s as f64),
        rent.epsilon_ppm,
    )?;
    Ok(term.accrue(rent.term_s as f64)?)
}

#[cfg(test)]
mod tests {
    use super::{B256, Candidate, place_holders, rho_of};

    #[test]
    fn epsilon_takes_as_many_holders_as_their_misses_together_need() {
        let candidates: Vec<Candidate> = (1..=5u8)
            .map(|k| Candidate {
                provider_key_hash: B256::repeat_byte(k),
                bundle_id: format!("b{k}"),
                rho_wei_per_gb_hour: u128::from(k),
            })
            .collect();
        // Provider 1 is seen missing 20 % of the time, the others 10 %.
        let miss = |key: &B256| if key.0[0] == 1 { 0.2 } else { 0.1 };
        assert_eq!(place_holders(&candidates, miss, 0.25), Ok((1, 0.25)));
        // 0.2 × 0.1 = 2 % ≤ 5 %: two, each bound to √5 %.
        let (k, share) = place_holders(&candidates, miss, 0.05).unwrap();
        assert_eq!(k, 2);
        assert!((share - 0.05f64.sqrt()).abs() < 1e-12);
        // 0.2 × 0.1 × 0.1 = 0.2 % > 0.1 %: four.
        assert_eq!(place_holders(&candidates, miss, 0.001).map(|p| p.0), Ok(4));
        // Four at most: 0.2 × 0.1³ = 2·10⁻⁴ is as low as it gets.
        let (k, all) = place_holders(&candidates, miss, 1e-5).unwrap_err();
        assert_eq!(k, 4);
        assert!((all - 2e-4).abs() < 1e-15);
        assert_eq!(
            place_holders(&candidates, miss, 0.0)
                .map_err(|e| e.0)
                .map(|p| p.0),
            Err(4),
            "no number of holders never misses"
        );
    }

    #[test]
    fn rho_is_the_shadow_price_of_the_bytes_and_never_below_the_floor() {
        // 360 loading seconds over the hour for a 10⁶-byte slot, at 10⁶ wei/s.
        assert_eq!(
            rho_of(1_000_000, 10_000_000, 360.0, 1_000_000),
            360_000_000_000
        );
        // Bytes that fit in what is free: the floor, a hundredth of the device-hour's share.
        assert_eq!(rho_of(1_000_000, 10_000_000, 0.0, 1_000_000), 3_600_000_000);
        assert_eq!(rho_of(1_000_000, 10_000_000, 5.0, 0), 3_600_000_000);
    }
}
