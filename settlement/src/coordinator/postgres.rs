//! The coordinator's [`Store`] in PostgreSQL (runtime queries, so building needs no database).
//!
//! The schema is the workspace's `migrations/`, which belong to the exchange's database: the
//! exchange server applies them at start, tests apply them to their throwaway databases. This
//! store only takes a pool on a database that is already migrated.

use alloy::primitives::B256;
use cx_protocol::voucher::Voucher;
use frost_secp256k1 as frost;
use sqlx::postgres::PgPool;
use sqlx::{Postgres, Row, Transaction};

use super::store::{PartStatus, Store, StoredPart};
use crate::error::{Error, Result};
use crate::ledger::ChainBatch;

/// The store on a PostgreSQL pool.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

fn to_i64(value: u64, what: &'static str) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::OutOfRange { what, value })
}

fn part_from_row(row: &sqlx::postgres::PgRow) -> Result<StoredPart> {
    let body: String = row.try_get("body")?;
    let tx: Option<Vec<u8>> = row.try_get("tx_hash")?;
    Ok(StoredPart {
        batch_id: row.try_get("batch_id")?,
        batch: serde_json::from_str(&body)?,
        status: PartStatus::parse(&row.try_get::<String, _>("status")?)?,
        signature: row.try_get("signature")?,
        tx_hash: tx.map(|t| B256::from_slice(&t)),
    })
}

const PART_COLUMNS: &str = "batch_id, body::text AS body, status, signature, tx_hash";

impl PgStore {
    /// The store on `pool`, whose database carries the schema of `migrations/`.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool (for tests and the explorer).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        Ok(self.pool.begin().await?)
    }
}

impl Store for PgStore {
    async fn add_receipts(&self, receipts: &[Voucher]) -> Result<usize> {
        let mut tx = self.begin().await?;
        let mut added = 0;
        for r in receipts {
            let k = &r.receipt.receipt;
            let done = sqlx::query(
                "INSERT INTO settlement_receipts (job_id, chain_id, escrow_id, voucher) \
                 VALUES ($1, $2, $3, $4::jsonb) ON CONFLICT DO NOTHING",
            )
            .bind(k.job_id.to_vec())
            .bind(to_i64(k.chain_id, "chain id")?)
            .bind(to_i64(k.escrow_id, "escrow id")?)
            .bind(serde_json::to_string(r)?)
            .execute(&mut *tx)
            .await?;
            added += done.rows_affected() as usize;
        }
        tx.commit().await?;
        Ok(added)
    }

