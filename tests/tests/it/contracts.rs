//! End to end against real Anvil chains (each test starts its own on free ports): deposits,
//! escrows, batches signed by a real 3-of-5 FROST committee, claims with Merkle proofs, refunds
//! after the deadline, replay, slashing, key rotation, and refusals that must leave every balance
//! unchanged.
//!
//! One file of ~700 lines on purpose: each test is one scenario that crosses Escrow, Settlement
//! and ProviderRegistry and reads top to bottom, and all of them share the fixtures below;
//! split by contract, a scenario would be cut in pieces.

use alloy::primitives::{B256, U256, keccak256};
use cx_devnet::AnvilInstance;
use cx_devnet::deploy::{DeployParams, deploy, mint_test_tokens};
use cx_settlement::Error;
use cx_settlement::batch::{
    BatchMessage, JobRange, ranges_from_ids, rotation_digest, slash_digest,
};
use cx_settlement::evm::EvmClient;
use cx_settlement::frost::DealerCommittee;
use cx_settlement::merkle::{BalancesTree, MerkleTree, receipt_leaf};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

const GRACE_S: u64 = 600;
const MIN_STAKE: u64 = 1_000_000_000;

struct Chain {
    anvil: AnvilInstance,
    operator: EvmClient,
    buyer: EvmClient,
    provider: EvmClient,
    stranger: EvmClient,
}

impl Chain {
    async fn start(chain_id: u64, committee: &DealerCommittee, native: bool) -> Chain {
        let anvil = AnvilInstance::spawn(chain_id, None, 6).expect("anvil");
        let url = anvil.rpc_url();
        let params = DeployParams {
            group_key: committee.group_key().expect("key"),
            grace_period_s: GRACE_S,
            min_stake: U256::from(MIN_STAKE),
            unbonding_delay_s: 86_400,
            asset: if native {
                cx_contracts::AssetSpec::Native
            } else {
                cx_contracts::AssetSpec::TestToken
            },
        };
        let deployment = deploy(&url, anvil.keys[0].clone(), params)
            .await
            .expect("deploy");
        let client =
            |i: usize| EvmClient::connect(&url, anvil.keys[i].clone(), deployment).expect("client");
        let chain = Chain {
            operator: client(0),
            buyer: client(1),
            provider: client(2),
            stranger: client(3),
            anvil,
        };
        if !native {
            for c in [&chain.buyer, &chain.provider, &chain.stranger] {
                mint_test_tokens(&chain.operator, c.account(), U256::from(10_000_000_000u64))
                    .await
                    .expect("mint");
                c.approve_all().await.expect("approve");
            }
        }
        chain
    }

    /// Asset balances of the parties and the two contracts, to compare before and after a refusal.
    async fn balances(&self) -> Vec<U256> {
        let d = self.operator.deployment();
        let mut out = Vec::new();
        for who in [
            self.buyer.account(),
            self.provider.account(),
            self.stranger.account(),
            d.settlement,
            d.registry,
        ] {
            out.push(self.operator.asset_balance(who).await.expect("balance"));
        }
        for who in [
            self.buyer.account(),
            self.provider.account(),
            self.stranger.account(),
        ] {
            out.push(
                self.operator
                    .escrow_balance(who)
                    .await
                    .expect("escrow balance"),
            );
            out.push(self.operator.claimed(who).await.expect("claimed"));
        }
        out
    }

    fn batch(&self, nonce: u64, balances: &BalancesTree, job_ids: &[u64]) -> BatchMessage {
        let leaves = job_ids
            .iter()
            .map(|id| receipt_leaf(keccak256(id.to_be_bytes())))
            .collect();
        BatchMessage {
            chain_id: self.anvil.chain_id,
            contract: self.operator.deployment().settlement,
            key_epoch: 0,
            nonce,
            receipts_root: MerkleTree::new(leaves).expect("receipts").root(),
            balances_root: balances.root(),
            ranges: ranges_from_ids(job_ids),
        }
    }

