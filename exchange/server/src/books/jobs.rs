//! Orders and the jobs they create: accepted in one transaction with the tab hold, so an order
//! is either wholly in the books (nonce spent, tab held, job and its first event written) or not
//! at all.

use super::accepts::{Row, RunRow, accept_rows};
use super::store::constraint;
use super::store::{Books, json_text, parse_wei, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256, Bytes};
use cx_protocol::job_status::JobStatus;
use cx_protocol::order::Signed;
use cx_protocol::wire::{JobEvent, JobRecord};
use cx_protocol::workload::{Workload, WorkloadKind};
use sqlx::postgres::PgConnection;

/// A signed order as it is stored.
#[derive(Debug, Clone)]
pub struct NewOrder {
    /// The EIP-712 digest both signatures cover (the order's id).
    pub digest: B256,
    /// `intent`, `reserve`, `rent` or `search`.
    pub kind: &'static str,
    /// The account that signed it.
    pub account: Address,
    /// The chain whose domain it was signed under.
    pub chain_id: u64,
    /// Its nonce (unique per account and chain).
    pub nonce: u64,
    /// The whole request as received (order, both signatures, the request body) under the
    /// order's kind (`{"intent": …}`, `{"reserve": …}`, `{"grant": …}` for a session grant), but
    /// for the signed order's co-signature when [`Self::mldsa_signature`] holds it
    /// ([`Self::split_cosignature`]).
    pub body: serde_json::Value,
    /// The signed order's ML-DSA co-signature, stored as its bytes beside the body, which holds
    /// `"0x"` in its place (migration `exchange_order_cosignature`: 6.6k hex characters that
    /// PostgreSQL would parse, try to compress and move out of line); `exchange_order_body(o)`
    /// reads the order whole.
    pub mldsa_signature: Option<Bytes>,
    /// An intent's limit (`max_price_wei`): what its job and the job's verification runs may
    /// cost together; `None` for other orders.
    pub limit_wei: Option<u128>,
}

impl NewOrder {
    /// `signed` without its ML-DSA co-signature, for the body, and the co-signature, for
    /// [`Self::mldsa_signature`] (`None` when it has none).
    pub fn split_cosignature<T: Clone>(signed: &Signed<T>) -> (Signed<T>, Option<Bytes>) {
        let cosignature = Some(signed.mldsa_signature.clone()).filter(|s| !s.is_empty());
        let bare = Signed {
            mldsa_signature: Bytes::new(),
            ..signed.clone()
        };
        (bare, cosignature)
    }
}

/// The job an order creates.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// The job id.
    pub id: B256,
    /// The escrow on `order.chain_id` it draws on.
    pub escrow_id: u64,
    /// The model it runs.
    pub model: String,
    /// `assigned` once cleared onto a bundle.
    pub status: JobStatus,
    /// The bundle it was cleared onto.
    pub bundle_id: Option<String>,
    /// What it holds on the tab, wei.
    pub held_wei: u128,
    /// The tab must stay open (not reclaimable) until then, unix seconds.
    pub needed_until_s: u64,
    /// The clearing decision, with every term and every rejection.
    pub decision: serde_json::Value,
    /// When a result must be back, unix seconds; past it the job expires and its hold returns.
    pub deadline_s: u64,
    /// The adapter it runs with (content id), if any.
    pub adapter: Option<String>,
    /// What it computes.
    pub workload: cx_protocol::workload::Workload,
}

/// A verification run of a job (T1, T3), written with it: the same order, request, model,
/// adapter, class and deadline, on another provider's bundle; its id is derived from the job's
/// ([`cx_protocol::replica::run_job_id`]).
#[derive(Debug, Clone)]
pub struct NewRun {
    /// The run's id.
    pub id: B256,
    /// Which run it is (1..=[`cx_protocol::replica::MAX_RUNS`]).
    pub run: u8,
    /// The bundle it was cleared onto.
    pub bundle_id: String,
    /// What it holds on the tab, wei.
    pub held_wei: u128,
    /// Its clearing decision.
    pub decision: serde_json::Value,
}

