//! The coordinator on its in-memory boundaries: batching across chains, any t of n under the
//! diversity rule, posting exactly once when an answer is lost or another process posted, and
//! key rotation — no processes, sockets, Anvil or PostgreSQL.

use alloy::primitives::{Address, U256};
use cx_protocol::pq::Identity;
use cx_protocol::voucher::Parties;
use k256::ecdsa::SigningKey;

use super::*;
use crate::config::Member;

const PROVIDER: Address = Address::repeat_byte(0x11);

fn member(index: u16, operator: &str) -> Member {
    Member {
        index,
        address: format!("127.0.0.1:{}", 9100 + index),
        verification_key: Vec::new(),
        operator: operator.into(),
        region: format!("region-{index}"),
    }
}

struct Market {
    coordinator: Coordinator<MemoryStore, MemoryChain, MemoryCommittee>,
    provider: Identity,
    exchange: Identity,
    buyer: SigningKey,
    buyer_identity: Identity,
    nonce: std::sync::atomic::AtomicU64,
}

/// The buyer every test's jobs are for.
fn buyer() -> Address {
    cx_protocol::order::account_of(&SigningKey::from_slice(&[0x22; 32]).unwrap())
}

impl Market {
    /// Five signers of operators a, a, b, b, c; any 3 from at least 2 operators; `chains`.
    async fn new(chain_ids: &[u64]) -> Market {
        let operators = ["a", "a", "b", "b", "c"];
        let members = (1..=5)
            .map(|i| member(i, operators[i as usize - 1]))
            .collect();
        let committee = MemoryCommittee::new(members, 3, 2).unwrap();
        let package = committee.dkg(0).await.unwrap();
        let key = EvmGroupKey::from_verifying_key(package.verifying_key()).unwrap();
        let chains = chain_ids
            .iter()
            .map(|&id| MemoryChain::new(id, key))
            .collect();
        let store = MemoryStore::default();
        store.save_group_key(0, &package).await.unwrap();
        let exchange = Identity::from_seed([8; 32]);
        let market = crate::config::MarketTerms {
            exchange_key: exchange.public().to_bytes().to_vec(),
            fee: Default::default(),
            slash: Default::default(),
        };
        Market {
            coordinator: Coordinator::new(store, committee, chains, &market).unwrap(),
            provider: Identity::from_seed([9; 32]),
            exchange,
            buyer: SigningKey::from_slice(&[0x22; 32]).unwrap(),
            buyer_identity: Identity::from_seed([7; 32]),
            nonce: Default::default(),
        }
    }

    fn chain(&self, chain_id: u64) -> &MemoryChain {
        self.coordinator.chain(chain_id).unwrap()
    }

    /// Opens `count` escrows of 1,000 on `chain_id` and returns the vouchers of one job on
    /// each, owing `owed`.
    fn jobs(&self, chain_id: u64, count: usize, owed: u128) -> Vec<Voucher> {
        self.jobs_until(chain_id, count, owed, u64::MAX)
    }

    /// As [`Market::jobs`], with escrows their buyer may reclaim after `reclaimable_at_s`.
    fn jobs_until(
        &self,
        chain_id: u64,
        count: usize,
        owed: u128,
        reclaimable_at_s: u64,
    ) -> Vec<Voucher> {
        (0..count)
            .map(|_| {
                let escrow_id =
                    self.chain(chain_id)
                        .open_job_until(buyer(), 1_000, reclaimable_at_s);
                self.job_on(chain_id, escrow_id, owed)
            })
            .collect()
    }

    /// One more job on tab `escrow_id` of `chain_id`, owing `owed`: the buyer's intent, the
    /// exchange's assignment and the provider's receipt.
    fn job_on(&self, chain_id: u64, escrow_id: u64, owed: u128) -> Voucher {
        let nonce = self
            .nonce
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let domain = cx_protocol::order::domain(chain_id, self.chain(chain_id).settlement());
        Parties {
            buyer: &self.buyer,
            buyer_identity: &self.buyer_identity,
            exchange: &self.exchange,
            provider: &self.provider,
            payout: PROVIDER,
        }
        .intent_job(&domain, escrow_id, nonce, owed, owed, owed)
        .unwrap()
    }

