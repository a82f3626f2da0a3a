//! The one door every transaction of this process goes through: measured gas, EIP-1559 fees by
//! the chain's [`FeePolicy`], the nonce chosen here, and a transaction that sits unmined
//! replaced at the same nonce with higher fees until it lands (once) or the cap stops it.
//!
//! Why the nonce is the account's *mined* count, not the node's pending one: a transaction this
//! process (or its previous life, killed mid-send) left in the pool holds that nonce; sending at
//! the pending count would queue behind it forever if its fee is under the base fee, while
//! sending at the mined count replaces it (with fees above the highest it offered, when the
//! books know them; else raised until the pool stops answering "underpriced"). Sends of one
//! account are serialised within the process (one lock per RPC URL and account), so two clients
//! of one key never race for a nonce; two *processes* must not share a key (the devnet gives
//! each party its own).
//!
//! What holds a nonce is known from this process's memory, and with an [`OfferBook`] from the
//! books (`chain_offers`), so it survives a restart. Offers of the *same call* (the same `to`,
//! value and input: a batch posted again) are followed as this send's own, so if the old offer
//! is the one mined, its receipt is the answer and nothing is sent twice. A send ends with the
//! receipt of whichever of its offers was mined. If `give_up_after_s` passes first, it returns
//! [`Error::TxPending`]; the next send of the account replaces or adopts the offer.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use alloy::eips::BlockNumberOrTag;
use alloy::eips::eip1559::BaseFeeParams;
use alloy::primitives::{Address, B256, keccak256};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::{TransactionReceipt, TransactionRequest};
use cx_contracts::{FeePolicy, Fees};

use super::offers::{Held, OfferBook};
use crate::error::{Error, Result};

/// How often a sent transaction's receipt and the chain's height are read.
const POLL: Duration = Duration::from_millis(250);

type Slot = Arc<tokio::sync::Mutex<Option<Held>>>;

/// One slot per (RPC URL, account): the lock that serialises the account's sends here, holding
/// what this process left pending.
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

/// What a transaction calls, whatever its nonce and fees: `keccak256(to ‖ value ‖ input)`.
fn call_hash(tx: &TransactionRequest) -> B256 {
    let mut bytes = Vec::new();
    match tx.to {
        Some(alloy::primitives::TxKind::Call(to)) => bytes.extend_from_slice(to.as_slice()),
        _ => bytes.push(0),
    }
    bytes.extend_from_slice(&tx.value.unwrap_or_default().to_be_bytes::<32>());
    bytes.extend_from_slice(tx.input.input().map_or(&[][..], |b| b.as_ref()));
    keccak256(bytes)
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
    book: Option<OfferBook>,
    chain_id: Arc<tokio::sync::OnceCell<u64>>,
}

/// One send in flight: the nonce, the offers made at it, the fees of the last.
struct Attempt {
    nonce: u64,
    call: B256,
    sent: Vec<B256>,
    offered: Option<Fees>,
}

impl Sender {
    /// Sends for `account` through `provider` (which holds its key) at `url`, under `policy`.
    pub fn new(provider: DynProvider, url: &str, account: Address, policy: FeePolicy) -> Self {
        Self {
            provider,
            url: url.to_string(),
            account,
            policy,
            book: None,
            chain_id: Default::default(),
        }
    }

    /// This sender paying gas by `policy`.
    pub fn with_policy(mut self, policy: FeePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// This sender keeping its offers in `book`.
    pub fn with_book(mut self, book: OfferBook) -> Self {
        self.book = Some(book);
        self
    }

    /// The policy.
    pub fn policy(&self) -> &FeePolicy {
        &self.policy
    }

    /// The RPC URL it sends to.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn chain_id(&self) -> Result<u64> {
        Ok(*self
            .chain_id
            .get_or_try_init(|| self.provider.get_chain_id())
            .await?)
    }

    async fn mined_count(&self) -> Result<u64> {
        Ok(self
            .provider
            .get_transaction_count(self.account)
            .latest()
            .await?)
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
        let mut attempt = Attempt {
            nonce: self.mined_count().await?,
            call: call_hash(&tx),
            sent: Vec::new(),
            offered: None,
        };
        let mut fees = self.first_fees(&mut attempt, left.take()).await?;
        loop {
            if let Some(f) = fees
                && let Some(again) = self.make_offer(&tx, &mut attempt, f).await?
            {
                fees = again;
                continue;
            }
            match self.wait(&mut attempt, deadline).await {
                Ok(Waited::Mined(receipt)) => {
                    self.close(attempt.nonce, Some(receipt.transaction_hash))
                        .await?;
                    return Ok(*receipt);
                }
                Ok(Waited::Replace(next)) => fees = Some(next),
                Ok(Waited::NonceTaken) => {
                    // Another transaction (an older offer of another call) took the nonce:
                    // this call is sent again at the next one.
                    tracing::warn!(attempt.nonce, "nonce taken by another transaction");
                    self.close(attempt.nonce, None).await?;
                    attempt.nonce = self.mined_count().await?;
                    attempt.sent.clear();
                    attempt.offered = None;
                    fees = self.first_fees(&mut attempt, None).await?;
                }
                Err(e) => {
                    if let Some(fees) = attempt.offered {
                        *left = Some(Held {
                            nonce: attempt.nonce,
                            call: attempt.call,
                            hashes: attempt.sent.clone(),
                            fees,
                        });
                    }
                    return Err(e);
                }
            }
        }
    }

