//! Training data by content id: stored once, read at intake to price a train order, and by the
//! provider running a training job that names it.

use super::store::Books;
use crate::error::Result;
use alloy::primitives::B256;

/// What the store says of a dataset (and keeps beside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetSummary {
    /// Sequences.
    pub sequences: u32,
    /// Tokens over all sequences.
    pub tokens: u64,
    /// The largest token id.
    pub max_token: u32,
}

impl Books {
    /// The file of dataset `id`, if stored.
    pub async fn dataset(&self, id: &str) -> Result<Option<Vec<u8>>> {
        let row: Option<(Vec<u8>,)> =
            sqlx::query_as("SELECT body FROM exchange_datasets WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(b,)| b))
    }

    /// Whether the provider with key hash `key_hash` runs a training job (handed out, not yet
    /// answered) whose request names dataset `id`: the one reader a dataset has besides its
    /// owner.
    pub async fn runs_training_on(&self, key_hash: B256, id: &str) -> Result<bool> {
        let row: Option<(i32,)> = sqlx::query_as(
            "SELECT 1 FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
             WHERE b.provider_key_hash = $1 AND j.status IN ('assigned', 'running') \
               AND j.workload = 'train' AND j.request->>'data' = $2 LIMIT 1",
        )
        .bind(key_hash.as_slice())
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }
}
