//! Searches filled: providers read the open searches, and the first valid witness wins. The
//! fill becomes a job (its id the search's digest, `done` with the witness) charged what the
//! provider's receipt claims, so it settles with its tab like any other.

use super::{Books, StandingOrder, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::B256;

impl Books {
    /// Open searches whose deadline is still ahead of `now_s`, soonest deadline first.
    pub async fn open_searches(&self, now_s: u64, limit: i64) -> Result<Vec<StandingOrder>> {
        let ids: Vec<(Vec<u8>,)> = sqlx::query_as(
            "SELECT digest FROM exchange_standing_orders \
             WHERE kind = 'search' AND status = 'open' AND ends_s >= $1 \
             ORDER BY ends_s, digest LIMIT $2",
        )
        .bind(to_i64(now_s, "time")?)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(ids.len());
        for (id,) in ids {
            let id = B256::try_from(id.as_slice()).map_err(|_| Error::Corrupt {
                what: "an order digest",
                value: hex::encode(&id),
            })?;
            if let Some(order) = self.standing_order(id).await? {
                out.push(order);
            }
        }
        Ok(out)
    }

    /// Fills open search `id` with `witness` found by the provider `key_hash`, charged
    /// `charged_wei` (at most what it holds; the rest returns to the tab) with `receipt`, in one
    /// transaction; false when it was no longer open (another witness won, or it ended).
    pub async fn fill_search(
        &self,
        id: B256,
        key_hash: B256,
        witness: u64,
        charged_wei: u128,
        receipt: &serde_json::Value,
        now_s: u64,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(Vec<u8>, i64, i64, String, i64)> = sqlx::query_as(
            "UPDATE exchange_standing_orders SET status = 'filled', updated_at = now() \
             WHERE digest = $1 AND kind = 'search' AND status = 'open' AND ends_s >= $2 \
             RETURNING account, chain_id, escrow_id, held_wei::text, ends_s",
        )
        .bind(id.as_slice())
        .bind(to_i64(now_s, "time")?)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((account, chain_id, escrow_id, held, ends_s)) = row else {
            return Ok(false);
        };
        let held = super::parse_wei(&held)?;
        if charged_wei > held {
            return Err(Error::OverCharged {
                charged_wei,
                price_wei: held,
            });
        }
        sqlx::query(
            // Its job slot on the tab was taken when the search was accepted.
            "UPDATE exchange_tabs SET held_wei = held_wei - $3::numeric, updated_at = now() \
             WHERE chain_id = $1 AND escrow_id = $2",
        )
        .bind(chain_id)
        .bind(escrow_id)
        .bind(wei_text(held - charged_wei))
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO exchange_jobs (id, order_digest, account, chain_id, escrow_id, model, \
                                        status, held_wei, decision, deadline_s) \
             VALUES ($1, $1, $2, $3, $4, 'search', 'done', $5::numeric, $6::jsonb, $7)",
        )
        .bind(id.as_slice())
        .bind(&account)
        .bind(chain_id)
        .bind(escrow_id)
        .bind(wei_text(charged_wei))
        .bind(serde_json::json!({"kind": "search", "witness": witness}).to_string())
        .bind(ends_s)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO exchange_receipts (job_id, provider_key_hash, amount_owed_wei, receipt) \
             VALUES ($1, $2, $3::numeric, $4::jsonb)",
        )
        .bind(id.as_slice())
        .bind(key_hash.as_slice())
        .bind(wei_text(charged_wei))
        .bind(receipt.to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             VALUES ($1, 0, 'done', jsonb_build_object('witness', $2::text, \
                     'charged_wei', $3::text, 'provider_key_hash', $4::text))",
        )
        .bind(id.as_slice())
        .bind(witness.to_string())
        .bind(charged_wei.to_string())
        .bind(key_hash.to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }
}
