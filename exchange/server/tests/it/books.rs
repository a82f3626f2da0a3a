//! The books on a real PostgreSQL, each test on its own throwaway database: creation and
//! migration, tabs that concurrent intents cannot overspend, replays refused with nothing written,
//! the chain watcher's writes idempotent.

use crate::common::{TestDb, with_database};
use alloy::primitives::{Address, B256};
use cx_exchange_server::Error;
use cx_exchange_server::books::{
    Books, JobStatus, NewJob, NewOrder, NewRun, StandingTerms, StoredBinding, TabEvent,
    database_url,
};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

#[tokio::test]
async fn open_creates_and_migrates_a_missing_database_and_is_idempotent() {
    let base = database_url();
    let name = format!(
        "cx_books_test_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let url = with_database(&base, &name);

    let books = Books::open(&url).await.expect("created and migrated");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' ORDER BY table_name",
    )
    .fetch_all(books.pool())
    .await
    .unwrap();
    for table in [
        "settlement_batches",
        "settlement_receipts",
        "_sqlx_migrations",
    ] {
        assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
    }
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(books.pool())
        .await
        .unwrap();
    books.pool().close().await;

    let again = Books::open(&url).await.expect("opened again");
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(again.pool())
        .await
        .unwrap();
    assert_eq!(applied, still);
    again.pool().close().await;

    let mut admin = PgConnection::connect(&with_database(&base, "postgres"))
        .await
        .unwrap();
    sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();
}

const CHAIN: u64 = 31337;

fn buyer() -> Address {
    Address::repeat_byte(0xb1)
}

async fn open_tab(books: &Books, escrow_id: u64, amount_wei: u128, deadline_s: u64) {
    books
        .apply_chain(
            CHAIN,
            &[TabEvent::Opened {
                escrow_id,
                buyer: buyer(),
                amount_wei,
                deadline_s,
                reference: B256::repeat_byte(7),
                block: 3,
            }],
            &[],
            4,
            None,
        )
        .await
        .unwrap();
}

fn order(nonce: u64, digest_byte: u64) -> NewOrder {
    let mut digest = [0u8; 32];
    digest[..8].copy_from_slice(&digest_byte.to_be_bytes());
    NewOrder {
        digest: B256::from(digest),
        kind: "intent",
        account: buyer(),
        chain_id: CHAIN,
        nonce,
        body: serde_json::json!({"nonce": nonce}),
        mldsa_signature: None,
        // No room past what a job holds, as the synthetic body had no limit to read.
        limit_wei: Some(0),
    }
}

fn job(order: &NewOrder, escrow_id: u64, held_wei: u128) -> NewJob {
    NewJob {
        id: order.digest,
        escrow_id,
        model: "m".into(),
        status: JobStatus::Assigned,
        bundle_id: Some("b1".into()),
        held_wei,
        needed_until_s: 100,
        decision: serde_json::json!({"chosen": "b1"}),
        deadline_s: 90,
        adapter: None,
        workload: cx_protocol::workload::Workload::Inference(
            cx_protocol::order::InferenceRequest {
                prompt: "p".into(),
                max_tokens: 4,
                ..Default::default()
            },
        ),
    }
}

async fn count(books: &Books, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(books.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn concurrent_intents_never_hold_more_than_the_tab() {
    let db = TestDb::new().await;
    let books = db.books().await;
    open_tab(&books, 1, 1_000, 1_000).await;
    // 50 intents of 30 wei race for 1000 wei: exactly 33 fit.
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let books = books.clone();
            tokio::spawn(async move {
                let o = order(i, i);
                books.accept(&o, &job(&o, 1, 30)).await
            })
        })
        .collect();
    let mut accepted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => accepted += 1,
            Err(Error::TabOverspent { needed_wei, .. }) => assert_eq!(needed_wei, 30),
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(accepted, 33);
    let tab = books.tab(CHAIN, 1).await.unwrap().unwrap();
    assert_eq!(tab.held_wei, 990);
    assert_eq!(count(&books, "exchange_jobs").await, 33);
    // A refused order leaves no row behind: its nonce is still free.
    assert_eq!(count(&books, "exchange_orders").await, 33);
}

