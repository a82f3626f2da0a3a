//! Residency claims the work contradicted (SPEC §8: residency is self-revealing).
//!
//! A job is cleared onto a bundle partly because of what the bundle's last report said it holds:
//! the decision's base-load term is zero when the base was reported resident, its adapter-load
//! term zero when the adapter was. Two things reveal such a claim as false, and each is recorded
//! against the provider (`exchange_residency_misses`) and shown with it:
//!
//! * `fetched` — the provider fetched, with its dispatch token, the adapter of a job it is
//!   running that was cleared on the word that this adapter was resident: direct evidence;
//! * `deadline` — a job the provider had taken (`running`) on such a claim missed its deadline:
//!   what a false claim leads to when the load does not fit the slack.
//!
//! The run time against the estimate is not used as evidence: on a shared machine a job can run
//! seconds past its estimate with everything resident, and a record that fires on noise would
//! say nothing. A job no provider took is not counted either (an absent provider claimed
//! nothing false; it counts in its observed failure rate instead).

use super::store::Books;
use crate::error::Result;
use alloy::primitives::B256;
use serde::Serialize;

/// What a decision claimed, as SQL over a job row `j`: the residency its zero load terms relied
/// on, or NULL when it relied on none (a job with no adapter claims no adapter).
const CLAIMED: &str = "CASE \
     WHEN (j.decision->'terms'->>'base_load')::float8 = 0 AND j.adapter IS NOT NULL \
          AND (j.decision->'terms'->>'adapter_load')::float8 = 0 THEN 'base+adapter' \
     WHEN j.adapter IS NOT NULL AND (j.decision->'terms'->>'adapter_load')::float8 = 0 \
          THEN 'adapter' \
     WHEN (j.decision->'terms'->>'base_load')::float8 = 0 THEN 'base' END";

/// The decision's estimate t̂ and the time since the job was cleared, milliseconds, over `j`.
const TIMES: &str = "greatest(0, round(coalesce((j.decision->'terms'->>'completion_s')::float8, 0) \
                     * 1000))::bigint, \
     greatest(0, (extract(epoch FROM now() - j.created_at) * 1000)::bigint)";

/// One provider's recorded residency misses, by kind of evidence.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ResidencyMisses {
    /// Jobs taken on a residency claim that then missed their deadline.
    pub deadline: u64,
    /// Adapters fetched for a job cleared on the word that they were resident.
    pub fetched: u64,
    /// Jobs cleared onto the provider on a residency claim (what the misses are out of).
    pub claims: u64,
}

/// Records a `deadline` miss for each `running` job whose deadline passed before `now_s`
/// and whose clearing relied on a residency claim: call it in the transaction that expires
/// them, before they leave `running`.
pub(super) async fn record_deadline_misses(tx: &mut sqlx::PgConnection, now_s: i64) -> Result<u64> {
    let done = sqlx::query(&format!(
        "INSERT INTO exchange_residency_misses \
             (job_id, provider_key_hash, bundle_id, claimed, evidence, estimate_ms, elapsed_ms) \
         SELECT j.id, b.provider_key_hash, j.bundle_id, c.claimed, 'deadline', {TIMES} \
         FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
         CROSS JOIN LATERAL (SELECT {CLAIMED} AS claimed) c \
         WHERE j.status = 'running' AND j.deadline_s < $1 AND c.claimed IS NOT NULL \
           AND b.provider_key_hash IS NOT NULL \
         ON CONFLICT DO NOTHING"
    ))
    .bind(now_s)
    .execute(tx)
    .await?;
    Ok(done.rows_affected())
}

impl Books {
    /// Records a `fetched` miss for each job provider `key_hash` is running with adapter
    /// `adapter` that was cleared on the word that the adapter was resident there (the provider
    /// just fetched it). Returns how many were recorded.
    pub async fn record_fetch_misses(&self, key_hash: B256, adapter: &str) -> Result<u64> {
        let done = sqlx::query(&format!(
            "INSERT INTO exchange_residency_misses \
                 (job_id, provider_key_hash, bundle_id, claimed, evidence, estimate_ms, elapsed_ms) \
             SELECT j.id, b.provider_key_hash, j.bundle_id, c.claimed, 'fetched', {TIMES} \
             FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
             CROSS JOIN LATERAL (SELECT {CLAIMED} AS claimed) c \
             WHERE b.provider_key_hash = $1 AND j.adapter = $2 \
               AND j.status IN ('assigned', 'running') \
               AND c.claimed IN ('adapter', 'base+adapter') \
             ON CONFLICT DO NOTHING"
        ))
        .bind(key_hash.as_slice())
        .bind(adapter)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Provider `key_hash`'s recorded misses, and how many jobs were cleared onto it on a claim.
    pub async fn residency_misses(&self, key_hash: B256) -> Result<ResidencyMisses> {
        let (deadline, fetched, claims): (i64, i64, i64) = sqlx::query_as(&format!(
            "SELECT \
                 (SELECT count(*) FROM exchange_residency_misses \
                  WHERE provider_key_hash = $1 AND evidence = 'deadline'), \
                 (SELECT count(*) FROM exchange_residency_misses \
                  WHERE provider_key_hash = $1 AND evidence = 'fetched'), \
                 (SELECT count(*) FROM exchange_jobs j JOIN exchange_bundles b \
                      ON b.id = j.bundle_id \
                  WHERE b.provider_key_hash = $1 AND ({CLAIMED}) IS NOT NULL)"
        ))
        .bind(key_hash.as_slice())
        .fetch_one(&self.pool)
        .await?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(ResidencyMisses {
            deadline: count(deadline),
            fetched: count(fetched),
            claims: count(claims),
        })
    }
}