    async fn deadline_in(&self, seconds: u64) -> u64 {
        self.anvil.now_s().await.expect("now") + seconds
    }
}

fn dealer(seed: u8) -> DealerCommittee {
    DealerCommittee::generate(5, 3, &mut ChaCha20Rng::from_seed([seed; 32])).expect("dealer")
}

fn rng() -> ChaCha20Rng {
    ChaCha20Rng::from_seed([99; 32])
}

/// Asserts a refusal by its custom error name.
fn assert_reverted<T: std::fmt::Debug>(result: cx_settlement::Result<T>, expected: &str) {
    match result {
        Err(Error::Reverted { name, detail }) => {
            assert_eq!(name, expected, "wrong custom error{detail}")
        }
        other => panic!("expected revert {expected}, got {other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn deposit_escrow_settle_claim_on_two_chains() {
    let committee = dealer(1);
    let mut rng = rng();
    let chains = [
        Chain::start(31337, &committee, false).await,
        Chain::start(31338, &committee, false).await,
    ];
    let mut signed = Vec::new();
    for chain in &chains {
        let buyer_before = chain
            .operator
            .asset_balance(chain.buyer.account())
            .await
            .unwrap();
        let provider_before = chain
            .operator
            .asset_balance(chain.provider.account())
            .await
            .unwrap();
        chain.buyer.deposit(U256::from(1_000)).await.unwrap();
        let deadline = chain.deadline_in(3600).await;
        let (job, _) = chain
            .buyer
            .open_job(600, deadline, B256::repeat_byte(7))
            .await
            .unwrap();
        assert!(chain.operator.is_open(job).await.unwrap());
        // 540 to the provider, 60 back to the buyer.
        let balances = BalancesTree::new(vec![
            (chain.provider.account(), U256::from(540)),
            (chain.buyer.account(), U256::from(60)),
        ])
        .unwrap();
        let batch = chain.batch(1, &balances, &[job]);
        assert_eq!(
            chain.operator.batch_digest_on_chain(&batch).await.unwrap(),
            batch.digest()
        );
        let sig = committee
            .sign_evm(batch.digest().as_slice(), &mut rng)
            .unwrap();
        chain.operator.settle_batch(&batch, &sig).await.unwrap();
        signed.push((batch.clone(), sig));
        assert!(!chain.operator.is_open(job).await.unwrap());
        assert_eq!(
            chain.operator.balances_root().await.unwrap(),
            balances.root()
        );
        assert_eq!(
            chain.operator.batch_state().await.unwrap(),
            (1, U256::from(600))
        );

        let (amount, proof) = balances.proof_for(chain.provider.account()).unwrap();
        chain.provider.claim(amount, proof).await.unwrap();
        let (amount, proof) = balances.proof_for(chain.buyer.account()).unwrap();
        chain.buyer.claim(amount, proof).await.unwrap();
        chain.buyer.withdraw(U256::from(400)).await.unwrap();

        let buyer_after = chain
            .operator
            .asset_balance(chain.buyer.account())
            .await
            .unwrap();
        let provider_after = chain
            .operator
            .asset_balance(chain.provider.account())
            .await
            .unwrap();
        assert_eq!(provider_after, provider_before + U256::from(540));
        assert_eq!(buyer_after, buyer_before - U256::from(540));
        let settlement = chain.operator.deployment().settlement;
        assert_eq!(
            chain.operator.asset_balance(settlement).await.unwrap(),
            U256::ZERO
        );

        let batches = chain.operator.settled_batches(0).await.unwrap();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].nonce, 1);
        assert_eq!(batches[0].balances_root, balances.root());
        assert_eq!(batches[0].receipts_root, batch.receipts_root);
        assert_eq!(batches[0].settled_amount, U256::from(600));
        assert_eq!(chain.operator.claims(0).await.unwrap().len(), 2);
        assert_eq!(chain.operator.opened_jobs(0).await.unwrap()[0].amount, 600);
    }
    // A batch signed for chain 31337 is refused on 31338 (the digest binds the chain id), even
    // with the same contract address and nonce.
    let (batch_a, sig_a) = &signed[0];
    let other = &chains[1];
    assert_eq!(
        batch_a.contract,
        other.operator.deployment().settlement,
        "same deployer, same address"
    );
    other.buyer.deposit(U256::from(600)).await.unwrap();
    other
        .buyer
        .open_job(600, other.deadline_in(3600).await, B256::ZERO)
        .await
        .unwrap();
    let before = other.balances().await;
    let replay = BatchMessage {
        chain_id: other.anvil.chain_id,
        nonce: 2,
        ..batch_a.clone()
    };
    assert_reverted(
        other.operator.settle_batch(&replay, sig_a).await,
        "InvalidSignature",
    );
    assert_eq!(other.balances().await, before);
}

