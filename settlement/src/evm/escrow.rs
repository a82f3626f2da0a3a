//! `Settlement`'s escrow side as one account sees it: the payment asset, deposits and
//! withdrawals, per-job escrows (tabs), signed batches, claims by Merkle proof, and the
//! committee's group key.

use alloy::primitives::{Address, B256, U256};
use alloy::providers::Provider;
use cx_contracts::{Settlement, TestStablecoin};

use super::{EvmClient, TxOutcome, frost_signature, send};
use crate::batch::BatchMessage;
use crate::error::{Error, Result};
use crate::frost::{EvmGroupKey, EvmSignature};

/// The group key as `Settlement.groupKey()` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnChainGroupKey {
    /// The key.
    pub key: EvmGroupKey,
    /// How many rotations happened.
    pub epoch: u32,
}

impl EvmClient {
    // ---- asset --------------------------------------------------------------------------------

    /// Lets `Settlement` and `ProviderRegistry` pull this account's tokens (no-op for native).
    pub async fn approve_all(&self) -> Result<()> {
        if self.deployment.is_native() {
            return Ok(());
        }
        let token = TestStablecoin::new(self.deployment.asset, self.provider.clone());
        send!(self, token.approve(self.deployment.settlement, U256::MAX));
        send!(self, token.approve(self.deployment.registry, U256::MAX));
        Ok(())
    }

    /// The asset balance of `who` (token balance, or ETH balance for native).
    pub async fn asset_balance(&self, who: Address) -> Result<U256> {
        if self.deployment.is_native() {
            return Ok(self.provider.get_balance(who).await?);
        }
        let token = TestStablecoin::new(self.deployment.asset, self.provider.clone());
        Ok(token.balanceOf(who).call().await?)
    }

    // ---- escrow -------------------------------------------------------------------------------

    /// Deposits `amount` into the free balance.
    pub async fn deposit(&self, amount: U256) -> Result<TxOutcome> {
        let contract = self.settlement();
        let call = contract.deposit(amount);
        let call = if self.deployment.is_native() {
            call.value(amount)
        } else {
            call
        };
        Ok(send!(self, call).0)
    }

    /// Withdraws `amount` of the free balance.
    pub async fn withdraw(&self, amount: U256) -> Result<TxOutcome> {
        Ok(send!(self, self.settlement().withdraw(amount)).0)
    }

    /// Opens a per-job escrow; returns the job's escrow id.
    pub async fn open_job(
        &self,
        amount: u128,
        deadline_s: u64,
        order_ref: B256,
    ) -> Result<(u64, TxOutcome)> {
        let (out, receipt) = send!(
            self,
            self.settlement().openJob(amount, deadline_s, order_ref)
        );
        let job_id = receipt
            .logs()
            .iter()
            .find_map(|log| log.log_decode::<Settlement::JobOpened>().ok())
            .map(|log| log.inner.data.jobId)
            .ok_or(Error::MissingEvent {
                tx_hash: out.tx_hash,
                event: "JobOpened",
            })?;
        Ok((job_id, out))
    }

    /// Reclaims an unsettled escrow after its deadline and grace period.
    pub async fn reclaim(&self, job_id: u64) -> Result<TxOutcome> {
        Ok(send!(self, self.settlement().reclaim(job_id)).0)
    }

    /// Posts a signed batch.
    pub async fn settle_batch(
        &self,
        batch: &BatchMessage,
        sig: &EvmSignature,
    ) -> Result<TxOutcome> {
        let contract = self.settlement();
        Ok(send!(
            self,
            contract.settleBatch(
                batch.nonce,
                batch.receipts_root,
                batch.balances_root,
                batch.packed_ranges(),
                frost_signature!(settlement, sig),
            )
        )
        .0)
    }

    /// Withdraws this account's credits up to `cumulative` with its Merkle proof.
    pub async fn claim(&self, cumulative: U256, proof: Vec<B256>) -> Result<TxOutcome> {
        Ok(send!(self, self.settlement().claim(cumulative, proof)).0)
    }

    /// Rotates the group key with a signature by the current key.
    pub async fn rotate_group_key(
        &self,
        new_key: EvmGroupKey,
        sig: &EvmSignature,
    ) -> Result<TxOutcome> {
        Ok(send!(
            self,
            self.settlement().rotateGroupKey(
                new_key.x,
                new_key.parity,
                frost_signature!(settlement, sig)
            )
        )
        .0)
    }

    // ---- reads --------------------------------------------------------------------------------

    /// The free balance of `who`.
    pub async fn escrow_balance(&self, who: Address) -> Result<U256> {
        Ok(self.settlement().balanceOf(who).call().await?)
    }

    /// What `who` has claimed so far.
    pub async fn claimed(&self, who: Address) -> Result<U256> {
        Ok(self.settlement().claimed(who).call().await?)
    }

    /// Whether escrow `job_id` is still open.
    pub async fn is_open(&self, job_id: u64) -> Result<bool> {
        Ok(self.settlement().isOpen(job_id).call().await?)
    }

    /// Last accepted batch nonce and total escrow settled.
    pub async fn batch_state(&self) -> Result<(u64, U256)> {
        let s = self.settlement().batchState().call().await?;
        Ok((s.nonce, U256::from(s.totalSettled)))
    }

    /// The current group key.
    pub async fn group_key(&self) -> Result<OnChainGroupKey> {
        let k = self.settlement().groupKey().call().await?;
        Ok(OnChainGroupKey {
            key: EvmGroupKey {
                x: k.x,
                parity: k.parity,
            },
            epoch: k.epoch,
        })
    }

    /// The digest the contract computes for `batch` (a signer can check its own encoding
    /// against the contract before signing).
    pub async fn batch_digest_on_chain(&self, batch: &BatchMessage) -> Result<B256> {
        Ok(self
            .settlement()
            .batchDigest(
                batch.key_epoch,
                batch.nonce,
                batch.receipts_root,
                batch.balances_root,
                batch.packed_ranges(),
            )
            .call()
            .await?)
    }

    /// The current cumulative balances root.
    pub async fn balances_root(&self) -> Result<B256> {
        Ok(self.settlement().balancesRoot().call().await?)
    }
}
