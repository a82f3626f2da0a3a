//! Registered bundles: the table the matching engine's memory is rebuilt from.

use super::store::Books;
use crate::error::Result;
use cx_protocol::Bundle;

impl Books {
    /// Registers a bundle, or replaces the one with its id.
    pub async fn upsert_bundle(&self, bundle: &Bundle) -> Result<()> {
        sqlx::query(
            "INSERT INTO exchange_bundles (id, body) VALUES ($1, $2::jsonb) \
             ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, updated_at = now(), \
                 withdrawal = NULL",
        )
        .bind(&bundle.id)
        .bind(serde_json::to_string(bundle)?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every bundle on offer, by id (not those their provider withdrew: their rows stay only
    /// for the jobs and history that name them).
    pub async fn bundles(&self) -> Result<Vec<Bundle>> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT body::text FROM exchange_bundles WHERE withdrawal IS NULL ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(body,)| Ok(serde_json::from_str(&body)?))
            .collect()
    }
}
