//! Event readers: what the explorer shows and what a restarted coordinator checks on chain.

use alloy::primitives::{B256, U256};
use alloy::sol_types::SolEvent;
use cx_contracts::{ProviderRegistry, Settlement};

use super::EvmClient;
use crate::error::Result;

/// A `BatchSettled` event with where it was logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettledBatch {
    /// Batch nonce.
    pub nonce: u64,
    /// Receipts root.
    pub receipts_root: B256,
    /// Cumulative balances root.
    pub balances_root: B256,
    /// Escrow the batch settled.
    pub settled_amount: U256,
    /// Transaction that carried it.
    pub tx_hash: Option<B256>,
    /// Block.
    pub block_number: Option<u64>,
}

/// Topic of `BatchSettled` (for log filters elsewhere).
pub fn batch_settled_topic() -> B256 {
    Settlement::BatchSettled::SIGNATURE_HASH
}

impl EvmClient {
    /// Every `BatchSettled` from `from_block` on.
    pub async fn settled_batches(&self, from_block: u64) -> Result<Vec<SettledBatch>> {
        let logs = self
            .settlement()
            .BatchSettled_filter()
            .from_block(from_block)
            .query()
            .await?;
        Ok(logs
            .into_iter()
            .map(|(e, log)| SettledBatch {
                nonce: e.nonce,
                receipts_root: e.receiptsRoot,
                balances_root: e.balancesRoot,
                settled_amount: e.settledAmount,
                tx_hash: log.transaction_hash,
                block_number: log.block_number,
            })
            .collect())
    }

    /// Every `JobOpened` from `from_block` on: (job id, buyer, amount, deadline, order ref).
    pub async fn opened_jobs(&self, from_block: u64) -> Result<Vec<Settlement::JobOpened>> {
        let logs = self
            .settlement()
            .JobOpened_filter()
            .from_block(from_block)
            .query()
            .await?;
        Ok(logs.into_iter().map(|(e, _)| e).collect())
    }

    /// Every `Claimed` from `from_block` on.
    pub async fn claims(&self, from_block: u64) -> Result<Vec<Settlement::Claimed>> {
        let logs = self
            .settlement()
            .Claimed_filter()
            .from_block(from_block)
            .query()
            .await?;
        Ok(logs.into_iter().map(|(e, _)| e).collect())
    }

    /// Every `Slashed` from `from_block` on.
    pub async fn slashes(&self, from_block: u64) -> Result<Vec<ProviderRegistry::Slashed>> {
        let logs = self
            .registry()
            .Slashed_filter()
            .from_block(from_block)
            .query()
            .await?;
        Ok(logs.into_iter().map(|(e, _)| e).collect())
    }
}
