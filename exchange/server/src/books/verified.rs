//! Verification outcomes in the books: the `verified` / `verification_failed` job events a
//! tier's check records (detail `{tier, method, passed, rounds, check_ms, cost_fraction}`), and
//! the one transaction a failed check ends its job in.

use super::Books;
use super::jobs::release_sql;
use crate::error::{Error, Result};
use alloy::primitives::B256;

impl Books {
    /// Records that job `job_id` passed its tier's check (`detail` says how); the result is
    /// then accepted as any other ([`Books::complete_job`]).
    pub async fn record_verified(&self, job_id: B256, detail: &serde_json::Value) -> Result<()> {
        sqlx::query(
            "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             SELECT $1, coalesce(max(seq), -1) + 1, 'verified', $2::jsonb \
             FROM exchange_job_events WHERE job_id = $1",
        )
        .bind(job_id.as_slice())
        .bind(detail.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Ends running job `job_id` of provider `key_hash` whose result failed its tier's check,
    /// in one transaction: a `verification_failed` event with `detail`, then the job `failed`
    /// with its whole hold back on its tab (and its session's cap), never charged, no receipt
    /// kept. A `failed` job counts against the provider's observed φ
    /// ([`Books::observed_failure_rate`]). A job that is not this provider's or not running is
    /// refused and nothing changes.
    pub async fn fail_verification(
        &self,
        job_id: B256,
        key_hash: B256,
        detail: &serde_json::Value,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let status: Option<(String,)> = sqlx::query_as(
            "SELECT j.status FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
             WHERE j.id = $1 AND b.provider_key_hash = $2 FOR UPDATE OF j",
        )
        .bind(job_id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&mut *tx)
        .await?;
        match status {
            None => return Err(Error::UnknownJob),
            Some((status,)) if status != "running" => {
                return Err(Error::JobNotRunning { status });
            }
            Some(_) => {}
        }
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
            "failed",
            "the result failed its verification",
        ))
        .bind(job_id.as_slice())
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
