//! Process faults against the running market, each party its own process (issue 16): the
//! exchange SIGKILLed during intake, during dispatch and between signing a batch and posting it;
//! a provider that stops reporting while it holds jobs; PostgreSQL restarted under load. What each checks: money is conserved across the books and
//! the chain (a tab holds exactly what its live jobs hold; claims pay exactly what settled);
//! every job ends completed-and-paid or refunded; nothing is settled twice; every order that was
//! acknowledged survives, none that was refused appears.
//!
//! The windows are made observable from outside, without test-only code in the exchange: a
//! provider SIGSTOPped while its long poll is answered (the job is taken, its result not yet
//! sent), Anvil told to stop mining (`evm_setAutomine false`) so a batch's transaction waits in
//! the mempool while the books say `signed`, a private PostgreSQL cluster stopped and restarted
//! with `pg_ctl`.

mod common;

use alloy::primitives::{Address, B256};
use common::{Restartable, job_status, tabs_off_their_jobs};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What became of one signed intent.
#[derive(Debug, Clone)]
enum Outcome {
    /// 2xx: the job id and what it holds.
    Acknowledged(B256),
    /// An answer that is not a success: the status and the body.
    Refused(u16, Value),
    /// No answer (the exchange died with the request in flight, or was down).
    Unanswered,
}

/// Each intent sent, by agent and nonce: its body and what became of it.
type Outcomes = Arc<std::sync::Mutex<HashMap<(usize, u64), (Value, Outcome)>>>;

/// The exchange SIGKILLed while three agents have many signed intents in flight: after a
/// restart on the same database every acknowledged order is in the books with its job, none
/// that was refused is, every tab holds exactly what its live jobs hold, the nonces of
/// acknowledged intents stay spent, and each unanswered intent can be sent again (it lands once:
/// accepted now, or refused as a reused nonce because it had been committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exchange_killed_during_intake_keeps_every_acknowledged_order_and_no_refused_one() {
    intake_killed(1).await;
}

/// The same kill with the exchange as a cluster of two nodes behind one address: the writer
/// and a `cx serve --standby` forwarding to it, the agents' and the provider's connections
/// spread across both. The writer is SIGKILLed under load, PostgreSQL releases its lease as its
/// connection closes, the standby takes it (the epoch raised: the fence), rebuilds its engine
/// from the books and serves on its own port; every check of the restart holds against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_killed_during_intake_is_replaced_by_its_standby_with_every_order_kept() {
    intake_killed(2).await;
}

/// Three nodes, two kills: the writer is SIGKILLed under load, a standby takes over, and the
/// new writer is SIGKILLed in turn while the load goes on through the surviving nodes; the
/// last one takes over. Requests a surviving node forwards wait through each takeover; every
/// check of the single-node kill holds across both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_loses_two_writers_under_load_and_keeps_every_order() {
    intake_killed(3).await;
}

