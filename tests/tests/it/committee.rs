//! The committee end to end: `cx-signer run` processes on free ports, a DKG over PQ sessions,
//! real Anvil chains, the coordinator on a throwaway PostgreSQL database.
//!
//! (Moved here from cx-settlement: these start processes, so they live with the harness.)
//!
//! Two scenarios, each with its own signers, chains and database (multi-process set-ups are the
//! expensive part, so each test walks through several failures in order):
//! - a batch settles on two chains; with 2 of 5 signers killed it still settles; with 3 killed it
//!   waits and then lands exactly once when one returns; a diversity rule no set can meet is a
//!   clear error; a rotated key signs the next batch;
//! - a tampered batch is refused by honest signers with their reasons; a coordinator that dies
//!   between aggregation and posting (or after posting, before recording) lands the batch once on
//!   restart; a wrong identity key, an unknown peer, a replayed or an altered frame end the
//!   session.
//!
//! One file (~1,100 lines) on purpose: every test drives the same multi-process committee fixture
//! (signer processes, chains, the coordinator's store) defined at the top, and each scenario reads top
//! to bottom; split, the fixture would be written twice or hidden in a module of its own.

use std::collections::HashMap;
use std::path::PathBuf;

use alloy::primitives::U256;
use cx_contracts::{ChainDeployment, DeploymentsFile};
use cx_devnet::db::TempDatabase;
use cx_devnet::{Cluster, ScenarioChain};
use cx_protocol::pq::Identity;
use cx_settlement::Error;
use cx_settlement::checked::UNKNOWN_VOUCHERS;
use cx_settlement::config::CommitteeRule;
use cx_settlement::coordinator::{Coordinator, EvmChain, PartStatus, PgStore, Store};
use cx_settlement::frost::{EvmGroupKey, EvmSignature};
use cx_settlement::ledger::{self, ChainBatch};
use cx_settlement::merkle::BalancesTree;
use cx_settlement::onchain::ChainView;
use cx_settlement::transport::{Channel, Limits};
use cx_settlement::wire::{PartToSign, Request, Response, SignBatchRequest};
use frost_secp256k1 as frost;

/// `cx-signer`, built by Cargo for this test run (see [`cx_devnet::signer_binary`] for why not
/// `CARGO_BIN_EXE_cx-signer`, which only exists inside cx-settlement's own tests).
fn signer_binary() -> PathBuf {
    cx_devnet::signer_binary().expect("cx-signer builds")
}

fn rule(threshold: u16, min_operators: usize) -> CommitteeRule {
    CommitteeRule {
        threshold,
        min_operators,
    }
}

fn write_deployments(path: &std::path::Path, chains: &[ChainDeployment]) {
    DeploymentsFile {
        chains: chains.to_vec(),
    }
    .write(path)
    .unwrap();
}

async fn store(db: &TempDatabase) -> PgStore {
    PgStore::new(
        db.pool()
            .await
            .expect("PostgreSQL reachable (set DATABASE_URL)"),
    )
}

fn evm_chains(
    views: Vec<ChainView>,
    poster: &alloy::signers::local::PrivateKeySigner,
) -> Vec<EvmChain> {
    views
        .into_iter()
        .map(|view| EvmChain::new(view, poster.clone()).unwrap())
        .collect()
}

async fn events(chain: &ScenarioChain) -> usize {
    chain.operator.settled_batches(0).await.unwrap().len()
}

async fn nonce(chain: &ScenarioChain) -> u64 {
    chain.view().unwrap().batch_nonce().await.unwrap()
}

/// Opens `count` tabs of 1,000 on `chain` and returns the voucher of one job on each, owing
/// `owed`, assigned by the cluster's exchange.
async fn open_and_receipt(
    exchange: &Identity,
    chain: &ScenarioChain,
    count: usize,
    owed: u128,
) -> Vec<cx_protocol::voucher::Voucher> {
    let ids = chain.open_jobs(count, 1_000).await.unwrap();
    chain.vouchers(&ids, owed, exchange).unwrap()
}

/// The market terms the cluster's signers pin.
fn market(cluster: &Cluster) -> cx_settlement::config::MarketTerms {
    cx_settlement::config::MarketTerms {
        exchange_key: cluster.exchange.public().to_bytes().to_vec(),
        fee: cluster.fee,
        slash: Default::default(),
    }
}

/// A committee's coordinator over two fresh chains (31337, 31338) deployed under its group key
/// from a DKG among the cluster's signers (`t` of them, `min_operators` operators), its store in a
/// fresh database.
struct TwoChains {
    package: frost::keys::PublicKeyPackage,
    chains: [ScenarioChain; 2],
    db: TempDatabase,
    coordinator: Coordinator<PgStore, EvmChain, cx_settlement::coordinator::Committee>,
}

async fn two_chains(cluster: &Cluster, t: u16, min_operators: usize) -> TwoChains {
    let committee = cluster.committee(t, min_operators).unwrap();
    let package = committee.dkg(0).await.unwrap();
    let key = EvmGroupKey::from_verifying_key(package.verifying_key()).unwrap();
    let chains = [
        ScenarioChain::start(31337, key).await.unwrap(),
        ScenarioChain::start(31338, key).await.unwrap(),
    ];
    write_deployments(
        &cluster.deployments_file,
        &[chains[0].entry(), chains[1].entry()],
    );
    let db = TempDatabase::create().await.unwrap();
    let store = store(&db).await;
    store.save_group_key(0, &package).await.unwrap();
    let views = chains.iter().map(|c| c.view().unwrap()).collect();
    let poster = chains[0].anvil.keys[3].clone();
    let coordinator = Coordinator::new(
        store,
        committee,
        evm_chains(views, &poster),
        &market(cluster),
    )
    .unwrap();
    TwoChains {
        package,
        chains,
        db,
        coordinator,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_settle_on_two_chains_through_signer_loss_and_key_rotation() {
    let mut cluster =
        Cluster::start(&signer_binary(), &["a", "a", "b", "b", "c"], rule(3, 2)).unwrap();
    // Four distinct operators can never sign when the committee has three: refused up front.
    let err = cluster.committee(3, 4).unwrap_err().to_string();
    assert!(err.contains("cannot be met"), "{err}");

    let TwoChains {
        package,
        chains,
        db: _db,
        coordinator,
    } = two_chains(&cluster, 3, 2).await;

    // 1. One batch, both chains.
    let mut receipts = open_and_receipt(&cluster.exchange, &chains[0], 3, 700).await;
    receipts.extend(open_and_receipt(&cluster.exchange, &chains[1], 2, 400).await);
    assert_eq!(coordinator.submit(&receipts).await.unwrap(), 5);
    assert_eq!(
        coordinator.submit(&receipts).await.unwrap(),
        0,
        "idempotent"
    );
    let id = coordinator.run_once().await.unwrap().expect("a batch");
    for (chain, (provider_total, buyer_total)) in chains.iter().zip([(2_100, 900), (800, 1_200)]) {
        assert_eq!(nonce(chain).await, 1);
        let provider = chain.provider.account();
        let (amount, proof) = coordinator
            .claim_proof(chain.anvil.chain_id, provider)
            .await
            .unwrap();
        assert_eq!(amount, U256::from(provider_total));
        let before = chain.operator.asset_balance(provider).await.unwrap();
        chain.provider.claim(amount, proof).await.unwrap();
        let after = chain.operator.asset_balance(provider).await.unwrap();
        assert_eq!(after - before, U256::from(provider_total));
        let (refund, _) = coordinator
            .claim_proof(chain.anvil.chain_id, chain.buyer.account())
            .await
            .unwrap();
        assert_eq!(refund, U256::from(buyer_total));
    }
    let steps: Vec<String> = coordinator
        .store()
        .steps(id)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, step, _)| step)
        .collect();
    assert_eq!(
        steps.iter().filter(|s| *s == "posted").count(),
        2,
        "{steps:?}"
    );

    // 2. Two of five signers gone (one of operator a, one of b): any 3 still sign.
    cluster.kill(1);
    cluster.kill(3);
    let receipts = open_and_receipt(&cluster.exchange, &chains[0], 2, 500).await;
    coordinator.submit(&receipts).await.unwrap();
    coordinator.run_once().await.unwrap().expect("a batch");
    assert_eq!(nonce(&chains[0]).await, 2);
    assert_eq!(nonce(&chains[1]).await, 1, "no receipts for chain 2");

    // 3. Three gone: the batch waits, recorded but unsigned, and nothing reaches the chain.
    cluster.kill(5);
    let receipts = open_and_receipt(&cluster.exchange, &chains[1], 1, 300).await;
    coordinator.submit(&receipts).await.unwrap();
    for _ in 0..2 {
        let err = coordinator.run_once().await.unwrap_err();
        assert!(matches!(&err, Error::WaitingForSigners { .. }), "{err}");
    }
    let unfinished = coordinator.store().unfinished().await.unwrap();
    assert_eq!(unfinished.len(), 1);
    assert_eq!(unfinished[0].status, PartStatus::Created);
    assert_eq!(nonce(&chains[1]).await, 1);
    // One returns: the same batch lands, once.
    cluster.restart(1).unwrap();
    assert_eq!(coordinator.run_once().await.unwrap(), None);
    assert_eq!(nonce(&chains[1]).await, 2);
    assert_eq!(events(&chains[1]).await, 2);
    assert!(coordinator.store().unfinished().await.unwrap().is_empty());

    // A rule the reachable signers cannot meet (operator c is down): a clear error, no round.
    let strict = cluster.committee(3, 3).unwrap();
    let err = strict
        .sign(b"never signed", &package, |_, _| Request::Ping)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::WaitingForSigners {
                min_operators: 3,
                ..
            }
        ),
        "{err}"
    );

    // 4. Rotation: a fresh DKG among all five, installed by a signature of the current key.
    cluster.restart(3).unwrap();
    cluster.restart(5).unwrap();
    let new_package = coordinator.dkg(1).await.unwrap();
    assert_ne!(new_package.verifying_key(), package.verifying_key());
    coordinator.rotate(1).await.unwrap();
    let new_key = EvmGroupKey::from_verifying_key(new_package.verifying_key()).unwrap();
    for chain in &chains {
        let on_chain = chain.view().unwrap().group_key().await.unwrap();
        assert_eq!((on_chain.key, on_chain.epoch), (new_key, 1));
    }
    let receipts = open_and_receipt(&cluster.exchange, &chains[0], 1, 100).await;
    coordinator.submit(&receipts).await.unwrap();
    coordinator.run_once().await.unwrap().expect("a batch");
    assert_eq!(nonce(&chains[0]).await, 3);
}

