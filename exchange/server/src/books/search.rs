//! Searches filled: providers read the open searches, and the first valid witness wins. The
//! fill becomes a job (its id the search's digest, `done` with the witness) charged what the
//! provider's receipt claims, so it settles with its tab like any other.

use super::standing::StandingOrder;
use super::store::{Books, to_i64};
use crate::error::Result;
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
        self.standing_orders(ids).await
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
        let filled = super::standing::Filled {
            id,
            order: id,
            account,
            tab: (chain_id, escrow_id),
            held_wei: super::store::parse_wei(&held)?,
            ends_s,
            model: "search",
            adapter: None,
        };
        filled
            .into_job(
                &mut tx,
                key_hash,
                charged_wei,
                receipt,
                &serde_json::json!({"kind": "search", "witness": witness}),
            )
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}
