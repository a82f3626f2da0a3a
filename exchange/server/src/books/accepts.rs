//! Orders accepted together: every intent's order, job and runs are one row of a statement that
//! writes many, so the database pays its per-statement costs (the round trip, the executor's
//! start, the constraints' setup, the commit) once for a group instead of once per order.
//!
//! Each order is still all or nothing, as alone: its tab's hold is a conditional update of its
//! row, and its order, job, runs and events are inserted from the holds that took, so an order
//! whose tab cannot hold it writes nothing while the others of its group are written. A group
//! holds each tab once (one UPDATE cannot change a row twice). When the statement fails whole
//! (a reused nonce, an order sent twice), each of its orders is written again alone, so that
//! each gets its own answer ([`super::jobs`] maps it); a statement PostgreSQL aborted to break
//! a deadlock wrote nothing and is run again.
//!
//! Groups form by themselves: an order waits in a queue, and whoever finds one of the
//! [`WRITERS`] slots free writes what is queued, group after group, until the queue is empty.
//! An order arriving alone is written at once, alone; under load, the orders that arrived while
//! a statement ran form the next group. The groups are written on tasks of their own, so a
//! caller that goes away does not take with it the answers of the others in its group.

use sqlx::{PgConnection, PgPool};
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// Groups written at once at most: each takes a connection and (on a database of few cores) a
/// core of its own while it runs.
const WRITERS: usize = 4;

/// Orders in one statement at most.
const GROUP: usize = 64;

/// Times an order's statement alone is run when PostgreSQL aborts it to break a deadlock.
const CONTENDED_TRIES: usize = 3;

/// One order, its job and its runs, as the statement binds them ([`super::jobs`] makes it).
#[derive(Debug)]
pub(super) struct Row {
    /// `(chain id, escrow id)`: the tab the row holds on.
    pub(super) tab: (i64, i64),
    pub(super) nonce: String,
    pub(super) digest: Vec<u8>,
    pub(super) kind: &'static str,
    pub(super) account: Vec<u8>,
    pub(super) body: String,
    pub(super) mldsa_signature: Option<alloy::primitives::Bytes>,
    pub(super) limit_wei: Option<String>,
    pub(super) job_id: Vec<u8>,
    pub(super) model: String,
    pub(super) status: &'static str,
    pub(super) bundle_id: Option<String>,
    pub(super) held_wei: String,
    pub(super) decision: String,
    pub(super) deadline_s: i64,
    pub(super) adapter: Option<String>,
    pub(super) request: String,
    pub(super) workload: &'static str,
    pub(super) needed_until_s: i64,
    pub(super) total_wei: String,
    pub(super) jobs: i32,
    pub(super) runs: Vec<RunRow>,
}

/// One verification run of a [`Row`]'s job.
#[derive(Debug)]
pub(super) struct RunRow {
    pub(super) id: Vec<u8>,
    pub(super) bundle_id: String,
    pub(super) held_wei: String,
    pub(super) decision: String,
    pub(super) run: i16,
}

