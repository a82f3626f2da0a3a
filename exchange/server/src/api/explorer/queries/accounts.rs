//! Accounts: a buyer's binding, its tabs (amount, held, spent, settled, open) and what it can
//! claim — its cumulative balance in the latest batch posted on each chain, which the Escrow
//! pays out against a Merkle proof.

use super::{amount_text, hex0x, ms};
use crate::api::explorer::params::Paging;
use crate::error::Result;
use alloy::primitives::Address;
use serde::Serialize;
use sqlx::PgPool;

/// An account with a tab or a binding.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AccountSummary {
    /// The account.
    pub(crate) account: String,
    /// Its tabs.
    pub(crate) tabs: i64,
    /// What its tabs hold in all, wei.
    pub(crate) amount_wei: String,
    /// Its jobs.
    pub(crate) jobs: i64,
}

/// One tab.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TabView {
    /// The chain.
    pub(crate) chain_id: i64,
    /// The escrow id.
    pub(crate) escrow_id: i64,
    /// What the escrow holds, wei.
    pub(crate) amount_wei: String,
    /// What unfinished jobs (and standing orders) hold of it now, wei.
    pub(crate) held_wei: String,
    /// What receipts charged to it, wei.
    pub(crate) spent_wei: String,
    /// Of which settled on chain, wei.
    pub(crate) settled_wei: String,
    /// Its way to settlement: `open`, `closing`, `submitted`, `settled`, `unspent` or
    /// `reclaimed`.
    pub(crate) status: String,
    /// When it went to the settlement committee, unix ms.
    pub(crate) submitted_at_ms: Option<i64>,
    /// How many jobs it paid when it went.
    pub(crate) jobs_paid: Option<i32>,
    /// When the buyer may reclaim it, unix seconds.
    pub(crate) deadline_s: i64,
    /// Jobs drawn on it.
    pub(crate) jobs: i64,
    /// Of which not finished.
    pub(crate) open_jobs: i64,
}

/// What an account may claim on a chain.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ClaimView {
    /// The chain.
    pub(crate) chain_id: i64,
    /// The latest posted batch's nonce there.
    pub(crate) nonce: i64,
    /// The batch.
    pub(crate) batch_id: i64,
    /// The account's cumulative balance after it, wei (what it has claimed is on chain).
    pub(crate) cumulative_wei: String,
}

/// An account's page.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AccountDetail {
    /// The account.
    pub(crate) account: String,
    /// SHA-256 of the ML-DSA key bound to it, if bound.
    pub(crate) mldsa_key_hash: Option<String>,
    /// When it was bound, unix ms.
    pub(crate) bound_at_ms: Option<i64>,
    /// Its tabs.
    pub(crate) tabs: Vec<TabView>,
    /// Its standing orders (reserves, rents, searches), newest first.
    pub(crate) standing_orders: Vec<StandingView>,
    /// Its claimable balances.
    pub(crate) claims: Vec<ClaimView>,
    /// Its preference over the shared market quote, learned from its market orders (none yet:
    /// it is quoted the shared quote).
    pub(crate) preference: Option<crate::preferences::PreferenceView>,
}

/// A standing order.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StandingView {
    /// Its digest.
    pub(crate) id: String,
    /// `reserve`, `rent` or `search`.
    pub(crate) kind: String,
    /// Its state.
    pub(crate) status: String,
    /// What it holds, wei.
    pub(crate) held_wei: String,
    /// When it ends, unix seconds.
    pub(crate) ends_s: i64,
}

/// A page of accounts with tabs, by account.
pub(crate) async fn list(pool: &PgPool, paging: Paging) -> Result<(Vec<AccountSummary>, bool)> {
    let rows: Vec<(Vec<u8>, i64, String, i64)> = sqlx::query_as(
        "SELECT t.buyer, count(*), sum(t.amount_wei)::text, \
                (SELECT count(*) FROM exchange_jobs j WHERE j.account = t.buyer) \
         FROM exchange_tabs t GROUP BY t.buyer ORDER BY t.buyer LIMIT $1 OFFSET $2",
    )
    .bind(i64::from(paging.limit) + 1)
    .bind(i64::from(paging.page - 1) * i64::from(paging.limit))
    .fetch_all(pool)
    .await?;
    let more = rows.len() > paging.limit as usize;
    Ok((
        rows.into_iter()
            .take(paging.limit as usize)
            .map(|(a, tabs, amount, jobs)| AccountSummary {
                account: hex0x(&a),
                tabs,
                amount_wei: amount,
                jobs,
            })
            .collect(),
        more,
    ))
}

#[derive(sqlx::FromRow)]
struct TabRow {
    chain_id: i64,
    escrow_id: i64,
    amount_wei: String,
    held_wei: String,
    spent_wei: String,
    settled_wei: String,
    status: String,
    submitted_ms: Option<i64>,
    jobs_paid: Option<i32>,
    deadline_s: i64,
    jobs: i64,
    open_jobs: i64,
}

