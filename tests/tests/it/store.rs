//! The coordinator's outbox on PostgreSQL (a throwaway, migrated database) and in memory: the
//! same transitions on both.

use cx_devnet::db::TempDatabase;
use cx_protocol::pq::Identity;
use cx_settlement::coordinator::{PartStatus, PgStore, Store};
use cx_settlement::ledger;

/// The outbox's transitions, the same for both stores: a part is unfinished until posted, a
/// signature is kept once, receipts are batched once, and a nonce cannot be taken twice.
async fn exercise_store<S: Store>(store: &S) {
    let provider = Identity::from_seed([5; 32]);
    let exchange = Identity::from_seed([6; 32]);
    let buyer_identity = Identity::from_seed([7; 32]);
    let buyer = k256::ecdsa::SigningKey::from_slice(&[8; 32]).unwrap();
    let parties = cx_protocol::voucher::Parties {
        buyer: &buyer,
        buyer_identity: &buyer_identity,
        exchange: &exchange,
        provider: &provider,
        payout: alloy::primitives::Address::repeat_byte(1),
    };
    let domain = cx_protocol::order::domain(1, alloy::primitives::Address::ZERO);
    let receipt = |escrow_id: u64| {
        parties
            .intent_job(&domain, escrow_id, escrow_id, 5, 5, 5)
            .unwrap()
    };
    let receipts = vec![receipt(0), receipt(1)];
    assert_eq!(store.add_receipts(&receipts).await.unwrap(), 2);
    assert_eq!(store.add_receipts(&receipts[..1]).await.unwrap(), 0);
    assert_eq!(store.pending_receipts().await.unwrap().len(), 2);
    let escrows = (0..2)
        .map(|id| {
            (
                id,
                ledger::Escrow {
                    escrow_id: id,
                    buyer: cx_protocol::order::account_of(&buyer),
                    amount: 10,
                    reclaimable_at_s: u64::MAX,
                },
            )
        })
        .collect();
    let part = ledger::assemble(
        ledger::Head {
            chain_id: 1,
            contract: alloy::primitives::Address::ZERO,
            key_epoch: 0,
            nonce: 1,
            fee: Default::default(),
        },
        receipts,
        &escrows,
        vec![],
    )
    .unwrap();
    let abandoned = store
        .create_batch(std::slice::from_ref(&part))
        .await
        .unwrap();
    assert!(store.pending_receipts().await.unwrap().is_empty());
    // Abandoning frees the nonce and returns the receipts.
    store.abandon_batch(abandoned).await.unwrap();
    assert!(store.unfinished().await.unwrap().is_empty());
    assert_eq!(store.pending_receipts().await.unwrap().len(), 2);
    let id = store
        .create_batch(std::slice::from_ref(&part))
        .await
        .unwrap();
    assert!(store.pending_receipts().await.unwrap().is_empty());
    assert!(
        store
            .create_batch(std::slice::from_ref(&part))
            .await
            .is_err()
    );
    let unfinished = store.unfinished().await.unwrap();
    assert_eq!(unfinished.len(), 1);
    assert_eq!(unfinished[0].batch, part);
    assert_eq!(unfinished[0].status, PartStatus::Created);
    store.record_signature(id, 1, &[7; 65]).await.unwrap();
    store.record_signature(id, 1, &[8; 65]).await.unwrap();
    assert!(
        store.abandon_batch(id).await.is_err(),
        "a signed batch stays"
    );
    let signed = store.latest_part(1).await.unwrap().unwrap();
    assert_eq!(signed.status, PartStatus::Signed);
    assert_eq!(
        signed.signature,
        Some(vec![7; 65]),
        "the first signature stays"
    );
    store.record_posted(id, 1, None).await.unwrap();
    assert!(store.unfinished().await.unwrap().is_empty());
    store.log_step(id, Some(1), "posted", "x").await.unwrap();
    assert_eq!(store.steps(id).await.unwrap().len(), 1);
    // Rejection takes a pending receipt out, once.
    let third = receipt(2);
    store
        .add_receipts(std::slice::from_ref(&third))
        .await
        .unwrap();
    assert!(store.reject_receipt(third.job_id(), "bad").await.unwrap());
    assert!(!store.reject_receipt(third.job_id(), "bad").await.unwrap());
    assert!(store.pending_receipts().await.unwrap().is_empty());
}

#[tokio::test]
async fn both_stores_keep_the_outbox_the_same_way() {
    exercise_store(&cx_settlement::coordinator::MemoryStore::default()).await;
    let db = TempDatabase::create()
        .await
        .expect("PostgreSQL reachable (set DATABASE_URL)");
    exercise_store(&PgStore::new(db.pool().await.unwrap())).await;
}
