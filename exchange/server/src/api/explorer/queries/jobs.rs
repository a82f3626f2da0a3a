//! Jobs: the filtered list, and one job with everything that happened to it — the signed order,
//! the clearing decision, the assignment, the receipt, the events, verification and settlement.

use super::{SETTLEMENT_JOINS, SHOWN_STATUS, hex0x, hex0x_opt, json, ms, wei};
use crate::api::explorer::params::{Before, JobFilter, Paging};
use crate::api::explorer::queries::settlement::{self, Part, Step};
use crate::error::Result;
use alloy::primitives::B256;
use cx_protocol::Bundle;
use cx_protocol::decision::DecisionRecord;
use serde::Serialize;
use sqlx::PgPool;

/// One row of the jobs list.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobSummary {
    /// The job id.
    pub(crate) id: String,
    /// When it was accepted, unix ms.
    pub(crate) created_at_ms: i64,
    /// The buyer.
    pub(crate) account: String,
    /// The tab's chain.
    pub(crate) chain_id: i64,
    /// The tab.
    pub(crate) escrow_id: i64,
    /// The catalog model.
    pub(crate) model: String,
    /// The adapter's content id, if any.
    pub(crate) adapter: Option<String>,
    /// The tier it was cleared at.
    pub(crate) tier: Option<String>,
    /// The status shown (settlement folded in).
    pub(crate) status: String,
    /// The job's own lifecycle state.
    pub(crate) job_status: String,
    /// The bundle it was cleared onto.
    pub(crate) bundle_id: Option<String>,
    /// The provider whose bundle it is.
    pub(crate) provider_key_hash: Option<String>,
    /// What it holds on its tab (what it was charged, once done), wei.
    pub(crate) held_wei: String,
    /// What its receipt charged, wei.
    pub(crate) charged_wei: Option<String>,
    /// The settlement batch its receipt is in.
    pub(crate) batch_id: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct SummaryRow {
    id: Vec<u8>,
    created_ms: i64,
    account: Vec<u8>,
    chain_id: i64,
    escrow_id: i64,
    model: String,
    adapter: Option<String>,
    tier: Option<String>,
    status: String,
    job_status: String,
    bundle_id: Option<String>,
    provider_key_hash: Option<Vec<u8>>,
    held_wei: String,
    charged_wei: Option<String>,
    batch_id: Option<i64>,
}

impl From<SummaryRow> for JobSummary {
    fn from(r: SummaryRow) -> Self {
        Self {
            id: hex0x(&r.id),
            created_at_ms: r.created_ms,
            account: hex0x(&r.account),
            chain_id: r.chain_id,
            escrow_id: r.escrow_id,
            model: r.model,
            adapter: r.adapter,
            tier: r.tier,
            status: r.status,
            job_status: r.job_status,
            bundle_id: r.bundle_id,
            provider_key_hash: hex0x_opt(r.provider_key_hash.as_ref()),
            held_wei: r.held_wei,
            charged_wei: r.charged_wei,
            batch_id: r.batch_id,
        }
    }
}

/// A page of jobs and whether more follow.
pub(crate) struct JobList {
    /// The jobs, newest first.
    pub(crate) jobs: Vec<JobSummary>,
    /// Whether there are older ones.
    pub(crate) more: bool,
}

/// Whether job `id` exists (a `?before=` cursor must name one).
pub(crate) async fn exists(pool: &PgPool, id: B256) -> Result<bool> {
    Ok(
        sqlx::query_scalar::<_, i64>("SELECT 1::bigint FROM exchange_jobs WHERE id = $1")
            .bind(id.as_slice())
            .fetch_optional(pool)
            .await?
            .is_some(),
    )
}

