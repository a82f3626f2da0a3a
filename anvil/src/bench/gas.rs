//! `cx-devnet bench gas`: gas of settlement measured with real transactions on a fresh Anvil.
//!
//! - `frost_verify_gas`: one FROST verification alone, measured inside a transaction by the
//!   `FrostGasProbe` contract (gasleft() around the library call; key in calldata).
//! - `settle_gas_per_job`: a batch of 100 jobs (10 providers, 20 buyers, 5 escrows each, so the
//!   ids form one contiguous range) settled with a real 3-of-5 FROST signature: the whole
//!   transaction's gas used (receipt, after refunds) divided by 100. Those 100 escrows are ids
//!   0-99, all in bitmap word 0, so the batch clears that word to zero and earns the 4,800-gas
//!   storage refund; `settle_gas_per_job_partial_word` is a second batch of 100 whose word keeps
//!   other open escrows (no refund), the less favourable case.
//! - `claim_gas`: one withdrawal with its Merkle proof (30 parties, 5 proof levels), whole
//!   transaction. Reported for a provider that already claimed once and holds tokens (the steady
//!   state: the storage slots exist); `claim_first_gas` is its first claim ever, which also pays
//!   for creating its `claimed` slot and its first token balance.

use alloy::primitives::{Address, B256, U256, keccak256};
use alloy::signers::local::PrivateKeySigner;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;
use serde::Serialize;

use cx_settlement::batch::{BatchMessage, ranges_from_ids};
use cx_settlement::evm::EvmClient;
use cx_settlement::frost::DealerCommittee;
use cx_settlement::merkle::{BalancesTree, MerkleTree, receipt_leaf};

use crate::anvil::AnvilInstance;
use crate::deploy::{DeployParams, deploy_with_probe, measure_frost_verify, mint_test_tokens};
use crate::error::{Error, Result};
use cx_contracts::AssetSpec;

/// Jobs in the measured batch.
pub const BATCH_JOBS: u64 = 100;
const PROVIDERS: usize = 10;
const BUYERS: usize = 20;

/// The measured figures.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct GasReport {
    /// Gas of one FROST verification (target ≤ 5,000).
    pub frost_verify_gas: u64,
    /// Whole settle transaction gas / jobs (target ≤ 500).
    pub settle_gas_per_job: u64,
    /// Whole settle transaction gas.
    pub settle_tx_gas: u64,
    /// The same for 100 jobs whose bitmap word keeps other open escrows (no clearing refund).
    pub settle_gas_per_job_partial_word: u64,
    /// Jobs in the batch.
    pub batch_jobs: u64,
    /// A claim with its proof, steady state (target ≤ 60,000).
    pub claim_gas: u64,
    /// A party's first claim ever.
    pub claim_first_gas: u64,
}

impl GasReport {
    /// The human table, each figure beside the target it is measured against.
    pub fn table(&self) -> String {
        let rows = [
            ("frost_verify_gas", self.frost_verify_gas, "<= 5000"),
            ("settle_gas_per_job", self.settle_gas_per_job, "<= 500"),
            ("settle_tx_gas", self.settle_tx_gas, ""),
            (
                "settle_partial_word",
                self.settle_gas_per_job_partial_word,
                "",
            ),
            ("claim_gas", self.claim_gas, "<= 60000"),
            ("claim_first_gas", self.claim_first_gas, ""),
        ];
        let mut out = format!("{:<22} {:>10} {:>10}\n", "metric", "gas", "target");
        for (name, gas, target) in rows {
            out += &format!("{name:<22} {gas:>10} {target:>10}\n");
        }
        out
    }
}