/// Sends `signal` (`STOP`, `CONT`) to a chain's node.
fn signal(chain: &ScenarioChain, signal: &str) {
    let pid = chain.anvil.process().pid().expect("anvil runs");
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_chain_hung_holds_back_only_its_own_receipts_which_settle_once_it_answers() {
    let cluster = Cluster::start(&signer_binary(), &["a", "b", "c"], rule(2, 2)).unwrap();
    let TwoChains {
        chains,
        db: _db,
        coordinator,
        ..
    } = two_chains(&cluster, 2, 2).await;

    // Chain 31338's node stops answering (accepts, never replies) with receipts for both
    // chains waiting: 31337 settles anyway; 31338's receipts wait for a later batch.
    let mut receipts = open_and_receipt(&cluster.exchange, &chains[0], 2, 300).await;
    receipts.extend(open_and_receipt(&cluster.exchange, &chains[1], 2, 200).await);
    coordinator.submit(&receipts).await.unwrap();
    signal(&chains[1], "STOP");
    let started = std::time::Instant::now();
    let first = coordinator
        .run_once()
        .await
        .unwrap()
        .expect("a batch for 31337");
    assert!(
        started.elapsed() < 4 * cx_settlement::evm::RPC_TIMEOUT,
        "a hung node fails its calls within the timeout: {:?}",
        started.elapsed()
    );
    signal(&chains[1], "CONT");
    assert_eq!(nonce(&chains[0]).await, 1, "the other chain settled");
    assert_eq!(nonce(&chains[1]).await, 0);
    let parts = coordinator.store().parts(first).await.unwrap();
    assert_eq!(parts.len(), 1, "31338 is not in it");
    assert_eq!(parts[0].batch.chain_id, 31337);
    assert!(coordinator.store().unfinished().await.unwrap().is_empty());

    // It answers again: its receipts settle in the next batch, once, and nothing else is sent.
    coordinator
        .run_once()
        .await
        .unwrap()
        .expect("a batch for 31338");
    assert_eq!(coordinator.run_once().await.unwrap(), None);
    assert_eq!(nonce(&chains[1]).await, 1);
    assert_eq!(events(&chains[1]).await, 1);
    assert_eq!(nonce(&chains[0]).await, 1);
    assert_eq!(events(&chains[0]).await, 1);
    assert!(coordinator.store().unfinished().await.unwrap().is_empty());
}

/// The steps the coordinator recorded for batch `id`, as "step: detail".
async fn steps(
    coordinator: &Coordinator<PgStore, EvmChain, cx_settlement::coordinator::Committee>,
    id: i64,
) -> Vec<String> {
    coordinator
        .store()
        .steps(id)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, step, detail)| format!("{step}: {detail}"))
        .collect()
}

/// The provider's claim on `chain` is `expected`, and claiming it pays exactly that.
async fn provider_claims_exactly(
    coordinator: &Coordinator<PgStore, EvmChain, cx_settlement::coordinator::Committee>,
    chain: &ScenarioChain,
    expected: u128,
) {
    let provider = chain.provider.account();
    let (amount, proof) = coordinator
        .claim_proof(chain.anvil.chain_id, provider)
        .await
        .unwrap();
    assert_eq!(amount, U256::from(expected));
    let before = chain.operator.asset_balance(provider).await.unwrap();
    chain.provider.claim(amount, proof).await.unwrap();
    assert_eq!(
        chain.operator.asset_balance(provider).await.unwrap() - before,
        amount
    );
}

