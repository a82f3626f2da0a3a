//! Rents filled: the order `committed` to a bundle at its ρ when accepted, the residency
//! observations the sweep makes, and the claim at the term's end — a job of the tab charged the
//! rent less its rebate, so it settles with its tab like any other. The accrual, the SLA and
//! the rebate are the pure core's ([`cx_exchange::lifecycle::rent`]); this module keeps the rows.

use super::fills::RentFill;
use super::store::{Books, parse_wei, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::B256;
use cx_exchange::lifecycle::rent::{PinObject, Rent as Term, RentState};

impl RentFill {
    /// The term as the pure core models it, with the observations so far; `None` until
    /// committed.
    pub fn term(&self, id: B256, adapter: &str, ends_s: u64, epsilon_ppm: u32) -> Option<Term> {
        let mut term = Term::new(
            id.to_string(),
            PinObject::Adapter(adapter.to_owned()),
            self.size_bytes?,
            self.rho_wei_per_gb_hour?,
            (self.starts_s? as f64, ends_s as f64),
            epsilon_ppm,
        )
        .ok()?;
        term.resident_observations = self.resident_reports;
        term.absent_observations = self.absent_reports + self.missed_deadlines;
        Some(term)
    }
}

/// A committed rent the sweep observes.
#[derive(Debug, Clone)]
pub struct CommittedRent {
    /// The rent's id.
    pub id: B256,
    /// Its bundle.
    pub bundle_id: String,
    /// The adapter's content id (hex, as reports name it).
    pub adapter: String,
    /// Whether its provider's latest report is fresh (re-signed within the freshness bound).
    pub fresh: bool,
}

/// A rent's term priced on a bundle.
#[derive(Debug, Clone, Copy)]
pub struct RentCommitment<'a> {
    /// The provider.
    pub provider_key_hash: B256,
    /// Its bundle.
    pub bundle_id: &'a str,
    /// ρ, wei per gigabyte-hour.
    pub rho_wei_per_gb_hour: u128,
    /// |a|, bytes.
    pub size_bytes: u64,
    /// The term's start, unix seconds.
    pub starts_s: u64,
}