#[tokio::test]
async fn orders_written_together_each_get_their_own_answer_and_write_all_or_nothing() {
    let db = TestDb::new().await;
    let books = db.books().await;
    // 20 tabs of 100 wei, 200 concurrent orders of 30 wei (a job of 20 and its run of 10), ten
    // on each tab, so three fit on each; every seventh reuses the nonce of the order before it.
    for tab in 1..=20 {
        open_tab(&books, tab, 100, 1_000).await;
    }
    let tasks: Vec<_> = (0..200u64)
        .map(|i| {
            let books = books.clone();
            tokio::spawn(async move {
                let o = order(if i % 7 == 6 { i - 1 } else { i }, 1_000 + i);
                let run = NewRun {
                    id: B256::from(cx_protocol::replica::run_job_id(o.digest.0, 1)),
                    run: 1,
                    bundle_id: "b2".into(),
                    held_wei: 10,
                    decision: serde_json::json!({"chosen": "b2"}),
                };
                let tab = 1 + i % 20;
                (
                    tab,
                    books.accept_with_runs(&o, &job(&o, tab, 20), &[run]).await,
                )
            })
        })
        .collect();
    let mut accepted = std::collections::HashMap::<u64, i64>::new();
    for task in tasks {
        match task.await.unwrap() {
            (tab, Ok(())) => *accepted.entry(tab).or_default() += 1,
            (_, Err(Error::TabOverspent { needed_wei: 30, .. } | Error::NonceReused { .. })) => {}
            (_, Err(other)) => panic!("{other}"),
        }
    }
    assert_eq!(accepted.values().sum::<i64>(), 60);
    for tab in 1..=20 {
        assert_eq!(accepted[&tab], 3, "tab {tab}");
        let held = books.tab(CHAIN, tab).await.unwrap().unwrap().held_wei;
        assert_eq!(held, 90, "tab {tab}");
    }
    // Each accepted order wrote itself, its job, its run and their two events; nothing else.
    assert_eq!(count(&books, "exchange_orders").await, 60);
    assert_eq!(count(&books, "exchange_jobs").await, 120);
    assert_eq!(count(&books, "exchange_job_events").await, 120);
    let runs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM exchange_jobs r JOIN exchange_jobs j ON j.id = r.verifies \
         JOIN exchange_job_events e ON e.job_id = r.id \
         WHERE r.run = 1 AND r.escrow_id = j.escrow_id AND r.order_digest = j.order_digest \
           AND e.detail ->> 'verifies' = '0x' || encode(j.id, 'hex')",
    )
    .fetch_one(books.pool())
    .await
    .unwrap();
    assert_eq!(runs, 60);
}