    /// The fees of the first offer at `attempt.nonce`, beating whatever holds it (this process's
    /// `left`, else the books); the held offers are adopted when they make the same call.
    /// `None`: the held offers are this call's and cannot be outbid under the cap: wait on them.
    async fn first_fees(&self, attempt: &mut Attempt, left: Option<Held>) -> Result<Option<Fees>> {
        let held = match left.filter(|l| l.nonce == attempt.nonce) {
            Some(l) => Some(l),
            None => match &self.book {
                Some(book) => {
                    book.held(self.chain_id().await?, self.account, attempt.nonce)
                        .await?
                }
                None => None,
            },
        };
        let (base, tip) = market(&self.provider).await?;
        let Some(held) = held else {
            return Ok(Some(self.policy.first(base, tip)));
        };
        if held.call == attempt.call {
            tracing::info!(
                nonce = held.nonce,
                offers = held.hashes.len(),
                "following this call's earlier offers"
            );
            attempt.sent = held.hashes;
            attempt.offered = Some(held.fees);
        }
        Ok(self.policy.replace(held.fees, base, tip).or_else(|| {
            // At the cap: another call's offer is still tried (the pool decides); this call's
            // own are waited on.
            (attempt.offered.is_none()).then(|| self.policy.first(base, tip))
        }))
    }

    /// Sends one offer; `Ok(Some(next))` when it must be made again at once with `next` fees
    /// (the pool's "underpriced" for a first offer), `Ok(None)` to wait.
    async fn make_offer(
        &self,
        tx: &TransactionRequest,
        attempt: &mut Attempt,
        fees: Fees,
    ) -> Result<Option<Option<Fees>>> {
        let mut offer = tx.clone();
        offer.nonce = Some(attempt.nonce);
        offer.max_fee_per_gas = Some(fees.max_fee_per_gas);
        offer.max_priority_fee_per_gas = Some(fees.max_priority_fee_per_gas);
        let e = match self.provider.send_transaction(offer).await {
            Ok(pending) => {
                let hash = *pending.tx_hash();
                tracing::debug!(%hash, attempt.nonce, ?fees, "transaction sent");
                if let Some(book) = &self.book {
                    book.offered(
                        self.chain_id().await?,
                        self.account,
                        attempt.nonce,
                        attempt.call,
                        hash,
                        fees,
                    )
                    .await?;
                }
                attempt.sent.push(hash);
                attempt.offered = Some(fees);
                return Ok(None);
            }
            Err(e) => e,
        };
        match refusal(&e) {
            Some(Refusal::Known) if attempt.sent.is_empty() => Err(Error::TxPending {
                nonce: attempt.nonce,
                tx_hash: None,
                reason: "the node already holds this transaction".into(),
            }),
            // An offer this send does not follow holds the nonce: outbid it now.
            Some(Refusal::Underpriced) if attempt.offered.is_none() => {
                let (base, tip) = market(&self.provider).await?;
                match self.policy.replace(fees, base, tip) {
                    Some(next) => Ok(Some(Some(next))),
                    None => Err(Error::TxPending {
                        nonce: attempt.nonce,
                        tx_hash: None,
                        reason: "another transaction holds the nonce and the fee cap does \
                                 not outbid it"
                            .into(),
                    }),
                }
            }
            Some(Refusal::NonceTooLow) if attempt.sent.is_empty() => {
                attempt.nonce = self.mined_count().await?;
                Ok(Some(self.first_fees(attempt, None).await?))
            }
            // A replacement refused, or the nonce used (by one of ours, most likely): wait.
            Some(_) => Ok(None),
            None => Err(Error::Rpc(e)),
        }
    }

    /// Waits for a receipt of one of `attempt`'s offers, a taken nonce, a stuck offer (the fees
    /// that replace it) or the deadline (an error).
    async fn wait(&self, attempt: &mut Attempt, deadline: Instant) -> Result<Waited> {
        let since = self.provider.get_block_number().await?;
        loop {
            if let Some(receipt) = self.receipt(&attempt.sent).await? {
                return Ok(Waited::Mined(Box::new(receipt)));
            }
            if self.mined_count().await? > attempt.nonce {
                // Mined at our nonce: ours, unless the receipt says otherwise a poll later (a
                // node may serve the count before the receipt).
                tokio::time::sleep(POLL).await;
                return Ok(match self.receipt(&attempt.sent).await? {
                    Some(receipt) => Waited::Mined(Box::new(receipt)),
                    None => Waited::NonceTaken,
                });
            }
            if Instant::now() > deadline {
                return Err(Error::TxPending {
                    nonce: attempt.nonce,
                    tx_hash: attempt.sent.last().copied(),
                    reason: format!(
                        "not mined within {} s (fees.give_up_after_s); the next transaction \
                         of this account replaces it",
                        self.policy.give_up_after_s
                    ),
                });
            }
            let height = self.provider.get_block_number().await?;
            if height >= since + self.policy.stuck_after_blocks
                && let Some(current) = attempt.offered
            {
                let (base, tip) = market(&self.provider).await?;
                if let Some(next) = self.policy.replace(current, base, tip) {
                    tracing::info!(
                        attempt.nonce,
                        ?current,
                        ?next,
                        "transaction stuck; replacing"
                    );
                    return Ok(Waited::Replace(next));
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn close(&self, nonce: u64, mined: Option<B256>) -> Result<()> {
        if let Some(book) = &self.book {
            book.closed(self.chain_id().await?, self.account, nonce, mined)
                .await?;
        }
        Ok(())
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

/// How a wait ended (other than the deadline).
enum Waited {
    Mined(Box<TransactionReceipt>),
    Replace(Fees),
    NonceTaken,
}