#[tokio::test(flavor = "current_thread")]
async fn native_eth_deployment_settles_and_pays_out() {
    let committee = dealer(2);
    let mut rng = rng();
    let chain = Chain::start(31337, &committee, true).await;
    let one_eth = U256::from(10u64).pow(U256::from(18));
    chain.buyer.deposit(one_eth).await.unwrap();
    let (job, _) = chain
        .buyer
        .open_job(
            1_000_000_000_000_000_000,
            chain.deadline_in(60).await,
            B256::ZERO,
        )
        .await
        .unwrap();
    let balances = BalancesTree::new(vec![(chain.provider.account(), one_eth)]).unwrap();
    let batch = chain.batch(1, &balances, &[job]);
    chain
        .operator
        .settle_batch(
            &batch,
            &committee
                .sign_evm(batch.digest().as_slice(), &mut rng)
                .unwrap(),
        )
        .await
        .unwrap();
    let before = chain
        .operator
        .asset_balance(chain.provider.account())
        .await
        .unwrap();
    let (amount, proof) = balances.proof_for(chain.provider.account()).unwrap();
    let out = chain.provider.claim(amount, proof).await.unwrap();
    let after = chain
        .operator
        .asset_balance(chain.provider.account())
        .await
        .unwrap();
    // The provider paid the claim's gas in ETH too; fee = gas used × effective price (≤ 1 gwei
    // base fee scale on Anvil, far below 0.01 ETH).
    assert!(
        after > before + one_eth - U256::from(10u64).pow(U256::from(16)),
        "claim of 1 ETH not received"
    );
    assert!(out.gas_used > 21_000);
}

#[tokio::test(flavor = "current_thread")]
async fn refund_after_deadline_and_never_after_settlement() {
    let committee = dealer(3);
    let mut rng = rng();
    let chain = Chain::start(31337, &committee, false).await;
    chain.buyer.deposit(U256::from(1_000)).await.unwrap();
    let (job, _) = chain
        .buyer
        .open_job(300, chain.deadline_in(100).await, B256::ZERO)
        .await
        .unwrap();
    let (settled_job, _) = chain
        .buyer
        .open_job(200, chain.deadline_in(100).await, B256::ZERO)
        .await
        .unwrap();

    let before = chain.balances().await;
    assert_reverted(chain.buyer.reclaim(job).await, "ReclaimTooEarly");
    assert_eq!(chain.balances().await, before);

    let balances = BalancesTree::new(vec![(chain.provider.account(), U256::from(200))]).unwrap();
    let batch = chain.batch(1, &balances, &[settled_job]);
    chain
        .operator
        .settle_batch(
            &batch,
            &committee
                .sign_evm(batch.digest().as_slice(), &mut rng)
                .unwrap(),
        )
        .await
        .unwrap();

    chain.anvil.advance_time(100 + GRACE_S + 1).await.unwrap();
    let before = chain.balances().await;
    assert_reverted(chain.stranger.reclaim(job).await, "NotBuyer");
    assert_eq!(chain.balances().await, before);
    chain.buyer.reclaim(job).await.unwrap();
    assert_eq!(
        chain
            .operator
            .escrow_balance(chain.buyer.account())
            .await
            .unwrap(),
        U256::from(800)
    );
    assert!(!chain.operator.is_open(job).await.unwrap());

    // The settled one can never be reclaimed; the reclaimed one can never be settled.
    let before = chain.balances().await;
    assert_reverted(chain.buyer.reclaim(settled_job).await, "EscrowNotOpen");
    assert_reverted(chain.buyer.reclaim(job).await, "EscrowNotOpen");
    let late = chain.batch(2, &balances, &[job]);
    let sig = committee
        .sign_evm(late.digest().as_slice(), &mut rng)
        .unwrap();
    assert_reverted(
        chain.operator.settle_batch(&late, &sig).await,
        "EscrowNotOpen",
    );
    assert_eq!(chain.balances().await, before);
}