/// The statement: the rows as columns (`v`, numbered by their position), each tab's hold
/// (`hold`: the rows whose hold took), and from those rows alone the orders and the jobs, and
/// from the jobs inserted their first events, their runs and theirs (so a job already in the
/// books fails on its own key, not its event's). The parts of one statement do not see each
/// other's rows, so the runs copy their job's columns from `held`; the foreign keys, checked at
/// the statement's end, see them. PostgreSQL runs each part of a WITH to its end, read or not.
const ACCEPT: &str = "\
    WITH v AS ( \
        SELECT * FROM unnest($1::int8[], $2::int8[], $3::bytea[], $4::text[], $5::bytea[], \
                             $6::text[], $7::text[], $8::bytea[], $9::text[], $10::bytea[], \
                             $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], \
                             $16::int8[], $17::text[], $18::text[], $19::text[], $20::int8[], \
                             $21::text[], $22::int4[]) \
            WITH ORDINALITY AS v(chain_id, escrow_id, digest, kind, account, nonce, body, \
                                 mldsa_signature, limit_wei, job_id, model, status, bundle_id, \
                                 held_wei, decision, deadline_s, adapter, request, workload, \
                                 needed_until_s, total_wei, jobs, i)), \
    hold AS ( \
        UPDATE exchange_tabs t SET jobs = t.jobs + v.jobs, \
                                   held_wei = t.held_wei + v.total_wei::numeric, \
                                   updated_at = now() \
        FROM v \
        WHERE t.chain_id = v.chain_id AND t.escrow_id = v.escrow_id AND t.buyer = v.account \
          AND t.status = 'open' AND t.deadline_s >= v.needed_until_s \
          AND t.held_wei + v.total_wei::numeric <= t.amount_wei AND t.jobs + v.jobs <= 400 \
        RETURNING v.i), \
    held AS (SELECT v.* FROM v JOIN hold USING (i)), \
    gate AS ( \
        INSERT INTO exchange_orders (digest, kind, account, chain_id, nonce, body, \
                                     mldsa_signature, limit_wei) \
        SELECT digest, kind, account, chain_id, nonce::numeric, body::jsonb, mldsa_signature, \
               limit_wei::numeric FROM held), \
    job AS ( \
        INSERT INTO exchange_jobs (id, order_digest, account, chain_id, escrow_id, model, status, \
                                   bundle_id, held_wei, decision, deadline_s, adapter, request, \
                                   workload) \
        SELECT job_id, digest, account, chain_id, escrow_id, model, status, bundle_id, \
               held_wei::numeric, decision::jsonb, deadline_s, adapter, request::jsonb, workload \
        FROM held \
        RETURNING id, status), \
    event AS ( \
        INSERT INTO exchange_job_events (job_id, seq, status) SELECT id, 0, status FROM job), \
    run AS ( \
        INSERT INTO exchange_jobs (id, order_digest, account, chain_id, escrow_id, model, status, \
                                   bundle_id, held_wei, decision, deadline_s, adapter, request, \
                                   workload, verifies, run) \
        SELECT r.id, h.digest, h.account, h.chain_id, h.escrow_id, h.model, 'assigned', \
               r.bundle_id, r.held_wei::numeric, r.decision::jsonb, h.deadline_s, h.adapter, \
               h.request::jsonb, h.workload, h.job_id, r.run \
        FROM job JOIN held h ON h.job_id = job.id JOIN unnest($23::int8[], $24::bytea[], $25::text[], $26::text[], \
                                $27::text[], $28::int2[]) \
                         AS r(i, id, bundle_id, held_wei, decision, run) ON r.i = h.i \
        RETURNING id, run, verifies), \
    run_event AS ( \
        INSERT INTO exchange_job_events (job_id, seq, status, detail) \
        SELECT id, 0, 'assigned', \
               jsonb_build_object('verifies', '0x' || encode(verifies, 'hex'), 'run', run) \
        FROM run) \
    SELECT i FROM hold";