/// Jobs matching `filter`, newest first (ties by id), one page of `paging` from `before`.
pub(crate) async fn list(
    pool: &PgPool,
    filter: &JobFilter,
    paging: Paging,
    before: Before<B256>,
) -> Result<JobList> {
    let sql = format!(
        "SELECT j.id, {created} AS created_ms, j.account, j.chain_id, j.escrow_id, j.model, \
                j.adapter, j.decision->>'tier' AS tier, {SHOWN_STATUS} AS status, \
                j.status AS job_status, j.bundle_id, \
                coalesce(b.provider_key_hash, er.provider_key_hash) AS provider_key_hash, \
                j.held_wei::text AS held_wei, er.amount_owed_wei::text AS charged_wei, sr.batch_id \
         FROM exchange_jobs j \
         LEFT JOIN exchange_bundles b ON b.id = j.bundle_id \
         LEFT JOIN exchange_receipts er ON er.job_id = j.id \
         {SETTLEMENT_JOINS} \
         WHERE ($1::bytea IS NULL OR j.account = $1) \
           AND ($2::bytea IS NULL OR coalesce(b.provider_key_hash, er.provider_key_hash) = $2) \
           AND ($3::text IS NULL OR j.model = $3) \
           AND ($4::text IS NULL OR j.adapter = $4) \
           AND ($5::text IS NULL OR j.decision->>'tier' = $5) \
           AND ($6::text IS NULL OR {SHOWN_STATUS} = $6) \
           AND ($7::bytea IS NULL OR (j.created_at, j.id) < \
                (SELECT c.created_at, c.id FROM exchange_jobs c WHERE c.id = $7)) \
         ORDER BY j.created_at DESC, j.id DESC LIMIT $8 OFFSET $9",
        created = ms!("j.created_at"),
    );
    let before = match before {
        Before::Start => None,
        Before::After(id) => Some(id.to_vec()),
    };
    let rows: Vec<SummaryRow> = sqlx::query_as(&sql)
        .bind(filter.account.map(|a| a.to_vec()))
        .bind(filter.provider.map(|p| p.to_vec()))
        .bind(filter.model.as_deref())
        .bind(filter.adapter.as_deref())
        .bind(filter.tier.as_deref())
        .bind(filter.status.as_deref())
        .bind(before)
        .bind(i64::from(paging.limit) + 1)
        .bind(i64::from(paging.page - 1) * i64::from(paging.limit))
        .fetch_all(pool)
        .await?;
    let more = rows.len() > paging.limit as usize;
    Ok(JobList {
        jobs: rows
            .into_iter()
            .take(paging.limit as usize)
            .map(JobSummary::from)
            .collect(),
        more,
    })
}

/// Jobs in each shown status (the index page's counts).
pub(crate) async fn status_counts(pool: &PgPool) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {SHOWN_STATUS} AS status, count(*) FROM exchange_jobs j {SETTLEMENT_JOINS} \
         GROUP BY 1 ORDER BY 1 LIMIT 50"
    ))
    .fetch_all(pool)
    .await?)
}

/// What the chosen bundle held when the job was cleared, read from the decision's terms: the
/// residency terms are μ1·(1−β) and μ2·(1−α), so a zero term means the base (adapter) was
/// resident. A job without an adapter has α = 1 by definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Residency {
    /// β: the base model was resident.
    pub(crate) base_resident: bool,
    /// α: the buyer's adapter was resident (or there was none).
    pub(crate) adapter_resident: bool,
}

impl Residency {
    /// β and α of `decision`'s chosen bundle at clearing time.
    fn of(decision: &DecisionRecord) -> Option<Self> {
        let (base_resident, adapter_resident) = decision.residency()?;
        Some(Self {
            base_resident,
            adapter_resident,
        })
    }
}

/// The signed order that made the job.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OrderView {
    /// Its EIP-712 digest.
    pub(crate) digest: String,
    /// `intent`, `session_grant`, …
    pub(crate) kind: String,
    /// The signer.
    pub(crate) account: String,
    /// Its domain's chain.
    pub(crate) chain_id: i64,
    /// Its nonce.
    pub(crate) nonce: String,
    /// When the exchange accepted it, unix ms.
    pub(crate) received_at_ms: i64,
    /// The signed order exactly as received, both signatures included (the inference request
    /// beside it is the buyer's and is not shown).
    pub(crate) signed: serde_json::Value,
}

/// The exchange's assignment of the job to a provider.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AssignmentView {
    /// The bundle.
    pub(crate) bundle_id: String,
    /// The provider whose bundle it is.
    pub(crate) provider_key_hash: Option<String>,
    /// Its operator.
    pub(crate) operator: Option<String>,
    /// The most the receipt may claim, wei (what the job held when assigned).
    pub(crate) price_wei: String,
    /// When the result was due, unix seconds.
    pub(crate) deadline_s: i64,
    /// When the provider took it, unix ms.
    pub(crate) taken_at_ms: Option<i64>,
    /// The exchange's ML-DSA-signed assignment, as its voucher carries it to the committee
    /// (once the job is in settlement).
    pub(crate) signed: Option<serde_json::Value>,
}

