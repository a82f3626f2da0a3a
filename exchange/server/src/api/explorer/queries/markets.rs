//! Prices over time. The market maker keeps its quotes in memory only, so the history is what
//! jobs paid: each job's charge (its receipt's amount, else what it holds) when it was accepted,
//! by model × tier.

use super::ms;
use crate::error::Result;
use serde::Serialize;
use sqlx::PgPool;

/// Jobs the chart reads at most (the newest).
pub(crate) const POINTS: i64 = 500;

/// One job's price.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PricePoint {
    /// The catalog model.
    pub(crate) model: String,
    /// The tier it was cleared at.
    pub(crate) tier: String,
    /// When it was accepted, unix ms.
    pub(crate) at_ms: i64,
    /// What it paid (or holds), wei.
    pub(crate) price_wei: String,
}

/// The newest [`POINTS`] jobs' prices, oldest first.
pub(crate) async fn history(pool: &PgPool) -> Result<Vec<PricePoint>> {
    let rows: Vec<(String, Option<String>, i64, String)> = sqlx::query_as(concat!(
        "SELECT j.model, j.decision->>'tier', ",
        ms!("j.created_at"),
        ", coalesce(er.amount_owed_wei, j.held_wei)::text \
         FROM exchange_jobs j LEFT JOIN exchange_receipts er ON er.job_id = j.id \
         WHERE j.status NOT IN ('expired', 'cancelled') \
         ORDER BY j.created_at DESC, j.id DESC LIMIT $1"
    ))
    .bind(POINTS)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .rev()
        .map(|(model, tier, at_ms, price_wei)| PricePoint {
            model,
            tier: tier.unwrap_or_else(|| "?".to_owned()),
            at_ms,
            price_wei,
        })
        .collect())
}
