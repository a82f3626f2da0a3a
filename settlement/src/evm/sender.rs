//! The one door every transaction of this process goes through: measured gas, EIP-1559 fees by
//! the chain's [`FeePolicy`], the nonce chosen here, and a transaction that sits unmined
//! replaced at the same nonce with higher fees until it lands (once) or the cap stops it.
//!
//! Why the nonce is the account's *mined* count, not the node's pending one: a transaction this
//! process (or its previous life, killed mid-send) left in the pool holds that nonce; sending at
//! the pending count would queue behind it forever if its fee is under the base fee, while
//! sending at the mined count replaces it (the pool answers "underpriced" until the offer beats
//! it by 10 %, and the offer is raised until it does). Sends of one account are serialised
//! within the process (one lock per RPC URL and account), so two clients of one key never race
//! for a nonce; two *processes* must not share a posting key (the devnet gives each party its
//! own).
//!
//! A send ends with the receipt of whichever of its offers was mined — the first, or a
//! replacement — so the caller sees one transaction landing once. If `give_up_after_s` passes
//! first, it returns [`Error::TxPending`] and remembers the offer, so the next send of the
//! account replaces it at its nonce.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use alloy::eips::BlockNumberOrTag;
use alloy::eips::eip1559::BaseFeeParams;
use alloy::primitives::{Address, B256};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::{TransactionReceipt, TransactionRequest};
use cx_contracts::{FeePolicy, Fees};

use crate::error::{Error, Result};

/// How often a sent transaction's receipt and the chain's height are read.
const POLL: Duration = Duration::from_millis(250);

/// An offer this process sent and stopped waiting for: the next send replaces it.
#[derive(Clone, Copy, Debug)]
struct LeftPending {
    nonce: u64,
    fees: Fees,
}

type Slot = Arc<tokio::sync::Mutex<Option<LeftPending>>>;

/// One slot per (RPC URL, account): the lock that serialises the account's sends here.
fn slot(url: &str, account: Address) -> Slot {
    static SLOTS: LazyLock<Mutex<HashMap<(String, Address), Slot>>> =
        LazyLock::new(Default::default);
    let mut slots = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
    slots.entry((url.to_string(), account)).or_default().clone()
}

/// What the node said about a raw transaction it did not take.
enum Refusal {
    /// An offer at this nonce is in the pool and this one does not beat it by enough.
    Underpriced,
    /// This exact transaction is in the pool already.
    Known,
    /// The nonce is used by a mined transaction.
    NonceTooLow,
}

fn refusal(e: &alloy::transports::TransportError) -> Option<Refusal> {
    let text = e.to_string().to_lowercase();
    if text.contains("underpriced") {
        Some(Refusal::Underpriced)
    } else if text.contains("already known") || text.contains("already imported") {
        Some(Refusal::Known)
    } else if text.contains("nonce too low") || text.contains("nonce is too low") {
        Some(Refusal::NonceTooLow)
    } else {
        None
    }
}

/// A revert at estimation, decoded like a contract call's.
fn estimate_error(e: alloy::transports::TransportError) -> Error {
    Error::from(alloy::contract::Error::TransportError(e))
}

/// The next block's base fee and the node's suggested tip.
async fn market(provider: &DynProvider) -> Result<(u128, u128)> {
    let block = provider
        .get_block_by_number(BlockNumberOrTag::Latest)
        .await?
        .ok_or_else(|| Error::Transport("the chain has no latest block".into()))?;
    let base = block
        .header
        .next_block_base_fee(BaseFeeParams::ethereum())
        .ok_or_else(|| {
            Error::Transport("the chain's blocks carry no base fee (no EIP-1559)".into())
        })?;
    let tip = provider.get_max_priority_fee_per_gas().await?;
    Ok((u128::from(base), tip))
}

/// The sender of one account on one chain.
#[derive(Clone, Debug)]
pub struct Sender {
    provider: DynProvider,
    url: String,
    account: Address,
    policy: FeePolicy,
}