#[tokio::test]
async fn a_replayed_nonce_or_a_closed_tab_writes_nothing() {
    let db = TestDb::new().await;
    let books = db.books().await;
    open_tab(&books, 1, 1_000, 1_000).await;
    let first = order(7, 1);
    books.accept(&first, &job(&first, 1, 10)).await.unwrap();
    let replay = order(7, 2);
    let err = books
        .accept(&replay, &job(&replay, 1, 10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NonceReused { nonce: 7 }), "{err}");
    let again = books.accept(&first, &job(&first, 1, 10)).await.unwrap_err();
    assert!(matches!(again, Error::OrderExists), "{again}");

    let unknown = order(8, 3);
    let err = books
        .accept(&unknown, &job(&unknown, 9, 10))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::UnknownTab { escrow_id: 9, .. }),
        "{err}"
    );
    let late = order(9, 4);
    let mut late_job = job(&late, 1, 10);
    late_job.needed_until_s = 5_000;
    let err = books.accept(&late, &late_job).await.unwrap_err();
    assert!(matches!(err, Error::TabEndsTooSoon { .. }), "{err}");

    // A tab that took as many jobs as one batch part settles takes no more (it settles whole).
    sqlx::query("UPDATE exchange_tabs SET jobs = 400 WHERE escrow_id = 1")
        .execute(books.pool())
        .await
        .unwrap();
    let full = order(11, 6);
    let err = books.accept(&full, &job(&full, 1, 10)).await.unwrap_err();
    assert!(matches!(err, Error::TabFull { jobs: 400, .. }), "{err}");
    sqlx::query("UPDATE exchange_tabs SET jobs = 1 WHERE escrow_id = 1")
        .execute(books.pool())
        .await
        .unwrap();

    books
        .apply_chain(
            CHAIN,
            &[TabEvent::Reclaimed {
                escrow_id: 1,
                block: 8,
            }],
            &[],
            9,
            None,
        )
        .await
        .unwrap();
    let closed = order(10, 5);
    let err = books
        .accept(&closed, &job(&closed, 1, 10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TabClosed { .. }), "{err}");

    assert_eq!(count(&books, "exchange_orders").await, 1);
    assert_eq!(count(&books, "exchange_jobs").await, 1);
    assert_eq!(books.tab(CHAIN, 1).await.unwrap().unwrap().held_wei, 10);
    let stored = books.job(first.digest).await.unwrap().unwrap();
    assert_eq!(stored.status, JobStatus::Assigned);
    assert_eq!(stored.events.len(), 1);
    assert_eq!(
        books
            .jobs(buyer(), Some("assigned"), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        books
            .jobs(buyer(), Some("done"), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_watchers_writes_are_idempotent_and_its_cursor_only_moves_forward() {
    let db = TestDb::new().await;
    let books = db.books().await;
    assert_eq!(books.chain_cursor(CHAIN).await.unwrap(), 0);
    open_tab(&books, 1, 500, 1_000).await;
    open_tab(&books, 1, 500, 1_000).await;
    assert_eq!(count(&books, "exchange_tabs").await, 1);
    assert_eq!(books.chain_cursor(CHAIN).await.unwrap(), 4);
    books.apply_chain(CHAIN, &[], &[], 2, None).await.unwrap();
    assert_eq!(
        books.chain_cursor(CHAIN).await.unwrap(),
        4,
        "never backwards"
    );
    let tab = books.tab(CHAIN, 1).await.unwrap().unwrap();
    assert_eq!(
        (tab.amount_wei, tab.available_wei(), tab.buyer),
        (500, 500, buyer())
    );
}

#[tokio::test]
async fn a_key_binds_one_account_and_an_account_one_key() {
    let db = TestDb::new().await;
    let books = db.books().await;
    let binding = |account: Address, key: u8| StoredBinding {
        account,
        chain_id: CHAIN,
        mldsa_key: vec![key; 8],
        mldsa_key_hash: B256::repeat_byte(key),
        binding: serde_json::json!({}),
    };
    books.bind(&binding(buyer(), 1)).await.unwrap();
    books.bind(&binding(buyer(), 1)).await.unwrap();
    assert!(matches!(
        books.bind(&binding(buyer(), 2)).await,
        Err(Error::AccountAlreadyBound(_))
    ));
    assert!(matches!(
        books.bind(&binding(Address::repeat_byte(9), 1)).await,
        Err(Error::KeyAlreadyBound)
    ));
    assert_eq!(
        books
            .binding(buyer())
            .await
            .unwrap()
            .unwrap()
            .mldsa_key_hash,
        B256::repeat_byte(1)
    );
}

/// Issue 32, item 3: the exchange gave a slash up after five refused tries, so an accused
/// provider only had to outlast five passes (a key change, a committee stalled for a minute).
/// A refused slash is now retried with backoff until the retry horizon; only then is it failed.
#[tokio::test]
async fn a_refused_slash_is_retried_with_backoff_until_its_horizon_not_given_up_after_five() {
    let db = TestDb::new().await;
    let books = db.books().await;
    open_tab(&books, 1, 1_000, 1_000).await;
    let o = order(0, 1);
    books.accept(&o, &job(&o, 1, 30)).await.unwrap();
    let evidence = B256::repeat_byte(0x5a);
    sqlx::query(
        "INSERT INTO exchange_slashes (evidence_hash, job_id, chain_id, evidence) \
         VALUES ($1, $2, $3, '{}'::jsonb)",
    )
    .bind(evidence.as_slice())
    .bind(o.digest.as_slice())
    .bind(CHAIN as i64)
    .execute(books.pool())
    .await
    .unwrap();
    let state = async || -> (String, i32, bool) {
        sqlx::query_as(
            "SELECT status, attempts, next_attempt_at > now() FROM exchange_slashes \
             WHERE evidence_hash = $1",
        )
        .bind(evidence.as_slice())
        .fetch_one(books.pool())
        .await
        .unwrap()
    };
    assert_eq!(books.pending_slashes(8).await.unwrap().len(), 1);
    for _ in 0..8 {
        books
            .slash_attempt_failed(evidence, "refused by 3 signers")
            .await
            .unwrap();
    }
    assert_eq!(state().await, ("pending".into(), 8, true));
    // Waiting out its backoff, it is not offered to the next pass.
    assert!(books.pending_slashes(8).await.unwrap().is_empty());
    // The backoff is capped (1 h), so it comes back within the hour.
    let wait_s: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM exchange_slashes",
    )
    .fetch_one(books.pool())
    .await
    .unwrap();
    assert!(wait_s <= 3_600.0, "{wait_s}");
    sqlx::query("UPDATE exchange_slashes SET next_attempt_at = now()")
        .execute(books.pool())
        .await
        .unwrap();
    assert_eq!(books.pending_slashes(8).await.unwrap().len(), 1);
    // Past the horizon, the next refusal gives it up, reason kept.
    sqlx::query("UPDATE exchange_slashes SET created_at = now() - interval '31 days'")
        .execute(books.pool())
        .await
        .unwrap();
    books
        .slash_attempt_failed(evidence, "nothing at stake")
        .await
        .unwrap();
    assert_eq!(state().await.0, "failed");
}

/// `exchange_jobs.status` takes exactly the names of `JobStatus`: each state a job can be in is
/// written and read back through the enum, and any other name (a typo in a statement, or
/// `settled`, which is a batch's state, not a job's) is refused by the column's CHECK.
#[tokio::test]
async fn job_status_check_allows_exactly_the_lifecycle() {
    let db = TestDb::new().await;
    let books = db.books().await;
    open_tab(&books, 1, 1_000, 1_000).await;
    let o = order(1, 1);
    books.accept(&o, &job(&o, 1, 30)).await.unwrap();
    for status in JobStatus::ALL {
        sqlx::query("UPDATE exchange_jobs SET status = $2 WHERE id = $1")
            .bind(o.digest.as_slice())
            .bind(status)
            .execute(books.pool())
            .await
            .unwrap();
        let stored = books.job(o.digest).await.unwrap().unwrap();
        assert_eq!(stored.status, status);
    }
    for name in ["settled", "Running", "pending", ""] {
        let err = sqlx::query("UPDATE exchange_jobs SET status = $2 WHERE id = $1")
            .bind(o.digest.as_slice())
            .bind(name)
            .execute(books.pool())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("exchange_jobs_status_check"),
            "{name}: {err}"
        );
    }
}

/// `exchange_jobs.workload` takes exactly the names of `WorkloadKind`, and a job has one exactly
/// when it has a request: what a job computes is kept beside it, never worked out again from its
/// market's name.
#[tokio::test]
async fn job_workload_check_allows_exactly_the_kinds() {
    let db = TestDb::new().await;
    let books = db.books().await;
    open_tab(&books, 1, 1_000, 1_000).await;
    let o = order(1, 1);
    books.accept(&o, &job(&o, 1, 30)).await.unwrap();
    let set = |kind: Option<&'static str>| {
        sqlx::query("UPDATE exchange_jobs SET workload = $2 WHERE id = $1")
            .bind(o.digest.as_slice())
            .bind(kind)
            .execute(books.pool())
    };
    let stored: (Option<String>,) =
        sqlx::query_as("SELECT workload FROM exchange_jobs WHERE id = $1")
            .bind(o.digest.as_slice())
            .fetch_one(books.pool())
            .await
            .unwrap();
    assert_eq!(stored.0.as_deref(), Some("inference"));
    for kind in cx_protocol::workload::WorkloadKind::ALL {
        set(Some(kind.as_str())).await.unwrap();
    }
    for name in [Some("search"), Some("Inference"), Some(""), None] {
        let err = set(name).await.unwrap_err();
        // Not a kind the exchange knows (exchange_jobs_workload_kind), or none for a request
        // (exchange_jobs_workload_check).
        assert!(
            err.to_string().contains("exchange_jobs_workload_"),
            "{name:?}: {err}"
        );
    }
}

