//! Providers and dispatch: who offered which bundles, the jobs a provider pulls, and the one
//! transaction a result is accepted in (job done, receipt kept, the unspent hold returned).

use super::jobs::stored_workload;
use super::store::constraint;
use super::store::{Books, json_text, parse_wei, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};
use cx_protocol::Bundle;
use cx_protocol::job_status::JobStatus;
use cx_protocol::wire::{Assignment, Completed};

/// A registered provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// SHA-256 of its ML-DSA-65 verification key.
    pub key_hash: B256,
    /// The encoded verification key.
    pub mldsa_key: Vec<u8>,
    /// Its operator.
    pub operator: String,
    /// The account its receipts pay.
    pub payout: Address,
}

/// A provider's result as [`Books::complete_job`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct JobResult<'a> {
    /// What the job produced, as the job's `result` keeps it.
    pub output: &'a serde_json::Value,
    /// The provider's signed receipt, kept as received.
    pub receipt: &'a serde_json::Value,
    /// What the job is charged, wei (the receipt's amount).
    pub charged_wei: u128,
    /// The verdict of the check the result passed before it was taken (a product's Freivalds
    /// test), recorded as the job's `verified` event; `None` when none ran.
    pub verified: Option<&'a serde_json::Value>,
}

impl Books {
    /// Registers (or re-registers) a provider and its bundles in one transaction; returns the
    /// ids of the bundles this offer withdrew, for the engine to drop. A bundle id another key
    /// registered is refused, and so is an operator other than the key's first.
    ///
    /// The offer *replaces* the provider's bundle set: were bundles only ever added, a provider
    /// re-offering fresh ids would grow this table and the engine without bound (the silence
    /// sweep never takes the bundles of a provider that keeps offering). The set is bounded by
    /// one offer's, [`cx_protocol::offer::MAX_OFFER_BUNDLES`] (checked with the signature).
    /// A bundle no longer offered is marked `leaving`, and at the provider's next offer its row
    /// is deleted if nothing names it, else `kept`: the next offer, not this one, so an order
    /// cleared onto it just before it left has written its job by then, and a job, its
    /// re-clearing or a standing order naming a withdrawn bundle keeps the row its provider is
    /// found by — the job still runs, completes and settles, and no other key takes the id.
    pub async fn register_provider(
        &self,
        provider: &Provider,
        token_hash: B256,
        offer: &serde_json::Value,
        bundles: &[Bundle],
    ) -> Result<Vec<String>> {
        let mut tx = self.pool.begin().await?;
        let operator: Result<(String,), sqlx::Error> = sqlx::query_as(
            "INSERT INTO exchange_providers (key_hash, mldsa_key, operator, payout, token_hash, offer) \
             VALUES ($1, $2, $3, $4, $5, $6::jsonb) \
             ON CONFLICT (key_hash) DO UPDATE SET payout = EXCLUDED.payout, \
                 token_hash = EXCLUDED.token_hash, offer = EXCLUDED.offer, seen_at = now() \
             RETURNING operator",
        )
        .bind(provider.key_hash.as_slice())
        .bind(&provider.mldsa_key)
        .bind(&provider.operator)
        .bind(provider.payout.as_slice())
        .bind(token_hash.as_slice())
        .bind(json_text(offer))
        .fetch_one(&mut *tx)
        .await;
        let (operator,) = operator.map_err(|err| match constraint(&err) {
            Some("exchange_providers_token_unique") => Error::BearerReused,
            _ => err.into(),
        })?;
        if operator != provider.operator {
            return Err(Error::OperatorChanged {
                registered: operator,
            });
        }
        for bundle in bundles {
            let done = sqlx::query(
                "INSERT INTO exchange_bundles (id, body, provider_key_hash) VALUES ($1, $2::jsonb, $3) \
                 ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, updated_at = now(), \
                     withdrawal = NULL \
                 WHERE exchange_bundles.provider_key_hash = EXCLUDED.provider_key_hash",
            )
            .bind(&bundle.id)
            .bind(serde_json::to_string(bundle)?)
            .bind(provider.key_hash.as_slice())
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(Error::BundleOwned(bundle.id.clone()));
            }
        }
        let key = provider.key_hash.as_slice();
        // What the previous offer withdrew (and this one did not offer again, which made it
        // live above): gone if nothing names it, kept as history if something does.
        sqlx::query(
            "DELETE FROM exchange_bundles b \
             WHERE b.provider_key_hash = $1 AND b.withdrawal = 'leaving' \
               AND NOT EXISTS (SELECT 1 FROM exchange_jobs j WHERE j.bundle_id = b.id) \
               AND NOT EXISTS (SELECT 1 FROM exchange_job_events e \
                               WHERE e.status = 're-cleared' AND e.detail->>'from' = b.id) \
               AND NOT EXISTS (SELECT 1 FROM exchange_standing_orders s \
                               WHERE s.bundle_id = b.id) \
               AND NOT EXISTS (SELECT 1 FROM exchange_reserve_bids r WHERE r.bundle_id = b.id)",
        )
        .bind(key)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE exchange_bundles SET withdrawal = 'kept' \
             WHERE provider_key_hash = $1 AND withdrawal = 'leaving'",
        )
        .bind(key)
        .execute(&mut *tx)
        .await?;
        let offered: Vec<&str> = bundles.iter().map(|b| b.id.as_str()).collect();
        let withdrawn: Vec<(String,)> = sqlx::query_as(
            "UPDATE exchange_bundles SET withdrawal = 'leaving', updated_at = now() \
             WHERE provider_key_hash = $1 AND withdrawal IS NULL AND NOT (id = ANY($2)) \
             RETURNING id",
        )
        .bind(key)
        .bind(&offered)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(withdrawn.into_iter().map(|(id,)| id).collect())
    }

    /// The bundles whose provider has not re-registered for `silent_s` seconds before `now_s`.
    pub async fn silent_bundles(&self, now_s: u64, silent_s: u64) -> Result<Vec<String>> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT b.id FROM exchange_bundles b \
             JOIN exchange_providers p ON p.key_hash = b.provider_key_hash \
             WHERE p.seen_at < to_timestamp($1)",
        )
        .bind(now_s.saturating_sub(silent_s) as f64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// The failure rate φ the exchange observed of provider `key_hash`: jobs on its bundles
    /// that ended without its result (expired, refunded, failed, or re-cleared away from it)
    /// over the jobs that ended or left it, smoothed by a prior of 1 in 20 (a newcomer is
    /// priced at 5%, and a few jobs move it only a little). What it reports is ignored.
    pub async fn observed_failure_rate(&self, key_hash: B256) -> Result<f64> {
        let (failed, ended): (i64, i64) = sqlx::query_as(
            "WITH mine AS (SELECT id FROM exchange_bundles WHERE provider_key_hash = $1), \
             jobs AS ( \
                 SELECT count(*) FILTER (WHERE j.status IN ('expired', 'refunded', 'failed')) AS failed, \
                        count(*) FILTER (WHERE j.status IN ('done', 'settled', 'expired', 'refunded', \
                                                            'failed')) AS ended \
                 FROM exchange_jobs j WHERE j.bundle_id IN (SELECT id FROM mine)), \
             moved AS ( \
                 SELECT count(*) AS n FROM exchange_job_events e \
                 WHERE e.status = 're-cleared' AND e.detail->>'from' IN (SELECT id FROM mine)) \
             SELECT (jobs.failed + moved.n)::bigint, (jobs.ended + moved.n)::bigint FROM jobs, moved",
        )
        .bind(key_hash.as_slice())
        .fetch_one(&self.pool)
        .await?;
        Ok((failed as f64 + 1.0) / (ended as f64 + 20.0))
    }

    /// Every provider with bundles: its key hash, payout account and bundle ids.
    pub async fn provider_bundles(&self) -> Result<Vec<(B256, Address, Vec<String>)>> {
        let rows: Vec<(Vec<u8>, Vec<u8>, Vec<String>)> = sqlx::query_as(
            "SELECT p.key_hash, p.payout, array_agg(b.id ORDER BY b.id) FROM exchange_providers p \
             JOIN exchange_bundles b ON b.provider_key_hash = p.key_hash \
             GROUP BY p.key_hash, p.payout",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(key, payout, ids)| {
                let corrupt = |what: &'static str, v: &[u8]| Error::Corrupt {
                    what,
                    value: hex::encode(v),
                };
                Ok((
                    B256::try_from(key.as_slice()).map_err(|_| corrupt("a key hash", &key))?,
                    Address::try_from(payout.as_slice())
                        .map_err(|_| corrupt("an address", &payout))?,
                    ids,
                ))
            })
            .collect()
    }

    /// Every provider with bundles and its latest offer as it signed it (what the exchange
    /// reads beyond the bundles: the residency report, the search rate).
    pub async fn provider_offers(&self) -> Result<Vec<(B256, cx_protocol::offer::Offer)>> {
        let rows: Vec<(Vec<u8>, serde_json::Value)> = sqlx::query_as(
            "SELECT p.key_hash, p.offer->'offer' FROM exchange_providers p \
             WHERE EXISTS (SELECT 1 FROM exchange_bundles b WHERE b.provider_key_hash = p.key_hash)",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(key, offer)| {
                let key = B256::try_from(key.as_slice()).map_err(|_| Error::Corrupt {
                    what: "a key hash",
                    value: hex::encode(&key),
                })?;
                Ok((key, serde_json::from_value(offer)?))
            })
            .collect()
    }

    /// The provider whose dispatch token hashes to `token_hash`.
    pub async fn provider_by_token(&self, token_hash: B256) -> Result<Option<Provider>> {
        let row: Option<ProviderRow> = sqlx::query_as(
            "SELECT key_hash, mldsa_key, operator, payout FROM exchange_providers \
             WHERE token_hash = $1",
        )
        .bind(token_hash.as_slice())
        .fetch_optional(&self.pool)
        .await?;
        let Some(ProviderRow {
            key_hash,
            mldsa_key,
            operator,
            payout,
        }) = row
        else {
            return Ok(None);
        };
        let corrupt = |what, bytes: &[u8]| Error::Corrupt {
            what,
            value: hex::encode(bytes),
        };
        Ok(Some(Provider {
            key_hash: B256::try_from(key_hash.as_slice())
                .map_err(|_| corrupt("a key hash", &key_hash))?,
            mldsa_key,
            operator,
            payout: Address::try_from(payout.as_slice())
                .map_err(|_| corrupt("an address", &payout))?,
        }))
    }

    /// Hands up to `limit` of the provider's assigned jobs, oldest first and not past their
    /// deadline at `now_s`, to it: each becomes `running` with an event naming the provider.
    /// Concurrent pulls never take the same job (`SKIP LOCKED`).
    ///
    /// Jobs an earlier process handed out (`running` since before these books were opened) are
    /// handed out once more: that process may have died with the answer of the pull unsent,
    /// and the job would otherwise wait for its deadline, run by no one. A provider that did
    /// get them keeps running its copy (`cx-provider` skips a job it holds), and a result is
    /// taken once, from `running`, so nothing is charged twice.
    pub async fn claim_jobs(
        &self,
        key_hash: B256,
        limit: u32,
        now_s: u64,
    ) -> Result<Vec<Assignment>> {
        let rows: Vec<AssignmentRow> = sqlx::query_as(
            "WITH picked AS ( \
                 SELECT j.id, j.status = 'running' AS again \
                 FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
                 WHERE b.provider_key_hash = $1 AND j.deadline_s >= $3 \
                   AND (j.status = 'assigned' \
                        OR j.status = 'running' AND j.updated_at < to_timestamp($4)) \
                 ORDER BY j.created_at LIMIT $2 FOR UPDATE OF j SKIP LOCKED), \
             claimed AS ( \
                 UPDATE exchange_jobs j SET status = 'running', updated_at = now() FROM picked \
                 WHERE j.id = picked.id \
                 RETURNING j.id, j.bundle_id, j.account, j.chain_id, j.escrow_id, j.model, \
                           j.adapter, j.workload, j.request::text AS request, \
                           j.held_wei::text AS held_wei, j.deadline_s, \
                           coalesce(j.decision->>'determinism', 'D') AS determinism), \
             events AS ( \
                 INSERT INTO exchange_job_events (job_id, seq, status, detail) \
                 SELECT c.id, (SELECT coalesce(max(e.seq), -1) + 1 FROM exchange_job_events e \
                               WHERE e.job_id = c.id), 'running', \
                        jsonb_build_object('provider_key_hash', '0x' || encode($1, 'hex'), \
                                           'handed_out_again', p.again) \
                 FROM claimed c JOIN picked p ON p.id = c.id RETURNING 1) \
             SELECT * FROM claimed",
        )
        .bind(key_hash.as_slice())
        .bind(i64::from(limit))
        .bind(to_i64(now_s, "time")?)
        .bind(self.opened_at_s)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(AssignmentRow::into_assignment)
            .collect()
    }

    /// The job `job_id` as it was handed to the provider `key_hash`, if it is one of its jobs.
    pub async fn assignment(&self, job_id: B256, key_hash: B256) -> Result<Option<Assignment>> {
        let row: Option<AssignmentRow> = sqlx::query_as(
            "SELECT j.id, j.bundle_id, j.account, j.chain_id, j.escrow_id, j.model, j.adapter, \
                    j.workload, j.request::text AS request, j.held_wei::text AS held_wei, \
                    j.deadline_s, coalesce(j.decision->>'determinism', 'D') AS determinism \
             FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
             WHERE j.id = $1 AND b.provider_key_hash = $2",
        )
        .bind(job_id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&self.pool)
        .await?;
        row.map(AssignmentRow::into_assignment).transpose()
    }

    /// Refuses a result for job `job_id` of provider `key_hash` at `now_s` that
    /// [`Books::complete_job`] would refuse: a job that is not this provider's, not running or
    /// past its deadline. Asked before a result's costly checks (a product's Freivalds rounds),
    /// so a result that cannot be taken costs no check and writes nothing; `complete_job`
    /// judges again under the job's lock, and that judgment is the one that counts.
    pub async fn check_result_open(&self, job_id: B256, key_hash: B256, now_s: u64) -> Result<()> {
        let row: Option<(JobStatus, i64)> = sqlx::query_as(
            "SELECT j.status, j.deadline_s \
             FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
             WHERE j.id = $1 AND b.provider_key_hash = $2",
        )
        .bind(job_id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&self.pool)
        .await?;
        let (status, deadline_s) = row.ok_or(Error::UnknownJob)?;
        result_open(status, deadline_s, now_s)
    }

    /// Accepts a provider's result for a job it runs, at `now_s`, in one transaction: the job is
    /// `done` with its output, charged the result's `charged_wei` (at most what it holds), the
    /// rest of its hold goes back to its tab and session, the receipt is kept, and the verdict
    /// of the check it passed, if any, is the job's `verified` event — written here, not
    /// before, so a result refused here leaves no verdict behind. A job that is not this
    /// provider's, not running or past its deadline is refused and nothing changes.
    pub async fn complete_job(
        &self,
        job_id: B256,
        key_hash: B256,
        now_s: u64,
        result: &JobResult<'_>,
    ) -> Result<Completed> {
        let &JobResult {
            output,
            receipt,
            charged_wei,
            verified,
        } = result;
        let mut tx = self.pool.begin().await?;
        let row: Option<RunningRow> = sqlx::query_as(
            "SELECT j.status, j.held_wei::text AS held_wei, j.session_id, j.chain_id, j.escrow_id, \
                    j.deadline_s, (j.verifies IS NOT NULL OR EXISTS ( \
                        SELECT 1 FROM exchange_jobs r WHERE r.verifies = j.id)) AS replicated \
             FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
             WHERE j.id = $1 AND b.provider_key_hash = $2 FOR UPDATE OF j",
        )
        .bind(job_id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(RunningRow {
            status,
            held_wei: held,
            session_id,
            chain_id,
            escrow_id,
            deadline_s,
            replicated,
        }) = row
        else {
            return Err(Error::UnknownJob);
        };
        // A replicated job's result waits for its runs' majority before it is paid.
        let new_status = if replicated {
            JobStatus::Verifying
        } else {
            JobStatus::Done
        };
        result_open(status, deadline_s, now_s)?;
        let held_wei = parse_wei(&held)?;
        if charged_wei > held_wei {
            return Err(Error::OverCharged {
                charged_wei,
                price_wei: held_wei,
            });
        }
        let released_wei = held_wei - charged_wei;
        sqlx::query(
            "UPDATE exchange_jobs SET status = $4, result = $2::jsonb, \
                 held_wei = $3::numeric, updated_at = now() WHERE id = $1",
        )
        .bind(job_id.as_slice())
        .bind(json_text(output))
        .bind(wei_text(charged_wei))
        .bind(new_status)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE exchange_tabs SET held_wei = held_wei - $3::numeric, updated_at = now() \
             WHERE chain_id = $1 AND escrow_id = $2",
        )
        .bind(chain_id)
        .bind(escrow_id)
        .bind(wei_text(released_wei))
        .execute(&mut *tx)
        .await?;
        if let Some(session) = &session_id {
            sqlx::query(
                "UPDATE exchange_sessions SET spent_wei = spent_wei - $2::numeric WHERE id = $1",
            )
            .bind(session.as_slice())
            .bind(wei_text(released_wei))
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "INSERT INTO exchange_receipts (job_id, provider_key_hash, amount_owed_wei, receipt) \
             VALUES ($1, $2, $3::numeric, $4::jsonb)",
        )
        .bind(job_id.as_slice())
        .bind(key_hash.as_slice())
        .bind(wei_text(charged_wei))
        .bind(json_text(receipt))
        .execute(&mut *tx)
        .await?;
        if let Some(detail) = verified {
            sqlx::query(
                "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
                 SELECT $1, coalesce(max(seq), -1) + 1, 'verified', $2::jsonb \
                 FROM exchange_job_events WHERE job_id = $1",
            )
            .bind(job_id.as_slice())
            .bind(json_text(detail))
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             SELECT $1, coalesce(max(seq), -1) + 1, $4, \
                    jsonb_build_object('charged_wei', $2::text, 'released_wei', $3::text) \
             FROM exchange_job_events WHERE job_id = $1",
        )
        .bind(job_id.as_slice())
        .bind(charged_wei.to_string())
        .bind(released_wei.to_string())
        .bind(new_status)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Completed {
            charged_wei,
            released_wei,
            status: new_status,
        })
    }
}

