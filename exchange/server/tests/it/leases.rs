//! Leases on a real PostgreSQL: a duty has one holder at a time, independent of the writer's;
//! a superseded holder's writes are fenced; a campaign runs its duty on one node and the next
//! node waiting takes it when that one stops.

use crate::common::TestDb;
use cx_exchange_server::Error;
use cx_exchange_server::books::{Books, Duty, Lease, Seat};
use cx_exchange_server::cluster::{Campaign, DutyTask, Start};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SETTLEMENT: Seat = Seat::Duty(Duty::Settlement);
const WATCH: Seat = Seat::Duty(Duty::Watch);

async fn take(db: &TestDb, seat: Seat, holder: &str, wait_ms: u64) -> Result<Lease, Error> {
    Lease::take(db.url(), seat, holder, Some(Duration::from_millis(wait_ms))).await
}

/// A statement touching `table` through `books`: whether the fence let it through.
async fn writes(books: &Books, table: &str) -> Result<(), String> {
    sqlx::query(&format!("DELETE FROM {table} WHERE false"))
        .execute(books.pool())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_duty_has_one_holder_its_own_epoch_and_fences_the_superseded_one() {
    let db = TestDb::new().await;
    db.books().await;
    let first = take(&db, SETTLEMENT, "node a", 0).await.unwrap();
    assert_eq!(first.epoch(), 1);
    match take(&db, SETTLEMENT, "node b", 1_200).await {
        Err(Error::WriterTaken { holder }) => assert_eq!(holder, "node a"),
        other => panic!("a held duty was taken: {other:?}"),
    }
    // The writer's lease and the other duty's are other locks: held at once, by anyone.
    let writer = take(&db, Seat::Writer, "node b", 0).await.unwrap();
    let watch = take(&db, WATCH, "node b", 0).await.unwrap();
    assert_eq!((writer.epoch(), watch.epoch()), (1, 1));

    let old = Books::open_fenced(db.url(), &first).await.unwrap();
    writes(&old, "settlement_batches").await.unwrap();
    // The holder goes (its lease connection closes): the next one raises the epoch.
    drop(first);
    let second = take(&db, SETTLEMENT, "node b", 5_000).await.unwrap();
    assert_eq!(second.epoch(), 2);
    let new = Books::open_fenced(db.url(), &second).await.unwrap();
    let refused = writes(&old, "settlement_batches").await.unwrap_err();
    assert!(refused.contains("fenced: settlement epoch 1"), "{refused}");
    writes(&new, "settlement_batches").await.unwrap();
    // A batch is the settlement duty's write, no longer the writer's; the writer's tables are
    // not the duty's either.
    let writing = Books::open_fenced(db.url(), &writer).await.unwrap();
    writes(&writing, "settlement_batches").await.unwrap();
    writes(&old, "exchange_jobs").await.unwrap();

    // The watchers' cursor is fenced by the watch duty's epoch.
    let watching = Books::open_fenced(db.url(), &watch).await.unwrap();
    watching.apply_chain(7, &[], &[], 3, None).await.unwrap();
    drop(watch);
    let next = take(&db, WATCH, "node c", 5_000).await.unwrap();
    assert_eq!(next.epoch(), 2);
    // (Shown to people as the database being away: a fenced node's request goes elsewhere.)
    let refused = format!(
        "{:?}",
        watching
            .apply_chain(7, &[], &[], 9, None)
            .await
            .unwrap_err()
    );
    assert!(refused.contains("fenced: watch epoch 1"), "{refused}");
    assert_eq!(watching.chain_cursor(7).await.unwrap(), 3, "nothing moved");
    let holders: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT duty, epoch, holder FROM exchange_duties ORDER BY duty")
            .fetch_all(new.pool())
            .await
            .unwrap();
    assert_eq!(
        holders,
        [
            ("settlement".to_owned(), 2, "node b".to_owned()),
            ("watch".to_owned(), 2, "node c".to_owned())
        ]
    );
}

/// A duty that records which node runs it, and runs until told to stop.
fn recorded(node: &'static str, runs: Arc<Mutex<Vec<&'static str>>>) -> Start {
    Box::new(move |_books, stopped| {
        let (runs, stopped) = (runs.clone(), stopped());
        Ok(vec![Box::pin(async move {
            runs.lock().unwrap().push(node);
            stopped.await;
        }) as DutyTask])
    })
}

async fn wait_for(runs: &Mutex<Vec<&'static str>>, want: &[&str]) {
    let started = Instant::now();
    while *runs.lock().unwrap() != want {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "runs {:?}, wanted {want:?}",
            runs.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_campaign_runs_its_duty_on_one_node_and_the_next_takes_it_when_that_one_stops() {
    let db = TestDb::new().await;
    let books = db.books().await;
    let runs = Arc::new(Mutex::new(Vec::new()));
    let a = Campaign::start(
        db.url(),
        "node a",
        vec![(Duty::Watch, recorded("a", runs.clone()))],
    );
    wait_for(&runs, &["a"]).await;
    let b = Campaign::start(
        db.url(),
        "node b",
        vec![(Duty::Watch, recorded("b", runs.clone()))],
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(*runs.lock().unwrap(), ["a"], "one node runs a duty");
    let stopped = Instant::now();
    a.stop().await;
    wait_for(&runs, &["a", "b"]).await;
    assert!(stopped.elapsed() < Duration::from_secs(5), "{stopped:?}");
    let (epoch, holder): (i64, String) =
        sqlx::query_as("SELECT epoch, holder FROM exchange_duties WHERE duty = 'watch'")
            .fetch_one(books.pool())
            .await
            .unwrap();
    assert_eq!((epoch, holder.as_str()), (2, "node b"));
    b.stop().await;
}