/// The provider's signed receipt.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ReceiptView {
    /// The provider that signed it.
    pub(crate) provider_key_hash: String,
    /// What it charged, wei.
    pub(crate) amount_owed_wei: String,
    /// When the exchange accepted it, unix ms.
    pub(crate) received_at_ms: i64,
    /// The signed receipt as received.
    pub(crate) signed: serde_json::Value,
}

/// One step of the job's lifecycle.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct EventView {
    /// Its sequence number.
    pub(crate) seq: i32,
    /// The state entered.
    pub(crate) status: String,
    /// What came with it.
    pub(crate) detail: serde_json::Value,
    /// When, unix ms.
    pub(crate) at_ms: i64,
}

/// The verification of the job's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct VerificationView {
    /// The tier it is verified at.
    pub(crate) tier: Option<String>,
    /// What verifying it was priced at when cleared: the λ_V·v(τ) term.
    pub(crate) cost: Option<f64>,
    /// The outcome, from the job's verification events (`None`: none recorded yet).
    pub(crate) result: Option<String>,
    /// How it was checked (`replica`, `freivalds`, …), from the last verification event.
    pub(crate) method: Option<String>,
    /// Whether the check passed.
    pub(crate) passed: Option<bool>,
    /// What the check cost the buyer, wei (decimal).
    pub(crate) cost_wei: Option<String>,
    /// How long the check took, ms.
    pub(crate) check_ms: Option<i64>,
    /// The runs that took part (replication), each `{job, provider, output_hash, …}` as the
    /// event recorded it.
    pub(crate) runs: Vec<serde_json::Value>,
    /// Those events.
    pub(crate) events: Vec<EventView>,
}

/// Where the job's receipt is in settlement.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SettlementView {
    /// `pending` (accepted by the coordinator, in no batch yet), `batched`, `settled` (the
    /// batch's part on the job's chain is posted) or `rejected`.
    pub(crate) state: String,
    /// The batch.
    pub(crate) batch_id: Option<i64>,
    /// Why the committee refused the receipt.
    pub(crate) rejected_reason: Option<String>,
    /// When the coordinator took the receipt, unix ms.
    pub(crate) received_at_ms: Option<i64>,
    /// The batch's parts (one per chain), with their transaction hashes.
    pub(crate) parts: Vec<Part>,
    /// The batch's steps.
    pub(crate) steps: Vec<Step>,
}

/// One job with everything the explorer knows about it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobDetail {
    /// The row the list shows.
    #[serde(flatten)]
    pub(crate) summary: JobSummary,
    /// When the result is due, unix seconds.
    pub(crate) deadline_s: i64,
    /// The session whose call made it.
    pub(crate) session_id: Option<String>,
    /// The signed order.
    pub(crate) order: OrderView,
    /// The clearing decision.
    pub(crate) decision: DecisionRecord,
    /// β and α of the chosen bundle at clearing time.
    pub(crate) residency: Option<Residency>,
    /// The chosen bundle as registered now.
    pub(crate) bundle: Option<Bundle>,
    /// The assignment.
    pub(crate) assignment: Option<AssignmentView>,
    /// The receipt.
    pub(crate) receipt: Option<ReceiptView>,
    /// Every state it went through.
    pub(crate) events: Vec<EventView>,
    /// Verification.
    pub(crate) verification: VerificationView,
    /// Settlement.
    pub(crate) settlement: Option<SettlementView>,
    /// A train order's result: the adapter it trained and how the loss went.
    pub(crate) trained: Option<cx_protocol::train::Trained>,
}

#[derive(sqlx::FromRow)]
struct DetailRow {
    #[sqlx(flatten)]
    summary: SummaryRow,
    deadline_s: i64,
    session_id: Option<Vec<u8>>,
    decision: String,
    order_digest: Vec<u8>,
    order_kind: String,
    order_account: Vec<u8>,
    order_chain_id: i64,
    order_nonce: String,
    order_body: String,
    order_ms: i64,
    bundle_body: Option<String>,
    operator: Option<String>,
    sr_received_ms: Option<i64>,
    signed_assignment: Option<String>,
    trained: Option<String>,
}