/// Whether a job in `status` with deadline `deadline_s` takes a result at `now_s`: only while
/// it runs and its deadline has not passed (the deadline sweep expires it after that).
pub(super) fn result_open(status: JobStatus, deadline_s: i64, now_s: u64) -> Result<()> {
    if status != JobStatus::Running {
        return Err(Error::JobNotRunning { status });
    }
    let deadline_s = u64::try_from(deadline_s).unwrap_or(0);
    if deadline_s < now_s {
        return Err(Error::ResultLate { deadline_s });
    }
    Ok(())
}

#[derive(sqlx::FromRow)]
struct ProviderRow {
    key_hash: Vec<u8>,
    mldsa_key: Vec<u8>,
    operator: String,
    payout: Vec<u8>,
}

/// A job as a result finds it.
#[derive(sqlx::FromRow)]
struct RunningRow {
    status: JobStatus,
    held_wei: String,
    session_id: Option<Vec<u8>>,
    chain_id: i64,
    escrow_id: i64,
    deadline_s: i64,
    replicated: bool,
}

#[derive(sqlx::FromRow)]
struct AssignmentRow {
    id: Vec<u8>,
    bundle_id: Option<String>,
    account: Vec<u8>,
    chain_id: i64,
    escrow_id: i64,
    model: String,
    adapter: Option<String>,
    workload: Option<String>,
    request: Option<String>,
    held_wei: String,
    deadline_s: i64,
    determinism: String,
}

impl AssignmentRow {
    fn into_assignment(self) -> Result<Assignment> {
        let corrupt = |what, bytes: &[u8]| Error::Corrupt {
            what,
            value: hex::encode(bytes),
        };
        Ok(Assignment {
            job_id: B256::try_from(self.id.as_slice())
                .map_err(|_| corrupt("a job id", &self.id))?,
            bundle_id: self.bundle_id.unwrap_or_default(),
            buyer: Address::try_from(self.account.as_slice())
                .map_err(|_| corrupt("an address", &self.account))?,
            chain_id: self.chain_id as u64,
            escrow_id: self.escrow_id as u64,
            model: self.model,
            adapter: self.adapter,
            workload: stored_workload(self.workload.as_deref(), self.request.as_deref())?,
            price_wei: parse_wei(&self.held_wei)?,
            deadline_s: self.deadline_s as u64,
            determinism: serde_json::from_value(serde_json::Value::String(
                self.determinism.clone(),
            ))
            .map_err(|_| Error::Corrupt {
                what: "a determinism class",
                value: self.determinism,
            })?,
            signed: None,
        })
    }
}
