//! What the chain watcher writes: tabs opened and reclaimed, batches seen, and its cursor. Every
//! write is idempotent by (chain, id), so replaying a block range after a restart changes nothing.
//!
//! With each range the watcher records the hash of the block it ended at; a later hash that
//! differs means the chain reorganised under what the books read, and [`Books::rewind_chain`]
//! undoes what came from the replaced blocks so the watcher reads them again.

use super::store::{Books, to_i64, wei_text};
use crate::error::Result;
use alloy::primitives::{Address, B256};

/// An escrow event the watcher read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TabEvent {
    /// `JobOpened`: a tab exists.
    Opened {
        /// The escrow id.
        escrow_id: u64,
        /// Who opened it.
        buyer: Address,
        /// What it holds, wei.
        amount_wei: u128,
        /// When the buyer may reclaim it, unix seconds.
        deadline_s: u64,
        /// Its `ref`.
        reference: B256,
        /// The block it was opened in.
        block: u64,
    },
    /// `JobReclaimed`: the buyer took it back; nothing may draw on it any more.
    Reclaimed {
        /// The escrow id.
        escrow_id: u64,
        /// The block it was reclaimed in.
        block: u64,
    },
}

/// A settlement batch that landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenBatch {
    /// Its nonce on that chain.
    pub nonce: u64,
    /// Merkle root of its receipts.
    pub receipts_root: B256,
    /// Root of cumulative balances after it.
    pub balances_root: B256,
    /// What it settled, wei.
    pub settled_wei: u128,
    /// The block it landed in.
    pub block: u64,
}

/// A block as the watcher saw it when it ended a pass there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenBlock {
    /// Its number.
    pub number: u64,
    /// Its hash then.
    pub hash: B256,
}

/// What [`Books::rewind_chain`] undid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rewind {
    /// Tabs opened in replaced blocks, removed (read again if the new chain has them).
    pub dropped_tabs: u64,
    /// Tabs reclaimed in replaced blocks, open again.
    pub reopened_tabs: u64,
    /// Batches seen landing in replaced blocks, forgotten.
    pub dropped_batches: u64,
}

/// Hashes of recent pass ends kept per chain: a reorg deeper than this many passes is beyond
/// what the watcher can place, and it rewinds to the oldest it kept.
pub const KEPT_BLOCKS: i64 = 256;