#[tokio::test(flavor = "current_thread")]
async fn replayed_batch_is_refused() {
    let committee = dealer(4);
    let mut rng = rng();
    let chain = Chain::start(31337, &committee, false).await;
    chain.buyer.deposit(U256::from(1_000)).await.unwrap();
    let (a, _) = chain
        .buyer
        .open_job(100, chain.deadline_in(3600).await, B256::ZERO)
        .await
        .unwrap();
    let (b, _) = chain
        .buyer
        .open_job(100, chain.deadline_in(3600).await, B256::ZERO)
        .await
        .unwrap();
    let balances = BalancesTree::new(vec![(chain.provider.account(), U256::from(100))]).unwrap();
    let batch = chain.batch(1, &balances, &[a]);
    let sig = committee
        .sign_evm(batch.digest().as_slice(), &mut rng)
        .unwrap();
    chain.operator.settle_batch(&batch, &sig).await.unwrap();

    let before = chain.balances().await;
    let state = chain.operator.batch_state().await.unwrap();
    assert_reverted(
        chain.operator.settle_batch(&batch, &sig).await,
        "BatchNonceNotIncreasing",
    );
    // Same signature with another job or nonce: the digest changes, the signature fails.
    let moved = BatchMessage {
        ranges: vec![JobRange {
            start: b,
            end: b + 1,
        }],
        ..batch.clone()
    };
    assert_reverted(
        chain.operator.settle_batch(&moved, &sig).await,
        "BatchNonceNotIncreasing",
    );
    let renonced = BatchMessage {
        nonce: 2,
        ..batch.clone()
    };
    assert_reverted(
        chain.operator.settle_batch(&renonced, &sig).await,
        "InvalidSignature",
    );
    assert_eq!(chain.balances().await, before);
    assert_eq!(chain.operator.batch_state().await.unwrap(), state);
    assert!(chain.operator.is_open(b).await.unwrap());
}