/// A reserve's terms: a window from 100 s to 200 s, 300 ms of compute on `tiny`.
fn reserve_terms() -> StandingTerms {
    StandingTerms {
        ends_s: 200,
        starts_s: Some(100),
        model: Some("tiny".into()),
        compute_ms: Some(300),
        ..StandingTerms::default()
    }
}

/// A standing order's terms that statements compare are columns, written with the order in one
/// statement: each kind has exactly its own (the CHECK refuses a reserve without its window or a
/// rent without its target), and a refused order leaves nothing behind, its hold included.
#[tokio::test]
async fn standing_order_terms_are_columns_each_kind_exactly_its_own() {
    let db = TestDb::new().await;
    let books = db.books().await;
    open_tab(&books, 1, 1_000, 1_000).await;
    let standing = |kind: &'static str, nonce: u64| NewOrder {
        kind,
        limit_wei: None,
        ..order(nonce, 100 + nonce)
    };
    let reserve = reserve_terms();
    let rent = StandingTerms {
        ends_s: 250,
        target: Some(B256::repeat_byte(0xab)),
        target_kind: Some(cx_protocol::order::RentTarget::Base),
        epsilon_ppm: Some(50_000),
        ..StandingTerms::default()
    };
    let search = StandingTerms {
        ends_s: 300,
        ..StandingTerms::default()
    };
    books
        .accept_standing(&standing("reserve", 1), 1, 10, &reserve, 500)
        .await
        .unwrap();
    books
        .accept_standing(&standing("rent", 2), 1, 10, &rent, 500)
        .await
        .unwrap();
    books
        .accept_standing(&standing("search", 3), 1, 10, &search, 500)
        .await
        .unwrap();
    // The tabs whose intents may draw on a reserve: its own tab until it ends, only it.
    assert_eq!(books.reserve_tabs(199).await.unwrap(), vec![(CHAIN, 1)]);
    assert!(books.reserve_tabs(200).await.unwrap().is_empty());
    type Row = (
        String,
        i64,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<String>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT kind, ends_s, starts_s, model, compute_ms, target, epsilon_ppm, target_kind \
         FROM exchange_standing_orders ORDER BY ends_s",
    )
    .fetch_all(books.pool())
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            (
                "reserve".into(),
                200,
                Some(100),
                Some("tiny".into()),
                Some(300),
                None,
                None,
                None
            ),
            (
                "rent".into(),
                250,
                None,
                None,
                None,
                Some("ab".repeat(32)),
                Some(50_000),
                Some("base".into())
            ),
            ("search".into(), 300, None, None, None, None, None, None),
        ]
    );
    let held = |books: Books| async move {
        sqlx::query_scalar::<_, String>("SELECT held_wei::text FROM exchange_tabs")
            .fetch_one(books.pool())
            .await
            .unwrap()
    };
    assert_eq!(held(books.clone()).await, "30");
    let without_window = StandingTerms {
        starts_s: None,
        ..reserve.clone()
    };
    let without_target = StandingTerms {
        target: None,
        ..rent.clone()
    };
    for (kind, nonce, terms) in [
        ("reserve", 4, &without_window),
        ("rent", 5, &without_target),
        ("search", 6, &reserve),
    ] {
        let err = books
            .accept_standing(&standing(kind, nonce), 1, 10, terms, 500)
            .await
            .unwrap_err();
        let Error::Database(err) = err else {
            panic!("{kind}: {err}");
        };
        assert!(
            err.to_string().contains("exchange_standing_orders_terms"),
            "{kind}: {err}"
        );
    }
    assert_eq!(count(&books, "exchange_standing_orders").await, 3);
    assert_eq!(count(&books, "exchange_orders").await, 3);
    assert_eq!(held(books.clone()).await, "30");
}