/// Job `id`, or `None`.
pub(crate) async fn detail(pool: &PgPool, id: B256) -> Result<Option<JobDetail>> {
    let sql = format!(
        "SELECT j.id, {created} AS created_ms, j.account, j.chain_id, j.escrow_id, j.model, \
                j.adapter, j.decision->>'tier' AS tier, {SHOWN_STATUS} AS status, \
                j.status AS job_status, j.bundle_id, \
                coalesce(b.provider_key_hash, er.provider_key_hash) AS provider_key_hash, \
                j.held_wei::text AS held_wei, er.amount_owed_wei::text AS charged_wei, sr.batch_id, \
                j.deadline_s, j.session_id, j.decision::text AS decision, \
                o.digest AS order_digest, o.kind AS order_kind, o.account AS order_account, \
                o.chain_id AS order_chain_id, o.nonce::text AS order_nonce, \
                exchange_order_body(o)::text AS order_body, {received} AS order_ms, \
                b.body::text AS bundle_body, p.operator, {sr_received} AS sr_received_ms, \
                (sr.voucher->'assignment')::text AS signed_assignment, \
                (j.result->'trained')::text AS trained \
         FROM exchange_jobs j \
         JOIN exchange_orders o ON o.digest = j.order_digest \
         LEFT JOIN exchange_bundles b ON b.id = j.bundle_id \
         LEFT JOIN exchange_receipts er ON er.job_id = j.id \
         LEFT JOIN exchange_providers p \
                ON p.key_hash = coalesce(b.provider_key_hash, er.provider_key_hash) \
         {SETTLEMENT_JOINS} \
         WHERE j.id = $1",
        created = ms!("j.created_at"),
        received = ms!("o.received_at"),
        sr_received = ms!("sr.received_at"),
    );
    let Some(row): Option<DetailRow> = sqlx::query_as(&sql)
        .bind(id.as_slice())
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let events = events(pool, id).await?;
    let receipt = receipt(pool, id).await?;
    let decision: DecisionRecord = serde_json::from_str(&row.decision).unwrap_or_default();
    let body = json(&row.order_body)?;
    // The order's body is `{"intent": signed, "request": …}` (or `"matmul"` / `"train"` for
    // those kinds; or `{"grant": signed}`): the signed order is the member that is not the
    // request.
    let signed = match &body {
        serde_json::Value::Object(map) => map
            .iter()
            .find(|(k, _)| !matches!(k.as_str(), "request" | "matmul" | "train"))
            .map(|(_, v)| v.clone())
            .unwrap_or(serde_json::Value::Null),
        _ => serde_json::Value::Null,
    };
    let order = OrderView {
        digest: hex0x(&row.order_digest),
        kind: row.order_kind,
        account: hex0x(&row.order_account),
        chain_id: row.order_chain_id,
        nonce: row.order_nonce,
        received_at_ms: row.order_ms,
        signed,
    };
    let bundle = row
        .bundle_body
        .as_deref()
        .and_then(|b| serde_json::from_str::<Bundle>(b).ok());
    let summary = JobSummary::from(row.summary);
    let assignment = summary.bundle_id.as_ref().map(|bundle_id| AssignmentView {
        bundle_id: bundle_id.clone(),
        provider_key_hash: summary.provider_key_hash.clone(),
        operator: row.operator.clone(),
        price_wei: assigned_price(&events, &summary.held_wei),
        deadline_s: row.deadline_s,
        taken_at_ms: events
            .iter()
            .find(|e| e.status == "running")
            .map(|e| e.at_ms),
        signed: row
            .signed_assignment
            .as_deref()
            .and_then(|a| serde_json::from_str(a).ok()),
    });
    let verification_events: Vec<EventView> = events
        .iter()
        .filter(|e| e.status.starts_with("verif") || e.detail.get("verification").is_some())
        .cloned()
        .collect();
    // The check's own record (`verified` / `verification_failed`: tier, method, passed,
    // cost_wei, check_ms and, for replication, the runs), whichever method wrote it.
    let check = verification_events
        .iter()
        .rev()
        .find(|e| e.detail.get("method").is_some())
        .map(|e| &e.detail);
    let field = |k: &str| check.and_then(|d| d.get(k));
    let verification = VerificationView {
        tier: field("tier")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .or_else(|| decision.tier.map(|t| t.to_string())),
        cost: decision.terms.map(|t| t.verification),
        result: verification_events.last().map(|e| {
            e.detail
                .get("result")
                .or_else(|| e.detail.get("verification"))
                .and_then(|v| v.as_str())
                .unwrap_or(&e.status)
                .to_owned()
        }),
        method: field("method").and_then(|v| v.as_str()).map(str::to_owned),
        passed: field("passed").and_then(serde_json::Value::as_bool),
        cost_wei: field("cost_wei")
            .and_then(|v| v.as_str())
            .map(str::to_owned),
        check_ms: field("check_ms").and_then(serde_json::Value::as_i64),
        runs: field("runs")
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default(),
        events: verification_events,
    };
    let settlement = settlement_of(pool, id, &summary, row.sr_received_ms).await?;
    Ok(Some(JobDetail {
        residency: Residency::of(&decision),
        deadline_s: row.deadline_s,
        session_id: hex0x_opt(row.session_id.as_ref()),
        order,
        decision,
        bundle,
        assignment,
        receipt,
        events,
        verification,
        settlement,
        summary,
        trained: row
            .trained
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok()),
    }))
}

