//! Read-only views of one chain's deployment: what signers and the coordinator check a batch
//! against (batch nonce, balances root, group key, open escrows, registered provider keys).
//!
//! Reads need no account: a signer that only checks never holds an Ethereum key.

use alloy::primitives::{Address, B256};
use alloy::providers::{DynProvider, Provider};
use cx_contracts::{ChainDeployment, Deployment, ProviderRegistry, Settlement};

use crate::error::Result;
use crate::evm::{OnChainGroupKey, events::batch_settled_topic, read_provider};
use crate::frost::EvmGroupKey;
use crate::ledger::Escrow;

/// One chain's deployment, read-only.
#[derive(Clone, Debug)]
pub struct ChainView {
    /// Chain id.
    pub chain_id: u64,
    /// JSON-RPC URL.
    pub rpc_url: String,
    /// Contract addresses.
    pub deployment: Deployment,
    provider: DynProvider,
    /// `gracePeriod_s` (immutable in the contract: read once).
    grace_period_s: std::sync::Arc<tokio::sync::OnceCell<u64>>,
}

impl ChainView {
    /// A view of `entry` (no network traffic until the first read).
    pub fn connect(entry: &ChainDeployment) -> Result<Self> {
        Ok(Self {
            chain_id: entry.chain.chain_id,
            rpc_url: entry.chain.rpc_url.clone(),
            deployment: entry.deployment,
            provider: read_provider(&entry.chain.rpc_url)?,
            grace_period_s: Default::default(),
        })
    }

    fn settlement(&self) -> Settlement::SettlementInstance<DynProvider> {
        Settlement::new(self.deployment.settlement, self.provider.clone())
    }

    /// Nonce of the last accepted batch (0 before any).
    pub async fn batch_nonce(&self) -> Result<u64> {
        Ok(self.settlement().batchState().call().await?.nonce)
    }

    /// The current cumulative-balances root.
    pub async fn balances_root(&self) -> Result<B256> {
        Ok(self.settlement().balancesRoot().call().await?)
    }

    /// The current group key and its epoch.
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

    /// Seconds after a deadline before a buyer may reclaim (`gracePeriod_s`, immutable).
    pub async fn grace_period_s(&self) -> Result<u64> {
        let contract = self.settlement();
        Ok(*self
            .grace_period_s
            .get_or_try_init(|| async { contract.gracePeriod_s().call().await })
            .await?)
    }

    /// The timestamp of the latest block: the clock reclaim times are measured on.
    pub async fn now_s(&self) -> Result<u64> {
        let block = self
            .provider
            .get_block_by_number(alloy::eips::BlockNumberOrTag::Latest)
            .await?
            .ok_or(crate::Error::Transport(
                "the chain has no latest block".into(),
            ))?;
        Ok(block.header.timestamp)
    }

    /// Escrow `id` while it is open; `None` once settled or reclaimed, or if never opened.
    pub async fn open_escrow(&self, id: u64) -> Result<Option<Escrow>> {
        let contract = self.settlement();
        let (open, job) = (contract.isOpen(id), contract.jobs(id));
        let (open, job, grace) = tokio::join!(open.call(), job.call(), self.grace_period_s());
        if !open? {
            return Ok(None);
        }
        let job = job?;
        Ok(Some(Escrow {
            escrow_id: id,
            buyer: job.buyer,
            amount: job.amount,
            reclaimable_at_s: job.deadline.saturating_add(grace?),
        }))
    }

    /// Whether escrow `id` was reclaimed by its buyer: its `JobReclaimed` event is on chain.
    /// A reclaimed escrow is closed for good (its bit never sets again), so any batch naming it
    /// can never land: the evidence that lets signers sign a replacement at that nonce.
    pub async fn reclaimed(&self, id: u64) -> Result<bool> {
        let logs = self
            .settlement()
            .JobReclaimed_filter()
            .topic1(alloy::primitives::U256::from(id))
            .from_block(0)
            .query()
            .await?;
        Ok(logs.iter().any(|(event, _)| event.jobId == id))
    }

    /// The ML-DSA key hash `provider` registered (`ProviderRegistry.setMetadata`); zero if none.
    pub async fn provider_key_hash(&self, provider: Address) -> Result<B256> {
        let registry = ProviderRegistry::new(self.deployment.registry, self.provider.clone());
        Ok(registry.providers(provider).call().await?.mlDsaKeyHash)
    }

    /// Whether a `BatchSettled` event with `nonce` and `balances_root` is on chain (how a
    /// restarted coordinator learns that a post it did not record went through).
    pub async fn batch_landed(&self, nonce: u64, balances_root: B256) -> Result<bool> {
        let filter = alloy::rpc::types::Filter::new()
            .address(self.deployment.settlement)
            .event_signature(batch_settled_topic())
            .from_block(0);
        let logs = self.provider.get_logs(&filter).await?;
        for log in logs {
            if let Ok(event) = log.log_decode::<Settlement::BatchSettled>() {
                let data = event.inner.data;
                if data.nonce == nonce && data.balancesRoot == balances_root {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
}
