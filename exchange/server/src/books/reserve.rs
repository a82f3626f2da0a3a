//! Reserves filled: providers' signed bids until the window starts, the award at its start (the
//! order `committed` to the winner's bundle at its rate), the draws of the buyer's intents in the
//! window, and the take-or-pay at its end — a job of the tab charged what the provider's receipt
//! claims (rate × compute_ms), so it settles with its tab like any other. The choice of winner
//! is the pure core's ([`cx_exchange::lifecycle::reserve::award`]); this module keeps the rows.

use super::fills::{ReserveFill, StoredBid};
use super::standing::StandingOrder;
use super::store::{Books, json_text, parse_wei, to_i64};
use crate::error::{Error, Result};
use alloy::primitives::B256;

/// A committed reserve an intent may draw on.
#[derive(Debug, Clone)]
pub struct Drawable {
    /// The reserve's id.
    pub id: B256,
    /// The buyer's signed reserve.
    pub order: cx_protocol::order::Reserve,
    /// The committed bundle.
    pub bundle_id: String,
    /// The committed rate.
    pub rate_wei_per_s: u64,
    /// Drawn so far, milliseconds.
    pub used_ms: u64,
}

impl Books {
    /// Records `provider_key_hash`'s signed bid on open reserve `id` (replacing its earlier
    /// one) while the window has not started at `now_s`; false when the reserve is not open.
    pub async fn place_bid(
        &self,
        id: B256,
        provider_key_hash: B256,
        bundle_id: &str,
        rate_wei_per_s: u64,
        bid: &serde_json::Value,
        now_s: u64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO exchange_reserve_bids (reserve, provider_key_hash, bundle_id, \
                                                rate_wei_per_s, bid) \
             SELECT s.digest, $2, $3, $4, $5::jsonb FROM exchange_standing_orders s \
             WHERE s.digest = $1 AND s.kind = 'reserve' AND s.status = 'open' AND s.starts_s > $6 \
             ON CONFLICT (reserve, provider_key_hash) DO UPDATE SET bundle_id = EXCLUDED.bundle_id, \
                 rate_wei_per_s = EXCLUDED.rate_wei_per_s, bid = EXCLUDED.bid, updated_at = now()",
        )
        .bind(id.as_slice())
        .bind(provider_key_hash.as_slice())
        .bind(bundle_id)
        .bind(to_i64(rate_wei_per_s, "rate")?)
        .bind(bid.to_string())
        .bind(to_i64(now_s, "time")?)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Reserves a provider acts on at `now_s`: the open ones still taking bids (window not
    /// started), and those committed to `provider_key_hash` (it claims their take-or-pay once
    /// their window is over); soonest first, at most `limit`.
    pub async fn provider_reserves(
        &self,
        provider_key_hash: B256,
        now_s: u64,
        limit: i64,
    ) -> Result<Vec<StandingOrder>> {
        let ids: Vec<(Vec<u8>,)> = sqlx::query_as(
            "SELECT s.digest FROM exchange_standing_orders s \
             WHERE s.kind = 'reserve' AND ((s.status = 'open' AND s.starts_s > $1) \
               OR (s.status = 'committed' AND s.provider_key_hash = $2)) \
             ORDER BY s.ends_s, s.digest LIMIT $3",
        )
        .bind(to_i64(now_s, "time")?)
        .bind(provider_key_hash.as_slice())
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        self.standing_orders(ids).await
    }

    /// Open reserves whose window has started by `now_s` (the award is due), at most `limit`.
    pub async fn reserves_due(&self, now_s: u64, limit: i64) -> Result<Vec<StandingOrder>> {
        let ids: Vec<(Vec<u8>,)> = sqlx::query_as(
            "SELECT s.digest FROM exchange_standing_orders s \
             WHERE s.kind = 'reserve' AND s.status = 'open' AND s.starts_s <= $1 \
             ORDER BY s.ends_s, s.digest LIMIT $2",
        )
        .bind(to_i64(now_s, "time")?)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        self.standing_orders(ids).await
    }

    /// Compute bundle `bundle_id` has committed to reserves whose windows overlap
    /// `[start_s, end_s)`, milliseconds.
    pub async fn committed_ms(&self, bundle_id: &str, start_s: u64, end_s: u64) -> Result<u64> {
        let (ms,): (Option<i64>,) = sqlx::query_as(
            "SELECT sum(s.compute_ms)::bigint FROM exchange_standing_orders s \
             WHERE s.kind = 'reserve' AND s.bundle_id = $1 AND s.status IN ('committed', 'filled') \
               AND s.starts_s < $3 AND s.ends_s > $2",
        )
        .bind(bundle_id)
        .bind(to_i64(start_s, "time")?)
        .bind(to_i64(end_s, "time")?)
        .fetch_one(&self.pool)
        .await?;
        Ok(ms.unwrap_or(0).max(0) as u64)
    }

    /// Awards open reserve `id`: `winner` (provider key hash, bundle, rate) commits it, every
    /// other bid is `lost` with its `refusals` entry; with no winner the reserve is `expired`
    /// and its hold returns. False when it was no longer open.
    pub async fn award_reserve(
        &self,
        id: B256,
        winner: Option<(B256, &str, u64)>,
        refusals: &[(B256, serde_json::Value)],
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let updated = match winner {
            Some((key, bundle, rate)) => sqlx::query(
                "UPDATE exchange_standing_orders SET status = 'committed', provider_key_hash = $2, \
                        bundle_id = $3, rate_wei_per_s = $4, updated_at = now() \
                 WHERE digest = $1 AND kind = 'reserve' AND status = 'open'",
            )
            .bind(id.as_slice())
            .bind(key.as_slice())
            .bind(bundle)
            .bind(to_i64(rate, "rate")?)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
            None => {
                let (count,): (i64,) = sqlx::query_as(&super::standing::release_sql(
                    "digest = $1 AND kind = 'reserve' AND status = 'open'",
                    "'expired'",
                ))
                .bind(id.as_slice())
                .fetch_one(&mut *tx)
                .await?;
                count as u64
            }
        };
        if updated != 1 {
            return Ok(false);
        }
        sqlx::query(
            "UPDATE exchange_reserve_bids SET status = CASE WHEN provider_key_hash = $2 \
                    THEN 'won' ELSE 'lost' END, updated_at = now() WHERE reserve = $1",
        )
        .bind(id.as_slice())
        .bind(winner.map(|(key, _, _)| key.to_vec()))
        .execute(&mut *tx)
        .await?;
        for (key, why) in refusals {
            sqlx::query(
                "UPDATE exchange_reserve_bids SET refusal = $3::jsonb \
                 WHERE reserve = $1 AND provider_key_hash = $2",
            )
            .bind(id.as_slice())
            .bind(key.as_slice())
            .bind(json_text(why))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The tabs `(chain_id, escrow_id)` with a reserve not ended at `now_s`, whatever its state:
    /// the only tabs whose intents may draw on one.
    pub async fn reserve_tabs(&self, now_s: u64) -> Result<Vec<(u64, u64)>> {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT DISTINCT chain_id, escrow_id FROM exchange_standing_orders \
             WHERE kind = 'reserve' AND ends_s > $1",
        )
        .bind(to_i64(now_s, "time")?)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(chain, escrow)| (chain as u64, escrow as u64))
            .collect())
    }

