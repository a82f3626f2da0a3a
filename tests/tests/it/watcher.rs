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