/// Runs the bench on a fresh Anvil (free port) and returns the report.
pub async fn gas_bench() -> Result<GasReport> {
    let anvil = AnvilInstance::spawn(31337, None, (PROVIDERS + BUYERS + 1) as u32)?;
    let url = anvil.rpc_url();
    let mut rng = ChaCha20Rng::from_seed([42u8; 32]);
    let committee = DealerCommittee::generate(5, 3, &mut rng)?;
    let group_key = committee.group_key()?;
    let deployer = anvil.keys[0].clone();
    let params = DeployParams {
        group_key,
        grace_period_s: 600,
        min_stake: U256::from(1_000_000_000u64),
        unbonding_delay_s: 86_400,
        asset: AssetSpec::TestToken,
    };
    let deployment = deploy_with_probe(&url, deployer.clone(), params).await?;
    let operator = EvmClient::connect(&url, deployer, deployment)?;

    // FROST verification alone.
    // The message is fixed (its bytes are what the seeded committee signs, so the figures repeat).
    let message = keccak256(b"cx-signer bench gas");
    let sig = committee.sign_evm(message.as_slice(), &mut rng)?;
    let (valid, frost_verify_gas) =
        measure_frost_verify(&operator, group_key, message, &sig).await?;
    if !valid {
        return Err(Error::Bench("the probe refused a valid FROST signature"));
    }

    let providers: Vec<PrivateKeySigner> = anvil.keys[1..=PROVIDERS].to_vec();
    let buyers: Vec<PrivateKeySigner> = anvil.keys[PROVIDERS + 1..=PROVIDERS + BUYERS].to_vec();
    let price = 1_000_000u128; // 1 test USD per job
    let now = anvil.now_s().await?;
    let mut jobs: Vec<(u64, Address, Address, u128)> = Vec::new(); // (id, buyer, provider, amount)
    for (b, key) in buyers.iter().enumerate() {
        let buyer = EvmClient::connect(&url, key.clone(), deployment)?;
        mint_test_tokens(&operator, buyer.account(), U256::from(1_000_000_000u64)).await?;
        buyer.approve_all().await?;
        buyer.deposit(U256::from(price * 5)).await?;
        for j in 0..5u64 {
            let order = keccak256([buyer.account().as_slice(), &j.to_be_bytes()].concat());
            let (id, _) = buyer.open_job(price, now + 3600, order).await?;
            let provider = providers[(b * 5 + j as usize) % PROVIDERS].address();
            jobs.push((id, buyer.account(), provider, price));
        }
    }

    // Credits: 90% of each escrow to its provider, 10% back to its buyer (cumulative).
    let mut credits: Vec<(Address, U256)> = Vec::new();
    let mut credit = |who: Address, amount: u128| match credits.iter_mut().find(|(a, _)| *a == who)
    {
        Some((_, total)) => *total += U256::from(amount),
        None => credits.push((who, U256::from(amount))),
    };
    let mut receipt_leaves = Vec::new();
    for (id, buyer, provider, amount) in &jobs {
        credit(*provider, amount * 9 / 10);
        credit(*buyer, amount - amount * 9 / 10);
        receipt_leaves.push(receipt_leaf(keccak256(
            [&id.to_be_bytes()[..], provider.as_slice()].concat(),
        )));
    }
    let balances = BalancesTree::new(credits)?;
    let ids: Vec<u64> = jobs.iter().map(|j| j.0).collect();
    let batch = BatchMessage {
        chain_id: deployment.chain_id,
        contract: deployment.settlement,
        key_epoch: 0,
        nonce: 1,
        receipts_root: MerkleTree::new(receipt_leaves)?.root(),
        balances_root: balances.root(),
        ranges: ranges_from_ids(&ids),
    };
    let sig = committee.sign_evm(batch.digest().as_slice(), &mut rng)?;
    let settled = operator.settle_batch(&batch, &sig).await?;

    // First claim, then a second batch and the steady-state claim by the same provider.
    let provider = EvmClient::connect(&url, providers[0].clone(), deployment)?;
    let (amount, proof) = balances.proof_for(provider.account())?;
    let first = provider.claim(amount, proof).await?;

    // Second batch: 100 jobs out of 200 newer ones, chosen so that their bitmap word keeps other
    // open escrows (no refund for clearing a word), the less favourable case.
    let now = anvil.now_s().await?;
    let mut newer: Vec<(u64, Address, Address, u128)> = Vec::new();
    for (b, key) in buyers.iter().enumerate() {
        let buyer = EvmClient::connect(&url, key.clone(), deployment)?;
        buyer.deposit(U256::from(price * 10)).await?;
        for j in 0..10u64 {
            let (id, _) = buyer
                .open_job(price, now + 3600, B256::with_last_byte(j as u8))
                .await?;
            newer.push((
                id,
                buyer.account(),
                providers[(b + j as usize) % PROVIDERS].address(),
                price,
            ));
        }
    }
    newer.sort_by_key(|j| j.0);
    let chosen = &newer[30..130];
    let mut entries = balances.entries().to_vec();
    let mut receipt_leaves = Vec::new();
    for (id, buyer, provider, amount) in chosen {
        for (who, total) in entries.iter_mut() {
            if who == provider {
                *total += U256::from(amount * 9 / 10);
            } else if who == buyer {
                *total += U256::from(amount - amount * 9 / 10);
            }
        }
        receipt_leaves.push(receipt_leaf(keccak256(
            [&id.to_be_bytes()[..], provider.as_slice()].concat(),
        )));
    }
    let balances2 = BalancesTree::new(entries)?;
    let chosen_ids: Vec<u64> = chosen.iter().map(|j| j.0).collect();
    let batch2 = BatchMessage {
        nonce: 2,
        receipts_root: MerkleTree::new(receipt_leaves)?.root(),
        balances_root: balances2.root(),
        ranges: ranges_from_ids(&chosen_ids),
        ..batch
    };
    let sig2 = committee.sign_evm(batch2.digest().as_slice(), &mut rng)?;
    let partial = operator.settle_batch(&batch2, &sig2).await?;
    let (amount2, proof2) = balances2.proof_for(provider.account())?;
    let steady = provider.claim(amount2, proof2).await?;

    Ok(GasReport {
        frost_verify_gas,
        settle_gas_per_job: settled.gas_used / BATCH_JOBS,
        settle_tx_gas: settled.gas_used,
        settle_gas_per_job_partial_word: partial.gas_used / chosen_ids.len() as u64,
        batch_jobs: BATCH_JOBS,
        claim_gas: steady.gas_used,
        claim_first_gas: first.gas_used,
    })
}