/// Points signer `index` at its own deployments file (its own RPC URLs) and restarts it.
fn give_own_nodes(cluster: &mut Cluster, index: u16, chains: &[ChainDeployment]) {
    let own = cluster.dir().join(format!("deployments-{index}.json"));
    write_deployments(&own, chains);
    let path = Cluster::config_path(cluster.dir(), index);
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["deployments_file"] = serde_json::json!(own);
    std::fs::write(&path, config.to_string()).unwrap();
    cluster.restart(index).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signer_whose_node_lags_is_left_out_and_signs_again_once_it_catches_up() {
    let mut cluster = Cluster::start(&signer_binary(), &["a", "b", "c"], rule(2, 2)).unwrap();
    let TwoChains {
        chains,
        db: _db,
        coordinator,
        ..
    } = two_chains(&cluster, 2, 2).await;
    // Signer 1 (the one a signing set is chosen from first) reads chain 31337 through a node
    // held at the current head: it sees none of the tabs opened from here on.
    let front = cx_devnet::lagging::LaggingRpc::start(&chains[0].anvil.rpc_url())
        .await
        .unwrap();
    let mut lagged = chains[0].entry();
    lagged.chain.rpc_url = front.url().to_string();
    give_own_nodes(&mut cluster, 1, &[lagged, chains[1].entry()]);
    let head = chains[0].anvil.block_number().await.unwrap();
    front.hold_at(Some(head));

    // It refuses (the escrows are not open on its chain); the other two sign and it lands.
    let receipts = open_and_receipt(&cluster.exchange, &chains[0], 2, 300).await;
    coordinator.submit(&receipts).await.unwrap();
    let first = coordinator.run_once().await.unwrap().expect("a batch");
    assert_eq!(nonce(&chains[0]).await, 1);
    let signed = steps(&coordinator, first).await;
    assert!(
        signed
            .iter()
            .any(|s| s.starts_with("signed:") && s.ends_with("signers [2, 3]")),
        "{signed:?}"
    );

    // Caught up, with signer 3 gone: it must sign, on balances it never saw (it signed no
    // batch at nonce 1), so it is sent the full list and the batch lands once.
    front.hold_at(None);
    cluster.kill(3);
    let receipts = open_and_receipt(&cluster.exchange, &chains[0], 1, 400).await;
    coordinator.submit(&receipts).await.unwrap();
    let second = coordinator.run_once().await.unwrap().expect("a batch");
    let signed = steps(&coordinator, second).await;
    assert!(
        signed
            .iter()
            .any(|s| s.contains("the full balances list") && s.ends_with("signers [1, 2]")),
        "{signed:?}"
    );
    assert_eq!(coordinator.run_once().await.unwrap(), None);
    assert_eq!(nonce(&chains[0]).await, 2);
    assert_eq!(events(&chains[0]).await, 2, "each batch once");

    // Lagging again, now behind the last batch: it sees nonce 1 and refuses batch 3; with
    // only signers 1 and 2 up no set is left, so the batch waits, refused, nothing sent.
    front.hold_at(Some(head));
    let receipts = open_and_receipt(&cluster.exchange, &chains[0], 1, 100).await;
    coordinator.submit(&receipts).await.unwrap();
    let err = coordinator.run_once().await.unwrap_err();
    assert!(
        matches!(&err, Error::Refused { refusals } if refusals.iter().any(|r| r.signer == 1)),
        "{err}"
    );
    assert_eq!(nonce(&chains[0]).await, 2);
    // Signer 3 returns: 2 and 3 sign the waiting batch, once.
    cluster.restart(3).unwrap();
    assert_eq!(coordinator.run_once().await.unwrap(), None);
    assert_eq!(nonce(&chains[0]).await, 3);
    assert_eq!(events(&chains[0]).await, 3);
    assert!(coordinator.store().unfinished().await.unwrap().is_empty());

    // Money is what the receipts say: the provider claims 300·2 + 400 + 100 less nothing
    // (the cluster's fee is 0), the buyer the rest of its four tabs of 1,000.
    provider_claims_exactly(&coordinator, &chains[0], 1_100).await;
    let (refund, _) = coordinator
        .claim_proof(31337, chains[0].buyer.account())
        .await
        .unwrap();
    assert_eq!(refund, U256::from(2_900));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_down_then_restarted_with_its_state_settles_once_and_its_watcher_sees_no_reorg() {
    let cluster = Cluster::start(&signer_binary(), &["a", "b", "c"], rule(2, 2)).unwrap();
    let TwoChains {
        mut chains,
        db: _db,
        coordinator,
        ..
    } = two_chains(&cluster, 2, 2).await;
    let books_db = TempDatabase::create().await.unwrap();
    let books = cx_exchange_server::books::Books::open(&books_db.url)
        .await
        .unwrap();
    let watcher =
        cx_exchange_server::chain::Watcher::new(books.clone(), chains[1].entry(), 0).unwrap();

    let mut receipts = open_and_receipt(&cluster.exchange, &chains[0], 2, 300).await;
    receipts.extend(open_and_receipt(&cluster.exchange, &chains[1], 2, 200).await);
    coordinator.submit(&receipts).await.unwrap();
    watcher.poll_once().await.unwrap();
    assert_eq!(
        crate::watcher::tabs_in_books(&books).await,
        crate::watcher::tabs_on_chain(&chains[1]).await
    );

    // 31338's node is shut down (it writes its state and exits): 31337 settles on its own; the
    // watcher's pass is an error, and the books keep what they had.
    chains[1].anvil.shut_down().unwrap();
    let first = coordinator
        .run_once()
        .await
        .unwrap()
        .expect("a batch for 31337");
    assert_eq!(nonce(&chains[0]).await, 1);
    let parts = coordinator.store().parts(first).await.unwrap();
    assert_eq!(parts.len(), 1, "31338 is not in it");
    assert!(watcher.poll_once().await.is_err());
    assert_eq!(crate::watcher::tabs_in_books(&books).await.len(), 2);

    // Back with its state on the same port: the same blocks and hashes, so the watcher reads
    // on with no reorg; the waiting receipts settle in the next batch, once.
    chains[1].anvil.start_again().unwrap();
    watcher.poll_once().await.unwrap();
    coordinator
        .run_once()
        .await
        .unwrap()
        .expect("a batch for 31338");
    assert_eq!(coordinator.run_once().await.unwrap(), None);
    assert_eq!((nonce(&chains[1]).await, events(&chains[1]).await), (1, 1));

    // Restarted once more after the batch: the chain still holds it, and claims pay out what
    // the receipts say.
    chains[1].anvil.shut_down().unwrap();
    chains[1].anvil.start_again().unwrap();
    watcher.poll_once().await.unwrap();
    assert_eq!((nonce(&chains[1]).await, events(&chains[1]).await), (1, 1));
    assert_eq!((nonce(&chains[0]).await, events(&chains[0]).await), (1, 1));
    let reorgs: i64 = sqlx::query_scalar("SELECT count(*) FROM exchange_chain_reorgs")
        .fetch_one(books.pool())
        .await
        .unwrap();
    assert_eq!(reorgs, 0, "a restart that kept its state is no reorg");
    assert_eq!(
        crate::watcher::tabs_in_books(&books).await,
        crate::watcher::tabs_on_chain(&chains[1]).await
    );
    provider_claims_exactly(&coordinator, &chains[1], 400).await;
}

fn sign_request(
    batch: &ChainBatch,
) -> impl Fn(alloy::primitives::B256, frost::SigningPackage) -> Request {
    let batch = batch.clone();
    move |round_id, signing_package| {
        Request::SignBatch(SignBatchRequest {
            round_id,
            batch: batch.clone(),
            previous_root: None,
            held_receipts: None,
            signing_package,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_crashes_and_session_attacks_are_refused() {
    let cluster = Cluster::start(&signer_binary(), &["a", "b", "c", "d", "e"], rule(3, 1)).unwrap();
    let committee = cluster.committee(3, 1).unwrap();
    let package = committee.dkg(0).await.unwrap();
    let key = EvmGroupKey::from_verifying_key(package.verifying_key()).unwrap();
    let chain = ScenarioChain::start(31337, key).await.unwrap();
    write_deployments(&cluster.deployments_file, &[chain.entry()]);
    let view = chain.view().unwrap();

    // 1. A tampered batch: honest signers refuse and say why; nothing is signed.
    let receipts = open_and_receipt(&cluster.exchange, &chain, 2, 600).await;
    let mut escrows = HashMap::new();
    for r in &receipts {
        let e = view
            .open_escrow(r.receipt.receipt.escrow_id)
            .await
            .unwrap()
            .unwrap();
        escrows.insert(e.escrow_id, e);
    }
    let honest = ledger::assemble(
        ledger::Head {
            chain_id: 31337,
            contract: chain.deployment.settlement,
            key_epoch: 0,
            nonce: 1,
            fee: cluster.fee,
        },
        receipts.clone(),
        &escrows,
        Vec::new(),
    )
    .unwrap();
    // The provider credited 100 more than the receipts say, with a root that matches the lie.
    let mut inflated = honest.clone();
    let provider = chain.provider.account();
    for (party, amount) in &mut inflated.new_balances {
        if *party == provider {
            *amount += U256::from(100);
        }
    }
    inflated.balances_root = BalancesTree::new(inflated.new_balances.clone())
        .unwrap()
        .root();
    let err = committee
        .sign(
            inflated.digest().as_slice(),
            &package,
            sign_request(&inflated),
        )
        .await
        .unwrap_err();
    match &err {
        Error::Refused { .. } => {
            let reason = err.to_string();
            assert!(reason.contains("expected 1200"), "{reason}");
            assert!(reason.contains("balances root"), "{reason}");
        }
        other => panic!("expected a refusal, got {other}"),
    }
    // A receipt whose amount was raised after the provider signed it.
    let mut forged = honest.clone();
    forged.receipts[0].receipt.receipt.amount_owed_wei = 1_000;
    let err = committee
        .sign(forged.digest().as_slice(), &package, sign_request(&forged))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("does not verify")),
        "{err}"
    );
    // A message that is not the batch's digest.
    let err = committee
        .sign(b"something else", &package, sign_request(&honest))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("digest")),
        "{err}"
    );
    // Vouchers named by id are taken only from those a signer checked ahead and holds: before
    // they were handed over, and for a forged one handed over (refused, never held), every
    // signer asks for the vouchers instead of signing; the honest ones, once handed over, are
    // held by all five.
    let by_id = |batch: &ChainBatch| {
        let part = PartToSign::whole(batch).vouchers_by_id();
        move |round, signing_package| part.request(round, signing_package)
    };
    let err = committee
        .sign(honest.digest().as_slice(), &package, by_id(&honest))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains(UNKNOWN_VOUCHERS)),
        "{err}"
    );
    assert_eq!(committee.check_ahead(&forged.receipts).await, 0);
    let err = committee
        .sign(forged.digest().as_slice(), &package, by_id(&forged))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains(UNKNOWN_VOUCHERS)),
        "{err}"
    );
    assert_eq!(committee.check_ahead(&honest.receipts).await, 5);
    // A registered provider takes an escrow it was never assigned: Mallory registers her own
    // key on chain, signs a receipt for the buyer's first job claiming the whole escrow, and
    // carries the job's real order and assignment. Every signer refuses: the assignment names
    // another key. (This batch is built straight to the signers, past the coordinator.)
    let mallory = Identity::generate();
    let mallory_account = cx_settlement::evm::EvmClient::connect(
        &chain.anvil.rpc_url(),
        chain.anvil.keys[3].clone(),
        chain.deployment,
    )
    .unwrap();
    mallory_account
        .set_metadata("http://127.0.0.1:9666", mallory.id().0.into())
        .await
        .unwrap();
    let mut stolen = receipts[0].clone();
    stolen.receipt.receipt.provider = mallory_account.account().into_array();
    stolen.receipt.receipt.provider_key = mallory.id().0;
    stolen.receipt.receipt.amount_owed_wei = 1_000;
    stolen.receipt =
        cx_protocol::receipt::SignedReceipt::sign(stolen.receipt.receipt.clone(), &mallory)
            .unwrap();
    let theft = ledger::assemble(
        ledger::Head {
            chain_id: 31337,
            contract: chain.deployment.settlement,
            key_epoch: 0,
            nonce: 1,
            fee: cluster.fee,
        },
        vec![stolen],
        &escrows,
        Vec::new(),
    )
    .unwrap();
    let err = committee
        .sign(theft.digest().as_slice(), &package, sign_request(&theft))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. }
            if err.to_string().contains("receipt.provider_key: differs from the exchange's assignment")),
        "{err}"
    );
    assert_eq!(nonce(&chain).await, 0);

    // Issue 32, item 11: the post-quantum half is checked by the signers, not taken from the
    // exchange. A forged order whose EIP-712 signature holds (as it would for whoever breaks
    // secp256k1, or for a compromised exchange holding the buyer's account key) but whose
    // ML-DSA co-signature is by another key than the buyer's binding names: every signer
    // refuses. Before, signers never looked at the co-signature and signed.
    let assemble = |vouchers: Vec<cx_protocol::voucher::Voucher>| {
        ledger::assemble(
            ledger::Head {
                chain_id: 31337,
                contract: chain.deployment.settlement,
                key_epoch: 0,
                nonce: 1,
                fee: cluster.fee,
            },
            vouchers,
            &escrows,
            Vec::new(),
        )
        .unwrap()
    };
    let mut cosigned_elsewhere = receipts[0].clone();
    if let cx_protocol::voucher::Authority::Intent(signed) = &mut cosigned_elsewhere.authority {
        let domain = cx_protocol::order::domain(31337, chain.deployment.settlement);
        let digest = signed.digest(&domain);
        signed.mldsa_signature = mallory
            .sign(cx_protocol::order::signed::ORDER_CONTEXT, digest.as_slice())
            .unwrap()
            .into();
    }
    let forged_order = assemble(vec![cosigned_elsewhere]);
    let err = committee
        .sign(
            forged_order.digest().as_slice(),
            &package,
            sign_request(&forged_order),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("mldsa_signature")),
        "{err}"
    );
    // The buyer's binding swapped for one binding Mallory's key to Mallory's own account.
    let mut borrowed = receipts[0].clone();
    borrowed.binding = cx_protocol::order::binding::Binding::sign(
        chain.anvil.keys[3].credential(),
        &mallory,
        &cx_protocol::order::domain(31337, chain.deployment.settlement),
        0,
    )
    .unwrap();
    let borrowed = assemble(vec![borrowed]);
    let err = committee
        .sign(
            borrowed.digest().as_slice(),
            &package,
            sign_request(&borrowed),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("binding.account")),
        "{err}"
    );
    assert_eq!(nonce(&chain).await, 0);

    // 2. The coordinator dies between aggregation and posting.
    let db = TempDatabase::create().await.unwrap();
    let poster = chain.anvil.keys[3].clone();
    let make = || async {
        let store = store(&db).await;
        store.save_group_key(0, &package).await.unwrap();
        Coordinator::new(
            store,
            cluster.committee(3, 1).unwrap(),
            evm_chains(vec![chain.view().unwrap()], &poster),
            &market(&cluster),
        )
        .unwrap()
    };
    let first = make().await;
    first.submit(&receipts).await.unwrap();
    let id = first.build().await.unwrap().expect("a batch");
    first.sign_pending().await.unwrap();
    assert_eq!(
        first.store().parts(id).await.unwrap()[0].status,
        PartStatus::Signed
    );
    drop(first);
    assert_eq!(nonce(&chain).await, 0);
    let second = make().await;
    second.resume().await.unwrap();
    second.resume().await.unwrap();
    assert_eq!(nonce(&chain).await, 1);
    assert_eq!(events(&chain).await, 1);
    let part = &second.store().parts(id).await.unwrap()[0];
    assert_eq!(part.status, PartStatus::Posted);
    assert!(part.tx_hash.is_some());
    drop(second);

    // 3. It dies after its transaction went out but before it recorded that.
    let third = make().await;
    third
        .submit(&open_and_receipt(&cluster.exchange, &chain, 1, 10).await)
        .await
        .unwrap();
    let id = third.build().await.unwrap().expect("a batch");
    third.sign_pending().await.unwrap();
    let part = third.store().parts(id).await.unwrap().remove(0);
    let signature = frost::Signature::deserialize(part.signature.as_ref().unwrap()).unwrap();
    chain
        .operator
        .settle_batch(
            &part.batch.message(),
            &EvmSignature::from_frost(&signature).unwrap(),
        )
        .await
        .unwrap();
    drop(third);
    let fourth = make().await;
    fourth.resume().await.unwrap();
    assert_eq!(nonce(&chain).await, 2);
    assert_eq!(events(&chain).await, 2, "posted once, not twice");
    let steps = fourth.store().steps(id).await.unwrap();
    assert!(
        steps
            .iter()
            .any(|(_, s, d)| s == "posted" && d.contains("already on chain")),
        "{steps:?}"
    );

    // 4. A receipt from a provider that never registered its key: refused with that reason; the
    // batch is abandoned, the receipt rejected, and the rest settles.
    let outsider = Identity::generate();
    let ids = chain.open_jobs(2, 1_000).await.unwrap();
    let mut receipts = chain.vouchers(&ids[..1], 100, &cluster.exchange).unwrap();
    // The exchange assigned it to the outsider, so every link but the registry holds.
    let unregistered = chain
        .vouchers_by(&outsider, &ids[1..], 100, &cluster.exchange)
        .unwrap()
        .remove(0);
    receipts.push(unregistered.clone());
    fourth.submit(&receipts).await.unwrap();
    let err = fourth.run_once().await.unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("has not registered key")),
        "{err}"
    );
    let refused = fourth.store().unfinished().await.unwrap()[0].batch_id;
    fourth.abandon(refused, &err.to_string()).await.unwrap();
    assert!(
        fourth
            .reject(unregistered.job_id(), "provider key not registered")
            .await
            .unwrap()
    );
    let id = fourth.run_once().await.unwrap().expect("a batch");
    assert_ne!(id, refused);
    assert_eq!(nonce(&chain).await, 3);
    assert_eq!(
        fourth.store().parts(id).await.unwrap()[0]
            .batch
            .receipts
            .len(),
        1
    );

    // 5. Sessions with a real signer process.
    let target = &cluster.members[0];
    let limits = Limits::default();
    // The peer presents another identity than the one pinned for it.
    let err = Channel::connect(
        target.address.as_str(),
        &cluster.coordinator,
        cluster.members[1].public().unwrap(),
        limits,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("expected"), "{err}");
    // An identity the signer does not know.
    let stranger = Identity::generate();
    assert!(
        Channel::connect(
            target.address.as_str(),
            &stranger,
            target.public().unwrap(),
            limits
        )
        .await
        .is_err()
    );
    // A replayed frame, then an altered one: each ends its session.
    let ping = serde_json::to_vec(&Request::Ping).unwrap();
    let mut channel = Channel::connect(
        target.address.as_str(),
        &cluster.coordinator,
        target.public().unwrap(),
        limits,
    )
    .await
    .unwrap();
    let frame = channel.seal(&ping).unwrap();
    channel.write_sealed(&frame).await.unwrap();
    assert!(matches!(
        channel.recv::<Response>().await.unwrap(),
        Response::Pong
    ));
    channel.write_sealed(&frame).await.unwrap();
    assert!(channel.recv::<Response>().await.is_err());
    let mut channel = Channel::connect(
        target.address.as_str(),
        &cluster.coordinator,
        target.public().unwrap(),
        limits,
    )
    .await
    .unwrap();
    let mut frame = channel.seal(&ping).unwrap();
    let last = frame.len() - 1;
    frame[last] ^= 1;
    channel.write_sealed(&frame).await.unwrap();
    assert!(channel.recv::<Response>().await.is_err());
    let log = cluster.log(1);
    assert!(log.contains("out of order"), "{log}");
    assert!(log.contains("fails authentication"), "{log}");
    assert!(log.contains("is not a known identity"), "{log}");
    // None of this cost the signer anything: it still answers.
    let mut channel = Channel::connect(
        target.address.as_str(),
        &cluster.coordinator,
        target.public().unwrap(),
        limits,
    )
    .await
    .unwrap();
    assert!(matches!(
        channel.call::<_, Response>(&Request::Ping).await.unwrap(),
        Response::Pong
    ));
}

