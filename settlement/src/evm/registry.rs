//! `ProviderRegistry` as one account sees it: a provider's metadata (endpoint, ML-DSA key hash)
//! and stake, and committee-signed slashing.

use alloy::primitives::{Address, B256, U256};

use super::{EvmClient, TxOutcome, frost_signature, send};
use crate::error::Result;
use crate::frost::EvmSignature;

impl EvmClient {
    /// Publishes endpoint and ML-DSA key hash.
    pub async fn set_metadata(&self, endpoint: &str, ml_dsa_key_hash: B256) -> Result<TxOutcome> {
        Ok(send!(
            self,
            self.registry()
                .setMetadata(endpoint.to_string(), ml_dsa_key_hash)
        )
        .0)
    }

    /// Adds stake.
    pub async fn stake(&self, amount: U256) -> Result<TxOutcome> {
        let contract = self.registry();
        let call = contract.stake(amount);
        let call = if self.deployment.is_native() {
            call.value(amount)
        } else {
            call
        };
        Ok(send!(self, call).0)
    }

    /// Starts unbonding `amount`.
    pub async fn unbond(&self, amount: U256) -> Result<TxOutcome> {
        Ok(send!(self, self.registry().unbond(amount)).0)
    }

    /// Withdraws stake whose unbonding delay has passed.
    pub async fn withdraw_unbonded(&self) -> Result<TxOutcome> {
        Ok(send!(self, self.registry().withdrawUnbonded()).0)
    }

    /// Submits a committee-signed slash.
    pub async fn slash(
        &self,
        provider: Address,
        amount: U256,
        recipient: Address,
        evidence_hash: B256,
        expires_at_s: u64,
        sig: &EvmSignature,
    ) -> Result<TxOutcome> {
        let contract = self.registry();
        Ok(send!(
            self,
            contract.slash(
                provider,
                amount,
                recipient,
                evidence_hash,
                expires_at_s,
                frost_signature!(registry, sig)
            )
        )
        .0)
    }

    /// (staked, unbonding, unlock time) of `provider`.
    pub async fn provider_stake(&self, provider: Address) -> Result<(U256, U256, U256)> {
        let p = self.registry().providers(provider).call().await?;
        Ok((p.staked, p.unbonding, p.unlockAt))
    }
}
