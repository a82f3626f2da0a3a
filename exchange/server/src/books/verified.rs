//! Verification outcomes in the books: the `verification_failed` job event a tier's failed
//! check records (detail `{tier, method, passed, rounds, check_ms, cost_fraction}`) and the one
//! transaction it ends its job in. A passed check's `verified` event is written by
//! [`Books::complete_job`], in the transaction that takes the result.

use super::jobs::release_sql;
use super::providers::result_open;
use super::store::Books;
use crate::error::{Error, Result};
use alloy::primitives::B256;

impl Books {
    /// Ends running job `job_id` of provider `key_hash` whose result failed its tier's check at
    /// `now_s`, in one transaction: a `verification_failed` event with `detail`, then the job
    /// `failed` with its whole hold back on its tab (and its session's cap), never charged, no
    /// receipt kept. A `failed` job counts against the provider's observed φ
    /// ([`Books::observed_failure_rate`]). A job that is not this provider's, not running or
    /// past its deadline is refused as [`Books::complete_job`] refuses it, and nothing changes:
    /// a late result is no result, and the deadline sweep expires the job.
    pub async fn fail_verification(
        &self,
        job_id: B256,
        key_hash: B256,
        now_s: u64,
        detail: &serde_json::Value,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(cx_protocol::job_status::JobStatus, i64)> = sqlx::query_as(
            "SELECT j.status, j.deadline_s \
             FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
             WHERE j.id = $1 AND b.provider_key_hash = $2 FOR UPDATE OF j",
        )
        .bind(job_id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&mut *tx)
        .await?;
        let (status, deadline_s) = row.ok_or(Error::UnknownJob)?;
        result_open(status, deadline_s, now_s)?;
        sqlx::query(
            "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             SELECT $1, coalesce(max(seq), -1) + 1, 'verification_failed', $2::jsonb \
             FROM exchange_job_events WHERE job_id = $1",
        )
        .bind(job_id.as_slice())
        .bind(detail.to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query(&release_sql(
            "id = $1 AND status = 'running'",
            cx_protocol::job_status::JobStatus::Failed,
            "the result failed its verification",
        ))
        .bind(job_id.as_slice())
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
