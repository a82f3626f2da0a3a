//! Transactions on a chain with real block times (Anvil `--block-time 1`): a transaction whose
//! fee falls under the base fee is replaced at its nonce and lands once; an offer an earlier
//! process left in the pool is outbid, not queued behind; `cx chain deploy`'s verification
//! refuses code that is not ours.

use std::time::{Duration, Instant};

use alloy::primitives::{Address, B256, U256};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::TransactionRequest;
use cx_contracts::FeePolicy;
use cx_devnet::AnvilInstance;
use cx_devnet::deploy::{DeployParams, deploy};
use cx_settlement::evm::{EvmClient, read_provider, signing_provider};
use cx_settlement::frost::DealerCommittee;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

async fn chain(chain_id: u64) -> (AnvilInstance, cx_contracts::Deployment) {
    let anvil = AnvilInstance::spawn_with_block_time(chain_id, 3, 1).expect("anvil");
    let committee = DealerCommittee::generate(5, 3, &mut ChaCha20Rng::from_seed([7; 32])).unwrap();
    let params = DeployParams {
        group_key: committee.group_key().unwrap(),
        grace_period_s: 600,
        min_stake: U256::from(1u64),
        unbonding_delay_s: 60,
        asset: cx_contracts::AssetSpec::Native,
    };
    let deployment = deploy(&anvil.rpc_url(), anvil.keys[0].clone(), params)
        .await
        .expect("deploy under 1 s blocks");
    (anvil, deployment)
}

async fn rpc(provider: &DynProvider, method: &'static str, params: serde_json::Value) {
    let _: serde_json::Value = provider
        .raw_request(method.into(), params)
        .await
        .unwrap_or_else(|e| panic!("{method}: {e}"));
}

/// The pool's transactions of `account`, as (nonce, hash).
async fn pooled(provider: &DynProvider, account: Address) -> Vec<(u64, B256)> {
    let content: serde_json::Value = provider
        .raw_request("txpool_content".into(), ())
        .await
        .unwrap();
    let mut out = Vec::new();
    for (from, txs) in content["pending"].as_object().into_iter().flatten() {
        if from.parse::<Address>().ok() != Some(account) {
            continue;
        }
        for tx in txs.as_object().into_iter().flat_map(|m| m.values()) {
            let nonce =
                u64::from_str_radix(tx["nonce"].as_str().unwrap().trim_start_matches("0x"), 16)
                    .unwrap();
            out.push((nonce, tx["hash"].as_str().unwrap().parse().unwrap()));
        }
    }
    out
}

