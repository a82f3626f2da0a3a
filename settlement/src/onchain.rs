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
use alloy::primitives::{Address, B256, Bytes};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::TransactionRequest;
use cx_contracts::{ChainDeployment, Deployment, ProviderRegistry, Settlement};

use crate::error::Result;
use crate::evm::{OnChainGroupKey, events::batch_settled_topic, read_provider_at};
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
    /// RPC URLs tried after `rpc_url`, in order.
    pub fallback_rpc_urls: Vec<String>,
    /// How gas is paid on this chain (for the clients built beside this view).
    pub fees: cx_contracts::FeePolicy,
    provider: DynProvider,
    /// `gracePeriod_s` (immutable in the contract: read once).
    grace_period_s: std::sync::Arc<tokio::sync::OnceCell<u64>>,
    /// The block every read is made at; `None`: the latest at each read.
    at: Option<PinnedBlock>,
}

/// Calls one JSON-RPC batch request holds at most: nodes cap a batch (geth at 1,000 by
/// default, hosted RPCs often lower), and a full part of a batch is up to ~1,200 reads.
const MAX_BATCH_CALLS: usize = 200;

/// What [`ChainView::part_state`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartState {
    /// Nonce of the last accepted batch.
    pub nonce: u64,
    /// The group key and its epoch.
    pub group_key: OnChainGroupKey,
    /// The cumulative-balances root.
    pub balances_root: B256,
    /// Each escrow asked for, with its terms while it is open.
    pub escrows: Vec<(u64, Option<Escrow>)>,
    /// Each provider asked for, with the ML-DSA key hash it registered (zero if none).
    pub provider_keys: Vec<(Address, B256)>,
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
            fallback_rpc_urls: entry.chain.fallback_rpc_urls.clone(),
            fees: entry.chain.fees,
            provider: read_provider_at(&entry.chain.rpc_urls().collect::<Vec<_>>())?,
            grace_period_s: Default::default(),
            at: None,
        })
    }

    /// Every RPC URL of the chain, the first tried first.
    pub fn rpc_urls(&self) -> Vec<&str> {
        std::iter::once(self.rpc_url.as_str())
            .chain(self.fallback_rpc_urls.iter().map(String::as_str))
            .collect()
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

    /// Everything a signer reads to check one part of a batch, at this view's block, in
    /// JSON-RPC batch requests: the batch nonce, group key and balances root, whether each of
    /// `escrow_ids` is open (and its terms), and each of `providers`' registered key hash. A few
    /// requests rather than ~20 per signer: t signers' requests to one node queued behind each
    /// other (`cx bench sign`'s p50 15 → 13 ms on 2 cores).
    pub async fn part_state(&self, escrow_ids: &[u64], providers: &[Address]) -> Result<PartState> {
        let grace_s = self.grace_period_s().await?;
        let settlement = self.settlement();
        let registry = ProviderRegistry::new(self.deployment.registry, self.provider.clone());
        let (nonce, key, root) = (
            settlement.batchState(),
            settlement.groupKey(),
            settlement.balancesRoot(),
        );
        let s = self.deployment.settlement;
        let mut calls = vec![
            (s, nonce.calldata().clone()),
            (s, key.calldata().clone()),
            (s, root.calldata().clone()),
        ];
        for &id in escrow_ids {
            calls.push((s, settlement.isOpen(id).calldata().clone()));
            calls.push((s, settlement.jobs(id).calldata().clone()));
        }
        for &provider in providers {
            let read = registry.providers(provider);
            calls.push((self.deployment.registry, read.calldata().clone()));
        }
        let mut answers = self.call_all(calls).await?.into_iter();
        let mut next = || {
            answers.next().ok_or(crate::Error::Transport(
                "a JSON-RPC batch answered fewer calls than it was sent".into(),
            ))
        };
        let nonce = nonce.decode_output(next()?)?.nonce;
        let on_chain = key.decode_output(next()?)?;
        let balances_root = root.decode_output(next()?)?;
        let mut escrows = Vec::with_capacity(escrow_ids.len());
        for &id in escrow_ids {
            let open = settlement.isOpen(id).decode_output(next()?)?;
            let job = settlement.jobs(id).decode_output(next()?)?;
            escrows.push((
                id,
                open.then(|| Escrow {
                    escrow_id: id,
                    buyer: job.buyer,
                    amount: job.amount,
                    reclaimable_at_s: job.deadline.saturating_add(grace_s),
                }),
            ));
        }
        let mut provider_keys = Vec::with_capacity(providers.len());
        for &provider in providers {
            let p = registry.providers(provider).decode_output(next()?)?;
            provider_keys.push((provider, p.mlDsaKeyHash));
        }
        Ok(PartState {
            nonce,
            group_key: OnChainGroupKey {
                key: EvmGroupKey {
                    x: on_chain.x,
                    parity: on_chain.parity,
                },
                epoch: on_chain.epoch,
            },
            balances_root,
            escrows,
            provider_keys,
        })
    }

    /// `eth_call`s of `calls` (contract, calldata) at this view's block, answered in order: in
    /// batch requests of at most [`MAX_BATCH_CALLS`], sent at once.
    async fn call_all(&self, calls: Vec<(Address, Bytes)>) -> Result<Vec<Bytes>> {
        let block = self.block_id();
        let mut sends = tokio::task::JoinSet::new();
        let mut waiters = Vec::with_capacity(calls.len());
        for chunk in calls.chunks(MAX_BATCH_CALLS) {
            let mut batch = alloy::rpc::client::BatchRequest::new(self.provider.client());
            for (to, data) in chunk {
                let request = TransactionRequest::default()
                    .to(*to)
                    .input(data.clone().into());
                waiters.push(batch.add_call::<_, Bytes>("eth_call", &(request, block))?);
            }
            sends.spawn(batch.send());
        }
        while let Some(sent) = sends.join_next().await {
            sent.map_err(|e| crate::Error::Transport(e.to_string()))??;
        }
        let mut answers = Vec::with_capacity(waiters.len());
        for waiter in waiters {
            answers.push(waiter.await?);
        }
        Ok(answers)
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
