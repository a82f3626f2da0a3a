//! Verification by replication (T1, T3) in the books: a job's runs written with it, the group
//! read back when a result comes in, a referee run added on a conflict, and the verdict applied
//! in one transaction (majority `done`, outvoted `failed` with its hold returned, the evidence
//! against it queued for the committee), plus the outbox of slashes.

use super::jobs::{NewRun, insert_runs, release_sql};
use super::store::{Books, json_text, parse_wei, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};
use cx_protocol::job_status::JobStatus;
use sqlx::Row;

/// One job of a verification group (the verified job is run 0) as the books hold it.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// The job id.
    pub id: B256,
    /// Which run (0: the verified job itself).
    pub run: u8,
    /// Its state.
    pub status: JobStatus,
    /// The bundle it was cleared onto.
    pub bundle_id: Option<String>,
    /// The key hash of the provider whose bundle it is.
    pub provider_key_hash: Option<B256>,
    /// That provider's operator.
    pub operator: Option<String>,
    /// What it holds on its tab (its charge once its result is in), wei.
    pub held_wei: u128,
    /// The provider's signed receipt, once its result is in.
    pub receipt: Option<serde_json::Value>,
    /// The output, once its result is in.
    pub result: Option<serde_json::Value>,
    /// The clearing decision it was placed by.
    pub decision: serde_json::Value,
    /// When its result came in, unix milliseconds.
    pub result_at_ms: Option<i64>,
}

/// What the group shares (it is one order's work).
#[derive(Debug, Clone)]
pub struct GroupHead {
    /// The buyer.
    pub account: Address,
    /// The tab's chain.
    pub chain_id: u64,
    /// The tab.
    pub escrow_id: u64,
    /// The session whose call made it, if one did.
    pub session_id: Option<B256>,
    /// The model.
    pub model: String,
    /// The adapter's content id, if any.
    pub adapter: Option<String>,
    /// What the group computes.
    pub workload: cx_protocol::workload::Workload,
    /// When every run's result is due.
    pub deadline_s: u64,
}

/// The verdict on a group, as the books apply it.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Runs whose output is the majority's: `verifying` → `done` (paid).
    pub passed: Vec<B256>,
    /// Runs outvoted: `verifying` → `failed`, hold returned, never paid.
    pub failed: Vec<B256>,
    /// Runs still out when the majority was reached: cancelled, hold returned.
    pub cancelled: Vec<B256>,
    /// Runs refunded because no majority can be had (nobody is paid).
    pub refunded: Vec<B256>,
    /// `(job, status, detail)`: the `verified` / `verification_failed` event of each run.
    pub events: Vec<(B256, &'static str, serde_json::Value)>,
    /// `(evidence hash, accused job, chain, evidence)`: slashes for the committee.
    pub slashes: Vec<(B256, B256, u64, serde_json::Value)>,
    /// The verified output the buyer's job (run 0) carries, when its own was outvoted.
    pub result: Option<serde_json::Value>,
}

/// A slash waiting for the committee.
#[derive(Debug, Clone)]
pub struct PendingSlash {
    /// The evidence hash (the registry's replay guard).
    pub evidence_hash: B256,
    /// The accused job.
    pub job_id: B256,
    /// The chain whose registry holds the accused's stake.
    pub chain_id: u64,
    /// The evidence, as the committee checks it.
    pub evidence: serde_json::Value,
    /// Tries so far.
    pub attempts: i32,
}

/// How long a refused slash keeps being retried (`failed`, with its last error, after): longer
/// than any unbonding delay a registry is deployed with here (the devnet's is one day), after
/// which neither the accused's old keys nor its withdrawn stake answer for the evidence.
pub const SLASH_RETRY_HORIZON_S: i64 = 30 * 86_400;

/// The longest wait between two tries of a refused slash; the first retry comes after
/// [`SLASH_RETRY_FIRST_S`], each next one after twice as long.
pub const SLASH_RETRY_MAX_S: i64 = 3_600;
/// See [`SLASH_RETRY_MAX_S`].
pub const SLASH_RETRY_FIRST_S: i64 = 15;

fn b256(bytes: &[u8], what: &'static str) -> Result<B256> {
    B256::try_from(bytes).map_err(|_| Error::Corrupt {
        what,
        value: hex::encode(bytes),
    })
}