/// The outcome of a spawned send, which must end within `within_s` with its receipt.
async fn landed(
    sending: tokio::task::JoinHandle<cx_settlement::Result<cx_settlement::evm::TxOutcome>>,
    within_s: u64,
    what: &str,
) -> cx_settlement::evm::TxOutcome {
    tokio::time::timeout(Duration::from_secs(within_s), sending)
        .await
        .expect("the send ends")
        .unwrap()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

async fn wait_for<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_under_the_base_fee_is_replaced_and_lands_once() {
    let (anvil, deployment) = chain(4243).await;
    let url = anvil.rpc_url();
    let raw = read_provider(&url).unwrap();
    let policy = FeePolicy {
        stuck_after_blocks: 2,
        ..FeePolicy::default()
    };
    let buyer = EvmClient::connect(&url, anvil.keys[1].clone(), deployment)
        .unwrap()
        .with_fees(policy);
    let account = buyer.account();

    // Mining paused: the deposit's first offer waits in the pool; then the base fee jumps far
    // past its fee cap (a spike), and blocks resume.
    rpc(&raw, "evm_setIntervalMining", serde_json::json!([0])).await;
    let sending = tokio::spawn({
        let buyer = buyer.clone();
        async move { buyer.deposit(U256::from(1_000u64)).await }
    });
    let (nonce, first) = wait_for("the first offer in the pool", async || {
        pooled(&raw, account).await.first().copied()
    })
    .await;
    assert_eq!(nonce, 0);
    rpc(
        &raw,
        "anvil_setNextBlockBaseFeePerGas",
        serde_json::json!(["0x174876e800"]),
    )
    .await; // 100 gwei
    rpc(&raw, "evm_setIntervalMining", serde_json::json!([1])).await;

    let outcome = landed(sending, 60, "the deposit lands").await;
    assert_ne!(
        outcome.tx_hash, first,
        "the offer under the base fee was replaced"
    );
    assert!(raw.get_transaction_receipt(first).await.unwrap().is_none());
    assert_eq!(
        raw.get_transaction_count(account).await.unwrap(),
        1,
        "one transaction"
    );
    assert_eq!(
        buyer.escrow_balance(account).await.unwrap(),
        U256::from(1_000u64),
        "deposited once"
    );
    let tx = raw
        .get_transaction_by_hash(outcome.tx_hash)
        .await
        .unwrap()
        .unwrap();
    use alloy::consensus::Transaction as _;
    assert!(
        tx.max_fee_per_gas() > 100_000_000_000,
        "re-priced over the new base fee"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_an_earlier_process_left_in_the_pool_is_outbid_not_queued_behind() {
    let (anvil, deployment) = chain(4244).await;
    let url = anvil.rpc_url();
    let raw = read_provider(&url).unwrap();
    rpc(&raw, "evm_setIntervalMining", serde_json::json!([0])).await;

    // What a killed process left: a transaction at the account's next nonce with a generous
    // fee, in the pool, never to be seen again by the new process.
    let old = signing_provider(&url, anvil.keys[1].clone()).unwrap();
    let account = anvil.keys[1].address();
    let left = TransactionRequest::default()
        .from(account)
        .to(Address::repeat_byte(0x42))
        .value(U256::from(7u64))
        .nonce(0)
        .gas_limit(21_000)
        .max_fee_per_gas(20_000_000_000)
        .max_priority_fee_per_gas(5_000_000_000);
    let left = *old.send_transaction(left).await.unwrap().tx_hash();

    // The new process sends its own transaction of the same account.
    let buyer = EvmClient::connect(&url, anvil.keys[1].clone(), deployment).unwrap();
    let sending = tokio::spawn({
        let buyer = buyer.clone();
        async move { buyer.deposit(U256::from(500u64)).await }
    });
    let replaced = wait_for("the old offer outbid", async || {
        let pool = pooled(&raw, account).await;
        (pool.len() == 1 && pool[0].1 != left).then_some(pool[0])
    })
    .await;
    assert_eq!(replaced.0, 0, "at the nonce the old offer held");
    rpc(&raw, "evm_setIntervalMining", serde_json::json!([1])).await;
    let outcome = landed(sending, 60, "the deposit lands").await;
    assert_eq!(outcome.tx_hash, replaced.1);
    assert!(raw.get_transaction_receipt(left).await.unwrap().is_none());
    assert_eq!(raw.get_transaction_count(account).await.unwrap(), 1);
    assert_eq!(
        raw.get_balance(Address::repeat_byte(0x42)).await.unwrap(),
        U256::ZERO
    );
    assert_eq!(
        buyer.escrow_balance(account).await.unwrap(),
        U256::from(500u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_refuses_an_address_that_holds_other_code() {
    let (anvil, deployment) = chain(4245).await;
    let raw = read_provider(&anvil.rpc_url()).unwrap();
    let committee = DealerCommittee::generate(5, 3, &mut ChaCha20Rng::from_seed([7; 32])).unwrap();
    let params = cx_settlement::evm::deploy::DeployParams {
        group_key: committee.group_key().unwrap(),
        grace_period_s: 600,
        min_stake: U256::from(1u64),
        unbonding_delay_s: 60,
        asset: cx_contracts::AssetSpec::Native,
    };
    cx_settlement::evm::deploy::verify(&raw, &deployment, &params)
        .await
        .expect("what was deployed verifies");
    // Another grace period than deployed: the immutable disagrees.
    let other = cx_settlement::evm::deploy::DeployParams {
        grace_period_s: 601,
        ..params
    };
    let err = cx_settlement::evm::deploy::verify(&raw, &deployment, &other)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("gracePeriod_s"), "{err}");
    // The registry's address named as the settlement: other code.
    let swapped = cx_contracts::Deployment {
        settlement: deployment.registry,
        ..deployment
    };
    let err = cx_settlement::evm::deploy::verify(&raw, &swapped, &params)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Settlement"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_whose_first_rpc_url_is_dead_is_reached_through_the_next() {
    let (anvil, deployment) = chain(4246).await;
    let dead = format!("http://127.0.0.1:{}", cx_devnet::free_port().unwrap());
    let mut entry = anvil.entry();
    entry.rpc_url = dead;
    entry.fallback_rpc_urls = vec![anvil.rpc_url()];
    let entry = cx_contracts::ChainDeployment {
        chain: entry,
        deployment,
    };
    let view = cx_settlement::onchain::ChainView::connect(&entry).unwrap();
    assert_eq!(view.batch_nonce().await.unwrap(), 0, "reads fail over");
    let buyer = EvmClient::for_chain(&entry, anvil.keys[1].clone()).unwrap();
    buyer
        .deposit(U256::from(9u64))
        .await
        .expect("a transaction fails over");
    assert_eq!(
        buyer.escrow_balance(buyer.account()).await.unwrap(),
        U256::from(9u64)
    );
}

/// The exchange keeps its poster's offers in the books: a restarted process whose earlier send
/// left an offer pending follows that offer when it makes the same call again (here at the fee
/// cap, so it cannot outbid it), and returns its receipt when it is mined — one deposit, not
/// two, although the nonce it started at was taken by a transaction it did not send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sender_follows_its_earlier_offer_from_the_books() {
    let (anvil, deployment) = chain(4247).await;
    let db = cx_devnet::db::TempDatabase::create().await.unwrap();
    let book = cx_settlement::evm::offers::OfferBook::new(db.pool().await.unwrap());
    let url = anvil.rpc_url();
    let raw = read_provider(&url).unwrap();
    let policy = FeePolicy {
        max_fee_per_gas_cap_wei: 5_000_000_000,
        priority_fee_wei: Some(5_000_000_000),
        give_up_after_s: 2,
        ..FeePolicy::default()
    };
    let client = |url: &str| {
        EvmClient::connect(url, anvil.keys[1].clone(), deployment)
            .unwrap()
            .with_fees(policy)
            .with_book(book.clone())
    };
    let account = anvil.keys[1].address();
    rpc(&raw, "evm_setIntervalMining", serde_json::json!([0])).await;
    let err = client(&url).deposit(U256::from(100u64)).await.unwrap_err();
    assert!(
        matches!(err, cx_settlement::Error::TxPending { nonce: 0, .. }),
        "{err}"
    );
    let pool = pooled(&raw, account).await;
    assert_eq!(pool.len(), 1);
    let old = pool[0].1;

    // Another process (another sender state: the URL written with a slash) makes the same call.
    let again = client(&format!("{url}/"));
    let sending = tokio::spawn({
        let again = again.clone();
        async move { again.deposit(U256::from(100u64)).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        pooled(&raw, account).await,
        vec![(0, old)],
        "nothing sent beside it"
    );
    rpc(&raw, "evm_setIntervalMining", serde_json::json!([1])).await;
    let outcome = landed(sending, 30, "its earlier offer's receipt").await;
    assert_eq!(outcome.tx_hash, old);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(raw.get_transaction_count(account).await.unwrap(), 1);
    assert_eq!(
        again.escrow_balance(account).await.unwrap(),
        U256::from(100u64),
        "deposited once"
    );
    let outcome: String = sqlx::query_scalar("SELECT outcome FROM chain_offers WHERE tx_hash = $1")
        .bind(old.as_slice())
        .fetch_one(&db.pool().await.unwrap())
        .await
        .unwrap();
    assert_eq!(outcome, "mined");
}
