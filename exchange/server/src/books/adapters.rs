//! Adapters by content id: stored once, served to providers, sized for clearing.

use super::Books;
use crate::error::Result;

/// An adapter's two PEFT files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAdapter {
    /// `adapter_config.json`.
    pub config: Vec<u8>,
    /// `adapter_model.safetensors`.
    pub weights: Vec<u8>,
}

impl Books {
    /// Stores an adapter under its content id (the caller has checked the id); storing the same
    /// content again changes nothing. Returns whether it was new.
    pub async fn put_adapter(&self, id: &str, adapter: &StoredAdapter) -> Result<bool> {
        let bytes = (adapter.config.len() + adapter.weights.len()) as i64;
        let done = sqlx::query(
            "INSERT INTO exchange_adapters (id, config, weights, bytes) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(id)
        .bind(&adapter.config)
        .bind(&adapter.weights)
        .bind(bytes)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The adapter `id`, if stored.
    pub async fn adapter(&self, id: &str) -> Result<Option<StoredAdapter>> {
        let row: Option<(Vec<u8>, Vec<u8>)> =
            sqlx::query_as("SELECT config, weights FROM exchange_adapters WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(config, weights)| StoredAdapter { config, weights }))
    }

    /// |a|: the adapter's size in bytes, if stored.
    pub async fn adapter_bytes(&self, id: &str) -> Result<Option<u64>> {
        let row: Option<(i64,)> =
            sqlx::query_as("SELECT bytes FROM exchange_adapters WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(b,)| b as u64))
    }
}
