//! Questions a test asks the exchange's books directly: consistency of holds, hand-outs after a
//! restart, a job's status, and waiting until every job ended.

use std::time::{Duration, Instant};

/// Every tab of the books whose hold is not the sum of what its live jobs hold (jobs expired,
/// refunded, failed or cancelled gave theirs back); empty when the books are consistent.
pub async fn tabs_off_their_jobs(books: &cx_exchange_server::books::Books) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT format('tab %s: holds %s, its live jobs %s', t.escrow_id, t.held_wei, \
                coalesce(sum(j.held_wei) FILTER (WHERE j.status NOT IN \
                    ('expired', 'refunded', 'failed', 'cancelled')), 0)) \
         FROM exchange_tabs t LEFT JOIN exchange_jobs j \
           ON j.chain_id = t.chain_id AND j.escrow_id = t.escrow_id \
         GROUP BY t.chain_id, t.escrow_id, t.held_wei \
         HAVING t.held_wei <> coalesce(sum(j.held_wei) FILTER (WHERE j.status NOT IN \
                    ('expired', 'refunded', 'failed', 'cancelled')), 0)",
    )
    .fetch_all(books.pool())
    .await
    .unwrap()
}

/// How many times a restarted exchange handed a job out again (its `running` events that say
/// so).
pub async fn handed_out_again(books: &cx_exchange_server::books::Books) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM exchange_job_events \
         WHERE status = 'running' AND (detail->>'handed_out_again')::boolean",
    )
    .fetch_one(books.pool())
    .await
    .unwrap()
}

/// Job `id`'s status in the books, `None` if there is no such job.
pub async fn job_status(
    books: &cx_exchange_server::books::Books,
    id: alloy::primitives::B256,
) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM exchange_jobs WHERE id = $1")
        .bind(id.as_slice())
        .fetch_optional(books.pool())
        .await
        .unwrap()
}

/// Waits until no job in the books is unfinished (every one done, settled, expired, refunded
/// or failed), at most `within`; returns the statuses counted.
pub async fn all_jobs_end(
    books: &cx_exchange_server::books::Books,
    within: Duration,
) -> Vec<(String, i64)> {
    let waited = Instant::now();
    loop {
        let counts: Vec<(String, i64)> =
            sqlx::query_as("SELECT status, count(*) FROM exchange_jobs GROUP BY status ORDER BY 1")
                .fetch_all(books.pool())
                .await
                .unwrap();
        if counts.iter().all(|(s, _)| {
            s.parse::<cx_exchange_server::books::JobStatus>()
                .is_ok_and(|s| s.is_terminal())
        }) {
            return counts;
        }
        assert!(
            waited.elapsed() < within,
            "jobs still unfinished after {within:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
