//! Tabs on their way to chain: which tabs stop taking jobs, what each paid, and which settled.
//!
//! A tab (one escrow) settles once, whole, so the books hand it to the coordinator only when it
//! takes no more jobs (its buyer asked to settle it, or its deadline is within the settle
//! margin: every hold needs the tab open that long past its job's deadline) and none of its
//! jobs is in flight and none of its standing orders open. The coordinator's outbox
//! (`settlement_*`, the same database) takes it from there.

use super::store::{Books, parse_wei, to_i64};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};
use sqlx::Row;

/// One job a tab pays, with what its voucher is made of.
#[derive(Debug, Clone)]
pub struct PaidJob {
    /// The job id.
    pub job_id: B256,
    /// The order it was made under (its EIP-712 digest, or a session grant's id).
    pub order_digest: B256,
    /// The order row's kind: `intent`, or `session_grant` for a call made with a session key.
    pub kind: String,
    /// The order row's body (`{"intent": Signed<Intent>, …}` or `{"grant": Signed<SessionGrant>}`).
    pub order: serde_json::Value,
    /// The provider-signed receipt, as received.
    pub receipt: serde_json::Value,
    /// The provider's key hash (the assignment named it).
    pub provider_key_hash: B256,
    /// What the job was charged, wei (the receipt's amount, within its price).
    pub charged_wei: u128,
    /// The job's deadline.
    pub deadline_s: u64,
    /// The job's request (none for a search's fill).
    pub request: Option<serde_json::Value>,
    /// The job's clearing decision (a search's fill: `{"kind": "search", "witness"}`).
    pub decision: serde_json::Value,
    /// The adapter's content id, if any.
    pub adapter: Option<String>,
    /// The buyer.
    pub buyer: Address,
    /// The job this one is a verification run of, and which run (T1, T3); `None` for the
    /// verified job itself and every other job.
    pub verifies: Option<(B256, u8)>,
}

/// A job that landed on chain in a posted batch part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledJob {
    /// The job id.
    pub job_id: B256,
    /// The batch.
    pub batch_id: i64,
    /// The chain.
    pub chain_id: u64,
    /// The transaction that carried the part, when known.
    pub tx_hash: Option<B256>,
}

impl Books {
    /// The buyer asked to settle tab `(chain_id, escrow_id)` now: an open tab of `buyer` takes
    /// no more jobs. Returns the tab as it is after (closing, or already further along), or
    /// `None` when it is not `buyer`'s (or unknown).
    pub async fn request_close(
        &self,
        chain_id: u64,
        escrow_id: u64,
        buyer: Address,
    ) -> Result<Option<super::tabs::Tab>> {
        sqlx::query(
            "UPDATE exchange_tabs SET status = 'closing', updated_at = now() \
             WHERE chain_id = $1 AND escrow_id = $2 AND buyer = $3 AND status = 'open'",
        )
        .bind(to_i64(chain_id, "chain id")?)
        .bind(to_i64(escrow_id, "escrow id")?)
        .bind(buyer.as_slice())
        .execute(&self.pool)
        .await?;
        Ok(self
            .tab(chain_id, escrow_id)
            .await?
            .filter(|tab| tab.buyer == buyer))
    }