/// Kills the writer during intake: one node restarted on the same books (`nodes` 1), or each
/// of a cluster's writers in turn until one node is left.
async fn intake_killed(nodes: usize) {
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let tag = format!("faults-intake-{nodes}");
    let mut market = if nodes == 1 {
        Restartable::start(&tag, &db.url, 3, 1_000_000_000_000).await
    } else {
        Restartable::start_cluster(&tag, &db.url, 3, 1_000_000_000_000, nodes).await
    };
    // Enough for every kill to land in the middle of the stream.
    let per_agent: u64 = 60 * nodes as u64;
    const WORKERS: usize = 4;
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let outcomes: Outcomes = Arc::default();
    // The acknowledged orders are sent again at the end, after the restart (and its checks),
    // so they must not be due by then: 20 s was passed in a run beside the other fault tests
    // on two cores. A cluster serves on through its kills, so its stream runs longer.
    let deadline_in_s = if nodes == 1 { 60 } else { 120 };
    let shared = Arc::new(market_bodies(&market, per_agent, deadline_in_s));
    let cluster = market.is_cluster();
    let mut tasks = Vec::new();
    for agent in 0..market.agents.len() {
        let next = Arc::new(AtomicU64::new(1));
        for _ in 0..WORKERS {
            let (next, shared, outcomes, acknowledged) = (
                next.clone(),
                shared.clone(),
                outcomes.clone(),
                acknowledged.clone(),
            );
            let signer = market.signer();
            tasks.push(tokio::spawn(async move {
                loop {
                    let nonce = next.fetch_add(1, Ordering::SeqCst);
                    if nonce > per_agent {
                        return;
                    }
                    let body = shared[&(agent, nonce)].clone();
                    let outcome = match signer.post_intent(&body).await {
                        Some((status, _, answer)) if (200..300).contains(&status) => {
                            acknowledged.fetch_add(1, Ordering::SeqCst);
                            Outcome::Acknowledged(
                                answer["job_id"].as_str().unwrap().parse().unwrap(),
                            )
                        }
                        // A node forwarding to a writer that died with the request: it may
                        // have been done, as with no answer at all.
                        Some((502, _, answer)) if answer["error"]["code"] == "bad_gateway" => {
                            Outcome::Unanswered
                        }
                        Some((status, _, answer)) => Outcome::Refused(status, answer),
                        None => Outcome::Unanswered,
                    };
                    let dead = matches!(outcome, Outcome::Unanswered);
                    outcomes
                        .lock()
                        .unwrap()
                        .insert((agent, nonce), (body, outcome));
                    // A single node is down until restarted; a cluster serves on.
                    if dead && !cluster {
                        return;
                    }
                }
            }));
        }
    }
    let kills = nodes.max(2) - 1;
    for kill in 1..=kills {
        // Kill it in the middle of the stream.
        let waited = Instant::now();
        let mark = 40 * kill;
        while acknowledged.load(Ordering::SeqCst) < mark {
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "intake too slow: {} acknowledged",
                acknowledged.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        market.kill_exchange();
        let killed = Instant::now();
        if !cluster {
            break;
        }
        let node = market.take_over().await;
        let database = tokio::task::block_in_place(|| market.exchange.serve.field("database"));
        let epoch = kill + 1;
        assert!(
            database.ends_with(&format!("writer epoch {epoch})")),
            "{database}"
        );
        let took = killed.elapsed();
        eprintln!(
            "intake kill {kill}: {node} writes {:.1} s after the kill ({} acknowledged by then)",
            took.as_secs_f64(),
            acknowledged.load(Ordering::SeqCst)
        );
        assert!(took < Duration::from_secs(20), "takeover took {took:?}");
    }
    for task in tasks {
        task.await.unwrap();
    }
    if cluster {
        // The fence: a connection still tagged with a dead writer's epoch cannot change a
        // job, an order or a tab; one with the current epoch can.
        let current = (kills + 1).to_string();
        let mut conn = market.books.pool().acquire().await.unwrap();
        for (epoch, refused) in [("1", true), (current.as_str(), false)] {
            sqlx::query(&format!("SET cx.writer_epoch = '{epoch}'"))
                .execute(&mut *conn)
                .await
                .unwrap();
            let tried = sqlx::query("UPDATE exchange_jobs SET model = model WHERE false")
                .execute(&mut *conn)
                .await;
            assert_eq!(tried.is_err(), refused, "epoch {epoch}: {tried:?}");
            if let Err(e) = tried {
                assert!(e.to_string().contains("fenced"), "{e}");
            }
        }
        sqlx::query("RESET cx.writer_epoch")
            .execute(&mut *conn)
            .await
            .unwrap();
    } else {
        market.restart_exchange().await;
    }

    let outcomes = outcomes.lock().unwrap().clone();
    let accounts: Vec<Address> = market.agents.iter().map(|a| a.keys.account()).collect();
    let order_of = |agent: usize, nonce: u64| {
        let books = market.books.clone();
        let account = accounts[agent];
        async move {
            sqlx::query_scalar::<_, Vec<u8>>(
                "SELECT digest FROM exchange_orders WHERE account = $1 AND nonce = $2::numeric",
            )
            .bind(account.as_slice())
            .bind(nonce.to_string())
            .fetch_optional(books.pool())
            .await
            .unwrap()
        }
    };
    let (mut acked, mut refused, mut unanswered, mut answer_lost) = (0, 0, 0, 0);
    for ((agent, nonce), (body, outcome)) in &outcomes {
        match outcome {
            Outcome::Acknowledged(job) => {
                acked += 1;
                let digest = order_of(*agent, *nonce).await;
                assert_eq!(
                    digest.as_deref(),
                    Some(job.as_slice()),
                    "acknowledged order {agent}/{nonce} is in the books"
                );
                assert!(
                    job_status(&market.books, *job).await.is_some(),
                    "its job {job} too"
                );
                // The same order is not taken twice, and its nonce stays spent for any other.
                let (status, _, answer) = market.post_intent(body).await.expect("an answer");
                assert_eq!(status, 409, "{answer}");
                assert_eq!(answer["error"]["code"], "order_exists", "{answer}");
                let other = market.intent(*agent, *nonce, 1_000_000_000, 21);
                let (status, _, answer) = market.post_intent(&other).await.expect("an answer");
                assert_eq!(status, 409, "{answer}");
                assert_eq!(answer["error"]["code"], "nonce_reused", "{answer}");
            }
            Outcome::Refused(status, answer) => {
                refused += 1;
                assert!(
                    *status < 500,
                    "a refusal is the client's to fix, not the server failing: {status} {answer}"
                );
                assert!(
                    order_of(*agent, *nonce).await.is_none(),
                    "refused order {agent}/{nonce} ({status} {answer}) is not in the books"
                );
            }
            Outcome::Unanswered => {
                unanswered += 1;
                // Sent again it is answered: accepted now or known already (committed before
                // the kill, its answer lost), and then in the books once; or refused as any
                // order over its limit is, and then not in the books.
                let (status, _, answer) = market.post_intent(body).await.expect("an answer");
                let kept = order_of(*agent, *nonce).await.is_some();
                match status {
                    202 => assert!(kept),
                    409 => {
                        assert_eq!(answer["error"]["code"], "order_exists", "{answer}");
                        assert!(kept);
                        answer_lost += 1;
                    }
                    400..500 => assert!(!kept, "{agent}/{nonce}: {status} {answer}"),
                    _ => panic!("resending {agent}/{nonce}: {status} {answer}"),
                }
            }
        }
    }
    assert!(acked >= 40, "{acked} acknowledged");
    assert!(refused > 0, "the over-limit intents were refused");
    eprintln!(
        "intake kill: {acked} acknowledged, {refused} refused, {unanswered} unanswered \
         ({answer_lost} of them committed, the answer lost)"
    );
    assert_eq!(
        tabs_off_their_jobs(&market.books).await,
        Vec::<String>::new()
    );

    // Every job ends done by the provider, which reconnects on its own: a result it could not
    // send while the exchange was away is sent again, and jobs the dead process had handed out
    // in a poll whose answer died with it are handed out again by the new one (before that fix
    // a whole poll's worth, 8 jobs, expired at their deadline in every run); the books still
    // balance.
    let ended = common::all_jobs_end(&market.books, Duration::from_secs(40)).await;
    assert!(
        ended
            .iter()
            .all(|(s, _)| matches!(s.as_str(), "done" | "refunded")),
        "no job expired: {ended:?}"
    );
    eprintln!(
        "intake kill: {} handed out again after the restart",
        common::handed_out_again(&market.books).await
    );
    eprintln!("intake kill: jobs ended {ended:?}");
    assert_eq!(
        tabs_off_their_jobs(&market.books).await,
        Vec::<String>::new()
    );
}

/// Every agent's signed intents, nonces 1..=`per_agent`: every seventh offers 1 wei, below any
/// bundle's price, and is refused.
fn market_bodies(
    market: &Restartable,
    per_agent: u64,
    deadline_in_s: u64,
) -> HashMap<(usize, u64), Value> {
    let mut bodies = HashMap::new();
    for agent in 0..market.agents.len() {
        for nonce in 1..=per_agent {
            // Every seventh is refused: no price is below 1 wei. (A limit of 1 wei was refused
            // only while the debug provider's self-benchmark was slow enough to price a job
            // above it; with the kernels optimised in test builds it is not.)
            let max_price = if nonce % 7 == 0 { 0 } else { 1_000_000_000 };
            bodies.insert(
                (agent, nonce),
                market.intent(agent, nonce, max_price, deadline_in_s),
            );
        }
    }
    bodies
}

/// The exchange SIGKILLed while jobs are taken by its provider: the provider is stopped
/// (SIGSTOP) inside its long poll, so the exchange hands it the jobs (`running` in the books)
/// and the provider has not yet run them; the exchange dies, starts again on the same books, and
/// the provider resumes. Its results are accepted by the new process (which also hands the
/// `running` jobs out once more, in case the answer was lost; the provider runs each once):
/// every job ends done once, charged once, the tab holds what its jobs hold, and a new order
/// clears and completes on the same provider, which found the exchange again on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exchange_killed_during_dispatch_loses_no_job_and_charges_none_twice() {
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let mut market = Restartable::start("faults-dispatch", &db.url, 1, 1_000_000_000_000).await;
    let provider = market.provider.0.id();
    // Inside its long poll (registered, pulling): stopped there.
    tokio::time::sleep(Duration::from_secs(1)).await;
    common::signal(provider, "STOP");
    let mut jobs = Vec::new();
    for nonce in 1..=4 {
        let body = market.intent(0, nonce, 1_000_000_000, 30);
        let (status, _, answer) = market.post_intent(&body).await.expect("an answer");
        assert_eq!(status, 202, "{answer}");
        jobs.push(answer["job_id"].as_str().unwrap().parse::<B256>().unwrap());
    }
    // The stopped provider's open poll takes work: wait until the books say so.
    let waited = Instant::now();
    loop {
        let mut running = 0;
        for job in &jobs {
            if job_status(&market.books, *job).await.as_deref() == Some("running") {
                running += 1;
            }
        }
        if running > 0 {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "no job was taken by the provider's poll"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    market.kill_exchange();
    market.restart_exchange().await;
    common::signal(provider, "CONT");

    // A new order clears and completes once the provider is back.
    let body = market.intent(0, 100, 1_000_000_000, 30);
    let (status, _, answer) = market.post_intent(&body).await.expect("an answer");
    assert_eq!(status, 202, "{answer}");
    let fresh: B256 = answer["job_id"].as_str().unwrap().parse().unwrap();
    jobs.push(fresh);
    let ended = common::all_jobs_end(&market.books, Duration::from_secs(45)).await;
    assert_eq!(
        job_status(&market.books, fresh).await.as_deref(),
        Some("done"),
        "the new order ran: {ended:?}"
    );
    for job in &jobs {
        let status = job_status(&market.books, *job).await.unwrap();
        assert_eq!(status, "done", "{job}");
        // One end, never charged twice.
        let ends = job_ends(&market.books, *job).await;
        assert_eq!(ends, vec![status.clone()], "{job}");
    }
    let done: i64 = sqlx::query_scalar("SELECT count(*) FROM exchange_jobs WHERE status = 'done'")
        .fetch_one(market.books.pool())
        .await
        .unwrap();
    eprintln!(
        "dispatch kill: {done} of {} jobs done, {} handed out again after the restart",
        jobs.len(),
        common::handed_out_again(&market.books).await
    );
    assert_eq!(
        tabs_off_their_jobs(&market.books).await,
        Vec::<String>::new()
    );
    // The provider is registered with the new process (its offer re-signed after the restart).
    common::registered(&market.client, "p0").await;
}

/// A real provider that stops reporting while it holds jobs: `p1` (the cheaper bundle, so it
/// wins an order while idle) is SIGSTOPped inside its long poll and jobs clear onto it. Once it has
/// been silent for `--provider-silence-s` its bundle leaves the engine and its jobs move to `p0`
/// (their deadlines allow it), which runs them; when `p1` resumes, whatever it finishes for the
/// moved jobs is refused, nothing is charged twice, and it re-registers and serves new orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_stops_reporting_leaves_and_its_jobs_move_to_another() {
    const SILENCE_S: u64 = 40;
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let market = Restartable::start_with(
        "faults-silent",
        &db.url,
        1,
        1_000_000_000_000,
        &["--provider-silence-s", &SILENCE_S.to_string()],
    )
    .await;
    let p1 = market.second_provider("p1", "100").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    common::signal(p1.0.id(), "STOP");
    let stopped = Instant::now();
    let mut jobs = Vec::new();
    for nonce in 1..=3 {
        let body = market.intent(0, nonce, 1_000_000_000, 150);
        let (status, _, answer) = market.post_intent(&body).await.expect("an answer");
        assert_eq!(status, 202, "{answer}");
        jobs.push(answer["job_id"].as_str().unwrap().parse::<B256>().unwrap());
    }
    // The first goes to the cheaper p1; the next may go to p0 instead, since the work p1 has
    // not done (a queue in t̂) makes it later than p0 by more than their prices differ.
    assert_eq!(
        bundle_of(&market.books, jobs[0]).await,
        "p1",
        "the cheaper bundle won while idle"
    );

    // Silent past the limit: p1 leaves the engine, p0 stays, the jobs move to p0 and finish.
    let waited = Instant::now();
    loop {
        let bundles = market.client.providers().await.unwrap();
        if !bundles.iter().any(|b| b.id == "p1") {
            assert!(bundles.iter().any(|b| b.id == "p0"), "the live one stays");
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(SILENCE_S + 40),
            "p1 never left the engine"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let left_after = stopped.elapsed();
    assert!(
        left_after >= Duration::from_secs(SILENCE_S - 31),
        "left after {left_after:?}: only silence takes a provider out"
    );
    let ended = common::all_jobs_end(&market.books, Duration::from_secs(60)).await;
    for job in &jobs {
        assert_eq!(
            job_status(&market.books, *job).await.as_deref(),
            Some("done"),
            "{ended:?}"
        );
        assert_eq!(bundle_of(&market.books, *job).await, "p0", "moved");
    }

    // p1 resumes: it runs what its poll had handed it and sends the results, which are
    // refused (the jobs are p0's now); it registers again and is back in the engine, though
    // the failures it just earned (λ_F·φ) now price it above p0.
    common::signal(p1.0.id(), "CONT");
    common::registered(&market.client, "p1").await;
    let body = market.intent(0, 100, 1_000_000_000, 60);
    let (status, _, answer) = market.post_intent(&body).await.expect("an answer");
    assert_eq!(status, 202, "{answer}");
    let fresh: B256 = answer["job_id"].as_str().unwrap().parse().unwrap();
    common::all_jobs_end(&market.books, Duration::from_secs(45)).await;
    assert_eq!(
        job_status(&market.books, fresh).await.as_deref(),
        Some("done")
    );
    let decision: String =
        sqlx::query_scalar("SELECT decision::text FROM exchange_jobs WHERE id = $1")
            .bind(fresh.as_slice())
            .fetch_one(market.books.pool())
            .await
            .unwrap();
    let decision: Value = serde_json::from_str(&decision).unwrap();
    assert_eq!(
        decision["feasible_total"], 2,
        "both in the engine: {decision}"
    );
    // Give p1's late results time to arrive, then check nothing changed because of them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for job in &jobs {
        let ends = job_ends(&market.books, *job).await;
        assert_eq!(ends, vec!["done".to_string()], "one end: {job}");
        // One receipt a job (its key), and it is p0's.
        let to_p0: bool = sqlx::query_scalar(
            "SELECT r.provider_key_hash = b.provider_key_hash FROM exchange_receipts r, \
             exchange_bundles b WHERE r.job_id = $1 AND b.id = 'p0'",
        )
        .bind(job.as_slice())
        .fetch_one(market.books.pool())
        .await
        .unwrap();
        assert!(to_p0, "charged once, by p0: {job}");
    }
    assert_eq!(
        tabs_off_their_jobs(&market.books).await,
        Vec::<String>::new()
    );
}

/// The end events of job `id`, in order (exactly one for a job that ended once).
async fn job_ends(books: &cx_exchange_server::books::Books, id: B256) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT status FROM exchange_job_events WHERE job_id = $1 \
         AND status IN ('done', 'expired', 'refunded', 'failed') ORDER BY seq",
    )
    .bind(id.as_slice())
    .fetch_all(books.pool())
    .await
    .unwrap()
}