/// An order's ML-DSA co-signature is stored as its bytes beside a body holding `"0x"` in its
/// place (intents written together and standing orders alike), and `exchange_order_body(o)`
/// gives the signed order as received; an order without one is stored whole.
#[tokio::test]
async fn a_co_signature_is_stored_as_bytes_and_the_order_read_back_whole() {
    use cx_protocol::order::Signed;
    let db = TestDb::new().await;
    let books = db.books().await;
    open_tab(&books, 1, 1_000, 1_000).await;
    let signed = Signed {
        account: buyer(),
        chain_id: CHAIN,
        verifying_contract: Address::repeat_byte(0x5e),
        order: serde_json::json!({"nonce": 1, "want": "m"}),
        signature: vec![0x1b; 65].into(),
        mldsa_signature: (0..3309u32).map(|i| (i * 7 + 3) as u8).collect(),
    };
    let (bare, cosignature) = NewOrder::split_cosignature(&signed);
    assert_eq!(cosignature.as_ref(), Some(&signed.mldsa_signature));
    let as_stored = |key: &str| {
        (
            serde_json::json!({ key: bare, "request": {"prompt": "p"} }),
            serde_json::json!({ key: signed, "request": {"prompt": "p"} }),
        )
    };
    let (body, intent_received) = as_stored("intent");
    let intent = NewOrder {
        body,
        mldsa_signature: cosignature.clone(),
        ..order(1, 1)
    };
    books.accept(&intent, &job(&intent, 1, 10)).await.unwrap();
    let (body, reserve_received) = as_stored("reserve");
    let reserve = NewOrder {
        kind: "reserve",
        limit_wei: None,
        body,
        mldsa_signature: cosignature.clone(),
        ..order(2, 2)
    };
    let terms = reserve_terms();
    books
        .accept_standing(&reserve, 1, 10, &terms, 500)
        .await
        .unwrap();
    let unsigned = order(3, 3);
    books
        .accept(&unsigned, &job(&unsigned, 1, 10))
        .await
        .unwrap();
    for (order, received) in [
        (&intent, &intent_received),
        (&reserve, &reserve_received),
        (&unsigned, &unsigned.body),
    ] {
        let (body, stored, whole): (serde_json::Value, Option<Vec<u8>>, serde_json::Value) =
            sqlx::query_as(
                "SELECT o.body, o.mldsa_signature, exchange_order_body(o) \
                 FROM exchange_orders o WHERE digest = $1",
            )
            .bind(order.digest.as_slice())
            .fetch_one(books.pool())
            .await
            .unwrap();
        assert_eq!(&whole, received, "{}", order.kind);
        assert_eq!(&body, &order.body);
        assert_eq!(
            stored.as_deref(),
            order.mldsa_signature.as_ref().map(|s| &s[..])
        );
    }
    let read = books.standing_order(reserve.digest).await.unwrap().unwrap();
    assert_eq!(
        read.order, reserve_received,
        "the standing order as read is the one received"
    );
}