impl Sender {
    /// Sends for `account` through `provider` (which holds its key) at `url`, under `policy`.
    pub fn new(provider: DynProvider, url: &str, account: Address, policy: FeePolicy) -> Self {
        Self {
            provider,
            url: url.to_string(),
            account,
            policy,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &FeePolicy {
        &self.policy
    }

    /// The RPC URL it sends to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends `tx` (its `to`, `input` and `value`; gas, fees and nonce are the sender's) and
    /// waits for the receipt of the offer that was mined.
    pub async fn send(&self, mut tx: TransactionRequest) -> Result<TransactionReceipt> {
        let slot = slot(&self.url, self.account);
        let mut left = slot.lock().await;
        tx.from = Some(self.account);
        tx.nonce = None;
        tx.gas_price = None;
        tx.max_fee_per_gas = None;
        tx.max_priority_fee_per_gas = None;
        let estimate = self
            .provider
            .estimate_gas(tx.clone())
            .await
            .map_err(estimate_error)?;
        tx.gas = Some(
            self.policy
                .gas_limit(estimate)
                .map_err(|e| Error::GasPolicy(e.to_string()))?,
        );
        let deadline = Instant::now() + Duration::from_secs(self.policy.give_up_after_s);
        let mut nonce = self
            .provider
            .get_transaction_count(self.account)
            .latest()
            .await?;
        let (base, tip) = market(&self.provider).await?;
        let mut fees = match *left {
            // What this process left in the pool holds this nonce: beat it.
            Some(l) if l.nonce == nonce => self.policy.replace(l.fees, base, tip),
            _ => None,
        }
        .unwrap_or_else(|| self.policy.first(base, tip));
        // Every offer sent at the current nonce; any of them may be the one mined.
        let mut sent: Vec<B256> = Vec::new();
        let mut offered: Option<Fees> = None;
        loop {
            match self.offer(&tx, nonce, fees).await {
                Ok(hash) => {
                    sent.push(hash);
                    offered = Some(fees);
                    tracing::debug!(%hash, nonce, ?fees, "transaction sent");
                }
                Err(e) => match refusal(&e) {
                    Some(Refusal::Known) if sent.is_empty() => {
                        // Not an offer made by this send: its hash is not ours to follow.
                        return Err(Error::TxPending {
                            nonce,
                            tx_hash: None,
                            reason: "the node already holds this transaction".into(),
                        });
                    }
                    Some(Refusal::Known) => {}
                    // Something older holds the nonce (a previous life's offer): outbid it now.
                    Some(Refusal::Underpriced) if offered.is_none() => {
                        let (base, tip) = market(&self.provider).await?;
                        match self.policy.replace(fees, base, tip) {
                            Some(next) => {
                                fees = next;
                                continue;
                            }
                            None => {
                                return Err(Error::TxPending {
                                    nonce,
                                    tx_hash: None,
                                    reason: "another transaction holds the nonce and the fee \
                                             cap does not outbid it"
                                        .into(),
                                });
                            }
                        }
                    }
                    Some(Refusal::Underpriced) => {}
                    Some(Refusal::NonceTooLow) if sent.is_empty() => {
                        nonce = self
                            .provider
                            .get_transaction_count(self.account)
                            .latest()
                            .await?;
                        continue;
                    }
                    Some(Refusal::NonceTooLow) => {}
                    None => return Err(Error::Rpc(e)),
                },
            }
            let since = self.provider.get_block_number().await?;
            // Wait for a receipt, a taken nonce, a stuck offer or the deadline.
            fees = loop {
                if let Some(receipt) = self.receipt(&sent).await? {
                    *left = None;
                    return Ok(receipt);
                }
                let mined = self
                    .provider
                    .get_transaction_count(self.account)
                    .latest()
                    .await?;
                if mined > nonce {
                    // Mined at our nonce: ours, unless the receipt says otherwise a poll later
                    // (a node may serve the count before the receipt).
                    tokio::time::sleep(POLL).await;
                    if let Some(receipt) = self.receipt(&sent).await? {
                        *left = None;
                        return Ok(receipt);
                    }
                    // Another transaction (an older offer of this account) took it: send
                    // again at the next nonce.
                    tracing::warn!(nonce, "nonce taken by another transaction; sending again");
                    nonce = mined;
                    sent.clear();
                    offered = None;
                    let (base, tip) = market(&self.provider).await?;
                    break self.policy.first(base, tip);
                }
                if Instant::now() > deadline {
                    if let Some(fees) = offered {
                        *left = Some(LeftPending { nonce, fees });
                    }
                    return Err(Error::TxPending {
                        nonce,
                        tx_hash: sent.last().copied(),
                        reason: format!(
                            "not mined within {} s (fees.give_up_after_s); the next \
                             transaction of this account replaces it",
                            self.policy.give_up_after_s
                        ),
                    });
                }
                let height = self.provider.get_block_number().await?;
                if height >= since + self.policy.stuck_after_blocks
                    && let Some(current) = offered
                {
                    let (base, tip) = market(&self.provider).await?;
                    if let Some(next) = self.policy.replace(current, base, tip) {
                        tracing::info!(nonce, ?current, ?next, "transaction stuck; replacing");
                        break next;
                    }
                }
                tokio::time::sleep(POLL).await;
            };
        }
    }

    /// Sends one offer of `tx` at `nonce` with `fees`; its hash.
    async fn offer(
        &self,
        tx: &TransactionRequest,
        nonce: u64,
        fees: Fees,
    ) -> std::result::Result<B256, alloy::transports::TransportError> {
        let mut tx = tx.clone();
        tx.nonce = Some(nonce);
        tx.max_fee_per_gas = Some(fees.max_fee_per_gas);
        tx.max_priority_fee_per_gas = Some(fees.max_priority_fee_per_gas);
        Ok(*self.provider.send_transaction(tx).await?.tx_hash())
    }

    /// The receipt of whichever of `sent` is mined.
    async fn receipt(&self, sent: &[B256]) -> Result<Option<TransactionReceipt>> {
        for hash in sent {
            if let Some(receipt) = self.provider.get_transaction_receipt(*hash).await? {
                return Ok(Some(receipt));
            }
        }
        Ok(None)
    }
}