impl Books {
    /// Accepts an order and its job atomically: the nonce is spent, the tab held and the job
    /// written, or nothing is (a replayed nonce, an overspent tab, …: the error says which).
    ///
    /// One statement, shared with the orders that arrive meanwhile ([`super::accepts`]): the tab
    /// hold is a conditional UPDATE (concurrent holds serialise on the row and PostgreSQL
    /// re-checks the condition against the committed row, so no two can take more than the tab
    /// holds); the order, the job and its first event are inserted only if the hold took; a
    /// reused nonce writes nothing of the order, hold included.
    pub async fn accept(&self, order: &NewOrder, job: &NewJob) -> Result<()> {
        self.accept_with_runs(order, job, &[]).await
    }

    /// [`Books::accept`] with the verification runs of the job (T1, T3): the tab holds the job's
    /// charge and every run's, and the runs are written in the same statement, so a job is
    /// never in the books without the runs its tier needs.
    pub async fn accept_with_runs(
        &self,
        order: &NewOrder,
        job: &NewJob,
        runs: &[NewRun],
    ) -> Result<()> {
        let row = row(order, job, runs)?;
        let took = self.group.accept(&self.pool, row).await;
        if !took.map_err(|e| accept_error(e, order.nonce))? {
            return Err(self.why_not(order, job, total_held(job, runs)?).await?);
        }
        Ok(())
    }

