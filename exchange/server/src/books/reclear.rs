//! Jobs stranded on a provider that left the market (silent, or no longer staked): each is
//! moved to another bundle while its deadline allows, else refunded at once (the hold returns to
//! its tab and session; nothing is charged).

use super::store::{Books, json_text, parse_wei, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};
use sqlx::Row;

/// A job assigned to (or running on) a bundle that left the engine.
#[derive(Debug, Clone)]
pub struct Stranded {
    /// The job id.
    pub id: B256,
    /// The buyer.
    pub account: Address,
    /// The catalog model.
    pub model: String,
    /// The adapter's content id, if any.
    pub adapter: Option<String>,
    /// What it computes.
    pub workload: cx_protocol::workload::Workload,
    /// When the result is due.
    pub deadline_s: u64,
    /// What it holds on its tab.
    pub held_wei: u128,
    /// The most it may hold when it moves: for an intent's job, the buyer's signed limit less
    /// what the order's other live jobs (verification runs) hold; else what it holds now (a
    /// session's call was held at its quote, within the grant's cap).
    pub limit_wei: u128,
    /// The clearing decision it was placed by.
    pub decision: serde_json::Value,
    /// The bundle it is stranded on.
    pub bundle_id: String,
}

/// What [`Books::reassign`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reassigned {
    /// The job is on its new bundle.
    Moved,
    /// It had moved on meanwhile (finished, expired, moved): nothing changed.
    Gone,
    /// Its tab cannot hold the new price: nothing changed.
    NoFunds,
}

impl Books {
    /// The unfinished jobs of `bundle_ids`.
    pub async fn stranded_jobs(&self, bundle_ids: &[String]) -> Result<Vec<Stranded>> {
        let rows = sqlx::query(&stranded_sql(
            "j.status IN ('assigned', 'running') AND j.bundle_id = ANY($1)",
        ))
        .bind(bundle_ids)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(stranded_of).collect()
    }

    /// Job `id` if it is unfinished on a bundle of the provider with key hash `key_hash`,
    /// with the reason that provider gave up on it recorded as a `released` event.
    pub async fn release(
        &self,
        id: B256,
        key_hash: B256,
        reason: &str,
    ) -> Result<Option<Stranded>> {
        let row = sqlx::query(&stranded_sql(
            "j.id = $1 AND j.status IN ('assigned', 'running') AND j.bundle_id IN ( \
                 SELECT b.id FROM exchange_bundles b WHERE b.provider_key_hash = $2)",
        ))
        .bind(id.as_slice())
        .bind(key_hash.as_slice())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        sqlx::query(
            "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             SELECT $1, coalesce(max(seq), -1) + 1, 'released', jsonb_build_object('reason', $2::text) \
             FROM exchange_job_events WHERE job_id = $1",
        )
        .bind(id.as_slice())
        .bind(reason)
        .execute(&self.pool)
        .await?;
        stranded_of(&row).map(Some)
    }