/// The price the job was assigned at: what it held then, which is what the `done` event's
/// charge and release add up to once it is done (the hold is cut to the charge), else its hold.
fn assigned_price(events: &[EventView], held_wei: &str) -> String {
    let done = events.iter().rev().find(|e| e.status == "done");
    let part = |e: &EventView, key: &str| {
        e.detail
            .get(key)
            .and_then(|v| v.as_str())
            .and_then(|s| s.parse::<u128>().ok())
    };
    match done.and_then(|e| Some(part(e, "charged_wei")? + part(e, "released_wei")?)) {
        Some(price) => price.to_string(),
        None => held_wei.to_owned(),
    }
}

/// The job's events, in order (bounded: a lifecycle has a handful).
async fn events(pool: &PgPool, id: B256) -> Result<Vec<EventView>> {
    let rows: Vec<(i32, String, String, i64)> = sqlx::query_as(concat!(
        "SELECT seq, status, detail::text, ",
        ms!("at"),
        " FROM exchange_job_events WHERE job_id = $1 ORDER BY seq LIMIT 500"
    ))
    .bind(id.as_slice())
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(seq, status, detail, at_ms)| {
            Ok(EventView {
                seq,
                status,
                detail: json(&detail)?,
                at_ms,
            })
        })
        .collect()
}

async fn receipt(pool: &PgPool, id: B256) -> Result<Option<ReceiptView>> {
    let row: Option<(Vec<u8>, String, String, i64)> = sqlx::query_as(concat!(
        "SELECT provider_key_hash, amount_owed_wei::text, receipt::text, ",
        ms!("received_at"),
        " FROM exchange_receipts WHERE job_id = $1"
    ))
    .bind(id.as_slice())
    .fetch_optional(pool)
    .await?;
    row.map(|(key, amount, receipt, at)| {
        wei(&amount)?;
        Ok(ReceiptView {
            provider_key_hash: hex0x(&key),
            amount_owed_wei: amount,
            received_at_ms: at,
            signed: json(&receipt)?,
        })
    })
    .transpose()
}

async fn settlement_of(
    pool: &PgPool,
    id: B256,
    summary: &JobSummary,
    received_at_ms: Option<i64>,
) -> Result<Option<SettlementView>> {
    if let Some(batch_id) = summary.batch_id {
        let parts = settlement::parts(pool, &[batch_id]).await?;
        let steps = settlement::steps(pool, batch_id).await?;
        let state = if summary.status == "settled" {
            "settled"
        } else {
            "batched"
        };
        return Ok(Some(SettlementView {
            state: state.to_owned(),
            batch_id: Some(batch_id),
            rejected_reason: None,
            received_at_ms,
            parts,
            steps,
        }));
    }
    if received_at_ms.is_some() {
        return Ok(Some(SettlementView {
            state: "pending".to_owned(),
            batch_id: None,
            rejected_reason: None,
            received_at_ms,
            parts: Vec::new(),
            steps: Vec::new(),
        }));
    }
    let rejected: Option<(String, i64)> = sqlx::query_as(concat!(
        "SELECT reason, ",
        ms!("rejected_at"),
        " FROM settlement_rejected_receipts WHERE job_id = $1"
    ))
    .bind(id.as_slice())
    .fetch_optional(pool)
    .await?;
    Ok(rejected.map(|(reason, at)| SettlementView {
        state: "rejected".to_owned(),
        batch_id: None,
        rejected_reason: Some(reason),
        received_at_ms: Some(at),
        parts: Vec::new(),
        steps: Vec::new(),
    }))
}