impl Books {
    /// Commits open rent `id` to `c`; false when it was no longer open.
    pub async fn commit_rent(&self, id: B256, c: RentCommitment<'_>) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE exchange_standing_orders SET status = 'committed', provider_key_hash = $2, \
                    bundle_id = $3, rho_wei_per_gb_hour = $4::numeric, size_bytes = $5, \
                    starts_s = $6, updated_at = now() \
             WHERE digest = $1 AND kind = 'rent' AND status = 'open'",
        )
        .bind(id.as_slice())
        .bind(c.provider_key_hash.as_slice())
        .bind(c.bundle_id)
        .bind(wei_text(c.rho_wei_per_gb_hour))
        .bind(to_i64(c.size_bytes, "size")?)
        .bind(to_i64(c.starts_s, "time")?)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Committed rents whose term is running at `now_s`, at most `limit`; each fresh when its
    /// provider's offer was last registered within `fresh_s`.
    pub async fn running_rents(
        &self,
        now_s: u64,
        fresh_s: u64,
        limit: i64,
    ) -> Result<Vec<CommittedRent>> {
        let rows: Vec<(Vec<u8>, String, String, bool)> = sqlx::query_as(
            "SELECT s.digest, s.bundle_id, s.target, \
                    EXISTS (SELECT 1 FROM exchange_providers p \
                            WHERE p.key_hash = s.provider_key_hash \
                              AND p.seen_at >= to_timestamp($3)) \
             FROM exchange_standing_orders s \
             WHERE s.kind = 'rent' AND s.status = 'committed' AND s.ends_s > $1 \
             ORDER BY s.ends_s, s.digest LIMIT $2",
        )
        .bind(to_i64(now_s, "time")?)
        .bind(limit)
        .bind(now_s.saturating_sub(fresh_s) as f64)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, bundle_id, target, fresh)| {
                Ok(CommittedRent {
                    id: b256(&id)?,
                    bundle_id,
                    adapter: target,
                    fresh,
                })
            })
            .collect()
    }

    /// The rents committed to `provider_key_hash` (what it must keep pinned, and claim at
    /// each term's end), soonest end first, at most `limit`.
    pub async fn provider_rents(
        &self,
        provider_key_hash: B256,
        limit: i64,
    ) -> Result<Vec<super::standing::StandingOrder>> {
        let ids: Vec<(Vec<u8>,)> = sqlx::query_as(
            "SELECT digest FROM exchange_standing_orders \
             WHERE kind = 'rent' AND status = 'committed' AND provider_key_hash = $1 \
             ORDER BY ends_s, digest LIMIT $2",
        )
        .bind(provider_key_hash.as_slice())
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        self.standing_orders(ids).await
    }

    /// One residency observation of committed rent `id`.
    pub async fn observe_rent(&self, id: B256, resident: bool) -> Result<()> {
        sqlx::query(
            "UPDATE exchange_standing_orders SET \
                    resident_reports = resident_reports + CASE WHEN $2 THEN 1 ELSE 0 END, \
                    absent_reports = absent_reports + CASE WHEN $2 THEN 0 ELSE 1 END \
             WHERE digest = $1 AND kind = 'rent' AND status = 'committed'",
        )
        .bind(id.as_slice())
        .bind(resident)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The fill of rent `id`: commitment, observations, and the claim.
    pub(super) async fn rent_fill(&self, id: B256) -> Result<RentFill> {
        let row: FillRow = sqlx::query_as(
            "SELECT s.provider_key_hash, s.bundle_id, s.rho_wei_per_gb_hour::text AS rho, \
                    s.size_bytes, s.starts_s, s.ends_s, s.resident_reports, s.absent_reports, \
                    s.target, s.epsilon_ppm, \
                    (SELECT count(*) FROM exchange_jobs m WHERE m.bundle_id = s.bundle_id \
                       AND m.adapter = s.target \
                       AND m.status = 'expired' AND m.deadline_s >= s.starts_s \
                       AND m.deadline_s <= s.ends_s) AS missed, \
                    j.held_wei::text AS charged, \
                    CASE WHEN EXISTS (SELECT 1 FROM exchange_job_events e WHERE e.job_id = j.id \
                                      AND e.status = 'settled') THEN 'settled' ELSE j.status END AS settlement \
             FROM exchange_standing_orders s \
             LEFT JOIN exchange_jobs j ON j.id = s.digest \
             WHERE s.digest = $1",
        )
        .bind(id.as_slice())
        .fetch_one(&self.pool)
        .await?;
        let mut fill = RentFill {
            provider_key_hash: row.provider_key_hash.map(|k| b256(&k)).transpose()?,
            bundle_id: row.bundle_id,
            rho_wei_per_gb_hour: row.rho.map(|r| parse_wei(&r)).transpose()?,
            size_bytes: row.size_bytes.map(|b| b as u64),
            starts_s: row.starts_s.map(|s| s as u64),
            resident_reports: row.resident_reports as u64,
            absent_reports: row.absent_reports as u64,
            missed_deadlines: row.missed.unwrap_or(0) as u64,
            sla_met: true,
            rent_wei: None,
            rebate_wei: None,
            charged_wei: row.charged.map(|c| parse_wei(&c)).transpose()?,
            settlement: row.settlement,
        };
        let epsilon_ppm = u32::try_from(row.epsilon_ppm).map_err(|_| Error::Corrupt {
            what: "a rent's epsilon_ppm",
            value: row.epsilon_ppm.to_string(),
        })?;
        if let Some(mut term) = fill.term(id, &row.target, row.ends_s as u64, epsilon_ppm) {
            fill.sla_met = term.sla_met();
            if let Ok(RentState::Ended {
                paid_wei,
                rebate_wei,
            }) = term.end(row.ends_s as f64)
            {
                fill.rent_wei = Some(paid_wei);
                fill.rebate_wei = Some(rebate_wei);
            }
        }
        Ok(fill)
    }

    /// Fills committed rent `id` at its term's end with its provider `key_hash`'s `receipt`,
    /// charged `charged_wei` (at most what it holds; the rest returns to the tab), in one
    /// transaction; false when it is not committed to that provider.
    pub async fn fill_rent(
        &self,
        id: B256,
        key_hash: B256,
        charged_wei: u128,
        receipt: &serde_json::Value,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(Vec<u8>, i64, i64, String, i64, String)> = sqlx::query_as(
            "UPDATE exchange_standing_orders s SET status = 'filled', updated_at = now() \
             WHERE s.digest = $1 \
               AND s.kind = 'rent' AND s.status = 'committed' AND s.provider_key_hash = $2 \
             RETURNING s.account, s.chain_id, s.escrow_id, s.held_wei::text, s.ends_s, s.target",
        )
        .bind(id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((account, chain_id, escrow_id, held, ends_s, adapter)) = row else {
            return Ok(false);
        };
        let filled = super::standing::Filled {
            id,
            account,
            tab: (chain_id, escrow_id),
            held_wei: parse_wei(&held)?,
            ends_s,
            model: "rent",
            adapter: Some(&adapter),
        };
        filled
            .into_job(&mut tx, key_hash, charged_wei, receipt, decision)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}

#[derive(sqlx::FromRow)]
struct FillRow {
    provider_key_hash: Option<Vec<u8>>,
    bundle_id: Option<String>,
    rho: Option<String>,
    size_bytes: Option<i64>,
    starts_s: Option<i64>,
    ends_s: i64,
    resident_reports: i64,
    absent_reports: i64,
    target: String,
    epsilon_ppm: i64,
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