/// What broke: a signer took the threshold and the participants of a DKG from the coordinator,
/// and approved a rotation to any key it held a share of, so a hostile coordinator could move
/// the chains to a 2-of-n key. Each signer now holds the committee rule in its own config: a
/// weaker DKG, a signing set below the diversity rule and a rotation to a key made under another
/// rule are refused by every honest signer, each for its own reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_asking_for_a_weaker_threshold_is_refused_by_every_honest_signer() {
    use cx_settlement::keyfile::{self, StoredKey};
    use cx_settlement::wire::{DkgRequest, SignRotationRequest};

    let mut cluster =
        Cluster::start(&signer_binary(), &["a", "a", "a", "b", "c"], rule(3, 2)).unwrap();
    let everyone: Vec<u16> = (1..=5).collect();
    let ask = |request: Request| {
        let cluster = &cluster;
        async move {
            let mut answers = Vec::new();
            for member in &cluster.members {
                // A failure names the signer and what it logged (a transport error alone
                // does not say whether the signer refused, stalled or was never there).
                let said = |e: Error| -> ! {
                    panic!(
                        "signer {} at {}: {e}; its log:\n{}",
                        member.index,
                        member.address,
                        cluster.log(member.index)
                    )
                };
                let mut channel = Channel::connect(
                    member.address.as_str(),
                    &cluster.coordinator,
                    member.public().unwrap(),
                    Limits::default(),
                )
                .await
                .unwrap_or_else(|e| said(e));
                let answer = channel.call::<_, Response>(&request).await;
                answers.push(answer.unwrap_or_else(|e| said(e)));
            }
            answers
        }
    };
    // 1. A DKG at 2-of-5, and one among four of the five: refused by all five.
    for (request, why) in [
        (
            DkgRequest {
                epoch: 0,
                min_signers: 2,
                participants: everyone.clone(),
            },
            "pinned threshold 3",
        ),
        (
            DkgRequest {
                epoch: 0,
                min_signers: 3,
                participants: vec![1, 2, 3, 4],
            },
            "pinned committee",
        ),
    ] {
        for (i, answer) in ask(Request::Dkg(request)).await.into_iter().enumerate() {
            match answer {
                Response::Refused { reason } => assert!(reason.contains(why), "{i}: {reason}"),
                other => panic!("signer {} accepted a weaker DKG: {other:?}", i + 1),
            }
        }
    }
    // The honest DKG still runs.
    let package = cluster.committee(3, 2).unwrap().dkg(0).await.unwrap();

    // 2. A signing set of one operator (the coordinator claims k = 1): each chosen signer
    // refuses at round 2, after its nonces were consumed.
    let lax = cluster.committee(3, 1).unwrap();
    let rotation = |round_id, signing_package| {
        Request::SignRotation(SignRotationRequest {
            round_id,
            chain_id: 31337,
            new_epoch: 1,
            signing_package,
        })
    };
    let err = lax.sign(b"anything", &package, rotation).await.unwrap_err();
    match &err {
        Error::Refused { .. } => {
            let reason = err.to_string();
            for index in 1..=3 {
                assert!(
                    reason.contains(&format!("signer {index} refused: ")),
                    "{reason}"
                );
            }
            assert_eq!(reason.matches("spans 1 operators").count(), 3, "{reason}");
        }
        other => panic!("expected refusals, got {other}"),
    }

    // 3. A key made at 2-of-5 (here by a dealer standing in for a DKG run some other way),
    // planted as epoch 1 in every signer's folder: a rotation to it is refused by all five,
    // though each holds a share of it.
    let (shares, public) = frost::keys::generate_with_dealer(
        5,
        2,
        frost::keys::IdentifierList::Default,
        cx_settlement::dkg::os_rng(),
    )
    .unwrap();
    for index in 1..=5u16 {
        let id = cx_settlement::dkg::identifier(index).unwrap();
        let key = StoredKey {
            epoch: 1,
            key_package: frost::keys::KeyPackage::try_from(shares[&id].clone()).unwrap(),
            public_key_package: public.clone(),
        };
        keyfile::write_key(&cluster.data_dir(index), &key).unwrap();
        cluster.restart(index).unwrap();
    }
    let all = cluster.committee(5, 2).unwrap();
    let err = all.sign(b"anything", &package, rotation).await.unwrap_err();
    match &err {
        Error::Refused { .. } => {
            let reason = err.to_string();
            assert_eq!(
                reason
                    .matches("has threshold 2; this signer's pinned threshold is 3")
                    .count(),
                5,
                "{reason}"
            );
        }
        other => panic!("expected refusals, got {other}"),
    }
}