/// Writes `rows` in one statement on `conn` (alone, its own transaction; in the caller's, with
/// it). For each row, whether its tab's hold took (and so it was written). An error: nothing
/// was written.
pub(super) async fn accept_rows(
    conn: &mut PgConnection,
    rows: &[&Row],
) -> std::result::Result<Vec<bool>, sqlx::Error> {
    fn column<'r, R, T>(items: &'r [R], f: impl Fn(&'r R) -> T) -> Vec<T> {
        items.iter().map(f).collect()
    }
    let runs: Vec<(i64, &RunRow)> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.runs.iter().map(move |run| (i as i64 + 1, run)))
        .collect();
    let held: Vec<(i64,)> = sqlx::query_as(ACCEPT)
        .bind(column(rows, |r| r.tab.0))
        .bind(column(rows, |r| r.tab.1))
        .bind(column(rows, |r| r.digest.as_slice()))
        .bind(column(rows, |r| r.kind))
        .bind(column(rows, |r| r.account.as_slice()))
        .bind(column(rows, |r| r.nonce.as_str()))
        .bind(column(rows, |r| r.body.as_str()))
        .bind(column(rows, |r| r.mldsa_signature.as_ref().map(|s| &s[..])))
        .bind(column(rows, |r| r.limit_wei.as_deref()))
        .bind(column(rows, |r| r.job_id.as_slice()))
        .bind(column(rows, |r| r.model.as_str()))
        .bind(column(rows, |r| r.status))
        .bind(column(rows, |r| r.bundle_id.as_deref()))
        .bind(column(rows, |r| r.held_wei.as_str()))
        .bind(column(rows, |r| r.decision.as_str()))
        .bind(column(rows, |r| r.deadline_s))
        .bind(column(rows, |r| r.adapter.as_deref()))
        .bind(column(rows, |r| r.request.as_str()))
        .bind(column(rows, |r| r.workload))
        .bind(column(rows, |r| r.needed_until_s))
        .bind(column(rows, |r| r.total_wei.as_str()))
        .bind(column(rows, |r| r.jobs))
        .bind(column(&runs, |(i, _)| *i))
        .bind(column(&runs, |(_, r)| r.id.as_slice()))
        .bind(column(&runs, |(_, r)| r.bundle_id.as_str()))
        .bind(column(&runs, |(_, r)| r.held_wei.as_str()))
        .bind(column(&runs, |(_, r)| r.decision.as_str()))
        .bind(column(&runs, |(_, r)| r.run))
        .fetch_all(&mut *conn)
        .await?;
    let mut took = vec![false; rows.len()];
    for (i,) in held {
        if let Some(t) = usize::try_from(i - 1).ok().and_then(|i| took.get_mut(i)) {
            *t = true;
        }
    }
    Ok(took)
}

/// What a row's writing answers: whether its hold took, or the error of its statement alone.
type Answer = std::result::Result<bool, sqlx::Error>;

struct Waiting {
    row: Row,
    answer: oneshot::Sender<Answer>,
}

/// The queue of orders waiting to be written, and the slots of those writing them.
#[derive(Debug)]
pub(super) struct Group {
    queue: Mutex<Queue>,
    slots: Arc<Semaphore>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Tabs a group being written holds on: the next groups leave their rows queued, so two
    /// statements never wait on each other's tab rows.
    writing: HashSet<(i64, i64)>,
}

impl Queue {
    /// Whether a waiting row's tab is free of the groups being written.
    fn takeable(&self) -> bool {
        self.waiting
            .iter()
            .any(|w| !self.writing.contains(&w.row.tab))
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("waiting", &self.waiting.len())
            .field("writing", &self.writing.len())
            .finish()
    }
}

impl Default for Group {
    fn default() -> Self {
        Self {
            queue: Mutex::default(),
            slots: Arc::new(Semaphore::new(WRITERS)),
        }
    }
}