/// The bundle job `id` is on now.
async fn bundle_of(books: &cx_exchange_server::books::Books, id: B256) -> String {
    sqlx::query_scalar("SELECT bundle_id FROM exchange_jobs WHERE id = $1")
        .bind(id.as_slice())
        .fetch_one(books.pool())
        .await
        .unwrap()
}

/// The exchange SIGKILLed between signing a batch and seeing it land: a real committee (three
/// `cx-signer`s, any two sign) and Anvil. Anvil stops mining (`evm_setAutomine false`), so the
/// batch's transaction waits in the mempool while the settlement store says `signed`; the
/// exchange is killed there, the block is mined, and the exchange starts again on the same books.
/// The batch lands exactly once (one `BatchSettled`, nonce 1, one part posted), every job is
/// settled once, and the claims pay exactly the settled amounts: the provider its receipts less
/// the fee, the fee account the fee, the buyer the rest of its tab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exchange_killed_between_signing_and_posting_a_batch_settles_it_once() {
    killed_between_signing_and_posting(Killed::Alone).await;
}

/// The same kill with a second node beside the writer (which holds the settlement duty, having
/// started first): the provider reaches the exchange through the standby, which forwards to the
/// writer; the writer is SIGKILLed with the batch signed and its transaction in the mempool; the
/// standby takes the writer's lease and the settlement duty's, finds the batch on chain and does
/// not send it again. Every check of the restart holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settling_writer_killed_between_signing_and_posting_a_standby_settles_it_once() {
    killed_between_signing_and_posting(Killed::Writer).await;
}