/// What broke: a buyer who reclaimed an escrow (deadline + grace passed) between signing and
/// mining made the signed batch revert forever; the signers refused any other digest at that
/// nonce, and settlement on that chain stopped for good. Now escrows near their reclaim time are
/// left out (coordinator and signers each by their own margin), and once `JobReclaimed` is on
/// chain the signers sign a replacement at the same nonce, which lands — while a replacement of
/// a digest that can still land is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_racing_a_signed_batch_settles_the_rest_at_the_same_nonce() {
    use cx_settlement::coordinator::BUILD_RECLAIM_MARGIN_S;
    use cx_settlement::signer::SIGN_RECLAIM_MARGIN_S;

    let cluster = Cluster::start(&signer_binary(), &["a", "b", "c"], rule(2, 1)).unwrap();
    let committee = cluster.committee(2, 1).unwrap();
    let package = committee.dkg(0).await.unwrap();
    let key = EvmGroupKey::from_verifying_key(package.verifying_key()).unwrap();
    let chain = ScenarioChain::start(31337, key).await.unwrap();
    write_deployments(&cluster.deployments_file, &[chain.entry()]);
    let db = TempDatabase::create().await.unwrap();
    let store = store(&db).await;
    store.save_group_key(0, &package).await.unwrap();
    let poster = chain.anvil.keys[3].clone();
    let coordinator = Coordinator::new(
        store,
        cluster.committee(2, 1).unwrap(),
        evm_chains(vec![chain.view().unwrap()], &poster),
        &market(&cluster),
    )
    .unwrap();
    let grace = chain.view().unwrap().grace_period_s().await.unwrap();

    // One escrow reclaimable just outside the coordinator's margin, two due in an hour.
    let now = chain.anvil.now_s().await.unwrap();
    let soon_deadline = now + BUILD_RECLAIM_MARGIN_S + 120 - grace;
    let (soon, _) = chain
        .buyer
        .open_job(1_000, soon_deadline, Default::default())
        .await
        .unwrap();
    let mut receipts = chain.vouchers(&[soon], 600, &cluster.exchange).unwrap();
    let later = chain.open_jobs(2, 1_000).await.unwrap();
    receipts.extend(chain.vouchers(&later, 600, &cluster.exchange).unwrap());
    coordinator.submit(&receipts).await.unwrap();
    let id = coordinator.build().await.unwrap().expect("a batch");
    coordinator.sign_pending().await.unwrap();
    let signed = coordinator.store().parts(id).await.unwrap().remove(0);
    assert_eq!(signed.status, PartStatus::Signed);
    assert_eq!(signed.batch.receipts.len(), 3);

    // 1. While the signed digest can still land, another at its nonce is refused.
    let view = chain.view().unwrap();
    let mut escrows = HashMap::new();
    for id in &later {
        escrows.insert(*id, view.open_escrow(*id).await.unwrap().unwrap());
    }
    let rival = ledger::assemble(
        ledger::Head {
            chain_id: 31337,
            contract: chain.deployment.settlement,
            key_epoch: 0,
            nonce: 1,
            fee: cluster.fee,
        },
        receipts[1..].to_vec(),
        &escrows,
        Vec::new(),
    )
    .unwrap();
    let err = committee
        .sign(rival.digest().as_slice(), &package, sign_request(&rival))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("it can still land")),
        "{err}"
    );

    // 2. The coordinator stalls past the reclaim time; the buyer takes the escrow back.
    chain
        .anvil
        .advance_time(BUILD_RECLAIM_MARGIN_S + 121)
        .await
        .unwrap();
    chain.buyer.reclaim(soon).await.unwrap();
    assert!(
        chain
            .operator
            .settle_batch(
                &signed.batch.message(),
                &EvmSignature::from_frost(
                    &frost::Signature::deserialize(signed.signature.as_ref().unwrap()).unwrap()
                )
                .unwrap()
            )
            .await
            .is_err(),
        "the signed batch can never land now"
    );

    // 3. The coordinator sees the reclaim, the signers accept the replacement, it lands at
    // the same nonce with the other two escrows.
    coordinator.resume().await.unwrap();
    assert_eq!(nonce(&chain).await, 1);
    assert_eq!(events(&chain).await, 1);
    let part = coordinator.store().parts(id).await.unwrap().remove(0);
    assert_eq!(part.status, PartStatus::Posted);
    assert_eq!(part.batch.receipts.len(), 2);
    let steps = coordinator.store().steps(id).await.unwrap();
    assert!(
        steps
            .iter()
            .any(|(_, s, d)| s == "replaced" && d.contains("reclaimed")),
        "{steps:?}"
    );
    for id in &later {
        assert!(!chain.operator.is_open(*id).await.unwrap());
    }
    let (amount, proof) = coordinator
        .claim_proof(31337, chain.provider.account())
        .await
        .unwrap();
    assert_eq!(amount, U256::from(1_200));
    chain.provider.claim(amount, proof).await.unwrap();

    // 4. An escrow inside the signers' own margin is refused by each of them, whoever built
    // the batch.
    let now = chain.anvil.now_s().await.unwrap();
    let (close, _) = chain
        .buyer
        .open_job(1_000, now + 100, Default::default())
        .await
        .unwrap();
    // Reclaimable at now + 100 + grace; move the clock to within the signers' margin of it.
    chain
        .anvil
        .advance_time(100 + grace - SIGN_RECLAIM_MARGIN_S + 60)
        .await
        .unwrap();
    let close_receipts = chain.vouchers(&[close], 10, &cluster.exchange).unwrap();
    let mut escrows = HashMap::new();
    escrows.insert(close, view.open_escrow(close).await.unwrap().unwrap());
    let edge = ledger::assemble(
        ledger::Head {
            chain_id: 31337,
            contract: chain.deployment.settlement,
            key_epoch: 0,
            nonce: 2,
            fee: cluster.fee,
        },
        close_receipts,
        &escrows,
        part.batch.new_balances.clone(),
    )
    .unwrap();
    let err = committee
        .sign(edge.digest().as_slice(), &package, sign_request(&edge))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("inside this signer's")),
        "{err}"
    );
}