impl Group {
    /// Writes `row` on `pool`, in a group with whatever else is queued: whether its hold took.
    pub(super) async fn accept(self: &Arc<Self>, pool: &PgPool, row: Row) -> Answer {
        let (answer, answered) = oneshot::channel();
        self.lock().waiting.push_back(Waiting { row, answer });
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            tokio::spawn(self.clone().write(pool.clone(), slot));
        }
        // Every writer looks at the queue again after giving its slot back, and the writer of a
        // group takes again once it is written, so a row queued while all slots were taken, or
        // while its tab was being written, is written by one of them.
        answered.await.unwrap_or(Err(sqlx::Error::WorkerCrashed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves the queue whole: every change is one push or
        // one drain of whole entries.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes groups from the queue while it has rows, holding `slot`.
    async fn write(self: Arc<Self>, pool: PgPool, mut slot: OwnedSemaphorePermit) {
        loop {
            loop {
                let group = self.take();
                if group.is_empty() {
                    break;
                }
                let _writing = Writing {
                    group: &self,
                    tabs: group.iter().map(|w| w.row.tab).collect(),
                };
                write_group(&pool, group).await;
            }
            drop(slot);
            // Rows whose tab a group being written holds are left to that group's writer, which
            // takes again once it is written.
            if !self.lock().takeable() {
                return;
            }
            match self.slots.clone().try_acquire_owned() {
                Ok(again) => slot = again,
                // Another writer holds a slot: it looks at the queue after giving it back.
                Err(_) => return,
            }
        }
    }

    /// The next group: queued rows in their order, each tab once and none a group being written
    /// holds on, at most [`GROUP`]; sorted by tab, so that statements lock tab rows in one order.
    fn take(&self) -> Vec<Waiting> {
        let mut queue = self.lock();
        let Queue { waiting, writing } = &mut *queue;
        let mut group = Vec::new();
        let mut left = VecDeque::with_capacity(waiting.len());
        for w in waiting.drain(..) {
            if group.len() < GROUP && writing.insert(w.row.tab) {
                group.push(w);
            } else {
                left.push_back(w);
            }
        }
        *waiting = left;
        group.sort_by_key(|w| w.row.tab);
        group
    }
}

/// The tabs of a group being written, given back when it is written (or its writer panicked:
/// the tabs' next rows are written all the same).
struct Writing<'g> {
    group: &'g Group,
    tabs: Vec<(i64, i64)>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut queue = self.group.lock();
        for tab in &self.tabs {
            queue.writing.remove(tab);
        }
    }
}

/// Writes `group` in one statement, or (when it fails whole) each of its rows alone, and
/// answers each row.
async fn write_group(pool: &PgPool, group: Vec<Waiting>) {
    let rows: Vec<&Row> = group.iter().map(|w| &w.row).collect();
    let together = match pool.acquire().await {
        Ok(mut conn) => accept_rows(&mut conn, &rows).await,
        Err(err) => Err(err),
    };
    match together {
        Ok(took) => {
            for (w, took) in group.into_iter().zip(took) {
                // The caller may have gone: its row is written all the same.
                let _ = w.answer.send(Ok(took));
            }
        }
        Err(err) if group.len() == 1 && !crate::error::is_contention(&err) => {
            let _ = group.into_iter().next().map(|w| w.answer.send(Err(err)));
        }
        // PostgreSQL away (or this node fenced off): each alone would wait for a connection in
        // turn, so each is answered at once, as its own statement would have been.
        Err(err) if crate::error::is_outage(&err) => {
            for w in group {
                let away = std::io::Error::other(format!("the books are unreachable: {err}"));
                let _ = w.answer.send(Err(sqlx::Error::Io(away)));
            }
        }
        Err(_) => {
            for w in group {
                let _ = w.answer.send(write_alone(pool, &w.row).await);
            }
        }
    }
}

/// Writes `row` in a statement of its own; one that PostgreSQL aborted to break a deadlock
/// wrote nothing and is run again, at most [`CONTENDED_TRIES`] times. The deadlock this meets:
/// an order sent again (its answer lost) holds its tab, then its job's unique check waits on
/// the job's row, which a statement ending that job has changed and whose next step waits on
/// the tab. Once the other commits, the order's statement finds its job and fails on its key.
async fn write_alone(pool: &PgPool, row: &Row) -> Answer {
    let mut tries = 1;
    loop {
        let alone = match pool.acquire().await {
            Ok(mut conn) => accept_rows(&mut conn, &[row]).await,
            Err(err) => Err(err),
        };
        match alone {
            Err(err) if crate::error::is_contention(&err) && tries < CONTENDED_TRIES => {
                tries += 1;
            }
            alone => return alone.map(|took| took[0]),
        }
    }
}