    /// Stops tabs whose deadline is within `settle_margin_s` of `now_s` from taking jobs;
    /// returns how many it closed.
    pub async fn close_due_tabs(&self, now_s: u64, settle_margin_s: u64) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE exchange_tabs SET status = 'closing', updated_at = now() \
             WHERE status = 'open' AND deadline_s <= $1",
        )
        .bind(to_i64(now_s.saturating_add(settle_margin_s), "deadline")?)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Closing tabs none of whose jobs is still in flight and none of whose standing orders is
    /// still open or committed (a search filled later, a reserve's take-or-pay, is a job the tab
    /// pays), oldest deadline first, at most `limit`.
    pub async fn tabs_ready_to_settle(&self, limit: i64) -> Result<Vec<(u64, u64)>> {
        let rows = sqlx::query(
            "SELECT t.chain_id, t.escrow_id FROM exchange_tabs t \
             WHERE t.status = 'closing' AND NOT EXISTS ( \
                 SELECT 1 FROM exchange_jobs j WHERE j.chain_id = t.chain_id \
                   AND j.escrow_id = t.escrow_id AND j.status IN ('assigned', 'running', 'verifying')) \
               AND NOT EXISTS ( \
                 SELECT 1 FROM exchange_standing_orders s WHERE s.chain_id = t.chain_id \
                   AND s.escrow_id = t.escrow_id AND s.status IN ('open', 'committed')) \
             ORDER BY t.deadline_s, t.chain_id, t.escrow_id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<i64, _>("chain_id")? as u64,
                    r.try_get::<i64, _>("escrow_id")? as u64,
                ))
            })
            .collect()
    }

    /// Every job tab `(chain_id, escrow_id)` pays: done, with a receipt claiming something. A
    /// job priced zero (an intent drawn on a reserve, paid by the reserve's take-or-pay) is not
    /// paid: it has no voucher of its own.
    pub async fn paid_jobs(&self, chain_id: u64, escrow_id: u64) -> Result<Vec<PaidJob>> {
        let rows = sqlx::query(
            "SELECT j.id, j.order_digest, o.kind, exchange_order_body(o)::text AS body, r.receipt::text AS receipt, \
                    r.provider_key_hash, r.amount_owed_wei::text AS charged, j.deadline_s, \
                    j.request::text AS request, j.decision::text AS decision, j.adapter, \
                    j.account, j.verifies, j.run \
             FROM exchange_jobs j \
             JOIN exchange_receipts r ON r.job_id = j.id \
             JOIN exchange_orders o ON o.digest = j.order_digest \
             WHERE j.chain_id = $1 AND j.escrow_id = $2 AND j.status = 'done' \
               AND r.amount_owed_wei > 0 \
             ORDER BY j.created_at, j.id",
        )
        .bind(to_i64(chain_id, "chain id")?)
        .bind(to_i64(escrow_id, "escrow id")?)
        .fetch_all(&self.pool)
        .await?;
        let b256 = |bytes: Vec<u8>, what: &'static str| {
            B256::try_from(bytes.as_slice()).map_err(|_| Error::Corrupt {
                what,
                value: hex::encode(&bytes),
            })
        };
        rows.into_iter()
            .map(|r| {
                let account: Vec<u8> = r.try_get("account")?;
                Ok(PaidJob {
                    job_id: b256(r.try_get("id")?, "a job id")?,
                    order_digest: b256(r.try_get("order_digest")?, "an order digest")?,
                    kind: r.try_get("kind")?,
                    order: serde_json::from_str(&r.try_get::<String, _>("body")?)?,
                    receipt: serde_json::from_str(&r.try_get::<String, _>("receipt")?)?,
                    provider_key_hash: b256(r.try_get("provider_key_hash")?, "a key hash")?,
                    charged_wei: parse_wei(&r.try_get::<String, _>("charged")?)?,
                    deadline_s: r.try_get::<i64, _>("deadline_s")? as u64,
                    request: r
                        .try_get::<Option<String>, _>("request")?
                        .map(|t| serde_json::from_str(&t))
                        .transpose()?,
                    decision: serde_json::from_str(&r.try_get::<String, _>("decision")?)?,
                    adapter: r.try_get("adapter")?,
                    buyer: Address::try_from(account.as_slice()).map_err(|_| Error::Corrupt {
                        what: "an address",
                        value: hex::encode(&account),
                    })?,
                    verifies: match r.try_get::<Option<Vec<u8>>, _>("verifies")? {
                        Some(v) => Some((
                            b256(v, "a job id")?,
                            u8::try_from(r.try_get::<i16, _>("run")?).map_err(|_| {
                                Error::Corrupt {
                                    what: "a run index",
                                    value: String::new(),
                                }
                            })?,
                        )),
                        None => None,
                    },
                })
            })
            .collect()
    }

    /// Records that tab `(chain_id, escrow_id)` went to the coordinator with `jobs` jobs
    /// (`unspent` when it paid none).
    pub async fn mark_tab_submitted(
        &self,
        chain_id: u64,
        escrow_id: u64,
        jobs: usize,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE exchange_tabs SET status = CASE WHEN $3 > 0 THEN 'submitted' ELSE 'unspent' END, \
                    submitted_at = now(), jobs_paid = $3, updated_at = now() \
             WHERE chain_id = $1 AND escrow_id = $2 AND status = 'closing'",
        )
        .bind(to_i64(chain_id, "chain id")?)
        .bind(to_i64(escrow_id, "escrow id")?)
        .bind(i32::try_from(jobs).unwrap_or(i32::MAX))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Submitted tabs whose batch part is now posted become `settled`, and each of their jobs
    /// gets a `settled` event naming the batch and transaction; returns those jobs.
    pub async fn record_settled(&self) -> Result<Vec<SettledJob>> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(
            "WITH landed AS ( \
                 UPDATE exchange_tabs t SET status = 'settled', updated_at = now() \
                 WHERE t.status = 'submitted' AND EXISTS ( \
                     SELECT 1 FROM settlement_receipts r JOIN settlement_batch_parts p \
                       ON p.batch_id = r.batch_id AND p.chain_id = r.chain_id \
                     WHERE r.chain_id = t.chain_id AND r.escrow_id = t.escrow_id \
                       AND p.status = 'posted') \
                 RETURNING t.chain_id, t.escrow_id) \
             SELECT r.job_id, r.batch_id, r.chain_id, p.tx_hash FROM landed l \
             JOIN settlement_receipts r ON r.chain_id = l.chain_id AND r.escrow_id = l.escrow_id \
             JOIN settlement_batch_parts p ON p.batch_id = r.batch_id AND p.chain_id = r.chain_id",
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut settled = Vec::with_capacity(rows.len());
        for r in rows {
            let job_id: Vec<u8> = r.try_get("job_id")?;
            let tx_hash: Option<Vec<u8>> = r.try_get("tx_hash")?;
            let job = SettledJob {
                job_id: B256::try_from(job_id.as_slice()).map_err(|_| Error::Corrupt {
                    what: "a job id",
                    value: hex::encode(&job_id),
                })?,
                batch_id: r.try_get("batch_id")?,
                chain_id: r.try_get::<i64, _>("chain_id")? as u64,
                tx_hash: tx_hash.and_then(|h| B256::try_from(h.as_slice()).ok()),
            };
            sqlx::query(
                "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
                 SELECT $1, coalesce(max(seq), -1) + 1, 'settled', \
                        jsonb_build_object('batch_id', $2::bigint, 'chain_id', $3::bigint, \
                                           'tx_hash', $4::text) \
                 FROM exchange_job_events WHERE job_id = $1",
            )
            .bind(job.job_id.as_slice())
            .bind(job.batch_id)
            .bind(to_i64(job.chain_id, "chain id")?)
            .bind(job.tx_hash.map(|h| h.to_string()))
            .execute(&mut *tx)
            .await?;
            settled.push(job);
        }
        tx.commit().await?;
        Ok(settled)
    }
}