/// What broke: a signer accepted any number of connections and handshakes (each handshake costs
/// ML-KEM and ML-DSA work before the peer is known), any number of sessions per peer, DKG
/// messages for any epoch without limit, and a DKG at epoch `u32::MAX` — after which no DKG
/// could ever follow. Each is bounded now (`PeerLimits`, defaults here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signer_bounds_handshakes_sessions_and_dkg_epochs() {
    use cx_settlement::config::PeerLimits;
    use cx_settlement::wire::{DkgRequest, PeerBody, PeerMessage};
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    let limits = PeerLimits::default();
    let cluster = Cluster::start(&signer_binary(), &["a", "b", "c"], rule(2, 1)).unwrap();
    let target = cluster.members[0].clone();
    let connect = |identity| open_session(&target, identity);

    // 1. A DKG far ahead (u32::MAX) is refused by every signer, and so are peer messages for it;
    // a peer gets three messages per epoch, no more.
    for member in &cluster.members {
        let mut channel = Channel::connect(
            member.address.as_str(),
            &cluster.coordinator,
            member.public().unwrap(),
            Limits::default(),
        )
        .await
        .unwrap();
        let answer: Response = channel
            .call(&Request::Dkg(DkgRequest {
                epoch: u32::MAX,
                min_signers: 2,
                participants: vec![1, 2, 3],
            }))
            .await
            .unwrap();
        assert!(
            matches!(&answer, Response::Refused { reason } if reason.contains("outside the admissible")),
            "{answer:?}"
        );
    }
    let second =
        cx_settlement::keyfile::read_identity(&cluster.dir().join("signer-2.identity")).unwrap();
    let mut peer = connect(&second).await.unwrap();
    let message = |epoch| {
        Request::Peer(PeerMessage {
            epoch,
            from: 2,
            body: PeerBody::Echo(alloy::primitives::B256::ZERO),
        })
    };
    let answer: Response = peer.call(&message(u32::MAX)).await.unwrap();
    assert!(matches!(answer, Response::Refused { .. }), "{answer:?}");
    for _ in 0..limits.max_peer_messages_per_epoch {
        let answer: Response = peer.call(&message(7)).await.unwrap();
        assert!(matches!(answer, Response::Ack), "{answer:?}");
    }
    let answer: Response = peer.call(&message(7)).await.unwrap();
    assert!(
        matches!(&answer, Response::Refused { reason } if reason.contains("already sent 3")),
        "{answer:?}"
    );
    drop(peer);
    // None of it stops the honest DKG.
    let committee = cluster.committee(2, 1).unwrap();
    committee.dkg(0).await.unwrap();
    drop(committee);
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    // 2. Sessions per peer: the coordinator holds its share; one more is closed after its
    // handshake.
    let mut held = Vec::new();
    for _ in 0..limits.max_sessions_per_peer {
        let mut channel = connect(&cluster.coordinator).await.unwrap();
        let pong: Response = channel.call(&Request::Ping).await.unwrap();
        assert!(matches!(pong, Response::Pong));
        held.push(channel);
    }
    let mut extra = connect(&cluster.coordinator).await.unwrap();
    assert!(extra.call::<_, Response>(&Request::Ping).await.is_err());
    drop(held);
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    // 3. Handshakes per second: of a burst of raw connections, those over the budget are
    // closed at once, before any cryptography.
    let burst = 2 * limits.max_handshakes_per_s as usize;
    let mut raw = Vec::new();
    for _ in 0..burst {
        raw.push(
            tokio::net::TcpStream::connect(target.address.as_str())
                .await
                .unwrap(),
        );
    }
    let mut reads = tokio::task::JoinSet::new();
    for mut stream in raw {
        reads.spawn(async move {
            let mut byte = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut byte));
            (matches!(read.await, Ok(Ok(0)) | Ok(Err(_))), stream)
        });
    }
    let mut closed = 0;
    let mut raw = Vec::new();
    while let Some(joined) = reads.join_next().await {
        let (was_closed, stream) = joined.unwrap();
        closed += usize::from(was_closed);
        raw.push(stream);
    }
    assert!(
        closed >= burst - limits.max_handshakes_per_s as usize,
        "{closed} of {burst} closed"
    );
    drop(raw);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // The signer still serves.
    let mut channel = connect(&cluster.coordinator).await.unwrap();
    let pong: Response = channel.call(&Request::Ping).await.unwrap();
    assert!(matches!(pong, Response::Pong));
}

