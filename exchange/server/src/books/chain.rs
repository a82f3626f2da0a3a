//! What the chain watcher writes: tabs opened and reclaimed, batches seen, and its cursor. Every
//! write is idempotent by (chain, id), so replaying a block range after a restart changes nothing.

use super::{Books, to_i64, wei_text};
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

impl Books {
    /// Applies what the watcher read of `[.., next_block)` on `chain_id` and moves its cursor, in
    /// one transaction: a crash between the two cannot lose or repeat a block.
    pub async fn apply_chain(
        &self,
        chain_id: u64,
        events: &[TabEvent],
        batches: &[SeenBatch],
        next_block: u64,
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
                TabEvent::Reclaimed { escrow_id } => {
                    sqlx::query(
                        "UPDATE exchange_tabs SET status = 'reclaimed', updated_at = now() \
                         WHERE chain_id = $1 AND escrow_id = $2",
                    )
                    .bind(chain)
                    .bind(to_i64(*escrow_id, "escrow id")?)
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
        tx.commit().await?;
        Ok(())
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
