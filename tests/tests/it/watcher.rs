//! The exchange's chain watcher against a real Anvil chain: tabs opened on chain appear in the
//! books with their buyer, amount, deadline and ref; a reclaimed tab is closed; a restarted
//! watcher resumes from its cursor and writes nothing twice.

use alloy::primitives::B256;
use cx_devnet::db::TempDatabase;
use cx_devnet::scenario::ScenarioChain;
use cx_exchange_server::books::Books;
use cx_exchange_server::chain::Watcher;
use cx_settlement::frost::DealerCommittee;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

async fn tab_count(books: &Books) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM exchange_tabs")
        .fetch_one(books.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn tabs_opened_and_reclaimed_on_chain_reach_the_books_once() {
    let committee = DealerCommittee::generate(5, 3, &mut ChaCha20Rng::seed_from_u64(4)).unwrap();
    let chain = ScenarioChain::start(31337, committee.group_key().unwrap())
        .await
        .unwrap();
    let db = TempDatabase::create().await.unwrap();
    let books = Books::open(&db.url).await.unwrap();

    let ids = chain.open_jobs(2, 5_000).await.unwrap();
    let watcher = Watcher::new(books.clone(), chain.entry(), 0).unwrap();
    let next = watcher.poll_once().await.unwrap();
    assert!(next > 0);
    assert_eq!(tab_count(&books).await, 2);
    let tab = books.tab(31337, ids[0]).await.unwrap().expect("mirrored");
    assert_eq!(tab.buyer, chain.buyer.account());
    assert_eq!(tab.amount_wei, 5_000);
    assert_eq!(tab.status, "open");
    assert_ne!(tab.reference, B256::ZERO);

    // A restarted watcher resumes from the cursor: nothing is read or written twice.
    let restarted = Watcher::new(books.clone(), chain.entry(), 0).unwrap();
    assert_eq!(restarted.poll_once().await.unwrap(), next);
    assert_eq!(tab_count(&books).await, 2);

    // Past deadline and grace the buyer reclaims; the tab closes.
    chain.anvil.advance_time(3_600 + 86_400).await.unwrap();
    chain.buyer.reclaim(ids[1]).await.unwrap();
    let more = chain.open_jobs(1, 7).await.unwrap();
    restarted.poll_once().await.unwrap();
    assert_eq!(tab_count(&books).await, 3);
    assert_eq!(
        books.tab(31337, ids[1]).await.unwrap().unwrap().status,
        "reclaimed"
    );
    assert_eq!(
        books.tab(31337, more[0]).await.unwrap().unwrap().amount_wei,
        7
    );

    // With a confirmation depth, the newest blocks wait.
    let cautious = Watcher::new(books.clone(), chain.entry(), 1_000).unwrap();
    cautious.poll_once().await.unwrap();
    assert_eq!(tab_count(&books).await, 3);
}

/// Every tab the chain itself holds now, as (escrow id, amount), from its `JobOpened` logs.
pub(crate) async fn tabs_on_chain(chain: &cx_devnet::scenario::ScenarioChain) -> Vec<(u64, u128)> {
    use alloy::providers::{Provider, ProviderBuilder};
    let provider = ProviderBuilder::new()
        .connect_http(chain.anvil.rpc_url().parse().unwrap())
        .erased();
    let settlement = cx_contracts::Settlement::new(chain.deployment.settlement, provider);
    let mut tabs: Vec<(u64, u128)> = settlement
        .JobOpened_filter()
        .from_block(0)
        .query()
        .await
        .unwrap()
        .into_iter()
        .map(|(e, _)| (e.jobId, e.amount))
        .collect();
    tabs.sort_unstable();
    tabs
}

/// Every tab the books hold, as (escrow id, amount).
pub(crate) async fn tabs_in_books(books: &Books) -> Vec<(u64, u128)> {
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT escrow_id, amount_wei::text FROM exchange_tabs ORDER BY escrow_id")
            .fetch_all(books.pool())
            .await
            .unwrap();
    rows.into_iter()
        .map(|(id, amount)| (id as u64, amount.parse().unwrap()))
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_reorg_of_depth_1_to_3_is_seen_and_the_books_follow_the_new_chain() {
    let committee = DealerCommittee::generate(5, 3, &mut ChaCha20Rng::seed_from_u64(5)).unwrap();
    let chain = ScenarioChain::start(31337, committee.group_key().unwrap())
        .await
        .unwrap();
    let db = TempDatabase::create().await.unwrap();
    let books = Books::open(&db.url).await.unwrap();
    // No confirmations, as on the devnet: every reorg reaches blocks the books already read.
    let watcher = Watcher::new(books.clone(), chain.entry(), 0).unwrap();
    chain.open_jobs(1, 100).await.unwrap();
    watcher.poll_once().await.unwrap();

    for depth in 1..=3u64 {
        let amount = 1_000 * u128::from(depth);
        chain.open_jobs(depth as usize, amount).await.unwrap();
        watcher.poll_once().await.unwrap();
        let before = tabs_in_books(&books).await;
        assert_eq!(before, tabs_on_chain(&chain).await);
        // The newest blocks are replaced by empty ones: the tabs they opened are gone on chain.
        chain.anvil.reorg(depth).await.unwrap();
        let after_chain = tabs_on_chain(&chain).await;
        assert!(
            after_chain.len() < before.len(),
            "depth {depth}: the reorg dropped a tab"
        );
        watcher.poll_once().await.unwrap();
        assert_eq!(tabs_in_books(&books).await, after_chain, "depth {depth}");
        // The new chain reuses the dropped escrow ids for other tabs: the books hold the new ones.
        chain.open_jobs(1, amount + 7).await.unwrap();
        watcher.poll_once().await.unwrap();
        assert_eq!(
            tabs_in_books(&books).await,
            tabs_on_chain(&chain).await,
            "depth {depth}"
        );
    }
    let reorgs: Vec<(i64, bool)> =
        sqlx::query_as("SELECT dropped_tabs, halted FROM exchange_chain_reorgs ORDER BY id")
            .fetch_all(books.pool())
            .await
            .unwrap();
    assert_eq!(reorgs.len(), 3, "{reorgs:?}");
    assert!(
        reorgs
            .iter()
            .all(|(dropped, halted)| *dropped >= 1 && !halted),
        "{reorgs:?}"
    );

    // A replaced block opened a tab a job already draws on: nothing is rewritten, the reorg
    // is recorded once as halting, and the watcher stays there, pass after pass.
    let ids = chain.open_jobs(1, 5_000).await.unwrap();
    watcher.poll_once().await.unwrap();
    let buyer = chain.buyer.account();
    let key = cx_protocol::pq::Identity::from_seed([3; 32]);
    books
        .bind(&cx_exchange_server::books::StoredBinding {
            account: buyer,
            chain_id: 31337,
            mldsa_key: key.public().to_bytes().to_vec(),
            mldsa_key_hash: B256::from(key.public().id().0),
            binding: serde_json::json!({}),
        })
        .await
        .unwrap();
    let digest = B256::repeat_byte(0xd1);
    books
        .accept(
            &cx_exchange_server::books::NewOrder {
                digest,
                kind: "intent",
                account: buyer,
                chain_id: 31337,
                nonce: 0,
                body: serde_json::json!({}),
                mldsa_signature: None,
                limit_wei: Some(0),
            },
            &cx_exchange_server::books::NewJob {
                id: digest,
                escrow_id: ids[0],
                model: "m".into(),
                status: cx_exchange_server::books::JobStatus::Assigned,
                bundle_id: Some("b".into()),
                held_wei: 10,
                needed_until_s: 0,
                decision: serde_json::json!({}),
                deadline_s: u64::from(u32::MAX),
                adapter: None,
                workload: cx_protocol::workload::Workload::Inference(
                    cx_protocol::order::InferenceRequest {
                        prompt: "p".into(),
                        max_tokens: 1,
                        ..Default::default()
                    },
                ),
            },
        )
        .await
        .unwrap();
    let held = tabs_in_books(&books).await;
    chain.anvil.reorg(1).await.unwrap();
    for _ in 0..2 {
        let err = watcher.poll_once().await.unwrap_err().to_string();
        assert!(err.contains("which orders already draw on"), "{err}");
    }
    assert_eq!(tabs_in_books(&books).await, held, "nothing rewritten");
    let halted: i64 = sqlx::query_scalar("SELECT count(*) FROM exchange_chain_reorgs WHERE halted")
        .fetch_one(books.pool())
        .await
        .unwrap();
    assert_eq!(halted, 1);
}

/// Accepts a job drawing on the tab `escrow_id` of `chain_id`, as an agent's intent would.
async fn draw_on(books: &Books, chain_id: u64, buyer: alloy::primitives::Address, escrow_id: u64) {
    let key = cx_protocol::pq::Identity::from_seed([3; 32]);
    books
        .bind(&cx_exchange_server::books::StoredBinding {
            account: buyer,
            chain_id,
            mldsa_key: key.public().to_bytes().to_vec(),
            mldsa_key_hash: B256::from(key.public().id().0),
            binding: serde_json::json!({}),
        })
        .await
        .unwrap();
    let digest = B256::repeat_byte(escrow_id as u8 ^ 0x5a);
    books
        .accept(
            &cx_exchange_server::books::NewOrder {
                digest,
                kind: "intent",
                account: buyer,
                chain_id,
                nonce: escrow_id,
                body: serde_json::json!({}),
                mldsa_signature: None,
                limit_wei: Some(0),
            },
            &cx_exchange_server::books::NewJob {
                id: digest,
                escrow_id,
                model: "m".into(),
                status: cx_exchange_server::books::JobStatus::Assigned,
                bundle_id: Some("b".into()),
                held_wei: 10,
                needed_until_s: 0,
                decision: serde_json::json!({}),
                deadline_s: u64::from(u32::MAX),
                adapter: None,
                workload: cx_protocol::workload::Workload::Inference(
                    cx_protocol::order::InferenceRequest {
                        prompt: "p".into(),
                        max_tokens: 1,
                        ..Default::default()
                    },
                ),
            },
        )
        .await
        .unwrap();
}

// Issue 32 item 10: every chain was watched at `--confirmations` 0 by default, so on a public
// chain a tab was believed in the block that opened it; an order drew on it at once, and the
// ordinary one-block reorg that replaced that block stopped the chain's watcher for good. A chain
// the registry does not call Anvil is now read at its finality depth: a reorg shallower than that
// replaces blocks the books never read, and the watcher goes on.
#[tokio::test(flavor = "current_thread")]
async fn a_reorg_shallower_than_the_finality_depth_does_not_stop_the_watcher() {
    let committee = DealerCommittee::generate(5, 3, &mut ChaCha20Rng::seed_from_u64(6)).unwrap();
    let chain = ScenarioChain::start(31337, committee.group_key().unwrap())
        .await
        .unwrap();
    let db = TempDatabase::create().await.unwrap();
    let books = Books::open(&db.url).await.unwrap();
    // The same chain, as the registry would list a public one (no `kind`), with a depth of 3.
    let mut entry = chain.entry();
    entry.chain.kind = cx_contracts::ChainKind::Public;
    entry.chain.finality_blocks = Some(3);
    let confirmations = entry.chain.confirmations(None);
    let watcher = Watcher::new(books.clone(), entry, confirmations).unwrap();
    let buyer = chain.buyer.account();

    let ids = chain.open_jobs(1, 5_000).await.unwrap();
    watcher.poll_once().await.unwrap();
    // Every tab the books believe is drawn on at once, as an eager agent would.
    for (escrow_id, _) in tabs_in_books(&books).await {
        draw_on(&books, 31337, buyer, escrow_id).await;
    }
    // The block that opened the tab is replaced.
    chain.anvil.reorg(1).await.unwrap();
    assert!(
        !tabs_on_chain(&chain)
            .await
            .iter()
            .any(|(id, _)| *id == ids[0])
    );
    for _ in 0..2 {
        watcher
            .poll_once()
            .await
            .expect("a reorg shallower than the finality depth does not stop the watcher");
    }
    let halted: i64 = sqlx::query_scalar("SELECT count(*) FROM exchange_chain_reorgs WHERE halted")
        .fetch_one(books.pool())
        .await
        .unwrap();
    assert_eq!(halted, 0);

    // The watcher goes on: a tab opened now is read once 3 blocks cover it.
    let later = chain.open_jobs(1, 7_000).await.unwrap();
    watcher.poll_once().await.unwrap();
    assert!(
        books.tab(31337, later[0]).await.unwrap().is_none(),
        "too shallow yet"
    );
    chain.open_jobs(3, 1).await.unwrap();
    watcher.poll_once().await.unwrap();
    let tab = books
        .tab(31337, later[0])
        .await
        .unwrap()
        .expect("deep enough now");
    assert_eq!(tab.amount_wei, 7_000);
}
