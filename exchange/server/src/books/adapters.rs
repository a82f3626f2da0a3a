//! Adapters by content id: stored once ([`Books::store`]), served to their owners and to the
//! providers whose work needs them, sized for clearing.

use super::store::Books;
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