#[tokio::test(flavor = "current_thread")]
async fn slashing_needs_the_committee_signature() {
    let committee = dealer(5);
    let impostor = dealer(6);
    let mut rng = rng();
    let chain = Chain::start(31337, &committee, false).await;
    let registry = chain.operator.deployment().registry;
    chain
        .provider
        .set_metadata("https://127.0.0.1:9001", B256::repeat_byte(0x4d))
        .await
        .unwrap();
    chain
        .provider
        .stake(U256::from(2 * MIN_STAKE))
        .await
        .unwrap();
    let evidence = keccak256(b"receipt 17: output hash differs from the re-execution");
    let amount = U256::from(MIN_STAKE);
    let recipient = chain.buyer.account();
    let expires_at = chain.deadline_in(3600).await;
    let digest = slash_digest(
        chain.anvil.chain_id,
        registry,
        chain.provider.account(),
        amount,
        recipient,
        evidence,
        expires_at,
    );

    let before = chain.balances().await;
    let bad = impostor.sign_evm(digest.as_slice(), &mut rng).unwrap();
    assert_reverted(
        chain
            .stranger
            .slash(
                chain.provider.account(),
                amount,
                recipient,
                evidence,
                expires_at,
                &bad,
            )
            .await,
        "InvalidSignature",
    );
    // A valid signature, but for other terms (more to slash).
    let good = committee.sign_evm(digest.as_slice(), &mut rng).unwrap();
    assert_reverted(
        chain
            .stranger
            .slash(
                chain.provider.account(),
                amount * U256::from(2),
                recipient,
                evidence,
                expires_at,
                &good,
            )
            .await,
        "InvalidSignature",
    );
    assert_eq!(chain.balances().await, before);
    assert_eq!(
        chain
            .operator
            .provider_stake(chain.provider.account())
            .await
            .unwrap()
            .0,
        U256::from(2 * MIN_STAKE)
    );

    let buyer_before = chain.operator.asset_balance(recipient).await.unwrap();
    chain
        .stranger
        .slash(
            chain.provider.account(),
            amount,
            recipient,
            evidence,
            expires_at,
            &good,
        )
        .await
        .unwrap();
    assert_eq!(
        chain
            .operator
            .provider_stake(chain.provider.account())
            .await
            .unwrap()
            .0,
        U256::from(MIN_STAKE)
    );
    assert_eq!(
        chain.operator.asset_balance(recipient).await.unwrap(),
        buyer_before + amount
    );
    let slashes = chain.operator.slashes(0).await.unwrap();
    assert_eq!(slashes.len(), 1);
    assert_eq!(slashes[0].evidenceHash, evidence);

    let before = chain.balances().await;
    assert_reverted(
        chain
            .stranger
            .slash(
                chain.provider.account(),
                amount,
                recipient,
                evidence,
                expires_at,
                &good,
            )
            .await,
        "EvidenceAlreadyUsed",
    );
    assert_eq!(chain.balances().await, before);
}

