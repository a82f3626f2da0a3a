//! Read-only views of one chain's deployment: what signers and the coordinator check a batch
//! against (batch nonce, balances root, group key, open escrows, registered provider keys).
//!
//! Reads need no account: a signer that only checks never holds an Ethereum key.
//!
//! A signer checks a batch on one state of the chain: [`ChainView::pinned`] fixes the latest
//! block (number and hash, EIP-1898, canonical required) and every read of that view is made at
//! it, the reclaim clock included. Separate "latest" reads could straddle a block, and a lagging
//! or load-balanced node could answer the nonce after batch n and the balances root before it,
//! so that a batch n+1 over stale balances would pass. At a pinned hash a node that does not
//! have the block fails the read instead of answering from another one.

use alloy::eips::{BlockId, RpcBlockHash};
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
    /// The block every read is made at; `None`: the latest at each read.
    at: Option<PinnedBlock>,
}

/// A block a view reads at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedBlock {
    /// Block number.
    pub number: u64,
    /// Block hash (what reads name, so no other block can answer).
    pub hash: B256,
    /// Its timestamp: the chain's clock for this view.
    pub timestamp_s: u64,
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
            at: None,
        })
    }

    /// This view fixed at the latest block: every read of the returned view is made at it.
    pub async fn pinned(&self) -> Result<Self> {
        let block = self
            .provider
            .get_block_by_number(alloy::eips::BlockNumberOrTag::Latest)
            .await?
            .ok_or(crate::Error::Transport(
                "the chain has no latest block".into(),
            ))?;
        Ok(Self {
            at: Some(PinnedBlock {
                number: block.header.number,
                hash: block.header.hash,
                timestamp_s: block.header.timestamp,
            }),
            ..self.clone()
        })
    }

    /// The block this view reads at, if pinned.
    pub fn block(&self) -> Option<PinnedBlock> {
        self.at
    }

    fn block_id(&self) -> BlockId {
        match self.at {
            Some(b) => BlockId::Hash(RpcBlockHash {
                block_hash: b.hash,
                require_canonical: Some(true),
            }),
            None => BlockId::latest(),
        }
    }

    fn settlement(&self) -> Settlement::SettlementInstance<DynProvider> {
        Settlement::new(self.deployment.settlement, self.provider.clone())
    }

    /// Nonce of the last accepted batch (0 before any).
    pub async fn batch_nonce(&self) -> Result<u64> {
        Ok(self
            .settlement()
            .batchState()
            .block(self.block_id())
            .call()
            .await?
            .nonce)
    }

    /// The current cumulative-balances root.
    pub async fn balances_root(&self) -> Result<B256> {
        Ok(self
            .settlement()
            .balancesRoot()
            .block(self.block_id())
            .call()
            .await?)
    }

    /// The current group key and its epoch.
    pub async fn group_key(&self) -> Result<OnChainGroupKey> {
        let k = self
            .settlement()
            .groupKey()
            .block(self.block_id())
            .call()
            .await?;
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

    /// The chain's clock: the pinned block's timestamp, or the latest block's.
    pub async fn now_s(&self) -> Result<u64> {
        if let Some(b) = self.at {
            return Ok(b.timestamp_s);
        }
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
        let block = self.block_id();
        let (open, job) = (
            contract.isOpen(id).block(block),
            contract.jobs(id).block(block),
        );
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
            .to_block(
                self.at
                    .map_or(alloy::eips::BlockNumberOrTag::Latest, |b| b.number.into()),
            )
            .query()
            .await?;
        Ok(logs.iter().any(|(event, _)| event.jobId == id))
    }

    /// What `provider` has at stake and the ML-DSA key hash it registered
    /// (`ProviderRegistry.providers`): zero for a stranger.
    pub async fn provider_standing(
        &self,
        provider: Address,
    ) -> Result<(alloy::primitives::U256, B256)> {
        let registry = ProviderRegistry::new(self.deployment.registry, self.provider.clone());
        let p = registry
            .providers(provider)
            .block(self.block_id())
            .call()
            .await?;
        Ok((p.staked, p.mlDsaKeyHash))
    }

    /// `ProviderRegistry.minStake`: the least a provider may have at stake.
    pub async fn min_stake(&self) -> Result<alloy::primitives::U256> {
        let registry = ProviderRegistry::new(self.deployment.registry, self.provider.clone());
        Ok(registry.minStake().block(self.block_id()).call().await?)
    }

    /// The ML-DSA key hash `provider` registered (`ProviderRegistry.setMetadata`); zero if none.
    pub async fn provider_key_hash(&self, provider: Address) -> Result<B256> {
        let registry = ProviderRegistry::new(self.deployment.registry, self.provider.clone());
        Ok(registry
            .providers(provider)
            .block(self.block_id())
            .call()
            .await?
            .mlDsaKeyHash)
    }

    /// Whether ML-DSA key `key_hash` answers for `provider` (`ProviderRegistry.keyAnswers`): its
    /// registered key, or one it replaced less than the unbonding delay ago. Slashing evidence is
    /// checked against this, so changing keys does not void what the old key signed.
    pub async fn key_answers(&self, provider: Address, key_hash: B256) -> Result<bool> {
        let registry = ProviderRegistry::new(self.deployment.registry, self.provider.clone());
        Ok(registry
            .keyAnswers(provider, key_hash)
            .block(self.block_id())
            .call()
            .await?)
    }

    /// Whether `ProviderRegistry` already slashed with `evidence_hash` (each is used once).
    pub async fn evidence_used(&self, evidence_hash: B256) -> Result<bool> {
        let registry = ProviderRegistry::new(self.deployment.registry, self.provider.clone());
        Ok(registry
            .evidenceUsed(evidence_hash)
            .block(self.block_id())
            .call()
            .await?)
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