    async fn steps(&self, batch_id: i64) -> Vec<String> {
        let steps = self.coordinator.store().steps(batch_id).await.unwrap();
        steps.into_iter().map(|(_, step, _)| step).collect()
    }
}

#[tokio::test]
async fn one_batch_has_one_part_per_chain_with_receipts_and_credits_add_up() {
    let market = Market::new(&[1, 2, 3]).await;
    let mut receipts = market.jobs(1, 3, 700);
    receipts.extend(market.jobs(2, 2, 400));
    let c = &market.coordinator;
    assert_eq!(c.submit(&receipts).await.unwrap(), 5);
    assert_eq!(
        c.submit(&receipts).await.unwrap(),
        0,
        "idempotent by job id"
    );

    let id = c.run_once().await.unwrap().expect("a batch");
    let parts = c.store().parts(id).await.unwrap();
    assert_eq!(parts.len(), 2, "chain 3 has no receipts, so no part");
    for (chain_id, provider_total, buyer_total) in [(1, 2_100, 900), (2, 800, 1_200)] {
        assert_eq!(market.chain(chain_id).landed().len(), 1);
        let (amount, _) = c.claim_proof(chain_id, PROVIDER).await.unwrap();
        assert_eq!(amount, U256::from(provider_total));
        let (refund, _) = c.claim_proof(chain_id, buyer()).await.unwrap();
        assert_eq!(refund, U256::from(buyer_total));
    }
    assert!(market.chain(3).landed().is_empty());
    assert!(matches!(
        c.claim_proof(3, PROVIDER).await,
        Err(Error::NoBatchYet { chain_id: 3 })
    ));
    assert_eq!(
        market
            .steps(id)
            .await
            .iter()
            .filter(|s| *s == "posted")
            .count(),
        2
    );
    assert_eq!(c.run_once().await.unwrap(), None, "nothing left to settle");

    // A second batch carries the balances forward (cumulative), at the next nonce.
    c.submit(&market.jobs(1, 1, 100)).await.unwrap();
    c.run_once().await.unwrap().expect("a batch");
    assert_eq!(market.chain(1).landed().last().unwrap().0, 2);
    let (amount, _) = c.claim_proof(1, PROVIDER).await.unwrap();
    assert_eq!(amount, U256::from(2_200));
}

#[tokio::test]
async fn a_receipt_for_a_chain_outside_the_registry_is_refused() {
    let market = Market::new(&[1]).await;
    let mut receipts = market.jobs(1, 1, 10);
    receipts[0].receipt.receipt.chain_id = 7;
    assert!(matches!(
        market.coordinator.submit(&receipts).await,
        Err(Error::UnknownChain { chain_id: 7 })
    ));
}

#[tokio::test]
async fn any_three_of_five_sign_under_the_diversity_rule_and_a_short_committee_waits() {
    let market = Market::new(&[1]).await;
    let c = &market.coordinator;
    // Two of five gone (one of a, one of b): any 3 still sign, from at least 2 operators.
    c.committee().set_up(1, false);
    c.committee().set_up(3, false);
    c.submit(&market.jobs(1, 2, 500)).await.unwrap();
    c.run_once().await.unwrap().expect("a batch");
    let set = c.committee().signing_sets().last().unwrap().clone();
    assert_eq!(set, vec![2, 4, 5]);

    // Three gone: the batch is recorded but waits unsigned, and nothing reaches the chain.
    c.committee().set_up(5, false);
    c.submit(&market.jobs(1, 1, 300)).await.unwrap();
    for _ in 0..2 {
        let err = c.run_once().await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::WaitingForSigners {
                    reachable: 2,
                    threshold: 3,
                    ..
                }
            ),
            "{err}"
        );
    }
    let unfinished = c.store().unfinished().await.unwrap();
    assert_eq!(unfinished.len(), 1);
    assert_eq!(unfinished[0].status, PartStatus::Created);
    assert_eq!(market.chain(1).landed().len(), 1);
    let steps = market.steps(unfinished[0].batch_id).await;
    assert!(steps.contains(&"waiting".to_string()), "{steps:?}");

    // One of operator a returns: the same batch lands, once.
    c.committee().set_up(1, true);
    assert_eq!(c.run_once().await.unwrap(), None);
    assert_eq!(market.chain(1).landed().len(), 2);
    assert!(c.store().unfinished().await.unwrap().is_empty());
    let set = c.committee().signing_sets().last().unwrap().clone();
    assert_eq!(set, vec![1, 2, 4]);
}

