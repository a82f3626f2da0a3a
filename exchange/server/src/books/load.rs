//! The work open on the market now, as the books hold it: what the sweep feeds the engine (each
//! bundle's queue, for t̂) and the market maker (each market's committed work, for its occupancy).

use super::store::Books;
use crate::error::Result;
use cx_protocol::Tier;

/// The jobs assigned to one bundle in one market (model × the tier it was cleared at) and not
/// yet done, replicas included (a verification run is work on its bundle like any job).
#[derive(Debug, Clone, PartialEq)]
pub struct OpenWork {
    /// The bundle.
    pub bundle_id: String,
    /// The catalog model.
    pub model: String,
    /// The tier the jobs were cleared at.
    pub tier: Tier,
    /// How many.
    pub jobs: u64,
    /// Their t_compute on the bundle, summed, seconds (as each decision estimated it).
    pub compute_s: f64,
}

impl Books {
    /// Every bundle's open work (`assigned` or `running`), by bundle, model and tier. A decision
    /// older than the `compute_s` term counts no seconds (its job still counts).
    pub async fn open_work(&self) -> Result<Vec<OpenWork>> {
        let rows: Vec<(String, String, Option<String>, i64, f64)> = sqlx::query_as(
            "SELECT bundle_id, model, decision->>'tier', count(*), \
                    coalesce(sum(coalesce((decision->'terms'->>'compute_s')::float8, 0)), 0) \
             FROM exchange_jobs \
             WHERE status IN ('assigned', 'running') AND bundle_id IS NOT NULL \
             GROUP BY 1, 2, 3",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(bundle_id, model, tier, jobs, compute_s)| {
                // A decision without a tier placed no job of its own (a fill): no market's work.
                let tier = serde_json::from_value(serde_json::Value::String(tier?)).ok()?;
                Some(OpenWork {
                    bundle_id,
                    model,
                    tier,
                    jobs: jobs.max(0) as u64,
                    compute_s: compute_s.max(0.0),
                })
            })
            .collect())
    }
}
