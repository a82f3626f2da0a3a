//! Who owns stored content, and the quota it counts against: an adapter or dataset is stored
//! once by content id, and every account that stored it owns it and is charged its bytes.

use super::store::Books;
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};

/// What an account may keep stored at once unless `cx serve --store-quota-bytes` says otherwise:
/// ten of the largest adapters.
pub const DEFAULT_STORE_QUOTA_BYTES: u64 = 1 << 30;

/// Stored content's kind (the owners table's `kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// An adapter (`PUT /v1/adapters`).
    Adapter,
    /// A training dataset (`PUT /v1/datasets`).
    Dataset,
}

impl Content {
    fn as_str(self) -> &'static str {
        match self {
            Content::Adapter => "adapter",
            Content::Dataset => "dataset",
        }
    }
}

/// What an upload stores.
#[derive(Clone, Copy, Debug)]
pub enum Upload<'a> {
    /// An adapter's two PEFT files.
    Adapter(&'a super::adapters::StoredAdapter),
    /// A dataset file and what it holds.
    Dataset {
        /// The file, as sent.
        body: &'a [u8],
        /// What it holds.
        summary: super::datasets::DatasetSummary,
    },
}

impl Upload<'_> {
    fn kind(&self) -> Content {
        match self {
            Upload::Adapter(_) => Content::Adapter,
            Upload::Dataset { .. } => Content::Dataset,
        }
    }

    /// The bytes it costs its owner's quota.
    fn bytes(&self) -> u64 {
        match self {
            Upload::Adapter(a) => (a.config.len() + a.weights.len()) as u64,
            Upload::Dataset { body, .. } => body.len() as u64,
        }
    }
}

impl Books {
    /// Stores `upload` under `id` (the caller has checked both) owned by each of `owners`,
    /// refusing with [`Error::StoreQuota`] what would take any of them past `quota` bytes owned.
    /// The same content stored again is stored once; owning it already changes nothing. One
    /// transaction for every owner: a refusal leaves nothing behind. Returns whether the content
    /// was new.
    pub async fn store(
        &self,
        id: &str,
        upload: Upload<'_>,
        owners: &[Address],
        quota: u64,
    ) -> Result<bool> {
        let (kind, bytes) = (upload.kind(), upload.bytes());
        // Locks in address order, so two uploads naming the same owners cannot deadlock.
        let mut owners = owners.to_vec();
        owners.sort_unstable();
        owners.dedup();
        let mut tx = self.pool.begin().await?;
        for account in &owners {
            // One upload of an account at a time, so two cannot both fit under its quota.
            sqlx::query(
                "SELECT pg_advisory_xact_lock(hashtextextended('cx-store:' || encode($1, 'hex'), 0))",
            )
            .bind(account.as_slice())
            .execute(&mut *tx)
            .await?;
            let (owned, used): (bool, i64) = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM exchange_content_owners \
                                WHERE kind = $1 AND id = $2 AND account = $3), \
                        coalesce((SELECT sum(bytes) FROM exchange_content_owners WHERE account = $3), 0)::bigint",
            )
            .bind(kind.as_str())
            .bind(id)
            .bind(account.as_slice())
            .fetch_one(&mut *tx)
            .await?;
            if !owned && used as u64 + bytes > quota {
                return Err(Error::StoreQuota {
                    used: used as u64,
                    bytes,
                    quota,
                });
            }
        }
        let created = match upload {
            Upload::Adapter(adapter) => sqlx::query(
                "INSERT INTO exchange_adapters (id, config, weights, bytes) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(id)
            .bind(&adapter.config)
            .bind(&adapter.weights)
            .bind(bytes as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
            Upload::Dataset { body, summary } => sqlx::query(
                "INSERT INTO exchange_datasets (id, body, sequences, tokens, max_token) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
            )
            .bind(id)
            .bind(body)
            .bind(summary.sequences as i32)
            .bind(summary.tokens as i64)
            .bind(i64::from(summary.max_token))
            .execute(&mut *tx)
            .await?
            .rows_affected(),
        } == 1;
        for account in &owners {
            sqlx::query(
                "INSERT INTO exchange_content_owners (kind, id, account, bytes) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(kind.as_str())
            .bind(id)
            .bind(account.as_slice())
            .bind(bytes as i64)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(created)
    }

    /// Whether `account` owns `kind` content `id`.
    pub async fn owns(&self, kind: Content, id: &str, account: Address) -> Result<bool> {
        let (owns,): (bool,) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM exchange_content_owners \
                            WHERE kind = $1 AND id = $2 AND account = $3)",
        )
        .bind(kind.as_str())
        .bind(id)
        .bind(account.as_slice())
        .fetch_one(&self.pool)
        .await?;
        Ok(owns)
    }

    /// Whether provider `key_hash`'s work needs adapter `id`: a job on its bundles names it and
    /// is not over (handed out, running or awaiting its verdict), or a rent it holds pins it.
    /// The one reader an adapter has besides its owners.
    pub async fn works_with_adapter(&self, key_hash: B256, id: &str) -> Result<bool> {
        let (needed,): (bool,) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
                            WHERE b.provider_key_hash = $1 AND j.adapter = $2 \
                              AND j.status IN ('assigned', 'running', 'verifying')) \
                 OR EXISTS (SELECT 1 FROM exchange_standing_orders s \
                            JOIN exchange_rent_holders h ON h.rent = s.digest \
                            WHERE s.kind = 'rent' AND s.status = 'committed' \
                              AND h.provider_key_hash = $1 AND NOT h.claimed \
                              AND s.target = $2)",
        )
        .bind(key_hash.as_slice())
        .bind(id)
        .fetch_one(&self.pool)
        .await?;
        Ok(needed)
    }

    /// The buyers of provider `key_hash`'s training jobs now running: who owns an adapter it
    /// trains and stores.
    pub async fn training_buyers(&self, key_hash: B256) -> Result<Vec<Address>> {
        let rows: Vec<(Vec<u8>,)> = sqlx::query_as(
            "SELECT DISTINCT j.account FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
             WHERE b.provider_key_hash = $1 AND j.status IN ('assigned', 'running') \
               AND j.workload = 'train' ORDER BY j.account",
        )
        .bind(key_hash.as_slice())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(a,)| {
                Address::try_from(a.as_slice()).map_err(|_| Error::Corrupt {
                    what: "an address",
                    value: hex::encode(&a),
                })
            })
            .collect()
    }

    /// Whether `account` may store content: it has bound its ML-DSA key and holds an open tab
    /// (money at stake), or is acting through a session (checked by the caller).
    pub async fn may_store(&self, account: Address, now_s: u64) -> Result<bool> {
        let (ok,): (bool,) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM exchange_bindings WHERE account = $1) \
                AND EXISTS (SELECT 1 FROM exchange_tabs \
                            WHERE buyer = $1 AND status = 'open' AND deadline_s > $2)",
        )
        .bind(account.as_slice())
        .bind(now_s as i64)
        .fetch_one(&self.pool)
        .await?;
        Ok(ok)
    }
}
