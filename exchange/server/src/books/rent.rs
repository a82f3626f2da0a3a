//! Rents filled: the order `committed` to its holders when accepted (each at its own ρ and share
//! of ε, `exchange_rent_holders`), the residency observations the sweep makes of each, and each
//! holder's claim at the term's end — a job of the tab charged its term less its rebate, so it
//! settles with its tab like any other; the order is `filled` once every holder claimed. The
//! accrual, the SLA and the rebate are the pure core's ([`cx_exchange::lifecycle::rent`]); this
//! module keeps the rows.

use super::fills::{RentFill, RentHolding};
use super::store::{Books, parse_wei, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::B256;
use cx_exchange::lifecycle::rent::{PinObject, Rent as Term, RentState};
use cx_protocol::order::RentTarget;
use std::collections::HashMap;

impl RentHolding {
    /// The holder's term as the pure core models it, with the observations so far: rent `id`
    /// of `pin` (`size_bytes`) from `starts_s` to `ends_s`.
    pub fn term(
        &self,
        id: B256,
        pin: PinObject,
        size_bytes: u64,
        (starts_s, ends_s): (u64, u64),
    ) -> Option<Term> {
        let mut term = Term::new(
            format!("{id}/{}", self.holder),
            pin,
            size_bytes,
            self.rho_wei_per_gb_hour,
            (starts_s as f64, ends_s as f64),
            self.epsilon_ppm,
        )
        .ok()?;
        term.resident_observations = self.resident_reports;
        term.absent_observations = self.absent_reports + self.missed_deadlines;
        Some(term)
    }
}

/// What the core's term pins for a rent of `kind` on content id `target`.
pub fn pin_of(kind: RentTarget, target: &str) -> PinObject {
    let id = target.to_owned();
    match kind {
        RentTarget::Adapter => PinObject::Adapter(id),
        RentTarget::Base => PinObject::Base(id),
        RentTarget::Prefix => PinObject::Prefix(id),
    }
}

/// A holder of a committed rent the sweep observes.
#[derive(Debug, Clone)]
pub struct CommittedRent {
    /// The rent's id.
    pub id: B256,
    /// Which holder.
    pub holder: u8,
    /// Its bundle.
    pub bundle_id: String,
    /// What it keeps resident.
    pub target_kind: RentTarget,
    /// Its content id (hex, as reports name it).
    pub target: String,
    /// Whether its provider's latest report is fresh (re-signed within the freshness bound).
    pub fresh: bool,
}

/// One holder's term priced on a bundle.
#[derive(Debug, Clone)]
pub struct RentCommitment {
    /// The provider.
    pub provider_key_hash: B256,
    /// Its bundle.
    pub bundle_id: String,
    /// ρ, wei per gigabyte-hour.
    pub rho_wei_per_gb_hour: u128,
    /// Its share of the buyer's ε, parts per million.
    pub epsilon_ppm: u32,
    /// ρ·|a|·term, wei.
    pub rent_wei: u128,
}

/// Jobs of holder `h`'s adapter on its bundle that missed their deadline within rent `s`'s term:
/// absent observations too (residency is self-revealing), counted from the jobs, never copied.
const MISSED_IN_TERM: &str = "(SELECT count(*) FROM exchange_jobs m WHERE m.bundle_id = h.bundle_id \
       AND m.adapter = s.target AND m.status = 'expired' AND m.deadline_s >= s.starts_s \
       AND m.deadline_s <= s.ends_s)";

/// How far back a provider's residency on rents counts towards its miss probability, seconds.
pub const MISS_WINDOW_S: u64 = 7 * 24 * 3600;

/// A prior of one miss in twenty observations: what a provider never observed holding a rent
/// is assumed to miss (5 %), and what its own observations pull it from.
const MISS_PRIOR: (f64, f64) = (1.0, 20.0);

impl Books {
    /// Commits open rent `id` to `holders` (holder 0 first) for state of `size_bytes` from
    /// `starts_s`, in one transaction; false when it was no longer open.
    pub async fn commit_rent(
        &self,
        id: B256,
        size_bytes: u64,
        starts_s: u64,
        holders: &[RentCommitment],
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE exchange_standing_orders SET status = 'committed', size_bytes = $2, \
                    starts_s = $3, updated_at = now() \
             WHERE digest = $1 AND kind = 'rent' AND status = 'open'",
        )
        .bind(id.as_slice())
        .bind(to_i64(size_bytes, "size")?)
        .bind(to_i64(starts_s, "time")?)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        for (k, h) in holders.iter().enumerate() {
            let k = u8::try_from(k)
                .ok()
                .filter(|k| *k < cx_protocol::holders::MAX_RENT_HOLDERS)
                .ok_or(Error::Corrupt {
                    what: "a rent's holder count",
                    value: holders.len().to_string(),
                })?;
            sqlx::query(
                "INSERT INTO exchange_rent_holders (rent, holder, job_id, provider_key_hash, \
                        bundle_id, rho_wei_per_gb_hour, epsilon_ppm, rent_wei) \
                 VALUES ($1, $2, $3, $4, $5, $6::numeric, $7, $8::numeric)",
            )
            .bind(id.as_slice())
            .bind(i16::from(k))
            .bind(cx_protocol::holders::holder_job_id(id.0, k).as_slice())
            .bind(h.provider_key_hash.as_slice())
            .bind(&h.bundle_id)
            .bind(wei_text(h.rho_wei_per_gb_hour))
            .bind(i32::try_from(h.epsilon_ppm).unwrap_or(i32::MAX))
            .bind(wei_text(h.rent_wei))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The holders of committed rents whose term is running at `now_s`, at most `limit`; each
    /// fresh when its provider's offer was last registered within `fresh_s`.
    pub async fn running_rents(
        &self,
        now_s: u64,
        fresh_s: u64,
        limit: i64,
    ) -> Result<Vec<CommittedRent>> {
        let rows: Vec<(Vec<u8>, i16, String, String, String, bool)> = sqlx::query_as(
            "SELECT s.digest, h.holder, h.bundle_id, s.target_kind, s.target, \
                    EXISTS (SELECT 1 FROM exchange_providers p \
                            WHERE p.key_hash = h.provider_key_hash \
                              AND p.seen_at >= to_timestamp($3)) \
             FROM exchange_standing_orders s JOIN exchange_rent_holders h ON h.rent = s.digest \
             WHERE s.kind = 'rent' AND s.status = 'committed' AND s.ends_s > $1 \
             ORDER BY s.ends_s, s.digest, h.holder LIMIT $2",
        )
        .bind(to_i64(now_s, "time")?)
        .bind(limit)
        .bind(now_s.saturating_sub(fresh_s) as f64)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, holder, bundle_id, kind, target, fresh)| {
                Ok(CommittedRent {
                    id: b256(&id)?,
                    holder: holder as u8,
                    bundle_id,
                    target_kind: serde_json::from_value(serde_json::Value::String(kind))?,
                    target,
                    fresh,
                })
            })
            .collect()
    }

    /// The rents `provider_key_hash` holds and has not claimed yet (what it must keep pinned,
    /// and claim at each term's end), soonest end first, at most `limit`.
    pub async fn provider_rents(
        &self,
        provider_key_hash: B256,
        limit: i64,
    ) -> Result<Vec<super::standing::StandingOrder>> {
        let ids: Vec<(Vec<u8>,)> = sqlx::query_as(
            "SELECT s.digest FROM exchange_standing_orders s \
             JOIN exchange_rent_holders h ON h.rent = s.digest \
             WHERE s.kind = 'rent' AND s.status = 'committed' AND h.provider_key_hash = $1 \
               AND NOT h.claimed \
             ORDER BY s.ends_s, s.digest LIMIT $2",
        )
        .bind(provider_key_hash.as_slice())
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        self.standing_orders(ids).await
    }

    /// One residency observation of holder `holder` of committed rent `id`.
    pub async fn observe_rent(&self, id: B256, holder: u8, resident: bool) -> Result<()> {
        sqlx::query(
            "UPDATE exchange_rent_holders SET \
                    resident_reports = resident_reports + CASE WHEN $3 THEN 1 ELSE 0 END, \
                    absent_reports = absent_reports + CASE WHEN $3 THEN 0 ELSE 1 END \
             WHERE rent = $1 AND holder = $2 AND NOT claimed",
        )
        .bind(id.as_slice())
        .bind(i16::from(holder))
        .bind(resident)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Each provider's estimated probability that a rent it holds is found absent: its absent
    /// observations (reports and missed deadlines, as the SLA counts them) over all of them, on
    /// rents whose term ended at or after `since_s`, under a prior of one miss in twenty
    /// ([`MISS_PRIOR`]). Providers not observed holding one are absent from the map (the prior
    /// alone).
    pub async fn rent_miss_rates(&self, since_s: u64) -> Result<HashMap<B256, f64>> {
        let rows: Vec<(Vec<u8>, i64, i64)> = sqlx::query_as(&format!(
            "SELECT h.provider_key_hash, sum(h.absent_reports + {MISSED_IN_TERM})::bigint, \
                    sum(h.resident_reports + h.absent_reports + {MISSED_IN_TERM})::bigint \
             FROM exchange_rent_holders h JOIN exchange_standing_orders s ON s.digest = h.rent \
             WHERE s.ends_s >= $1 GROUP BY h.provider_key_hash"
        ))
        .bind(to_i64(since_s, "time")?)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(key, absent, all)| {
                Ok((
                    b256(&key)?,
                    (absent as f64 + MISS_PRIOR.0) / (all as f64 + MISS_PRIOR.1),
                ))
            })
            .collect()
    }

    /// The miss probability of a provider never observed holding a rent.
    pub fn prior_miss_rate() -> f64 {
        MISS_PRIOR.0 / MISS_PRIOR.1
    }

    /// The fill of rent `id`: what its holders share, each holder's commitment, observations
    /// and claim.
    pub(super) async fn rent_fill(&self, id: B256) -> Result<RentFill> {
        type Row = (Option<i64>, Option<i64>, i64, String, String);
        let (size_bytes, starts_s, ends_s, target, kind): Row = sqlx::query_as(
            "SELECT size_bytes, starts_s, ends_s, target, target_kind \
                 FROM exchange_standing_orders WHERE digest = $1",
        )
        .bind(id.as_slice())
        .fetch_one(&self.pool)
        .await?;
        let rows: Vec<HolderRow> = sqlx::query_as(&format!(
            "SELECT h.holder, h.job_id, h.provider_key_hash, h.bundle_id, \
                    h.rho_wei_per_gb_hour::text AS rho, h.epsilon_ppm, h.rent_wei::text AS rent, \
                    h.resident_reports, h.absent_reports, h.claimed, {MISSED_IN_TERM} AS missed, \
                    j.held_wei::text AS charged, \
                    CASE WHEN EXISTS (SELECT 1 FROM exchange_job_events e WHERE e.job_id = j.id \
                                      AND e.status = 'settled') THEN 'settled' ELSE j.status END AS settlement \
             FROM exchange_rent_holders h \
             JOIN exchange_standing_orders s ON s.digest = h.rent \
             LEFT JOIN exchange_jobs j ON j.id = h.job_id \
             WHERE h.rent = $1 ORDER BY h.holder"
        ))
        .bind(id.as_slice())
        .fetch_all(&self.pool)
        .await?;
        let kind: RentTarget = serde_json::from_value(serde_json::Value::String(kind))?;
        let size_bytes = size_bytes.map(|b| b as u64);
        let starts_s = starts_s.map(|s| s as u64);
        let holders = rows
            .into_iter()
            .map(|row| {
                let mut h = RentHolding {
                    holder: row.holder as u8,
                    job_id: b256(&row.job_id)?,
                    provider_key_hash: b256(&row.provider_key_hash)?,
                    bundle_id: row.bundle_id,
                    rho_wei_per_gb_hour: parse_wei(&row.rho)?,
                    epsilon_ppm: row.epsilon_ppm as u32,
                    resident_reports: row.resident_reports as u64,
                    absent_reports: row.absent_reports as u64,
                    missed_deadlines: row.missed.unwrap_or(0) as u64,
                    sla_met: true,
                    rent_wei: parse_wei(&row.rent)?,
                    rebate_wei: None,
                    claimed: row.claimed,
                    charged_wei: row.charged.map(|c| parse_wei(&c)).transpose()?,
                    settlement: row.settlement,
                };
                let term = size_bytes.zip(starts_s).and_then(|(size, starts)| {
                    h.term(id, pin_of(kind, &target), size, (starts, ends_s as u64))
                });
                if let Some(mut term) = term {
                    h.sla_met = term.sla_met();
                    if let Ok(RentState::Ended { rebate_wei, .. }) = term.end(ends_s as f64) {
                        h.rebate_wei = Some(rebate_wei);
                    }
                }
                Ok(h)
            })
            .collect::<Result<_>>()?;
        Ok(RentFill {
            size_bytes,
            starts_s,
            holders,
        })
    }

    /// Fills the holding of provider `key_hash` in committed rent `id` at its term's end with
    /// its `receipt`, charged `charged_wei` (at most its term's rent; the rest of that part of
    /// the hold returns to the tab), in one transaction; the order is `filled` once no holder is
    /// left to claim. False when the provider holds no unclaimed part of it.
    pub async fn fill_rent(
        &self,
        id: B256,
        key_hash: B256,
        charged_wei: u128,
        receipt: &serde_json::Value,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let holding: Option<(Vec<u8>, String)> = sqlx::query_as(
            "UPDATE exchange_rent_holders h SET claimed = true \
             FROM exchange_standing_orders s \
             WHERE h.rent = $1 AND h.provider_key_hash = $2 AND NOT h.claimed \
               AND s.digest = h.rent AND s.status = 'committed' \
             RETURNING h.job_id, h.rent_wei::text",
        )
        .bind(id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((job_id, part)) = holding else {
            return Ok(false);
        };
        let part = parse_wei(&part)?;
        type Row = (Vec<u8>, i64, i64, i64, String, String);
        let (account, chain_id, escrow_id, ends_s, target, kind): Row = sqlx::query_as(
            "UPDATE exchange_standing_orders s SET held_wei = s.held_wei - $2::numeric, \
                        status = CASE WHEN EXISTS (SELECT 1 FROM exchange_rent_holders h \
                                                   WHERE h.rent = s.digest AND NOT h.claimed) \
                                      THEN s.status ELSE 'filled' END, \
                        updated_at = now() \
                 WHERE s.digest = $1 \
                 RETURNING s.account, s.chain_id, s.escrow_id, s.ends_s, s.target, \
                           s.target_kind",
        )
        .bind(id.as_slice())
        .bind(wei_text(part))
        .fetch_one(&mut *tx)
        .await?;
        let filled = super::standing::Filled {
            id: b256(&job_id)?,
            order: id,
            account,
            tab: (chain_id, escrow_id),
            held_wei: part,
            ends_s,
            model: "rent",
            // A job of an adapter names it (its missed deadlines count against the rent).
            adapter: (kind == "adapter").then_some(target.as_str()),
        };
        filled
            .into_job(&mut tx, key_hash, charged_wei, receipt, decision)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}

#[derive(sqlx::FromRow)]
struct HolderRow {
    holder: i16,
    job_id: Vec<u8>,
    provider_key_hash: Vec<u8>,
    bundle_id: String,
    rho: String,
    epsilon_ppm: i32,
    rent: String,
    resident_reports: i64,
    absent_reports: i64,
    claimed: bool,
    missed: Option<i64>,
    charged: Option<String>,
    settlement: Option<String>,
}

fn b256(bytes: &[u8]) -> Result<B256> {
    B256::try_from(bytes).map_err(|_| Error::Corrupt {
        what: "a 32-byte hash",
        value: hex::encode(bytes),
    })
}