#[tokio::test]
async fn a_rule_no_set_can_meet_is_refused_up_front() {
    let members = vec![member(1, "a"), member(2, "a"), member(3, "b")];
    assert!(matches!(
        MemoryCommittee::new(members.clone(), 2, 3),
        Err(Error::ImpossibleRule {
            min_operators: 3,
            ..
        })
    ));
    assert!(matches!(
        MemoryCommittee::new(members, 4, 1),
        Err(Error::ImpossibleThreshold {
            threshold: 4,
            members: 3
        })
    ));
}

#[tokio::test]
async fn a_post_whose_answer_is_lost_is_recorded_from_the_chain_not_sent_again() {
    let market = Market::new(&[1]).await;
    let c = &market.coordinator;
    c.submit(&market.jobs(1, 2, 600)).await.unwrap();
    let id = c.build().await.unwrap().expect("a batch");
    c.sign_pending().await.unwrap();
    assert_eq!(
        c.store().parts(id).await.unwrap()[0].status,
        PartStatus::Signed
    );

    // The transaction goes through; its answer does not come back.
    market.chain(1).lose_answers(1);
    assert_eq!(c.post_pending().await.unwrap(), 1);
    assert_eq!(market.chain(1).transactions(), 1);
    let part = &c.store().parts(id).await.unwrap()[0];
    assert_eq!(part.status, PartStatus::Posted);
    assert_eq!(part.tx_hash, None, "not known, and not invented");
    let steps = c.store().steps(id).await.unwrap();
    assert!(
        steps
            .iter()
            .any(|(_, s, d)| s == "posted" && d.contains("already on chain")),
        "{steps:?}"
    );
    // Running again sends nothing.
    c.resume().await.unwrap();
    assert_eq!(market.chain(1).transactions(), 1);
}

#[tokio::test]
async fn a_batch_another_process_posted_first_is_recognised_on_chain() {
    let market = Market::new(&[1]).await;
    let c = &market.coordinator;
    c.submit(&market.jobs(1, 1, 10)).await.unwrap();
    let id = c.build().await.unwrap().expect("a batch");
    c.sign_pending().await.unwrap();
    // A coordinator that died after sending (before recording) left this on chain.
    let part = c.store().parts(id).await.unwrap().remove(0);
    let signature = frost::Signature::deserialize(part.signature.as_ref().unwrap()).unwrap();
    market
        .chain(1)
        .post_batch(
            &part.batch.message(),
            &EvmSignature::from_frost(&signature).unwrap(),
        )
        .await
        .unwrap();
    c.resume().await.unwrap();
    assert_eq!(market.chain(1).transactions(), 1, "posted once, not twice");
    assert_eq!(
        c.store().parts(id).await.unwrap()[0].status,
        PartStatus::Posted
    );
}

#[tokio::test]
async fn a_build_waits_for_the_unfinished_batch_before_it() {
    let market = Market::new(&[1]).await;
    let c = &market.coordinator;
    c.submit(&market.jobs(1, 1, 10)).await.unwrap();
    let first = c.build().await.unwrap().expect("a batch");
    c.submit(&market.jobs(1, 1, 10)).await.unwrap();
    assert!(matches!(
        c.build().await,
        Err(Error::Unfinished { batch_id }) if batch_id == first
    ));
    // Abandoning it frees its nonce and returns its receipts: both settle in the next batch.
    c.abandon(first, "test").await.unwrap();
    let id = c.run_once().await.unwrap().expect("a batch");
    assert_eq!(
        c.store().parts(id).await.unwrap()[0].batch.receipts.len(),
        2
    );
    assert_eq!(
        market.chain(1).landed(),
        vec![(1, c.store().parts(id).await.unwrap()[0].batch.balances_root)]
    );
}