/// An order sent again while its job is being ended (a provider's result, a sweep: statements
/// that change the job's row and then its tab's) is answered as an order sent before, not with
/// an internal error: the resend holds the tab, then its job's unique check waits on the job's
/// row; the ending transaction waits on the tab; PostgreSQL breaks the cycle by aborting one of
/// them (found in a cluster kill test: an agent resending after a lost answer got a 500). An
/// aborted statement wrote nothing, so the books run it again, and it finds the order.
#[tokio::test]
async fn an_order_sent_again_while_its_job_ends_is_known_not_a_deadlock() {
    let db = TestDb::new().await;
    let books = db.books().await;
    open_tab(&books, 1, 1_000, 1_000).await;
    let first = order(1, 1);
    let its_job = job(&first, 1, 10);
    books.accept(&first, &its_job).await.unwrap();

    let mut ending = books.pool().begin().await.unwrap();
    sqlx::query("UPDATE exchange_jobs SET updated_at = now() WHERE id = $1")
        .bind(its_job.id.as_slice())
        .execute(&mut *ending)
        .await
        .unwrap();
    let resend = tokio::spawn({
        let (books, first, its_job) = (books.clone(), first.clone(), its_job.clone());
        async move { books.accept(&first, &its_job).await }
    });
    // The resend holds the tab and waits on the job's row.
    let waited = std::time::Instant::now();
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(books.pool())
    .await
    .unwrap()
        == 0
    {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(10),
            "no wait"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The ending takes the tab: a cycle, broken after PostgreSQL's deadlock_timeout (1 s).
    let ended = sqlx::query("UPDATE exchange_tabs SET updated_at = now() WHERE escrow_id = 1")
        .execute(&mut *ending)
        .await;
    match ended {
        Ok(_) => ending.commit().await.unwrap(),
        // This side was the one aborted: it is rolled back.
        Err(err) => assert!(err.to_string().contains("deadlock"), "{err}"),
    }
    let answer = resend.await.unwrap();
    assert!(matches!(answer, Err(Error::OrderExists)), "{answer:?}");
    assert_eq!(count(&books, "exchange_orders").await, 1);
    assert_eq!(count(&books, "exchange_jobs").await, 1);
    assert_eq!(books.tab(CHAIN, 1).await.unwrap().unwrap().held_wei, 10);
}