/// Account `account`: `None` if the exchange has neither a binding nor a tab for it.
pub(crate) async fn detail(pool: &PgPool, account: Address) -> Result<Option<AccountDetail>> {
    let binding: Option<(Vec<u8>, i64)> = sqlx::query_as(concat!(
        "SELECT mldsa_key_hash, ",
        ms!("bound_at"),
        " FROM exchange_bindings WHERE account = $1"
    ))
    .bind(account.as_slice())
    .fetch_optional(pool)
    .await?;
    let tabs: Vec<TabRow> = sqlx::query_as(
        "SELECT t.chain_id, t.escrow_id, t.amount_wei::text AS amount_wei, \
                t.held_wei::text AS held_wei, \
                coalesce(s.spent, 0)::text AS spent_wei, coalesce(s.settled, 0)::text AS settled_wei, \
                t.status, (extract(epoch FROM t.submitted_at) * 1000)::bigint AS submitted_ms, \
                t.jobs_paid, t.deadline_s, coalesce(s.jobs, 0) AS jobs, \
                coalesce(s.open_jobs, 0) AS open_jobs \
         FROM exchange_tabs t LEFT JOIN LATERAL ( \
             SELECT count(*) AS jobs, \
                    count(*) FILTER (WHERE j.status IN ('assigned', 'running')) AS open_jobs, \
                    sum(er.amount_owed_wei) AS spent, \
                    sum(er.amount_owed_wei) FILTER (WHERE bp.status = 'posted') AS settled \
             FROM exchange_jobs j \
             LEFT JOIN exchange_receipts er ON er.job_id = j.id \
             LEFT JOIN settlement_receipts sr ON sr.job_id = j.id \
             LEFT JOIN settlement_batch_parts bp \
                    ON bp.batch_id = sr.batch_id AND bp.chain_id = sr.chain_id \
             WHERE j.chain_id = t.chain_id AND j.escrow_id = t.escrow_id) s ON true \
         WHERE t.buyer = $1 ORDER BY t.chain_id, t.escrow_id LIMIT 500",
    )
    .bind(account.as_slice())
    .fetch_all(pool)
    .await?;
    if binding.is_none() && tabs.is_empty() {
        return Ok(None);
    }
    let standing: Vec<(Vec<u8>, String, String, String, i64)> = sqlx::query_as(
        "SELECT digest, kind, status, held_wei::text, ends_s FROM exchange_standing_orders \
         WHERE account = $1 ORDER BY created_at DESC LIMIT 100",
    )
    .bind(account.as_slice())
    .fetch_all(pool)
    .await?;
    // The latest posted part of each chain, and this account's entry in its balances.
    let claims: Vec<(i64, i64, i64, Option<String>)> = sqlx::query_as(
        "SELECT DISTINCT ON (bp.chain_id) bp.chain_id, bp.nonce, bp.batch_id, \
                (SELECT e->>1 FROM jsonb_array_elements( \
                     CASE WHEN jsonb_typeof(bp.body->'new_balances') = 'array' \
                          THEN bp.body->'new_balances' ELSE '[]'::jsonb END) e \
                 WHERE lower(e->>0) = $1 LIMIT 1) \
         FROM settlement_batch_parts bp WHERE bp.status = 'posted' \
         ORDER BY bp.chain_id, bp.nonce DESC LIMIT 100",
    )
    .bind(account.to_string().to_lowercase())
    .fetch_all(pool)
    .await?;
    Ok(Some(AccountDetail {
        account: hex0x(account.as_slice()),
        mldsa_key_hash: binding.as_ref().map(|(k, _)| hex0x(k)),
        bound_at_ms: binding.map(|(_, at)| at),
        tabs: tabs
            .into_iter()
            .map(|t| TabView {
                chain_id: t.chain_id,
                escrow_id: t.escrow_id,
                amount_wei: t.amount_wei,
                held_wei: t.held_wei,
                spent_wei: t.spent_wei,
                settled_wei: t.settled_wei,
                status: t.status,
                submitted_at_ms: t.submitted_ms,
                jobs_paid: t.jobs_paid,
                deadline_s: t.deadline_s,
                jobs: t.jobs,
                open_jobs: t.open_jobs,
            })
            .collect(),
        standing_orders: standing
            .into_iter()
            .map(|(id, kind, status, held, ends_s)| StandingView {
                id: hex0x(&id),
                kind,
                status,
                held_wei: held,
                ends_s,
            })
            .collect(),
        claims: claims
            .into_iter()
            .filter_map(|(chain_id, nonce, batch_id, balance)| {
                let cumulative_wei = amount_text(&serde_json::Value::String(balance?))?;
                Some(ClaimView {
                    chain_id,
                    nonce,
                    batch_id,
                    cumulative_wei,
                })
            })
            .collect(),
        preference: None,
    }))
}