#[tokio::test]
async fn a_rotated_key_signs_the_next_batch() {
    let market = Market::new(&[1, 2]).await;
    let c = &market.coordinator;
    let new_package = c.dkg(1).await.unwrap();
    c.rotate(1).await.unwrap();
    c.rotate(1).await.unwrap(); // finished already: nothing sent twice
    let new_key = EvmGroupKey::from_verifying_key(new_package.verifying_key()).unwrap();
    for chain_id in [1, 2] {
        let on_chain = market.chain(chain_id).group_key().await.unwrap();
        assert_eq!((on_chain.key, on_chain.epoch), (new_key, 1));
        assert_eq!(market.chain(chain_id).transactions(), 1);
    }
    c.submit(&market.jobs(1, 1, 10)).await.unwrap();
    c.run_once().await.unwrap().expect("a batch");
    assert_eq!(market.chain(1).landed().len(), 1);
}

#[tokio::test]
async fn the_memory_chain_refuses_what_the_contract_refuses() {
    let market = Market::new(&[1]).await;
    let c = &market.coordinator;
    c.submit(&market.jobs(1, 1, 10)).await.unwrap();
    let id = c.build().await.unwrap().expect("a batch");
    c.sign_pending().await.unwrap();
    let part = c.store().parts(id).await.unwrap().remove(0);
    let signature = frost::Signature::deserialize(part.signature.as_ref().unwrap()).unwrap();
    let signature = EvmSignature::from_frost(&signature).unwrap();
    let chain = market.chain(1);
    let mut tampered = part.batch.message();
    tampered.balances_root = alloy::primitives::B256::repeat_byte(1);
    assert!(matches!(
        chain.post_batch(&tampered, &signature).await,
        Err(Error::Reverted { name, .. }) if name == "InvalidSignature"
    ));
    chain
        .post_batch(&part.batch.message(), &signature)
        .await
        .unwrap();
    assert!(matches!(
        chain.post_batch(&part.batch.message(), &signature).await,
        Err(Error::Reverted { name, .. }) if name == "BatchNonceNotIncreasing"
    ));
}

/// The outbox's transitions on the memory store (PostgreSQL's twin runs the same function in
/// cx-e2e): a part is unfinished until posted, a signature is kept once, receipts are batched
/// once, and a nonce cannot be taken twice.
#[tokio::test]
async fn the_memory_store_keeps_the_outbox() {
    let market = Market::new(&[1]).await;
    let store = MemoryStore::default();
    let receipts = market.jobs(1, 2, 5);
    assert_eq!(store.add_receipts(&receipts).await.unwrap(), 2);
    assert_eq!(store.add_receipts(&receipts[..1]).await.unwrap(), 0);
    let mut escrows = std::collections::HashMap::new();
    for id in 0..2 {
        let escrow = market.chain(1).open_escrow(id).await.unwrap().unwrap();
        escrows.insert(id, escrow);
    }
    let head = ledger::Head {
        chain_id: 1,
        contract: Address::ZERO,
        key_epoch: 0,
        nonce: 1,
        fee: Default::default(),
    };
    let part = ledger::assemble(head, receipts, &escrows, vec![]).unwrap();
    let id = store
        .create_batch(std::slice::from_ref(&part))
        .await
        .unwrap();
    assert!(store.pending_receipts().await.unwrap().is_empty());
    assert!(matches!(
        store.create_batch(std::slice::from_ref(&part)).await,
        Err(Error::NonceInUse {
            chain_id: 1,
            nonce: 1
        })
    ));
    store.record_signature(id, 1, &[7; 65]).await.unwrap();
    store.record_signature(id, 1, &[8; 65]).await.unwrap();
    assert!(matches!(
        store.abandon_batch(id).await,
        Err(Error::SignedAlready { .. })
    ));
    assert_eq!(
        store.latest_part(1).await.unwrap().unwrap().signature,
        Some(vec![7; 65])
    );
    store.record_posted(id, 1, None).await.unwrap();
    assert!(store.unfinished().await.unwrap().is_empty());
}