    /// [`Books::accept_with_runs`] for a job drawn on committed reserve `reserve`: its
    /// `compute_ms` drawn from what the reserve has left in the same transaction as the order,
    /// the job and its runs (paid at spot: the reserve pays only its own provider's work). False
    /// (and nothing written) when the reserve no longer has that much left or is no longer
    /// committed — a concurrent intent took it; the caller places the intent at spot.
    pub async fn accept_drawing(
        &self,
        order: &NewOrder,
        job: &NewJob,
        runs: &[NewRun],
        reserve: B256,
        compute_ms: u64,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let drawn = sqlx::query(
            "UPDATE exchange_standing_orders s SET used_ms = s.used_ms + $2, updated_at = now() \
             WHERE s.digest = $1 AND s.kind = 'reserve' AND s.status = 'committed' \
               AND s.used_ms + $2 <= s.compute_ms",
        )
        .bind(reserve.as_slice())
        .bind(to_i64(compute_ms, "compute")?)
        .execute(&mut *tx)
        .await?;
        if drawn.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some(total_wei) = self.accept_in(&mut tx, order, job, runs).await? {
            drop(tx);
            return Err(self.why_not(order, job, total_wei).await?);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Why the tab could not hold `total_wei` for `job`.
    async fn why_not(&self, order: &NewOrder, job: &NewJob, total_wei: u128) -> Result<Error> {
        self.why_not_held(
            (order.chain_id, job.escrow_id),
            order.account,
            total_wei,
            job.needed_until_s,
        )
        .await
    }

    /// The order, the job, its runs and their hold, in one statement on `conn` (in the caller's
    /// transaction, committed or dropped with whatever else it holds). `Some(total)` when the
    /// tab could not hold the `total` wei (nothing written).
    async fn accept_in(
        &self,
        conn: &mut PgConnection,
        order: &NewOrder,
        job: &NewJob,
        runs: &[NewRun],
    ) -> Result<Option<u128>> {
        let row = row(order, job, runs)?;
        let took = accept_rows(conn, &[&row])
            .await
            .map_err(|e| accept_error(e, order.nonce))?;
        Ok((!took[0]).then_some(total_held(job, runs)?))
    }

    /// Expires every unfinished job whose deadline passed before `now_s`: its hold returns to its
    /// tab (and to its session's cap), it is never charged, and an `expired` event says what was
    /// released. One transaction, so each job is either expired with its hold released or
    /// untouched, whatever crashes. A job its provider had taken on a residency claim is also
    /// recorded as a residency miss ([`super::residency`]). Returns the ids it expired.
    pub async fn expire_due(&self, now_s: u64) -> Result<Vec<B256>> {
        let now = to_i64(now_s, "time")?;
        let mut tx = self.pool.begin().await?;
        super::residency::record_deadline_misses(&mut tx, now).await?;
        let rows: Vec<(Vec<u8>,)> = sqlx::query_as(&release_sql(
            "status IN ('assigned', 'running', 'verifying') AND deadline_s < $1",
            JobStatus::Expired,
            "no result (or no verified result) by the deadline",
        ))
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        ids(rows)
    }

    /// Cancels a job of session `session_id` that no provider has taken yet: its hold returns
    /// to the tab and the session's cap, nothing is charged. Returns whether it was cancelled
    /// (false: not this session's, or already running or ended).
    pub async fn cancel_job(&self, id: B256, session_id: B256) -> Result<bool> {
        let rows: Vec<(Vec<u8>,)> = sqlx::query_as(&release_sql(
            "id = $1 AND session_id = $2 AND status = 'assigned'",
            JobStatus::Cancelled,
            "cancelled by the buyer before a provider took it",
        ))
        .bind(id.as_slice())
        .bind(session_id.as_slice())
        .fetch_all(&self.pool)
        .await?;
        Ok(ids(rows)?.len() == 1)
    }

    /// One job with its events.
    pub async fn job(&self, id: B256) -> Result<Option<JobRecord>> {
        let row: Option<JobRow> = sqlx::query_as(&format!("{JOB_SELECT} WHERE id = $1"))
            .bind(id.as_slice())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let events: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT status, detail::text, (extract(epoch FROM at) * 1000)::bigint \
             FROM exchange_job_events WHERE job_id = $1 ORDER BY seq",
        )
        .bind(id.as_slice())
        .fetch_all(&self.pool)
        .await?;
        let mut job = row.into_record()?;
        let receipt: Option<(String,)> =
            sqlx::query_as("SELECT receipt::text FROM exchange_receipts WHERE job_id = $1")
                .bind(id.as_slice())
                .fetch_optional(&self.pool)
                .await?;
        job.receipt = receipt.map(|(r,)| serde_json::from_str(&r)).transpose()?;
        job.events = events
            .into_iter()
            .map(|(status, detail, at_ms)| {
                Ok(JobEvent {
                    status,
                    detail: serde_json::from_str(&detail)?,
                    at_ms,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Some(job))
    }

    /// An account's jobs, newest first, optionally of one status; at most `limit`.
    pub async fn jobs(
        &self,
        account: Address,
        status: Option<&str>,
        limit: u32,
    ) -> Result<Vec<JobRecord>> {
        let rows: Vec<JobRow> = sqlx::query_as(&format!(
            "{JOB_LIST_SELECT} WHERE account = $1 AND ($2::text IS NULL OR status = $2) \
             ORDER BY created_at DESC LIMIT $3"
        ))
        .bind(account.as_slice())
        .bind(status)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(JobRow::into_record).collect()
    }
}

const JOB_SELECT: &str = "SELECT id, account, chain_id, escrow_id, model, status, bundle_id, \
                          held_wei::text, decision::text, deadline_s, adapter, session_id, \
                          result::text FROM exchange_jobs";

/// [`JOB_SELECT`] for lists: a product (a matmul job's `result.product`, up to 5.6 MB of
/// base64) is left out, so a page of jobs stays small; `GET /v1/jobs/{id}` has it.
const JOB_LIST_SELECT: &str = "SELECT id, account, chain_id, escrow_id, model, status, \
                               bundle_id, held_wei::text, decision::text, deadline_s, adapter, \
                               session_id, (result - 'product')::text AS result FROM exchange_jobs";

#[derive(sqlx::FromRow)]
struct JobRow {
    id: Vec<u8>,
    account: Vec<u8>,
    chain_id: i64,
    escrow_id: i64,
    model: String,
    status: JobStatus,
    bundle_id: Option<String>,
    held_wei: String,
    decision: String,
    deadline_s: i64,
    adapter: Option<String>,
    session_id: Option<Vec<u8>>,
    result: Option<String>,
}

impl JobRow {
    fn into_record(self) -> Result<JobRecord> {
        let corrupt = |what| Error::Corrupt {
            what,
            value: String::new(),
        };
        Ok(JobRecord {
            id: B256::try_from(self.id.as_slice()).map_err(|_| corrupt("a job id"))?,
            account: Address::try_from(self.account.as_slice())
                .map_err(|_| corrupt("an address"))?,
            chain_id: self.chain_id as u64,
            escrow_id: self.escrow_id as u64,
            model: self.model,
            status: self.status,
            bundle_id: self.bundle_id,
            held_wei: parse_wei(&self.held_wei)?,
            decision: serde_json::from_str(&self.decision)?,
            deadline_s: self.deadline_s as u64,
            adapter: self.adapter,
            session_id: self
                .session_id
                .map(|id| B256::try_from(id.as_slice()).map_err(|_| corrupt("a session id")))
                .transpose()?,
            result: self.result.map(|r| serde_json::from_str(&r)).transpose()?,
            receipt: None,
            events: Vec::new(),
        })
    }
}

/// The statement that ends every unfinished job matching `condition` in state `status`: its
/// hold returns to its tab (and its session's cap), nothing is charged, and an event records
/// what was released and why. One statement, so a job is either ended with its hold released
/// or untouched. Returns the ended jobs' ids.
pub(super) fn release_sql(condition: &str, status: JobStatus, reason: &str) -> String {
    let status = status.as_str();
    format!(
        "WITH ended AS ( \
             UPDATE exchange_jobs SET status = '{status}', updated_at = now() WHERE {condition} \
             RETURNING id, chain_id, escrow_id, session_id, held_wei), \
         tabs AS ( \
             UPDATE exchange_tabs t SET held_wei = t.held_wei - d.released, updated_at = now() \
             FROM (SELECT chain_id, escrow_id, sum(held_wei) AS released FROM ended \
                   GROUP BY chain_id, escrow_id) d \
             WHERE t.chain_id = d.chain_id AND t.escrow_id = d.escrow_id RETURNING 1), \
         sessions AS ( \
             UPDATE exchange_sessions s SET spent_wei = s.spent_wei - d.released \
             FROM (SELECT session_id, sum(held_wei) AS released FROM ended \
                   WHERE session_id IS NOT NULL GROUP BY session_id) d \
             WHERE s.id = d.session_id RETURNING 1), \
         events AS ( \
             INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             SELECT ended.id, (SELECT coalesce(max(e.seq), -1) + 1 FROM exchange_job_events e \
                               WHERE e.job_id = ended.id), '{status}', \
                    jsonb_build_object('released_wei', ended.held_wei::text, 'reason', '{reason}') \
             FROM ended RETURNING 1) \
         SELECT id FROM ended"
    )
}

/// Job ids as the database returns them.
fn ids(rows: Vec<(Vec<u8>,)>) -> Result<Vec<B256>> {
    rows.into_iter()
        .map(|(id,)| {
            B256::try_from(id.as_slice()).map_err(|_| Error::Corrupt {
                what: "a job id",
                value: hex::encode(&id),
            })
        })
        .collect()
}

/// `order`, `job` and `runs` as one row of the statement that writes intents together.
fn row(order: &NewOrder, job: &NewJob, runs: &[NewRun]) -> Result<Row> {
    Ok(Row {
        tab: (
            to_i64(order.chain_id, "chain id")?,
            to_i64(job.escrow_id, "escrow id")?,
        ),
        nonce: order.nonce.to_string(),
        digest: order.digest.to_vec(),
        kind: order.kind,
        account: order.account.to_vec(),
        body: json_text(&order.body),
        mldsa_signature: order.mldsa_signature.clone(),
        limit_wei: order.limit_wei.map(wei_text),
        job_id: job.id.to_vec(),
        model: job.model.clone(),
        status: job.status.as_str(),
        bundle_id: job.bundle_id.clone(),
        held_wei: wei_text(job.held_wei),
        decision: json_text(&job.decision),
        deadline_s: to_i64(job.deadline_s, "deadline")?,
        adapter: job.adapter.clone(),
        request: json_text(&job.workload.request_value()),
        workload: job.workload.kind().as_str(),
        needed_until_s: to_i64(job.needed_until_s, "deadline")?,
        total_wei: wei_text(total_held(job, runs)?),
        jobs: 1 + runs.len() as i32,
        runs: runs
            .iter()
            .map(|r| RunRow {
                id: r.id.to_vec(),
                bundle_id: r.bundle_id.clone(),
                held_wei: wei_text(r.held_wei),
                decision: json_text(&r.decision),
                run: i16::from(r.run),
            })
            .collect(),
    })
}

/// The error of an order's statement alone: a reused nonce and an order accepted before by name.
fn accept_error(err: sqlx::Error, nonce: u64) -> Error {
    match constraint(&err) {
        Some("exchange_orders_nonce_unique") => Error::NonceReused { nonce },
        Some("exchange_orders_pkey") | Some("exchange_jobs_pkey") => Error::OrderExists,
        _ => err.into(),
    }
}

/// What a job and its runs hold together, wei.
pub(super) fn total_held(job: &NewJob, runs: &[NewRun]) -> Result<u128> {
    runs.iter()
        .try_fold(job.held_wei, |sum, r| sum.checked_add(r.held_wei))
        .ok_or(Error::ContextTooLarge)
}

/// The part of a statement that holds a job's and its runs' charge on its tab (`hold`, a row
/// when it took): a conditional update, so concurrent holds serialise on the row and none
/// takes more than the tab holds, nor more than a settlement batch of jobs. Parameters of
/// [`bind_job_with_runs`].
pub(super) const TAB_HOLD: &str = "\
    hold AS ( \
        UPDATE exchange_tabs SET jobs = jobs + $24, held_wei = held_wei + $23::numeric, \
                                 updated_at = now() \
        WHERE chain_id = $4 AND escrow_id = $5 AND buyer = $3 AND status = 'open' \
          AND deadline_s >= $22 AND held_wei + $23::numeric <= amount_wei AND jobs + $24 <= 400 \
        RETURNING 1)";

/// The parts of a statement that write a job, its first event, its verification runs and
/// theirs, once the statement's `gate` part (defined before them: a session's spend) returned
/// a row; an intent's are written with others' ([`super::accepts`]). The parts of one statement
/// do not see each other's rows, so the runs copy the job's columns from the parameters (the
/// foreign keys, checked at the statement's end, do see them). Parameters of
/// [`bind_job_with_runs`].
pub(super) const JOB_WITH_RUNS: &str = "\
    job AS ( \
        INSERT INTO exchange_jobs (id, order_digest, account, chain_id, escrow_id, model, status, \
                                   bundle_id, held_wei, decision, deadline_s, adapter, request, \
                                   workload, session_id) \
        SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9::numeric, $10::jsonb, $11, $12, $13::jsonb, \
               $14, $15 FROM gate \
        RETURNING id), \
    event AS ( \
        INSERT INTO exchange_job_events (job_id, seq, status) SELECT id, 0, $7 FROM job), \
    run AS ( \
        INSERT INTO exchange_jobs (id, order_digest, account, chain_id, escrow_id, model, status, \
                                   bundle_id, held_wei, decision, deadline_s, adapter, request, \
                                   workload, session_id, verifies, run) \
        SELECT r.id, $2, $3, $4, $5, $6, 'assigned', r.bundle_id, r.held::numeric, \
               r.decision::jsonb, $11, $12, $13::jsonb, $14, $15, $1, r.run \
        FROM job, unnest($16::bytea[], $17::text[], $18::text[], $19::text[], $20::int2[]) \
             AS r(id, bundle_id, held, decision, run) \
        RETURNING id, run), \
    run_event AS ( \
        INSERT INTO exchange_job_events (job_id, seq, status, detail) \
        SELECT id, 0, 'assigned', jsonb_build_object('verifies', $21::text, 'run', run) \
        FROM run)";

/// Binds the parameters of [`TAB_HOLD`] and [`JOB_WITH_RUNS`], `$1`..`$24` (a statement's own
/// start at `$25`): `job` and `runs`, of order `order_digest` (a session's calls name its
/// grant) by `account` on `chain_id`, made by session `session` if one.
pub(super) fn bind_job_with_runs<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    order_digest: B256,
    account: Address,
    chain_id: u64,
    job: &NewJob,
    runs: &[NewRun],
    session: Option<B256>,
) -> Result<sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>> {
    Ok(query
        .bind(job.id.to_vec())
        .bind(order_digest.to_vec())
        .bind(account.to_vec())
        .bind(to_i64(chain_id, "chain id")?)
        .bind(to_i64(job.escrow_id, "escrow id")?)
        .bind(job.model.clone())
        .bind(job.status)
        .bind(job.bundle_id.clone())
        .bind(wei_text(job.held_wei))
        .bind(json_text(&job.decision))
        .bind(to_i64(job.deadline_s, "deadline")?)
        .bind(job.adapter.clone())
        .bind(json_text(&job.workload.request_value()))
        .bind(job.workload.kind().as_str())
        .bind(session.map(|s| s.to_vec()))
        .bind(runs.iter().map(|r| r.id.to_vec()).collect::<Vec<_>>())
        .bind(runs.iter().map(|r| r.bundle_id.clone()).collect::<Vec<_>>())
        .bind(
            runs.iter()
                .map(|r| wei_text(r.held_wei))
                .collect::<Vec<_>>(),
        )
        .bind(
            runs.iter()
                .map(|r| json_text(&r.decision))
                .collect::<Vec<_>>(),
        )
        .bind(runs.iter().map(|r| i16::from(r.run)).collect::<Vec<_>>())
        .bind(job.id.to_string())
        .bind(to_i64(job.needed_until_s, "deadline")?)
        .bind(wei_text(total_held(job, runs)?))
        .bind(1 + runs.len() as i32))
}

/// Writes `runs` of job `original` (inserted in the same transaction): each copies the
/// original's order, buyer, tab, session, model, adapter, workload and deadline, and starts
/// `assigned` with an event naming the job it verifies.
pub(super) async fn insert_runs(
    tx: &mut PgConnection,
    original: B256,
    runs: &[NewRun],
) -> Result<()> {
    for run in runs {
        let inserted = sqlx::query(
            "WITH job AS ( \
                 INSERT INTO exchange_jobs (id, order_digest, account, chain_id, escrow_id, model, \
                                            status, bundle_id, held_wei, decision, deadline_s, \
                                            adapter, workload, request, session_id, verifies, \
                                            run) \
                 SELECT $1, order_digest, account, chain_id, escrow_id, model, 'assigned', $2, \
                        $3::numeric, $4::jsonb, deadline_s, adapter, workload, request, \
                        session_id, id, $5 \
                 FROM exchange_jobs WHERE id = $6 \
                 RETURNING id) \
             INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             SELECT id, 0, 'assigned', jsonb_build_object('verifies', $7::text, 'run', $5) \
             FROM job",
        )
        .bind(run.id.as_slice())
        .bind(&run.bundle_id)
        .bind(wei_text(run.held_wei))
        .bind(json_text(&run.decision))
        .bind(i16::from(run.run))
        .bind(original.as_slice())
        .bind(original.to_string())
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() != 1 {
            return Err(Error::UnknownJob);
        }
    }
    Ok(())
}

/// A job's workload as the books keep it: its kind (the `workload` column) and its request.
pub(super) fn stored_workload(kind: Option<&str>, request: Option<&str>) -> Result<Workload> {
    let corrupt = |what: &'static str, value: &str| Error::Corrupt {
        what,
        value: value.to_owned(),
    };
    let (Some(kind), Some(request)) = (kind, request) else {
        return Err(corrupt("a job without a workload", kind.unwrap_or("")));
    };
    let kind = WorkloadKind::parse(kind).ok_or_else(|| corrupt("a workload kind", kind))?;
    Ok(Workload::from_stored(kind, serde_json::from_str(request)?)?)
}