async fn open_session(
    target: &cx_settlement::config::Member,
    identity: &Identity,
) -> cx_settlement::Result<Channel> {
    Channel::connect(
        target.address.as_str(),
        identity,
        target.public()?,
        Limits::default(),
    )
    .await
}

/// What broke: every sign request carried the full list of cumulative balances, so requests grew
/// with history until they no longer fit a frame. Requests now carry the receipts and the root
/// they build on; each signer keeps its own lists (checked against the chain, kept across
/// restarts), and only a signer that lacks one costs a full list, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_requests_carry_balance_changes_and_signers_keep_their_own_balances() {
    let mut cluster = Cluster::start(&signer_binary(), &["a", "b", "c"], rule(2, 1)).unwrap();
    let package = cluster.committee(2, 1).unwrap().dkg(0).await.unwrap();
    let key = EvmGroupKey::from_verifying_key(package.verifying_key()).unwrap();
    let chain = ScenarioChain::start(31337, key).await.unwrap();
    write_deployments(&cluster.deployments_file, &[chain.entry()]);
    let db = TempDatabase::create().await.unwrap();
    let store = store(&db).await;
    store.save_group_key(0, &package).await.unwrap();
    let poster = chain.anvil.keys[3].clone();
    let coordinator = Coordinator::new(
        store,
        cluster.committee(2, 1).unwrap(),
        evm_chains(vec![chain.view().unwrap()], &poster),
        &market(&cluster),
    )
    .unwrap();
    let mut how = Vec::new();
    let exchange = cluster.exchange.clone();
    let settle = async |coordinator: &Coordinator<PgStore>| {
        let receipts = open_and_receipt(&exchange, &chain, 2, 100).await;
        coordinator.submit(&receipts).await.unwrap();
        let id = coordinator.run_once().await.unwrap().expect("a batch");
        let steps = coordinator.store().steps(id).await.unwrap();
        let (_, _, detail) = steps.iter().find(|(_, s, _)| s == "signed").unwrap();
        detail.contains("balance changes")
    };
    // Signers 1 and 2 sign (one per operator first, then by index) and follow the balances.
    how.push(settle(&coordinator).await);
    how.push(settle(&coordinator).await);
    // Signer 3 steps in without the latest list: it gets the full one, once.
    cluster.kill(1);
    how.push(settle(&coordinator).await);
    // Signer 1 is back, behind by one batch: it refuses the changes (it does not hold the
    // list they build on) and is left out; 2 and 3, which hold it, sign changes only.
    cluster.restart(1).unwrap();
    how.push(settle(&coordinator).await);
    how.push(settle(&coordinator).await);
    // Restarts lose nothing: the lists are in the signers' own files.
    cluster.restart(1).unwrap();
    cluster.restart(2).unwrap();
    how.push(settle(&coordinator).await);
    assert_eq!(how, [true, true, false, true, true, true]);
    // Only when it is needed (3 down) is signer 1 sent the full list, once.
    cluster.kill(3);
    how.push(settle(&coordinator).await);
    how.push(settle(&coordinator).await);
    assert_eq!(how[6..], [false, true]);
    assert_eq!(nonce(&chain).await, 8);
    let (amount, _) = coordinator
        .claim_proof(31337, chain.provider.account())
        .await
        .unwrap();
    assert_eq!(amount, U256::from(1_600));
}

/// Three signers (2 of 3), one chain, the coordinator, and the chain's provider staked
/// 3 000 000 000: where a slash is signed and lands.
struct SlashScene {
    cluster: Cluster,
    chain: ScenarioChain,
    _db: TempDatabase,
    coordinator: Coordinator<PgStore, EvmChain, cx_settlement::coordinator::Committee>,
    /// A second handle on the committee, for signing requests the coordinator would not send.
    committee: cx_settlement::coordinator::Committee,
    package: frost::keys::PublicKeyPackage,
    key: EvmGroupKey,
    stake: U256,
}

impl SlashScene {
    async fn start() -> Self {
        let cluster = Cluster::start(&signer_binary(), &["a", "b", "c"], rule(2, 1)).unwrap();
        let committee = cluster.committee(2, 1).unwrap();
        let package = committee.dkg(0).await.unwrap();
        let key = EvmGroupKey::from_verifying_key(package.verifying_key()).unwrap();
        let chain = ScenarioChain::start(31337, key).await.unwrap();
        write_deployments(&cluster.deployments_file, &[chain.entry()]);
        let db = TempDatabase::create().await.unwrap();
        let store = store(&db).await;
        store.save_group_key(0, &package).await.unwrap();
        let poster = chain.anvil.keys[3].clone();
        let coordinator = Coordinator::new(
            store,
            cluster.committee(2, 1).unwrap(),
            evm_chains(vec![chain.view().unwrap()], &poster),
            &market(&cluster),
        )
        .unwrap();
        let stake = U256::from(3_000_000_000u64);
        cx_devnet::deploy::mint_test_tokens(&chain.operator, chain.provider.account(), stake)
            .await
            .unwrap();
        chain.provider.approve_all().await.unwrap();
        chain.provider.stake(stake).await.unwrap();
        Self {
            cluster,
            chain,
            _db: db,
            coordinator,
            committee,
            package,
            key,
            stake,
        }
    }
}