/// What broke: a buyer who reclaimed an escrow between signing and mining made the signed
/// batch revert forever, and with it every later batch on that chain. Now the coordinator sees
/// the reclaim on chain, replaces the part at the same nonce with the rest of its receipts, and
/// that lands; an escrow inside the safety margin is never put in a batch at all.
#[tokio::test]
async fn a_reclaim_racing_a_signed_batch_settles_the_rest_at_the_same_nonce() {
    let market = Market::new(&[1]).await;
    let c = &market.coordinator;
    let chain = market.chain(1);
    let now = chain.clock_s();
    // Inside the margin from the start: rejected at build, never signed.
    let close = market.jobs_until(1, 1, 100, now + BUILD_RECLAIM_MARGIN_S);
    let soon = market.jobs_until(1, 1, 100, now + BUILD_RECLAIM_MARGIN_S + 60);
    let later = market.jobs_until(1, 2, 100, now + 100_000);
    c.submit(&close).await.unwrap();
    c.submit(&soon).await.unwrap();
    c.submit(&later).await.unwrap();
    let id = c.build().await.unwrap().expect("a batch");
    c.sign_pending().await.unwrap();
    let signed = c.store().parts(id).await.unwrap().remove(0);
    assert_eq!(signed.status, PartStatus::Signed);
    assert_eq!(
        signed.batch.receipts.len(),
        3,
        "the escrow inside the margin is left out"
    );
    assert!(
        c.store().pending_receipts().await.unwrap().is_empty(),
        "it was rejected"
    );

    // The coordinator stalls; time passes; the buyer reclaims the `soon` escrow.
    chain.advance_s(BUILD_RECLAIM_MARGIN_S + 61);
    chain.reclaim(soon[0].receipt.receipt.escrow_id).unwrap();
    c.resume().await.unwrap();
    assert_eq!(chain.landed().len(), 1);
    assert_eq!(chain.landed()[0].0, 1, "the same nonce");
    let part = c.store().parts(id).await.unwrap().remove(0);
    assert_eq!(part.status, PartStatus::Posted);
    assert_eq!(part.batch.nonce, 1);
    assert_eq!(part.batch.receipts.len(), 2);
    assert_ne!(part.batch.digest(), signed.batch.digest());
    assert_eq!(c.claim_proof(1, PROVIDER).await.unwrap().0, U256::from(200));
    let steps = market.steps(id).await;
    assert!(steps.contains(&"replaced".to_string()), "{steps:?}");
    assert!(c.store().pending_receipts().await.unwrap().is_empty());
    // The chain carries on.
    c.submit(&market.jobs(1, 1, 10)).await.unwrap();
    c.run_once().await.unwrap().expect("a batch");
    assert_eq!(chain.landed().last().unwrap().0, 2);
}