impl Books {
    /// The group of job `id` (the verified job, run 0, and its runs), by run; `None` when `id`
    /// is no job. Asked with a run's id, the group of the job it verifies.
    pub async fn verification_group(
        &self,
        id: B256,
    ) -> Result<Option<(GroupHead, Vec<RunRecord>)>> {
        let root: Option<(Option<Vec<u8>>,)> =
            sqlx::query_as("SELECT verifies FROM exchange_jobs WHERE id = $1")
                .bind(id.as_slice())
                .fetch_optional(&self.pool)
                .await?;
        let Some((verifies,)) = root else {
            return Ok(None);
        };
        let original = match verifies {
            Some(v) => b256(&v, "a job id")?,
            None => id,
        };
        let rows = sqlx::query(
            "SELECT j.id, j.run, j.status, j.bundle_id, b.provider_key_hash, p.operator, \
                    j.held_wei::text AS held, r.receipt::text AS receipt, j.result::text AS result, \
                    j.decision::text AS decision, j.account, j.chain_id, j.escrow_id, \
                    j.session_id, j.model, j.adapter, j.workload, j.request::text AS request, \
                    j.deadline_s, \
                    (extract(epoch FROM r.received_at) * 1000)::bigint AS result_at_ms \
             FROM exchange_jobs j \
             LEFT JOIN exchange_bundles b ON b.id = j.bundle_id \
             LEFT JOIN exchange_providers p ON p.key_hash = b.provider_key_hash \
             LEFT JOIN exchange_receipts r ON r.job_id = j.id \
             WHERE j.id = $1 OR j.verifies = $1 ORDER BY j.run",
        )
        .bind(original.as_slice())
        .fetch_all(&self.pool)
        .await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let account: Vec<u8> = first.try_get("account")?;
        let head = GroupHead {
            account: Address::try_from(account.as_slice()).map_err(|_| Error::Corrupt {
                what: "an address",
                value: hex::encode(&account),
            })?,
            chain_id: first.try_get::<i64, _>("chain_id")? as u64,
            escrow_id: first.try_get::<i64, _>("escrow_id")? as u64,
            session_id: first
                .try_get::<Option<Vec<u8>>, _>("session_id")?
                .map(|s| b256(&s, "a session id"))
                .transpose()?,
            model: first.try_get("model")?,
            adapter: first.try_get("adapter")?,
            workload: super::jobs::stored_workload(
                first.try_get::<Option<String>, _>("workload")?.as_deref(),
                first.try_get::<Option<String>, _>("request")?.as_deref(),
            )?,
            deadline_s: first.try_get::<i64, _>("deadline_s")? as u64,
        };
        let json = |r: &sqlx::postgres::PgRow, col: &str| -> Result<Option<serde_json::Value>> {
            r.try_get::<Option<String>, _>(col)?
                .map(|t| serde_json::from_str(&t).map_err(Error::from))
                .transpose()
        };
        let runs = rows
            .iter()
            .map(|r| {
                Ok(RunRecord {
                    id: b256(&r.try_get::<Vec<u8>, _>("id")?, "a job id")?,
                    run: u8::try_from(r.try_get::<i16, _>("run")?).unwrap_or(u8::MAX),
                    status: r.try_get("status")?,
                    bundle_id: r.try_get("bundle_id")?,
                    provider_key_hash: r
                        .try_get::<Option<Vec<u8>>, _>("provider_key_hash")?
                        .map(|k| b256(&k, "a key hash"))
                        .transpose()?,
                    operator: r.try_get("operator")?,
                    held_wei: parse_wei(&r.try_get::<String, _>("held")?)?,
                    receipt: json(r, "receipt")?,
                    result: json(r, "result")?,
                    decision: json(r, "decision")?.unwrap_or(serde_json::Value::Null),
                    result_at_ms: r.try_get("result_at_ms")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some((head, runs)))
    }

    /// Adds `run` (a referee, or a replacement of a run that never answered) to the group of
    /// `original`, holding its charge on the tab (and the session's cap) if they still have it.
    /// False when they do not, or when that run was added meanwhile.
    pub async fn add_run(&self, original: B256, head: &GroupHead, run: &NewRun) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        // The group's lock, as a verdict takes it: a verdict judged without this run must not
        // commit beside it (it would end the group while the run is still placed).
        lock_group(&mut tx, original).await?;
        let held = sqlx::query(
            "UPDATE exchange_tabs SET jobs = jobs + 1, held_wei = held_wei + $3::numeric, \
                    updated_at = now() \
             WHERE chain_id = $1 AND escrow_id = $2 AND status IN ('open', 'closing') \
               AND held_wei + $3::numeric <= amount_wei AND jobs < 400",
        )
        .bind(to_i64(head.chain_id, "chain id")?)
        .bind(to_i64(head.escrow_id, "escrow id")?)
        .bind(wei_text(run.held_wei))
        .execute(&mut *tx)
        .await?;
        if held.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some(session) = head.session_id {
            let capped = sqlx::query(
                "UPDATE exchange_sessions SET spent_wei = spent_wei + $2::numeric \
                 WHERE id = $1 AND spent_wei + $2::numeric <= spend_cap_wei",
            )
            .bind(session.as_slice())
            .bind(wei_text(run.held_wei))
            .execute(&mut *tx)
            .await?;
            if capped.rows_affected() != 1 {
                return Ok(false);
            }
        }
        match insert_runs(&mut tx, original, std::slice::from_ref(run)).await {
            Ok(()) => {}
            Err(Error::Database(err))
                if super::store::constraint(&err) == Some("exchange_jobs_runs")
                    || super::store::constraint(&err) == Some("exchange_jobs_pkey") =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Applies `verdict` to the group of `original` in one transaction. False (and nothing
    /// changed) when a run moved on meanwhile — a result came in, a deadline passed — so the
    /// caller reads the group again and judges anew.
    ///
    /// `judged` are the runs the verdict was judged on: a run placed since (a referee another
    /// result's judgement placed) makes it stale as well.
    pub async fn apply_verdict(
        &self,
        original: B256,
        judged: &[B256],
        verdict: &Verdict,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        lock_group(&mut tx, original).await?;
        let list = |ids: &[B256]| ids.iter().map(|i| i.to_vec()).collect::<Vec<Vec<u8>>>();
        let unjudged: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM exchange_jobs \
             WHERE (id = $1 OR verifies = $1) AND NOT (id = ANY($2))",
        )
        .bind(original.as_slice())
        .bind(list(judged))
        .fetch_one(&mut *tx)
        .await?;
        if unjudged != 0 {
            return Ok(false);
        }
        let passed = sqlx::query(
            "UPDATE exchange_jobs SET status = 'done', updated_at = now() \
             WHERE id = ANY($1) AND status = 'verifying'",
        )
        .bind(list(&verdict.passed))
        .execute(&mut *tx)
        .await?;
        if passed.rows_affected() != verdict.passed.len() as u64 {
            return Ok(false);
        }
        let steps: [(&[B256], &str, JobStatus, &str); 3] = [
            (
                &verdict.failed,
                "status = 'verifying'",
                JobStatus::Failed,
                "outvoted: its output is not the majority of the verification runs",
            ),
            (
                &verdict.cancelled,
                "status IN ('assigned', 'running')",
                JobStatus::Cancelled,
                "not needed: the verification runs reached a majority without it",
            ),
            (
                &verdict.refunded,
                "status IN ('assigned', 'running', 'verifying')",
                JobStatus::Refunded,
                "no majority of the verification runs agrees: nobody is paid",
            ),
        ];
        for (ids, condition, status, reason) in steps {
            if ids.is_empty() {
                continue;
            }
            let ended: Vec<(Vec<u8>,)> = sqlx::query_as(&release_sql(
                &format!("id = ANY($1) AND {condition}"),
                status,
                reason,
            ))
            .bind(list(ids))
            .fetch_all(&mut *tx)
            .await?;
            if ended.len() != ids.len() {
                return Ok(false);
            }
        }
        for (job, status, detail) in &verdict.events {
            sqlx::query(
                "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
                 SELECT $1, coalesce(max(seq), -1) + 1, $2, $3::jsonb \
                 FROM exchange_job_events WHERE job_id = $1",
            )
            .bind(job.as_slice())
            .bind(*status)
            .bind(json_text(detail))
            .execute(&mut *tx)
            .await?;
        }
        for (hash, job, chain_id, evidence) in &verdict.slashes {
            sqlx::query(
                "INSERT INTO exchange_slashes (evidence_hash, job_id, chain_id, evidence) \
                 VALUES ($1, $2, $3, $4::jsonb) ON CONFLICT (evidence_hash) DO NOTHING",
            )
            .bind(hash.as_slice())
            .bind(job.as_slice())
            .bind(to_i64(*chain_id, "chain id")?)
            .bind(json_text(evidence))
            .execute(&mut *tx)
            .await?;
        }
        if let Some(result) = &verdict.result {
            sqlx::query("UPDATE exchange_jobs SET result = $2::jsonb WHERE id = $1")
                .bind(original.as_slice())
                .bind(json_text(result))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The provider key hash that owns bundle `id` (none for a bundle registered without a
    /// provider).
    pub async fn bundle_owner(&self, id: &str) -> Result<Option<B256>> {
        let row: Option<(Option<Vec<u8>>,)> =
            sqlx::query_as("SELECT provider_key_hash FROM exchange_bundles WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        row.and_then(|(k,)| k)
            .map(|k| b256(&k, "a key hash"))
            .transpose()
    }

    /// Bundle `id`'s provider's bundles, and those of every provider that shares an on-chain
    /// identity (payout account, the address `ProviderRegistry` stakes and slashes) with it:
    /// keys are free to make, so two keys of one account are one provider to replication. Empty
    /// for a bundle no provider offered (registered by the operator).
    pub async fn same_identity_bundles(&self, id: &str) -> Result<Vec<String>> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "WITH owner AS (SELECT b.provider_key_hash AS key_hash, p.payout \
                            FROM exchange_bundles b \
                            LEFT JOIN exchange_providers p ON p.key_hash = b.provider_key_hash \
                            WHERE b.id = $1 AND b.provider_key_hash IS NOT NULL) \
             SELECT b.id FROM exchange_bundles b \
             LEFT JOIN exchange_providers p ON p.key_hash = b.provider_key_hash \
             WHERE b.provider_key_hash IN (SELECT key_hash FROM owner) \
                OR p.payout IN (SELECT payout FROM owner)",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// Slashes waiting for the committee, oldest first, at most `limit`.
    pub async fn pending_slashes(&self, limit: i64) -> Result<Vec<PendingSlash>> {
        let rows = sqlx::query(
            "SELECT evidence_hash, job_id, chain_id, evidence::text AS evidence, attempts \
             FROM exchange_slashes WHERE status = 'pending' AND next_attempt_at <= now() \
             ORDER BY next_attempt_at LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(PendingSlash {
                    evidence_hash: b256(&r.try_get::<Vec<u8>, _>("evidence_hash")?, "a hash")?,
                    job_id: b256(&r.try_get::<Vec<u8>, _>("job_id")?, "a job id")?,
                    chain_id: r.try_get::<i64, _>("chain_id")? as u64,
                    evidence: serde_json::from_str(&r.try_get::<String, _>("evidence")?)?,
                    attempts: r.try_get("attempts")?,
                })
            })
            .collect()
    }

    /// Records that `slash` landed in transaction `tx_hash` on its chain, with a `slashed`
    /// event on the accused job naming it.
    pub async fn slash_posted(&self, slash: &PendingSlash, tx_hash: B256) -> Result<()> {
        let chain_id = slash.chain_id;
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE exchange_slashes SET status = 'posted', tx_hash = $2, updated_at = now() \
             WHERE evidence_hash = $1",
        )
        .bind(slash.evidence_hash.as_slice())
        .bind(tx_hash.as_slice())
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             SELECT $1, coalesce(max(seq), -1) + 1, 'slashed', \
                    jsonb_build_object('chain_id', $2::bigint, 'tx_hash', $3::text, \
                                       'evidence_hash', $4::text) \
             FROM exchange_job_events WHERE job_id = $1",
        )
        .bind(slash.job_id.as_slice())
        .bind(to_i64(chain_id, "chain id")?)
        .bind(tx_hash.to_string())
        .bind(slash.evidence_hash.to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records a refused attempt at the slash on `evidence_hash`: it is tried again after a
    /// backoff ([`SLASH_RETRY_FIRST_S`] doubling up to [`SLASH_RETRY_MAX_S`]) until
    /// [`SLASH_RETRY_HORIZON_S`] after it was found, then given up (`failed`, the reason kept).
    /// A refusal may be passing (a stalled committee, a chain down, a signer behind): a fixed
    /// number of tries would let an accused provider wait it out.
    pub async fn slash_attempt_failed(&self, evidence_hash: B256, reason: &str) -> Result<()> {
        sqlx::query(
            "UPDATE exchange_slashes SET attempts = attempts + 1, last_error = $2, \
                    next_attempt_at = now() + make_interval(secs => \
                        least($4::float8, $3::float8 * power(2, least(attempts, 20)))), \
                    status = CASE WHEN created_at + make_interval(secs => $5::float8) < now() \
                                  THEN 'failed' ELSE status END, \
                    updated_at = now() \
             WHERE evidence_hash = $1",
        )
        .bind(evidence_hash.as_slice())
        .bind(reason)
        .bind(SLASH_RETRY_FIRST_S as f64)
        .bind(SLASH_RETRY_MAX_S as f64)
        .bind(SLASH_RETRY_HORIZON_S as f64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Gives up the slash on `evidence_hash` at once (`failed`, with `reason`): for what no retry
    /// can change (evidence that does not parse, terms under which it takes nothing).
    pub async fn slash_given_up(&self, evidence_hash: B256, reason: &str) -> Result<()> {
        sqlx::query(
            "UPDATE exchange_slashes SET attempts = attempts + 1, last_error = $2, \
                    status = 'failed', updated_at = now() \
             WHERE evidence_hash = $1",
        )
        .bind(evidence_hash.as_slice())
        .bind(reason)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// One verdict or added run at a time per verification group: the verified job's row is the
/// group's lock, held to the end of `tx`.
async fn lock_group(tx: &mut sqlx::PgConnection, original: B256) -> Result<()> {
    sqlx::query("SELECT 1 FROM exchange_jobs WHERE id = $1 FOR UPDATE")
        .bind(original.as_slice())
        .execute(&mut *tx)
        .await?;
    Ok(())
}