/// Two outputs for one deterministic job (escrow `escrow_id`), both signed by the provider.
fn conflicting_receipts(
    cluster: &Cluster,
    chain: &ScenarioChain,
    escrow_id: u64,
) -> cx_settlement::slash::SlashEvidence {
    let first = chain
        .vouchers(&[escrow_id], 100, &cluster.exchange)
        .unwrap()
        .remove(0)
        .receipt;
    let mut other = first.receipt.clone();
    other.output_hash = [0xee; 32];
    let second =
        cx_protocol::receipt::SignedReceipt::sign(other, &chain.provider_identity).unwrap();
    cx_settlement::slash::SlashEvidence::ConflictingReceipts { first, second }
}

/// What broke: the committee had no slash request at all, so the registry's slashing could never
/// be signed. Now a slash names its evidence (two receipts by one provider for one class-D job
/// with different outputs), every signer checks it on its own, and the signed digest carries an
/// expiry: valid evidence lands once; reused, stale, or not-conflicting evidence does not.
/// And (issue 32 item 4) the signers checked only that amount and recipient were non-zero: a
/// coordinator could take a whole stake and pay it to anyone. Now every signer refuses any amount
/// but its market's multiple of the accused's price, and any recipient but the market's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slash_with_valid_evidence_lands_and_stale_or_reused_evidence_does_not() {
    use cx_settlement::slash::SlashEvidence;
    use cx_settlement::wire::SignSlashRequest;

    let SlashScene {
        cluster,
        chain,
        _db,
        coordinator,
        committee,
        package,
        stake,
        ..
    } = SlashScene::start().await;

    let conflicting = |escrow_id: u64| conflicting_receipts(&cluster, &chain, escrow_id);
    let ids = chain.open_jobs(3, 1_000).await.unwrap();
    let evidence = conflicting(ids[0]);
    let (amount, recipient) = market(&cluster).slash.terms(&evidence).unwrap();
    // 10x the 100 wei the receipts owe, burnt.
    assert_eq!(amount, U256::from(1_000u64));
    assert_eq!(recipient, cx_settlement::slash::BURN_ADDRESS);
    let staked = async || {
        chain
            .operator
            .provider_stake(chain.provider.account())
            .await
            .unwrap()
            .0
    };

    // 0. Valid evidence on other terms: the whole stake, or the right amount to the buyer.
    for (hostile_amount, to, why) in [
        (U256::MAX, recipient, "take exactly"),
        (amount + U256::from(1u64), recipient, "take exactly"),
        (amount, chain.buyer.account(), "pay slashed stake to"),
    ] {
        let err = coordinator
            .slash(&evidence, hostile_amount, to, 3_600)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Refused { .. } if err.to_string().contains(why)),
            "{err}"
        );
    }
    assert_eq!(staked().await, stake, "nothing was taken");

    // 1. Valid evidence: it lands, and the recipient is paid.
    let before = chain.operator.asset_balance(recipient).await.unwrap();
    coordinator
        .slash(&evidence, amount, recipient, 3_600)
        .await
        .unwrap();
    assert_eq!(staked().await, stake - amount);
    assert_eq!(
        chain.operator.asset_balance(recipient).await.unwrap(),
        before + amount
    );

    // 2. The same evidence again (either order): every signer refuses.
    let swapped = match evidence.clone() {
        SlashEvidence::ConflictingReceipts { first, second } => {
            SlashEvidence::ConflictingReceipts {
                first: second,
                second: first,
            }
        }
        other => panic!("the evidence made above is a conflicting pair: {other:?}"),
    };
    let err = coordinator
        .slash(&swapped, amount, recipient, 3_600)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("already used")),
        "{err}"
    );

    // 3. Not evidence: the same output twice, or another class.
    let honest = chain
        .vouchers(&[ids[1]], 100, &cluster.exchange)
        .unwrap()
        .remove(0)
        .receipt;
    let same = SlashEvidence::ConflictingReceipts {
        first: honest.clone(),
        second: honest.clone(),
    };
    let err = coordinator
        .slash(&same, amount, recipient, 3_600)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("nothing conflicts")),
        "{err}"
    );

    // 4. Stale: an expiry already passed is refused by the signers; one that passes before the
    // signature is posted is refused by the contract.
    let fresh = conflicting(ids[2]);
    let now = chain.anvil.now_s().await.unwrap();
    let registry = chain.deployment.registry;
    let digest_at = |expires_at_s| {
        cx_settlement::batch::slash_digest(
            31337,
            registry,
            fresh.provider(),
            amount,
            recipient,
            fresh.hash(),
            expires_at_s,
        )
    };
    let request = |expires_at_s| {
        let evidence = fresh.clone();
        move |round_id, signing_package| {
            Request::SignSlash(Box::new(SignSlashRequest {
                round_id,
                chain_id: 31337,
                evidence: evidence.clone(),
                amount,
                recipient,
                expires_at_s,
                signing_package,
            }))
        }
    };
    let err = committee
        .sign(digest_at(now - 1).as_slice(), &package, request(now - 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("stale")),
        "{err}"
    );
    let expires_at = now + 60;
    let signature = committee
        .sign(
            digest_at(expires_at).as_slice(),
            &package,
            request(expires_at),
        )
        .await
        .unwrap();
    chain.anvil.advance_time(120).await.unwrap();
    let err = chain
        .operator
        .slash(
            fresh.provider(),
            amount,
            recipient,
            fresh.hash(),
            expires_at,
            &EvmSignature::from_frost(&signature).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("SlashExpired"), "{err}");
    assert_eq!(staked().await, stake - amount, "nothing more was taken");
}

/// Issue 32, item 3: a provider that signed a wrong result changes its ML-DSA key before the
/// slash lands. Before the key history, every signer checked the evidence against the key
/// registered *now* and refused ("has not registered the key"): the provider kept its stake.
/// Now the replaced key answers for what it signed for the registry's unbonding delay (the time
/// stake stays slashable after a provider decides to leave), and no longer after it.
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_that_changes_its_key_after_a_wrong_result_is_still_slashed() {
    use alloy::primitives::B256;

    let SlashScene {
        cluster,
        chain,
        _db,
        coordinator,
        key,
        stake,
        ..
    } = SlashScene::start().await;
    let conflicting = |escrow_id: u64| conflicting_receipts(&cluster, &chain, escrow_id);
    let ids = chain.open_jobs(2, 1_000).await.unwrap();
    let (first, later) = (conflicting(ids[0]), conflicting(ids[1]));
    let (amount, recipient) = market(&cluster).slash.terms(&first).unwrap();

    // The provider swaps its key after signing both pairs.
    let new_key = B256::from(Identity::generate().id().0);
    chain
        .provider
        .set_metadata("http://127.0.0.1:9001", new_key)
        .await
        .unwrap();
    let registered = chain
        .operator
        .provider_stake(chain.provider.account())
        .await
        .unwrap();
    assert_eq!(registered.0, stake);

    // Within the unbonding delay the old key still answers: the slash lands.
    coordinator
        .slash(&first, amount, recipient, 3_600)
        .await
        .unwrap();
    let staked = chain
        .operator
        .provider_stake(chain.provider.account())
        .await
        .unwrap()
        .0;
    assert_eq!(staked, stake - amount);

    // Past it, the old key answers for nothing more: every signer refuses, nothing is taken.
    let delay = cx_devnet::deploy::devnet_params(key).unbonding_delay_s;
    chain.anvil.advance_time(delay).await.unwrap();
    let err = coordinator
        .slash(&later, amount, recipient, 3_600)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused { .. } if err.to_string().contains("has not registered")),
        "{err}"
    );
    let after = chain
        .operator
        .provider_stake(chain.provider.account())
        .await
        .unwrap()
        .0;
    assert_eq!(after, stake - amount, "nothing more was taken");
}