#[tokio::test(flavor = "current_thread")]
async fn refusals_keep_every_balance() {
    let committee = dealer(7);
    let next_committee = dealer(8);
    let mut rng = rng();
    let chain = Chain::start(31337, &committee, false).await;
    chain.buyer.deposit(U256::from(1_000)).await.unwrap();
    let (job, _) = chain
        .buyer
        .open_job(500, chain.deadline_in(3600).await, B256::ZERO)
        .await
        .unwrap();
    let (spare, _) = chain
        .buyer
        .open_job(400, chain.deadline_in(3600).await, B256::ZERO)
        .await
        .unwrap();
    let balances = BalancesTree::new(vec![
        (chain.provider.account(), U256::from(450)),
        (chain.buyer.account(), U256::from(50)),
        (chain.stranger.account(), U256::from(1)),
    ])
    .unwrap();
    let batch = chain.batch(1, &balances, &[job]);
    chain
        .operator
        .settle_batch(
            &batch,
            &committee
                .sign_evm(batch.digest().as_slice(), &mut rng)
                .unwrap(),
        )
        .await
        .unwrap();
    chain
        .provider
        .stake(U256::from(MIN_STAKE + 5))
        .await
        .unwrap();

    let before = chain.balances().await;
    let (amount, proof) = balances.proof_for(chain.provider.account()).unwrap();
    assert_reverted(
        chain
            .provider
            .claim(amount + U256::from(1), proof.clone())
            .await,
        "InvalidProof",
    );
    assert_reverted(
        chain.stranger.claim(amount, proof.clone()).await,
        "InvalidProof",
    );
    assert_reverted(
        chain.buyer.withdraw(U256::from(101)).await,
        "InsufficientBalance",
    );
    assert_reverted(
        chain
            .buyer
            .open_job(101, chain.deadline_in(10).await, B256::ZERO)
            .await,
        "InsufficientBalance",
    );
    assert_reverted(
        chain
            .buyer
            .open_job(1, chain.deadline_in(0).await, B256::ZERO)
            .await,
        "DeadlineInPast",
    );
    assert_reverted(
        chain
            .buyer
            .open_job(0, chain.deadline_in(10).await, B256::ZERO)
            .await,
        "ZeroAmount",
    );
    assert_reverted(chain.buyer.deposit(U256::ZERO).await, "ZeroAmount");
    assert_reverted(chain.buyer.reclaim(spare + 5).await, "UnknownJob");
    // Tampered batch fields under the batch's own signature.
    let batch2 = chain.batch(2, &balances, &[spare]);
    let sig2 = committee
        .sign_evm(batch2.digest().as_slice(), &mut rng)
        .unwrap();
    let tampered = BatchMessage {
        balances_root: B256::repeat_byte(1),
        ..batch2.clone()
    };
    assert_reverted(
        chain.operator.settle_batch(&tampered, &sig2).await,
        "InvalidSignature",
    );
    let mut bad_z = sig2;
    bad_z.z += U256::from(1);
    assert_reverted(
        chain.operator.settle_batch(&batch2, &bad_z).await,
        "InvalidSignature",
    );
    let empty = BatchMessage {
        ranges: vec![JobRange { start: 3, end: 3 }],
        ..batch2.clone()
    };
    let sig_empty = committee
        .sign_evm(empty.digest().as_slice(), &mut rng)
        .unwrap();
    assert_reverted(
        chain.operator.settle_batch(&empty, &sig_empty).await,
        "InvalidRange",
    );
    // Stake rules.
    assert_reverted(
        chain.provider.unbond(U256::from(10)).await,
        "BelowMinimumStake",
    );
    assert_reverted(
        chain.provider.unbond(U256::from(2 * MIN_STAKE)).await,
        "InsufficientStake",
    );
    assert_reverted(chain.provider.withdraw_unbonded().await, "NothingUnbonding");
    assert_reverted(
        chain.stranger.stake(U256::from(MIN_STAKE - 1)).await,
        "BelowMinimumStake",
    );
    // Rotation by anyone but the current key.
    let new_key = next_committee.group_key().unwrap();
    let deployment = chain.operator.deployment();
    let rotation = rotation_digest(
        chain.anvil.chain_id,
        deployment.settlement,
        0,
        new_key.x,
        new_key.parity,
    );
    let by_new = next_committee
        .sign_evm(rotation.as_slice(), &mut rng)
        .unwrap();
    assert_reverted(
        chain.operator.rotate_group_key(new_key, &by_new).await,
        "InvalidSignature",
    );
    assert_eq!(chain.balances().await, before);

    // Claims are capped by what batches settled, whatever the root says.
    let (amount, proof) = balances.proof_for(chain.provider.account()).unwrap();
    chain.provider.claim(amount, proof.clone()).await.unwrap();
    let before = chain.balances().await;
    assert_reverted(chain.provider.claim(amount, proof).await, "NothingToClaim");
    assert_eq!(chain.balances().await, before);

    // A real rotation: afterwards only the new key settles.
    let by_current = committee.sign_evm(rotation.as_slice(), &mut rng).unwrap();
    chain
        .operator
        .rotate_group_key(new_key, &by_current)
        .await
        .unwrap();
    let on_chain = chain.operator.group_key().await.unwrap();
    assert_eq!((on_chain.key, on_chain.epoch), (new_key, 1));
    let before = chain.balances().await;
    assert_reverted(
        chain.operator.settle_batch(&batch2, &sig2).await,
        "InvalidSignature",
    );
    assert_eq!(chain.balances().await, before);
    // The new key signs under the new epoch (the digest binds it).
    let batch2 = BatchMessage {
        key_epoch: 1,
        ..batch2
    };
    assert_eq!(
        chain.operator.batch_digest_on_chain(&batch2).await.unwrap(),
        batch2.digest()
    );
    let sig_new = next_committee
        .sign_evm(batch2.digest().as_slice(), &mut rng)
        .unwrap();
    chain
        .operator
        .settle_batch(&batch2, &sig_new)
        .await
        .unwrap();
    assert!(!chain.operator.is_open(spare).await.unwrap());
}