impl Books {
    /// Applies what the watcher read of `[.., next_block)` on `chain_id` and moves its cursor, in
    /// one transaction: a crash between the two cannot lose or repeat a block.
    pub async fn apply_chain(
        &self,
        chain_id: u64,
        events: &[TabEvent],
        batches: &[SeenBatch],
        next_block: u64,
        end: Option<SeenBlock>,
    ) -> Result<()> {
        let chain = to_i64(chain_id, "chain id")?;
        let mut tx = self.pool.begin().await?;
        for event in events {
            match event {
                TabEvent::Opened {
                    escrow_id,
                    buyer,
                    amount_wei,
                    deadline_s,
                    reference,
                    block,
                } => {
                    sqlx::query(
                        "INSERT INTO exchange_tabs \
                         (chain_id, escrow_id, buyer, amount_wei, deadline_s, ref, opened_block) \
                         VALUES ($1, $2, $3, $4::numeric, $5, $6, $7) ON CONFLICT DO NOTHING",
                    )
                    .bind(chain)
                    .bind(to_i64(*escrow_id, "escrow id")?)
                    .bind(buyer.as_slice())
                    .bind(wei_text(*amount_wei))
                    .bind(to_i64(*deadline_s, "deadline")?)
                    .bind(reference.as_slice())
                    .bind(to_i64(*block, "block")?)
                    .execute(&mut *tx)
                    .await?;
                }
                TabEvent::Reclaimed { escrow_id, block } => {
                    sqlx::query(
                        "UPDATE exchange_tabs SET status = 'reclaimed', reclaimed_block = $3, \
                         updated_at = now() WHERE chain_id = $1 AND escrow_id = $2",
                    )
                    .bind(chain)
                    .bind(to_i64(*escrow_id, "escrow id")?)
                    .bind(to_i64(*block, "block")?)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        for b in batches {
            sqlx::query(
                "INSERT INTO exchange_batches_seen \
                 (chain_id, nonce, receipts_root, balances_root, settled_wei, block) \
                 VALUES ($1, $2, $3, $4, $5::numeric, $6) ON CONFLICT DO NOTHING",
            )
            .bind(chain)
            .bind(to_i64(b.nonce, "nonce")?)
            .bind(b.receipts_root.as_slice())
            .bind(b.balances_root.as_slice())
            .bind(wei_text(b.settled_wei))
            .bind(to_i64(b.block, "block")?)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "INSERT INTO exchange_chain_cursors (chain_id, next_block) VALUES ($1, $2) \
             ON CONFLICT (chain_id) DO UPDATE SET next_block = EXCLUDED.next_block, \
             updated_at = now() WHERE exchange_chain_cursors.next_block < EXCLUDED.next_block",
        )
        .bind(chain)
        .bind(to_i64(next_block, "block")?)
        .execute(&mut *tx)
        .await?;
        if let Some(end) = end {
            let number = to_i64(end.number, "block")?;
            sqlx::query(
                "INSERT INTO exchange_chain_blocks (chain_id, number, hash) VALUES ($1, $2, $3) \
                 ON CONFLICT (chain_id, number) DO UPDATE SET hash = EXCLUDED.hash",
            )
            .bind(chain)
            .bind(number)
            .bind(end.hash.as_slice())
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "DELETE FROM exchange_chain_blocks WHERE chain_id = $1 AND number NOT IN \
                 (SELECT number FROM exchange_chain_blocks WHERE chain_id = $1 \
                  ORDER BY number DESC LIMIT $2)",
            )
            .bind(chain)
            .bind(KEPT_BLOCKS)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The newest `limit` pass ends recorded on `chain_id`, newest first.
    pub async fn seen_blocks(&self, chain_id: u64, limit: i64) -> Result<Vec<SeenBlock>> {
        let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
            "SELECT number, hash FROM exchange_chain_blocks WHERE chain_id = $1 \
             ORDER BY number DESC LIMIT $2",
        )
        .bind(to_i64(chain_id, "chain id")?)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(number, hash)| {
                Ok(SeenBlock {
                    number: number as u64,
                    hash: B256::try_from(hash.as_slice()).map_err(|_| crate::Error::Corrupt {
                        what: "a block hash",
                        value: hex::encode(&hash),
                    })?,
                })
            })
            .collect()
    }

    /// Undoes, in one transaction, what the watcher read from `fork_block` on (those blocks
    /// were replaced): tabs opened there go, tabs reclaimed there reopen, batches seen there
    /// are forgotten, and the cursor moves back to `fork_block` so the next pass reads the new
    /// blocks. Every reorg is recorded in `exchange_chain_reorgs`.
    ///
    /// If a tab opened in a replaced block already has a job, session or standing order on it,
    /// nothing is undone: the books promised that money to someone, and a rewrite is the
    /// operator's call. The reorg is recorded as halting and [`crate::Error::ReorgBelowHolds`]
    /// returned, so the watcher goes no further on that chain.
    pub async fn rewind_chain(&self, chain_id: u64, fork_block: u64) -> Result<Rewind> {
        let chain = to_i64(chain_id, "chain id")?;
        let fork = to_i64(fork_block, "block")?;
        let mut tx = self.pool.begin().await?;
        let cursor: i64 = sqlx::query_scalar(
            "SELECT next_block FROM exchange_chain_cursors WHERE chain_id = $1 FOR UPDATE",
        )
        .bind(chain)
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or(0);
        let drawn: Vec<i64> = sqlx::query_scalar(
            "SELECT t.escrow_id FROM exchange_tabs t WHERE t.chain_id = $1 AND t.opened_block >= $2 \
             AND (EXISTS (SELECT 1 FROM exchange_jobs j WHERE j.chain_id = t.chain_id AND j.escrow_id = t.escrow_id) \
               OR EXISTS (SELECT 1 FROM exchange_sessions s WHERE s.chain_id = t.chain_id AND s.escrow_id = t.escrow_id) \
               OR EXISTS (SELECT 1 FROM exchange_standing_orders o WHERE o.chain_id = t.chain_id AND o.escrow_id = t.escrow_id)) \
             ORDER BY t.escrow_id",
        )
        .bind(chain)
        .bind(fork)
        .fetch_all(&mut *tx)
        .await?;
        let record = |rewind: Rewind, halted: bool, detail: String| {
            sqlx::query(
                "INSERT INTO exchange_chain_reorgs (chain_id, fork_block, cursor_block, \
                 dropped_tabs, reopened_tabs, dropped_batches, halted, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(chain)
            .bind(fork)
            .bind(cursor)
            .bind(rewind.dropped_tabs as i64)
            .bind(rewind.reopened_tabs as i64)
            .bind(rewind.dropped_batches as i64)
            .bind(halted)
            .bind(detail)
        };
        if !drawn.is_empty() {
            let err = crate::Error::ReorgBelowHolds {
                chain_id,
                fork_block,
                tabs: drawn.iter().map(|t| *t as u64).collect(),
            };
            // Recorded once: the watcher meets the same reorg at every pass while it waits.
            let known: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM exchange_chain_reorgs \
                 WHERE chain_id = $1 AND fork_block = $2 AND halted)",
            )
            .bind(chain)
            .bind(fork)
            .fetch_one(&mut *tx)
            .await?;
            if !known {
                record(Rewind::default(), true, err.to_string())
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            return Err(err);
        }
        let rewind = Rewind {
            dropped_tabs: sqlx::query(
                "DELETE FROM exchange_tabs WHERE chain_id = $1 AND opened_block >= $2",
            )
            .bind(chain)
            .bind(fork)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
            reopened_tabs: sqlx::query(
                "UPDATE exchange_tabs SET status = 'open', reclaimed_block = NULL, updated_at = now() \
                 WHERE chain_id = $1 AND status = 'reclaimed' AND reclaimed_block >= $2",
            )
            .bind(chain)
            .bind(fork)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
            dropped_batches: sqlx::query(
                "DELETE FROM exchange_batches_seen WHERE chain_id = $1 AND block >= $2",
            )
            .bind(chain)
            .bind(fork)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
        };
        sqlx::query("DELETE FROM exchange_chain_blocks WHERE chain_id = $1 AND number >= $2")
            .bind(chain)
            .bind(fork)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE exchange_chain_cursors SET next_block = $2, updated_at = now() \
             WHERE chain_id = $1 AND next_block > $2",
        )
        .bind(chain)
        .bind(fork)
        .execute(&mut *tx)
        .await?;
        record(
            rewind,
            false,
            format!("blocks from {fork_block} replaced; read again"),
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rewind)
    }

    /// The next block the watcher has to read on `chain_id` (0 before its first pass).
    pub async fn chain_cursor(&self, chain_id: u64) -> Result<u64> {
        let row: Option<(i64,)> =
            sqlx::query_as("SELECT next_block FROM exchange_chain_cursors WHERE chain_id = $1")
                .bind(to_i64(chain_id, "chain id")?)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map_or(0, |(b,)| b as u64))
    }
}