    async fn pending_receipts(&self) -> Result<Vec<Voucher>> {
        let rows = sqlx::query(
            "SELECT voucher::text AS voucher FROM settlement_receipts WHERE batch_id IS NULL \
             ORDER BY received_at, job_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok(serde_json::from_str(&row.try_get::<String, _>("voucher")?)?))
            .collect()
    }

    async fn create_batch(&self, parts: &[ChainBatch]) -> Result<i64> {
        let mut tx = self.begin().await?;
        let id: i64 = sqlx::query("INSERT INTO settlement_batches DEFAULT VALUES RETURNING id")
            .fetch_one(&mut *tx)
            .await?
            .try_get("id")?;
        for p in parts {
            sqlx::query(
                "INSERT INTO settlement_batch_parts (batch_id, chain_id, nonce, digest, body, status) \
                 VALUES ($1, $2, $3, $4, $5::jsonb, 'created')",
            )
            .bind(id)
            .bind(to_i64(p.chain_id, "chain id")?)
            .bind(to_i64(p.nonce, "nonce")?)
            .bind(p.digest().to_vec())
            .bind(serde_json::to_string(p)?)
            .execute(&mut *tx)
            .await?;
            for r in &p.receipts {
                sqlx::query(
                    "UPDATE settlement_receipts SET batch_id = $1 WHERE job_id = $2 AND batch_id IS NULL",
                )
                .bind(id)
                .bind(r.receipt.receipt.job_id.to_vec())
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(id)
    }

    async fn record_signature(&self, batch_id: i64, chain_id: u64, signature: &[u8]) -> Result<()> {
        sqlx::query(
            "UPDATE settlement_batch_parts SET status = 'signed', signature = $3, updated_at = now() \
             WHERE batch_id = $1 AND chain_id = $2 AND status = 'created'",
        )
        .bind(batch_id)
        .bind(to_i64(chain_id, "chain id")?)
        .bind(signature.to_vec())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn record_posted(
        &self,
        batch_id: i64,
        chain_id: u64,
        tx_hash: Option<B256>,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE settlement_batch_parts SET status = 'posted', tx_hash = $3, updated_at = now() \
             WHERE batch_id = $1 AND chain_id = $2",
        )
        .bind(batch_id)
        .bind(to_i64(chain_id, "chain id")?)
        .bind(tx_hash.map(|h| h.to_vec()))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn unfinished(&self) -> Result<Vec<StoredPart>> {
        let rows = sqlx::query(&format!(
            "SELECT {PART_COLUMNS} FROM settlement_batch_parts WHERE status <> 'posted' \
             ORDER BY batch_id, chain_id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(part_from_row).collect()
    }

    async fn latest_part(&self, chain_id: u64) -> Result<Option<StoredPart>> {
        let row = sqlx::query(&format!(
            "SELECT {PART_COLUMNS} FROM settlement_batch_parts WHERE chain_id = $1 \
             ORDER BY nonce DESC LIMIT 1"
        ))
        .bind(to_i64(chain_id, "chain id")?)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(part_from_row).transpose()
    }

    async fn parts(&self, batch_id: i64) -> Result<Vec<StoredPart>> {
        let rows = sqlx::query(&format!(
            "SELECT {PART_COLUMNS} FROM settlement_batch_parts WHERE batch_id = $1 ORDER BY chain_id"
        ))
        .bind(batch_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(part_from_row).collect()
    }

    async fn log_step(
        &self,
        batch_id: i64,
        chain_id: Option<u64>,
        step: &str,
        detail: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO settlement_steps (batch_id, chain_id, step, detail) VALUES ($1, $2, $3, $4)",
        )
        .bind(batch_id)
        .bind(chain_id.map(|c| to_i64(c, "chain id")).transpose()?)
        .bind(step)
        .bind(detail)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn steps(&self, batch_id: i64) -> Result<Vec<(Option<u64>, String, String)>> {
        let rows = sqlx::query(
            "SELECT chain_id, step, detail FROM settlement_steps WHERE batch_id = $1 ORDER BY id",
        )
        .bind(batch_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let chain: Option<i64> = row.try_get("chain_id")?;
                Ok((
                    chain.map(|c| c as u64),
                    row.try_get("step")?,
                    row.try_get("detail")?,
                ))
            })
            .collect()
    }

    async fn abandon_batch(&self, batch_id: i64) -> Result<()> {
        let mut tx = self.begin().await?;
        // Lock the parts so a concurrent signer of this batch cannot slip in between.
        let signed: i64 = sqlx::query(
            "SELECT count(*) AS signed FROM (SELECT status FROM settlement_batch_parts \
             WHERE batch_id = $1 FOR UPDATE) parts WHERE status <> 'created'",
        )
        .bind(batch_id)
        .fetch_one(&mut *tx)
        .await?
        .try_get("signed")?;
        if signed > 0 {
            return Err(Error::SignedAlready { batch_id });
        }
        sqlx::query("DELETE FROM settlement_batch_parts WHERE batch_id = $1")
            .bind(batch_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE settlement_receipts SET batch_id = NULL WHERE batch_id = $1")
            .bind(batch_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn replace_part(
        &self,
        batch_id: i64,
        chain_id: u64,
        replacement: Option<&ChainBatch>,
    ) -> Result<()> {
        let chain = to_i64(chain_id, "chain id")?;
        let mut tx = self.begin().await?;
        // Locked, so a concurrent post of this part cannot slip in between.
        let status: Option<String> = sqlx::query(
            "SELECT status FROM settlement_batch_parts WHERE batch_id = $1 AND chain_id = $2 \
             FOR UPDATE",
        )
        .bind(batch_id)
        .bind(chain)
        .fetch_optional(&mut *tx)
        .await?
        .map(|row| row.try_get("status"))
        .transpose()?;
        match status.as_deref() {
            None => return Err(Error::MissingPart { batch_id, chain_id }),
            Some("posted") => return Err(Error::PostedAlready { batch_id, chain_id }),
            Some(_) => {}
        }
        sqlx::query(
            "UPDATE settlement_receipts SET batch_id = NULL WHERE batch_id = $1 AND chain_id = $2",
        )
        .bind(batch_id)
        .bind(chain)
        .execute(&mut *tx)
        .await?;
        match replacement {
            Some(p) => {
                sqlx::query(
                    "UPDATE settlement_batch_parts SET digest = $3, body = $4::jsonb, \
                     status = 'created', signature = NULL, tx_hash = NULL, updated_at = now() \
                     WHERE batch_id = $1 AND chain_id = $2",
                )
                .bind(batch_id)
                .bind(chain)
                .bind(p.digest().to_vec())
                .bind(serde_json::to_string(p)?)
                .execute(&mut *tx)
                .await?;
                for r in &p.receipts {
                    sqlx::query(
                        "UPDATE settlement_receipts SET batch_id = $1 WHERE job_id = $2 \
                         AND batch_id IS NULL",
                    )
                    .bind(batch_id)
                    .bind(r.receipt.receipt.job_id.to_vec())
                    .execute(&mut *tx)
                    .await?;
                }
            }
            None => {
                sqlx::query(
                    "DELETE FROM settlement_batch_parts WHERE batch_id = $1 AND chain_id = $2",
                )
                .bind(batch_id)
                .bind(chain)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn reject_receipt(&self, job_id: [u8; 32], reason: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        let moved = sqlx::query(
            "INSERT INTO settlement_rejected_receipts (job_id, voucher, reason) \
             SELECT job_id, voucher, $2 FROM settlement_receipts \
             WHERE job_id = $1 AND batch_id IS NULL",
        )
        .bind(job_id.to_vec())
        .bind(reason)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM settlement_receipts WHERE job_id = $1 AND batch_id IS NULL")
            .bind(job_id.to_vec())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(moved > 0)
    }

    async fn save_group_key(
        &self,
        epoch: u32,
        package: &frost::keys::PublicKeyPackage,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO settlement_group_keys (epoch, verifying_key, public_key_package) \
             VALUES ($1, $2, $3::jsonb) ON CONFLICT (epoch) DO NOTHING",
        )
        .bind(epoch as i32)
        .bind(package.verifying_key().serialize()?)
        .bind(serde_json::to_string(package)?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn group_keys(&self) -> Result<Vec<(u32, frost::keys::PublicKeyPackage)>> {
        let rows = sqlx::query(
            "SELECT epoch, public_key_package::text AS package FROM settlement_group_keys ORDER BY epoch",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let epoch: i32 = row.try_get("epoch")?;
                let package: String = row.try_get("package")?;
                Ok((epoch as u32, serde_json::from_str(&package)?))
            })
            .collect()
    }
}
