//! Tenants' preferences over the shared quote ([`crate::preferences`]): written when they change,
//! read back at start.

use super::store::Books;
use crate::error::Result;
use alloy::primitives::Address;
use cx_exchange::pricing::tenant::DeltaParts;

impl Books {
    /// Every stored preference: (account, delta, observations). A row that does not read as a
    /// delta is skipped (its tenant starts over), not an error at start.
    pub async fn tenant_preferences(&self) -> Result<Vec<(Address, DeltaParts, u64)>> {
        let rows: Vec<(Vec<u8>, serde_json::Value, i64)> =
            sqlx::query_as("SELECT account, delta, observations FROM exchange_tenant_preferences")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(account, delta, observations)| {
                Some((
                    Address::try_from(account.as_slice()).ok()?,
                    serde_json::from_value(delta).ok()?,
                    observations.max(0) as u64,
                ))
            })
            .collect())
    }

    /// Stores `changed` preferences (one transaction; each replaces the account's row).
    pub async fn save_tenant_preferences(
        &self,
        changed: &[(Address, DeltaParts, u64)],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for (account, delta, observations) in changed {
            sqlx::query(
                "INSERT INTO exchange_tenant_preferences (account, delta, observations) \
                 VALUES ($1, $2, $3) ON CONFLICT (account) DO UPDATE \
                 SET delta = EXCLUDED.delta, observations = EXCLUDED.observations, \
                     updated_at = now()",
            )
            .bind(account.as_slice())
            .bind(serde_json::to_value(delta)?)
            .bind(i64::try_from(*observations).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