#[tokio::test(flavor = "current_thread")]
async fn claim_beyond_settled_funds_is_refused() {
    // A root that credits more than the batch settled (which only a faulty committee would sign)
    // still cannot reach open escrows or deposits.
    let committee = dealer(9);
    let mut rng = rng();
    let chain = Chain::start(31337, &committee, false).await;
    chain.buyer.deposit(U256::from(1_000)).await.unwrap();
    let (job, _) = chain
        .buyer
        .open_job(100, chain.deadline_in(3600).await, B256::ZERO)
        .await
        .unwrap();
    chain
        .buyer
        .open_job(800, chain.deadline_in(3600).await, B256::ZERO)
        .await
        .unwrap();
    let balances = BalancesTree::new(vec![(chain.provider.account(), U256::from(900))]).unwrap();
    let batch = chain.batch(1, &balances, &[job]);
    chain
        .operator
        .settle_batch(
            &batch,
            &committee
                .sign_evm(batch.digest().as_slice(), &mut rng)
                .unwrap(),
        )
        .await
        .unwrap();
    let before = chain.balances().await;
    let (amount, proof) = balances.proof_for(chain.provider.account()).unwrap();
    assert_reverted(
        chain.provider.claim(amount, proof).await,
        "ClaimExceedsSettledFunds",
    );
    assert_eq!(chain.balances().await, before);
}

/// What broke: a signer read the nonce, the balances root and the escrows in separate "latest"
/// calls, so answers could come from different blocks (a lagging or load-balanced node), and a
/// batch n+1 could be checked against the balances from before batch n. A pinned view reads
/// every value at one block, by hash, whatever the chain does meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn a_pinned_view_reads_nonce_root_and_escrows_at_one_block() {
    use cx_contracts::{ChainDeployment, Deployment};
    use cx_settlement::onchain::ChainView;

    let committee = dealer(11);
    let mut rng = rng();
    let chain = Chain::start(31337, &committee, false).await;
    chain.buyer.deposit(U256::from(1_000)).await.unwrap();
    let (job, _) = chain
        .buyer
        .open_job(600, chain.deadline_in(3600).await, B256::ZERO)
        .await
        .unwrap();
    let deployment: Deployment = chain.operator.deployment();
    let view = ChainView::connect(&ChainDeployment {
        chain: chain.anvil.entry(),
        deployment,
    })
    .unwrap();
    let before = view.pinned().await.unwrap();
    let root_before = before.balances_root().await.unwrap();

    let balances = BalancesTree::new(vec![(chain.provider.account(), U256::from(600))]).unwrap();
    let batch = chain.batch(1, &balances, &[job]);
    let sig = committee
        .sign_evm(batch.digest().as_slice(), &mut rng)
        .unwrap();
    chain.operator.settle_batch(&batch, &sig).await.unwrap();
    chain.anvil.advance_time(60).await.unwrap();

    // The chain moved on; the pinned view did not.
    assert_eq!(view.batch_nonce().await.unwrap(), 1);
    assert_eq!(before.batch_nonce().await.unwrap(), 0);
    assert_eq!(before.balances_root().await.unwrap(), root_before);
    assert!(before.open_escrow(job).await.unwrap().is_some());
    assert!(view.open_escrow(job).await.unwrap().is_none());
    let pinned = before.block().unwrap();
    assert_eq!(before.now_s().await.unwrap(), pinned.timestamp_s);
    assert!(view.now_s().await.unwrap() >= pinned.timestamp_s + 60);
    let after = view.pinned().await.unwrap();
    assert!(after.block().unwrap().number > pinned.number);
    assert_eq!(after.balances_root().await.unwrap(), balances.root());
}
