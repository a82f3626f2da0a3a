//! The chain watcher: follows one chain's `Settlement` contract (tabs opened and reclaimed on the
//! escrow, batches accepted) and writes what it saw to the books, so that the exchange never lets
//! an intent draw on a tab or a stake it has not read on chain.
//!
//! Each pass reads the logs of `[cursor, head − confirmations]` in bounded ranges and applies each
//! range with the cursor in one transaction ([`Books::apply_chain`]): a restart resumes where the
//! last committed range ended, and replaying a range changes nothing. `confirmations` is the
//! reorg depth the operator trusts (0 on the devnet, where blocks are final when mined); a log
//! is only read once its block is that deep.
//!
//! A reorg deeper than that is still seen: each range is applied with the hash of the block it
//! ended at, and every pass first checks the newest recorded hash against the chain. When it
//! differs, the watcher walks back to the newest hash the chain still has and rewinds the books
//! to the block after it ([`Books::rewind_chain`]), so the new blocks are read in their place —
//! unless a replaced block opened a tab orders already draw on, where it stops (logged, recorded).

use crate::books::{Books, SeenBatch, SeenBlock, TabEvent};
use crate::error::{Error, Result};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use cx_contracts::{ChainDeployment, Settlement};
use std::time::Duration;

/// Blocks read per `eth_getLogs` call: public RPC nodes refuse wide ranges.
const MAX_RANGE: u64 = 2_000;

/// Follows one chain.
#[derive(Debug, Clone)]
pub struct Watcher {
    books: Books,
    chain: ChainDeployment,
    confirmations: u64,
    provider: DynProvider,
}

impl Watcher {
    /// A watcher of `chain` writing to `books` (no traffic until the first pass).
    pub fn new(books: Books, chain: ChainDeployment, confirmations: u64) -> Result<Self> {
        let url = chain
            .chain
            .rpc_url
            .parse()
            .map_err(|_| Error::BadRpcUrl(chain.chain.rpc_url.clone()))?;
        Ok(Self {
            provider: ProviderBuilder::new().connect_http(url).erased(),
            books,
            chain,
            confirmations,
        })
    }

    /// The chain id this watcher follows.
    pub fn chain_id(&self) -> u64 {
        self.chain.chain.chain_id
    }

    /// Reads everything confirmed since the last pass; returns the next block to read.
    pub async fn poll_once(&self) -> Result<u64> {
        let chain_id = self.chain_id();
        let head = self.provider.get_block_number().await.map_err(chain_err)?;
        let Some(last) = head.checked_sub(self.confirmations) else {
            return self.books.chain_cursor(chain_id).await;
        };
        if let Some(fork) = self.fork().await? {
            let rewind = self.books.rewind_chain(chain_id, fork).await?;
            tracing::warn!(
                chain_id,
                fork_block = fork,
                dropped_tabs = rewind.dropped_tabs,
                reopened_tabs = rewind.reopened_tabs,
                dropped_batches = rewind.dropped_batches,
                "chain reorganised under what the books read; rewound to read the new blocks"
            );
        }
        let mut from = self.books.chain_cursor(chain_id).await?;
        while from <= last {
            let to = last.min(from + MAX_RANGE - 1);
            // The range's end is hashed before and after its logs are read: a reorg in between
            // would pair logs of one chain with the hash of another, so the pass is retried.
            let before = self.hash(to).await?;
            let (events, batches) = self.read(from, to).await?;
            if self.hash(to).await? != before {
                return Err(Error::Chain(format!(
                    "block {to} changed while its range was read; read again next pass"
                )));
            }
            let end = SeenBlock {
                number: to,
                hash: before,
            };
            self.books
                .apply_chain(chain_id, &events, &batches, to + 1, Some(end))
                .await?;
            from = to + 1;
        }
        Ok(from)
    }

    /// The first block to read again if the chain no longer has what the last passes ended at:
    /// the block after the newest recorded end it still has (block 0 if it has none of them).
    /// A pass without a reorg reads one recorded end and one block hash; the rest only when
    /// the newest differs.
    async fn fork(&self) -> Result<Option<u64>> {
        let chain_id = self.chain_id();
        let newest = self.books.seen_blocks(chain_id, 1).await?;
        match newest.first() {
            None => return Ok(None),
            Some(block) if self.hash(block.number).await? == block.hash => return Ok(None),
            Some(_) => {}
        }
        let seen = self
            .books
            .seen_blocks(chain_id, crate::books::KEPT_BLOCKS)
            .await?;
        for block in &seen[1..] {
            if self.hash(block.number).await? == block.hash {
                return Ok(Some(block.number + 1));
            }
        }
        Ok(Some(0))
    }

    /// The hash of block `number` (zero if the chain has no such block: it was reorganised away).
    async fn hash(&self, number: u64) -> Result<alloy::primitives::B256> {
        Ok(self
            .provider
            .get_block_by_number(alloy::eips::BlockNumberOrTag::Number(number))
            .await
            .map_err(chain_err)?
            .map_or(alloy::primitives::B256::ZERO, |b| b.header.hash))
    }

    /// Polls every `interval` until `shutdown` resolves; a failed pass is logged and retried.
    pub async fn run(self, interval: Duration, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            if let Err(err) = self.poll_once().await {
                tracing::warn!(chain_id = self.chain_id(), error = %err, "chain watcher pass failed");
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    async fn read(&self, from: u64, to: u64) -> Result<(Vec<TabEvent>, Vec<SeenBatch>)> {
        let settlement = Settlement::new(self.chain.deployment.settlement, self.provider.clone());
        let block_of = |log: &alloy::rpc::types::Log| log.block_number.unwrap_or(from);
        let mut events: Vec<(u64, u64, TabEvent)> = Vec::new();
        for (e, log) in settlement
            .JobOpened_filter()
            .from_block(from)
            .to_block(to)
            .query()
            .await
            .map_err(chain_err)?
        {
            events.push((
                block_of(&log),
                log.log_index.unwrap_or(0),
                TabEvent::Opened {
                    escrow_id: e.jobId,
                    buyer: e.buyer,
                    amount_wei: e.amount,
                    deadline_s: e.deadline,
                    reference: e.r#ref,
                    block: block_of(&log),
                },
            ));
        }
        for (e, log) in settlement
            .JobReclaimed_filter()
            .from_block(from)
            .to_block(to)
            .query()
            .await
            .map_err(chain_err)?
        {
            events.push((
                block_of(&log),
                log.log_index.unwrap_or(0),
                TabEvent::Reclaimed {
                    escrow_id: e.jobId,
                    block: block_of(&log),
                },
            ));
        }
        // Chain order, so a tab opened and reclaimed in one range ends reclaimed.
        events.sort_by_key(|(block, index, _)| (*block, *index));
        let batches = settlement
            .BatchSettled_filter()
            .from_block(from)
            .to_block(to)
            .query()
            .await
            .map_err(chain_err)?
            .into_iter()
            .map(|(e, log)| SeenBatch {
                nonce: e.nonce,
                receipts_root: e.receiptsRoot,
                balances_root: e.balancesRoot,
                settled_wei: u128::try_from(e.settledAmount).unwrap_or(u128::MAX),
                block: block_of(&log),
            })
            .collect();
        Ok((events.into_iter().map(|(_, _, e)| e).collect(), batches))
    }
}

fn chain_err(err: impl std::fmt::Display) -> Error {
    Error::Chain(err.to_string())
}