    /// Moves stranded job `id` from `from` to bundle `to`, placed by `decision` at `held_wei`:
    /// less than it held returns the difference to its tab and session; more (within the
    /// buyer's limit, which the caller checked) is held from the tab if the tab has it. Back to
    /// `assigned`, so the new bundle's provider pulls it; the old provider's late result is
    /// refused (its key no longer holds the assignment).
    pub async fn reassign(
        &self,
        id: B256,
        from: &str,
        to: &str,
        decision: &serde_json::Value,
        held_wei: u128,
    ) -> Result<Reassigned> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT chain_id, escrow_id, session_id, held_wei::text AS held FROM exchange_jobs \
             WHERE id = $1 AND bundle_id = $2 AND status IN ('assigned', 'running') FOR UPDATE",
        )
        .bind(id.as_slice())
        .bind(from)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(Reassigned::Gone);
        };
        let old = parse_wei(&row.try_get::<String, _>("held")?)?;
        let released = old.saturating_sub(held_wei);
        let (chain_id, escrow_id): (i64, i64) =
            (row.try_get("chain_id")?, row.try_get("escrow_id")?);
        let session: Option<Vec<u8>> = row.try_get("session_id")?;
        let extra = held_wei.saturating_sub(old);
        if extra > 0 {
            if session.is_some() {
                // A session's call is held within the grant's cap at its quote: never more.
                return Ok(Reassigned::NoFunds);
            }
            let took = sqlx::query(
                "UPDATE exchange_tabs SET held_wei = held_wei + $3::numeric, updated_at = now() \
                 WHERE chain_id = $1 AND escrow_id = $2 AND held_wei + $3::numeric <= amount_wei",
            )
            .bind(chain_id)
            .bind(escrow_id)
            .bind(wei_text(extra))
            .execute(&mut *tx)
            .await?;
            if took.rows_affected() != 1 {
                return Ok(Reassigned::NoFunds);
            }
        }
        sqlx::query(
            "UPDATE exchange_jobs SET bundle_id = $2, decision = $3::jsonb, status = 'assigned', \
                    held_wei = $4::numeric, updated_at = now() WHERE id = $1",
        )
        .bind(id.as_slice())
        .bind(to)
        .bind(json_text(decision))
        .bind(wei_text(held_wei))
        .execute(&mut *tx)
        .await?;
        if released > 0 {
            sqlx::query(
                "UPDATE exchange_tabs SET held_wei = held_wei - $3::numeric, updated_at = now() \
                 WHERE chain_id = $1 AND escrow_id = $2",
            )
            .bind(chain_id)
            .bind(escrow_id)
            .bind(wei_text(released))
            .execute(&mut *tx)
            .await?;
            if let Some(session) = &session {
                sqlx::query(
                    "UPDATE exchange_sessions SET spent_wei = spent_wei - $2::numeric WHERE id = $1",
                )
                .bind(session.as_slice())
                .bind(wei_text(released))
                .execute(&mut *tx)
                .await?;
            }
        }
        sqlx::query(
            "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             SELECT $1, coalesce(max(seq), -1) + 1, 're-cleared', \
                    jsonb_build_object('from', $2::text, 'to', $3::text, 'released_wei', $4::text, \
                                       'held_wei', $5::text) \
             FROM exchange_job_events WHERE job_id = $1",
        )
        .bind(id.as_slice())
        .bind(from)
        .bind(to)
        .bind(released.to_string())
        .bind(held_wei.to_string())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Reassigned::Moved)
    }

    /// Refunds stranded job `id` at once: no other bundle can take it by its deadline.
    pub async fn refund_stranded(&self, id: B256) -> Result<bool> {
        let rows: Vec<(Vec<u8>,)> = sqlx::query_as(&super::jobs::release_sql(
            "id = $1 AND status IN ('assigned', 'running')",
            cx_protocol::job_status::JobStatus::Refunded,
            "its provider left the market or gave it up, and no other bundle can take it by its \
             deadline",
        ))
        .bind(id.as_slice())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.len() == 1)
    }
}

/// The query of [`Stranded`] jobs meeting `condition` (over `exchange_jobs j`), soonest due first.
fn stranded_sql(condition: &str) -> String {
    format!(
        "SELECT j.id, j.account, j.model, j.adapter, j.workload, j.request::text AS request, \
                    j.deadline_s, j.held_wei::text AS held, j.decision::text AS decision, \
                    j.bundle_id, \
                    (o.limit_wei \
                         - coalesce((SELECT sum(k.held_wei) FROM exchange_jobs k \
                                     WHERE k.order_digest = j.order_digest AND k.id <> j.id \
                                       AND k.status NOT IN ('expired', 'refunded', 'failed', \
                                                            'cancelled')), 0))::text AS limit_wei \
             FROM exchange_jobs j LEFT JOIN exchange_orders o ON o.digest = j.order_digest \
             WHERE {condition} ORDER BY j.deadline_s"
    )
}

/// A [`Stranded`] job from a row of [`stranded_sql`].
fn stranded_of(r: &sqlx::postgres::PgRow) -> Result<Stranded> {
    let id: Vec<u8> = r.try_get("id")?;
    let account: Vec<u8> = r.try_get("account")?;
    let held_wei = parse_wei(&r.try_get::<String, _>("held")?)?;
    // Never below what it holds (a limit the other runs left negative is no room).
    let limit_wei = match r.try_get::<Option<String>, _>("limit_wei")? {
        Some(limit) => parse_wei(&limit).unwrap_or(0).max(held_wei),
        None => held_wei,
    };
    Ok(Stranded {
        id: B256::try_from(id.as_slice()).map_err(|_| Error::Corrupt {
            what: "a job id",
            value: hex::encode(&id),
        })?,
        account: Address::try_from(account.as_slice()).map_err(|_| Error::Corrupt {
            what: "an address",
            value: hex::encode(&account),
        })?,
        model: r.try_get("model")?,
        adapter: r.try_get("adapter")?,
        workload: super::jobs::stored_workload(
            r.try_get::<Option<String>, _>("workload")?.as_deref(),
            r.try_get::<Option<String>, _>("request")?.as_deref(),
        )?,
        deadline_s: r.try_get::<i64, _>("deadline_s")? as u64,
        held_wei,
        limit_wei,
        decision: serde_json::from_str(&r.try_get::<String, _>("decision")?)?,
        bundle_id: r.try_get("bundle_id")?,
    })
}