/// What broke: a batch took every pending receipt, so past ~1,500 each sign request was over
/// the frame limit and settlement stopped for good. 5,000 pending receipts now settle in parts of
/// at most `MAX_RECEIPTS_PER_BATCH`, oldest first, each at the next nonce.
#[tokio::test]
async fn five_thousand_pending_receipts_settle_in_bounded_batches() {
    let market = Market::new(&[1]).await;
    let c = &market.coordinator;
    let chain = market.chain(1);
    let template = market.jobs(1, 1, 10).remove(0);
    let mut receipts = vec![template.clone()];
    for _ in 1..5_000 {
        let escrow_id = chain.open_job(buyer(), 1_000);
        let mut r = template.clone();
        r.receipt.receipt.escrow_id = escrow_id;
        r.receipt.receipt.job_id[8..16].copy_from_slice(&escrow_id.to_be_bytes());
        receipts.push(r);
    }
    // Straight into the store: the in-memory committee does not check signatures, and signing
    // 5,000 vouchers would be the test's whole cost.
    assert_eq!(c.store().add_receipts(&receipts).await.unwrap(), 5_000);
    let mut sizes = Vec::new();
    while let Some(id) = c.run_once().await.unwrap() {
        sizes.push(c.store().parts(id).await.unwrap()[0].batch.receipts.len());
    }
    let max = ledger::MAX_RECEIPTS_PER_BATCH;
    let mut expected = vec![max; 5_000 / max];
    if 5_000 % max > 0 {
        expected.push(5_000 % max);
    }
    assert_eq!(sizes, expected);
    let nonces: Vec<u64> = chain.landed().iter().map(|(n, _)| *n).collect();
    assert_eq!(nonces, (1..=expected.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        c.claim_proof(1, PROVIDER).await.unwrap().0,
        U256::from(50_000)
    );
}

/// A tab pays many jobs and settles once, whole; the coordinator refuses a receipt whose
/// provider was never assigned the job, keeping nothing of the call.
#[tokio::test]
async fn a_tab_settles_its_jobs_together_and_an_unassigned_receipt_is_refused() {
    let market = Market::new(&[1]).await;
    let c = &market.coordinator;
    let tab = market.chain(1).open_job(buyer(), 1_000);
    let jobs: Vec<Voucher> = (0..3).map(|_| market.job_on(1, tab, 200)).collect();

    // Mallory is registered somewhere with her own key; she re-signs one job's receipt as hers.
    let mallory = Identity::from_seed([66; 32]);
    let mut forged = jobs[0].clone();
    forged.receipt.receipt.provider_key = mallory.id().0;
    forged.receipt =
        cx_protocol::receipt::SignedReceipt::sign(forged.receipt.receipt.clone(), &mallory)
            .unwrap();
    let err = c.submit(&[jobs[1].clone(), forged]).await.unwrap_err();
    assert!(err.to_string().contains("provider_key"), "{err}");
    assert!(c.store().pending_receipts().await.unwrap().is_empty());

    assert_eq!(c.submit(&jobs).await.unwrap(), 3);
    let id = c.run_once().await.unwrap().expect("a batch");
    let part = c.store().parts(id).await.unwrap().remove(0);
    assert_eq!(part.batch.receipts.len(), 3);
    assert_eq!(part.batch.escrows.len(), 1, "the tab settles once");
    assert_eq!(c.claim_proof(1, PROVIDER).await.unwrap().0, U256::from(600));
    assert_eq!(c.claim_proof(1, buyer()).await.unwrap().0, U256::from(400));
}

#[test]
fn whole_tabs_are_never_split_across_parts() {
    let market_jobs = |tab: u64, n: usize| -> Vec<Voucher> {
        let exchange = Identity::from_seed([1; 32]);
        let provider = Identity::from_seed([2; 32]);
        let buyer_identity = Identity::from_seed([3; 32]);
        let key = SigningKey::from_slice(&[4; 32]).unwrap();
        let parties = Parties {
            buyer: &key,
            buyer_identity: &buyer_identity,
            exchange: &exchange,
            provider: &provider,
            payout: PROVIDER,
        };
        let domain = cx_protocol::order::domain(1, Address::ZERO);
        (0..n)
            .map(|i| {
                parties
                    .intent_job(&domain, tab, tab * 100 + i as u64, 1, 1, 1)
                    .unwrap()
            })
            .collect()
    };
    let mut pending = market_jobs(1, 2);
    pending.extend(market_jobs(2, 3));
    pending.extend(market_jobs(3, 1));
    // Tab 2 does not fit beside tab 1 in a part of 4; tab 3 does.
    let tabs: Vec<u64> = whole_tabs(pending, 4)
        .iter()
        .map(|v| v.receipt.receipt.escrow_id)
        .collect();
    assert_eq!(tabs, vec![1, 1, 3]);
}