/// Three nodes, the settlement duty on a standby (the writer runs `--duties watch`): the node
/// settling is SIGKILLed with the batch signed and in the mempool, and the last node takes the
/// duty, finds the batch on chain and does not send it again; then the writer is SIGKILLed too
/// and the same node takes its lease. Every check of the restart holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settling_standby_and_then_the_writer_killed_the_last_node_settles_once() {
    killed_between_signing_and_posting(Killed::SettlerThenWriter).await;
}

/// Which `cx serve` dies with a batch in flight.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Killed {
    /// The only node, started again.
    Alone,
    /// The writer, which settles; a standby takes both.
    Writer,
    /// A standby that settles, then the writer; the third node takes both.
    SettlerThenWriter,
}

/// The holder of `duty`'s lease and its epoch, once one holds it.
async fn duty_holder(books: &cx_exchange_server::books::Books, duty: &str) -> (String, i64) {
    let waited = Instant::now();
    loop {
        let held: Option<(String, i64)> =
            sqlx::query_as("SELECT holder, epoch FROM exchange_duties WHERE duty = $1")
                .bind(duty)
                .fetch_optional(books.pool())
                .await
                .unwrap();
        if let Some(held) = held {
            return held;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "no node took {duty}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the lease holder `holder` ("pid N on ADDR") is the node at `node`.
fn holds(holder: &str, node: &common::Exchange) -> bool {
    holder.ends_with(&format!(" on {}", node.url.trim_start_matches("https://")))
}

async fn killed_between_signing_and_posting(killed: Killed) {
    use cx_settlement::evm::EvmClient;
    let bin = common::provider_bin();
    // Keys: 0 deploys, 1 the agent, 2 the provider, 3 posts.
    let (tag, writer_flags): (&str, &[&str]) = match killed {
        Killed::Alone => ("faults-settle", &[]),
        Killed::Writer => ("faults-settle-standby", &[]),
        Killed::SettlerThenWriter => ("faults-settle-duty", &["--duties", "watch"]),
    };
    let mut world = common::settling_with(tag, 500, 4, 3, writer_flags).await;
    // The standby the provider reaches the exchange through, which survives; and, for the
    // duty's kill, the standby that settles.
    let (standby, mut settler) = match killed {
        Killed::Alone => (None, None),
        Killed::Writer => (Some(world.start_standby()), None),
        Killed::SettlerThenWriter => {
            let (b, c) = (world.start_standby(), world.start_standby());
            let (holder, epoch) = duty_holder(&world.books, "settlement").await;
            assert_eq!(epoch, 1);
            assert!(!holds(&holder, &world.market), "--duties watch: {holder}");
            if holds(&holder, &b) {
                (Some(c), Some(b))
            } else {
                assert!(holds(&holder, &c), "{holder}");
                (Some(b), Some(c))
            }
        }
    };
    if killed == Killed::Writer {
        let (holder, _) = duty_holder(&world.books, "settlement").await;
        assert!(
            holds(&holder, &world.market),
            "the writer started first: {holder}"
        );
    }
    let model = common::gen_model(&bin, &world.dir.path);
    let _provider = common::start_provider(
        &bin,
        &world.dir.path,
        "p0",
        &model,
        standby.as_ref().unwrap_or(&world.market),
        &world.deployments,
        &world.anvil.keys[2],
        "1000000",
        &[],
    );
    let payout = world.anvil.keys[2].address();
    common::registered(&world.client, "p0").await;
    let agent = common::Agent::import(
        &world.dir.path,
        &world.market,
        B256::from(world.anvil.keys[1].to_bytes()),
    )
    .await;
    let amount = 5_000_000u128;
    let tab = agent
        .open_tab(&world.client, amount, &world.deployments)
        .await;
    common::cx_json(agent.args(&["bind", "--json"]), String::new()).await;
    let api_key = agent.session(tab, "4000000", "1000000", "60").await;
    for n in 0..2 {
        let chat = serde_json::json!({
            "model": common::MODEL,
            "messages": [{"role": "user", "content": format!("Say hello {n}.")}],
            "max_tokens": 4,
        });
        world.client.chat(&api_key, &chat).await.unwrap();
    }
    let charged = world.client.tab(31337, tab).await.unwrap().held_wei;
    assert!(charged > 0);

    // The chain stops mining: the batch's transaction will wait in the mempool.
    let rpc = cx_settlement::evm::read_provider(&world.anvil.rpc_url()).unwrap();
    use alloy::providers::Provider as _;
    let _: Value = rpc
        .raw_request("evm_setAutomine".into(), (false,))
        .await
        .unwrap();
    let closed = common::cx_json(
        agent.args(&["settle-tab", &tab.to_string(), "--json"]),
        String::new(),
    )
    .await;
    assert_eq!(closed["status"], "closing", "{closed}");
    let waited = Instant::now();
    loop {
        let signed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM settlement_batch_parts WHERE status = 'signed'",
        )
        .fetch_one(world.books.pool())
        .await
        .unwrap();
        let pool: Value = rpc.raw_request("txpool_status".into(), ()).await.unwrap();
        let pending = u64::from_str_radix(
            pool["pending"]
                .as_str()
                .unwrap_or("0x0")
                .trim_start_matches("0x"),
            16,
        )
        .unwrap_or_else(|_| pool["pending"].as_u64().unwrap_or(0));
        if signed == 1 && pending >= 1 {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the batch was never signed and sent: {signed} signed, pool {pool}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Killed with the batch signed and its transaction in flight; then the block is mined.
    match settler.as_mut() {
        Some(settler) => settler.serve.kill(),
        None => world.market.serve.kill(),
    }
    let _: Value = rpc.raw_request("evm_mine".into(), ()).await.unwrap();
    let _: Value = rpc
        .raw_request("evm_setAutomine".into(), (true,))
        .await
        .unwrap();
    if let Some(survivor) = standby.as_ref().filter(|_| settler.is_some()) {
        // The last node takes the duty at the next epoch, while the writer still writes.
        let killed = Instant::now();
        loop {
            let (holder, epoch) = duty_holder(&world.books, "settlement").await;
            if epoch == 2 {
                assert!(holds(&holder, survivor), "{holder}");
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(20),
                "no node took settlement"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "settlement taken {:.2} s after its holder's kill",
            killed.elapsed().as_secs_f64()
        );
        world.market.serve.kill();
    }
    match standby {
        Some(standby) => world.take_over(standby).await,
        None => world.restart_exchange().await,
    }

    let waited = Instant::now();
    let provider_claim = loop {
        if let Ok(claim) = world.client.claim(31337, payout).await
            && world.client.tab(31337, tab).await.unwrap().status == "settled"
        {
            break claim;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the tab never settled after the restart: {:?}",
            world.client.tab(31337, tab).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Exactly once on chain.
    let chain = EvmClient::connect(
        &world.anvil.rpc_url(),
        world.anvil.keys[0].clone(),
        world.deployment,
    )
    .unwrap();
    let settled = chain.settled_batches(0).await.unwrap();
    assert_eq!(settled.len(), 1, "one BatchSettled: {settled:?}");
    assert_eq!(
        chain.batch_state().await.unwrap().0,
        1,
        "the batch nonce is 1"
    );
    let parts: Vec<(i64, String)> =
        sqlx::query_as("SELECT nonce, status FROM settlement_batch_parts ORDER BY nonce")
            .fetch_all(world.books.pool())
            .await
            .unwrap();
    assert_eq!(parts, vec![(1, "posted".to_owned())]);
    // The restarted process found it on chain and did not send it again.
    let posted: Vec<String> =
        sqlx::query_scalar("SELECT detail FROM settlement_steps WHERE step = 'posted' ORDER BY id")
            .fetch_all(world.books.pool())
            .await
            .unwrap();
    assert_eq!(posted, vec!["already on chain; not sent again".to_owned()]);
    // Every job settled once (a paid job stays `done`; its settlement is an event).
    let jobs: Vec<(String, i64)> = sqlx::query_as(
        "SELECT j.status, (SELECT count(*) FROM exchange_job_events e \
                           WHERE e.job_id = j.id AND e.status = 'settled') \
         FROM exchange_jobs j",
    )
    .fetch_all(world.books.pool())
    .await
    .unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert!(
        jobs.iter().all(|(s, n)| s == "done" && *n == 1),
        "one `settled` event each: {jobs:?}"
    );
    // The claims pay exactly what settled: 5 % of each receipt to the fee account.
    let receipts: Vec<String> =
        sqlx::query_scalar("SELECT amount_owed_wei::text FROM exchange_receipts")
            .fetch_all(world.books.pool())
            .await
            .unwrap();
    let cut: u128 = receipts
        .iter()
        .map(|r| r.parse::<u128>().unwrap() * 500 / 10_000)
        .sum();
    assert_eq!(provider_claim.cumulative_wei, (charged - cut).to_string());
    let fee = world.client.claim(31337, world.fee.account).await.unwrap();
    assert_eq!(fee.cumulative_wei, cut.to_string());
    // The agent asks the node that serves now (a restart serves at the same address).
    let agent = agent.at(&world.market);
    let claimed = common::cx_json(
        agent.args(&[
            "claim",
            "--json",
            "--deployments",
            common::path(&world.deployments),
        ]),
        String::new(),
    )
    .await;
    assert_eq!(claimed["claimed_wei"], (amount - charged).to_string());
}

/// How long an intent may wait for its answer while the database is away: the pool gives up
/// on a connection well before a client would.
const OUTAGE_ANSWER_BOUND: Duration = Duration::from_secs(10);

/// What the stream of intents saw while PostgreSQL restarted.
#[derive(Debug, Default)]
struct Stream {
    /// Acknowledged: the agent's nonce and the job.
    acknowledged: Vec<(u64, B256)>,
    /// Answered 503: the nonce.
    unavailable: Vec<u64>,
    /// Anything else: the nonce, the status and the body.
    other: Vec<(u64, u16, String)>,
}

/// Checks one answer given while the database may be down: 202, or 503 with our JSON error and
/// `Retry-After`, within [`OUTAGE_ANSWER_BOUND`].
fn judge(stream: &mut Stream, nonce: u64, answer: Option<common::Answer>, took: Duration) {
    assert!(took < OUTAGE_ANSWER_BOUND, "intent {nonce} took {took:?}");
    let Some((status, headers, body)) = answer else {
        panic!("intent {nonce}: no answer within {took:?}");
    };
    match status {
        202 => stream
            .acknowledged
            .push((nonce, body["job_id"].as_str().unwrap().parse().unwrap())),
        503 => {
            assert_eq!(body["error"]["code"], "unavailable", "{body}");
            let retry = headers
                .iter()
                .find(|(k, _)| k == "retry-after")
                .unwrap_or_else(|| panic!("503 without Retry-After: {headers:?}"));
            assert!(retry.1.parse::<u64>().is_ok_and(|s| s >= 1), "{retry:?}");
            stream.unavailable.push(nonce);
        }
        _ => stream.other.push((nonce, status, body.to_string())),
    }
}

/// PostgreSQL restarted under a running `cx serve` (a private cluster: `pg_ctl restart -m fast`,
/// then `-m immediate`, then stopped for a while and started): intents keep flowing; while the
/// database is away intake answers 503 `unavailable` with `Retry-After` (never 500, never a hang
/// past a bound, never a panic); after it, intake works again without restarting `cx serve`, and
/// every acknowledged order is in the books and no refused one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_load_answers_503_and_loses_no_acknowledged_order() {
    let cluster = Arc::new(common::PgCluster::start("faults-pg"));
    let url = cluster.url("cx");
    let market = Restartable::start("faults-pg", &url, 1, 1_000_000_000_000).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(1));
    let flow = {
        let (market, stop, next) = (market.signer(), stop.clone(), next.clone());
        tokio::spawn(async move {
            let mut stream = Stream::default();
            while !stop.load(Ordering::SeqCst) {
                let nonce = next.fetch_add(1, Ordering::SeqCst);
                let body = market.intent(0, nonce, 1_000_000_000, 30);
                let started = Instant::now();
                let answer = market.post_intent(&body).await;
                judge(&mut stream, nonce, answer, started.elapsed());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stream
        })
    };
    let pg_ctl = |args: &'static [&'static str]| {
        let cluster = cluster.clone();
        async move {
            tokio::task::spawn_blocking(move || cluster.pg_ctl(args))
                .await
                .unwrap()
        }
    };
    // Acknowledged orders are counted by the flow; wait for some before each fault, and after.
    let books = market.books.clone();
    let orders = || {
        let books = books.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM exchange_orders")
                .fetch_one(books.pool())
                .await
                .unwrap_or(0)
        }
    };
    let progress = |since: i64| async move {
        let waited = Instant::now();
        while orders().await < since + 3 {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "intake never recovered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    progress(0).await;
    for mode in [
        &["restart", "-w", "-m", "fast"][..],
        &["restart", "-w", "-m", "immediate"],
    ] {
        pg_ctl(mode).await;
        progress(orders().await).await;
    }
    // A longer outage: stopped, intake answers 503 meanwhile, then started again.
    pg_ctl(&["stop", "-w", "-m", "fast"]).await;
    let mut during = Stream::default();
    for _ in 0..3 {
        let nonce = next.fetch_add(1, Ordering::SeqCst);
        let body = market.intent(0, nonce, 1_000_000_000, 30);
        let started = Instant::now();
        let answer = market.post_intent(&body).await;
        judge(&mut during, nonce, answer, started.elapsed());
    }
    assert_eq!(during.unavailable.len(), 3, "{during:?}");
    pg_ctl(&["start", "-w", "-t", "30"]).await;
    progress(orders().await).await;
    stop.store(true, Ordering::SeqCst);
    let mut stream = flow.await.unwrap();
    stream.unavailable.extend(during.unavailable);
    eprintln!(
        "postgres restarts: {} acknowledged, {} answered 503",
        stream.acknowledged.len(),
        stream.unavailable.len()
    );
    assert!(stream.other.is_empty(), "{:?}", stream.other);

    // Every acknowledged order is there; none answered 503 is.
    let account = market.agents[0].keys.account();
    let nonces: Vec<String> =
        sqlx::query_scalar("SELECT nonce::text FROM exchange_orders WHERE account = $1")
            .bind(account.as_slice())
            .fetch_all(market.books.pool())
            .await
            .unwrap();
    let nonces: std::collections::HashSet<u64> =
        nonces.iter().map(|n| n.parse().unwrap()).collect();
    for (nonce, job) in &stream.acknowledged {
        assert!(
            nonces.contains(nonce),
            "acknowledged {nonce} is in the books"
        );
        assert!(job_status(&market.books, *job).await.is_some());
    }
    for nonce in &stream.unavailable {
        assert!(
            !nonces.contains(nonce),
            "503-answered {nonce} is not in the books"
        );
    }
    assert_eq!(nonces.len(), stream.acknowledged.len());
    assert_eq!(
        tabs_off_their_jobs(&market.books).await,
        Vec::<String>::new()
    );
    let ended = common::all_jobs_end(&market.books, Duration::from_secs(40)).await;
    assert!(
        ended.iter().all(|(s, _)| s == "done" || s == "expired"),
        "{ended:?}"
    );
    assert_eq!(
        tabs_off_their_jobs(&market.books).await,
        Vec::<String>::new()
    );
}