    /// The committed reserves of `account`'s tab `(chain_id, escrow_id)` whose window holds
    /// `now_s`, soonest end first: what its intents draw on.
    pub async fn drawable_reserves(
        &self,
        account: alloy::primitives::Address,
        (chain_id, escrow_id): (u64, u64),
        now_s: u64,
    ) -> Result<Vec<Drawable>> {
        let rows: Vec<(Vec<u8>, String, String, i64, i64)> = sqlx::query_as(
            "SELECT s.digest, (o.body -> 'reserve' -> 'order')::text, s.bundle_id, \
                    s.rate_wei_per_s, s.used_ms \
             FROM exchange_standing_orders s JOIN exchange_orders o ON o.digest = s.digest \
             WHERE s.account = $1 AND s.chain_id = $2 AND s.escrow_id = $3 \
               AND s.kind = 'reserve' AND s.status = 'committed' \
               AND s.starts_s <= $4 AND s.ends_s > $4 \
             ORDER BY s.ends_s, s.digest",
        )
        .bind(account.as_slice())
        .bind(to_i64(chain_id, "chain id")?)
        .bind(to_i64(escrow_id, "escrow id")?)
        .bind(to_i64(now_s, "time")?)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, order, bundle_id, rate, used)| {
                Ok(Drawable {
                    id: b256(&id)?,
                    order: serde_json::from_str(&order)?,
                    bundle_id,
                    rate_wei_per_s: rate as u64,
                    used_ms: used as u64,
                })
            })
            .collect()
    }

    /// Fills committed reserve `id` at the end of its window with its provider `key_hash`'s
    /// take-or-pay `receipt`, charged `charged_wei` (at most what it holds; the rest returns to
    /// the tab), in one transaction; false when it is not committed to that provider.
    pub async fn fill_reserve(
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
               AND s.kind = 'reserve' AND s.status = 'committed' AND s.provider_key_hash = $2 \
             RETURNING s.account, s.chain_id, s.escrow_id, s.held_wei::text, s.ends_s, s.model",
        )
        .bind(id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((account, chain_id, escrow_id, held, ends_s, model)) = row else {
            return Ok(false);
        };
        let filled = super::standing::Filled {
            id,
            order: id,
            account,
            tab: (chain_id, escrow_id),
            held_wei: parse_wei(&held)?,
            ends_s,
            model: &model,
            adapter: None,
        };
        filled
            .into_job(&mut tx, key_hash, charged_wei, receipt, decision)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Ends committed reserves and rents whose provider did not claim the take-or-pay (the
    /// term's rent) within `grace_s` of the window's (term's) end at `now_s`: `unclaimed`,
    /// their holds back on their tabs. Returns how many.
    pub async fn expire_unclaimed(&self, now_s: u64, grace_s: u64) -> Result<u64> {
        let (count,): (i64,) = sqlx::query_as(&super::standing::release_sql(
            "kind IN ('reserve', 'rent') AND status = 'committed' AND ends_s + $2 < $1",
            "'unclaimed'",
        ))
        .bind(to_i64(now_s, "time")?)
        .bind(to_i64(grace_s, "grace")?)
        .fetch_one(&self.pool)
        .await?;
        Ok(count as u64)
    }

    /// The fill of reserve `id` (bids, commitment, draws, take-or-pay).
    pub(super) async fn reserve_fill(&self, id: B256) -> Result<ReserveFill> {
        let bids: Vec<BidRow> = sqlx::query_as(
            "SELECT provider_key_hash, bundle_id, rate_wei_per_s, status, refusal::text AS refusal \
             FROM exchange_reserve_bids WHERE reserve = $1 \
             ORDER BY rate_wei_per_s, provider_key_hash",
        )
        .bind(id.as_slice())
        .fetch_all(&self.pool)
        .await?;
        let row: FillRow = sqlx::query_as(
            "SELECT s.provider_key_hash, s.bundle_id, s.rate_wei_per_s, s.used_ms, \
                    (SELECT count(*) FROM exchange_jobs d WHERE d.decision->>'reserve' = $2) \
                        AS draws, \
                    j.held_wei::text AS charged, \
                    CASE WHEN EXISTS (SELECT 1 FROM exchange_job_events e WHERE e.job_id = j.id \
                                      AND e.status = 'settled') THEN 'settled' ELSE j.status END AS settlement \
             FROM exchange_standing_orders s LEFT JOIN exchange_jobs j ON j.id = s.digest \
             WHERE s.digest = $1",
        )
        .bind(id.as_slice())
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await?;
        Ok(ReserveFill {
            bids: bids
                .into_iter()
                .map(|b| {
                    Ok(StoredBid {
                        provider_key_hash: b256(&b.provider_key_hash)?,
                        bundle_id: b.bundle_id,
                        rate_wei_per_s: b.rate_wei_per_s as u64,
                        status: b.status,
                        refusal: b.refusal.map(|r| serde_json::from_str(&r)).transpose()?,
                    })
                })
                .collect::<Result<_>>()?,
            provider_key_hash: row.provider_key_hash.map(|k| b256(&k)).transpose()?,
            bundle_id: row.bundle_id,
            rate_wei_per_s: row.rate_wei_per_s.map(|r| r as u64),
            used_ms: row.used_ms as u64,
            draws: row.draws as u64,
            charged_wei: row.charged.map(|c| parse_wei(&c)).transpose()?,
            settlement: row.settlement,
        })
    }
}

#[derive(sqlx::FromRow)]
struct BidRow {
    provider_key_hash: Vec<u8>,
    bundle_id: String,
    rate_wei_per_s: i64,
    status: String,
    refusal: Option<String>,
}

#[derive(sqlx::FromRow)]
struct FillRow {
    provider_key_hash: Option<Vec<u8>>,
    bundle_id: Option<String>,
    rate_wei_per_s: Option<i64>,
    used_ms: i64,
    draws: i64,
    charged: Option<String>,
    settlement: Option<String>,
}

fn b256(bytes: &[u8]) -> Result<B256> {
    B256::try_from(bytes).map_err(|_| Error::Corrupt {
        what: "a 32-byte hash",
        value: hex::encode(bytes),
    })
}
