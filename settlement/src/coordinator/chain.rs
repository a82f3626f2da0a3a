//! What the coordinator needs of a chain, behind the [`Chain`] boundary: read the contract's
//! state (nonce, balances root, group key, open escrows), post a signed batch or key rotation,
//! and recognise a batch that is already there.
//!
//! Two implementations: [`EvmChain`] talks JSON-RPC to a deployed `Settlement` (a read-only
//! [`ChainView`] plus an [`EvmClient`] for the account that pays gas); [`MemoryChain`] keeps the
//! contract's rules in memory (nonces increase, the FROST signature must verify under the current
//! key, an escrow settles once) so the coordinator's tests run in milliseconds without Anvil, and
//! can lose a transaction's answer on purpose.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;

use alloy::primitives::{Address, B256, keccak256};
use alloy::signers::local::PrivateKeySigner;
use frost_secp256k1 as frost;

use crate::batch::{BatchMessage, rotation_digest};
use crate::error::{Error, Result};
use crate::evm::{EvmClient, OnChainGroupKey};
use crate::frost::{EvmGroupKey, EvmSignature};
use crate::ledger::{self, Escrow};
use crate::onchain::ChainView;

/// A batch part sent to its chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Posted {
    /// The transaction.
    pub tx_hash: B256,
    /// Gas it used, where the chain reports it.
    pub gas_used: Option<u64>,
}

/// One chain's `Settlement` as the coordinator uses it.
pub trait Chain: Send + Sync {
    /// EIP-155 chain id.
    fn chain_id(&self) -> u64;
    /// Address of `Settlement` (batches and rotations are bound to it).
    fn settlement(&self) -> Address;
    /// Address of `ProviderRegistry` (slashes are bound to it).
    fn registry(&self) -> Address;
    /// Nonce of the last accepted batch (0 before any).
    fn batch_nonce(&self) -> impl Future<Output = Result<u64>> + Send;
    /// The current cumulative-balances root.
    fn balances_root(&self) -> impl Future<Output = Result<B256>> + Send;
    /// The current group key and its epoch.
    fn group_key(&self) -> impl Future<Output = Result<OnChainGroupKey>> + Send;
    /// Escrow `id` while it is open; `None` once settled or reclaimed, or if never opened.
    fn open_escrow(&self, id: u64) -> impl Future<Output = Result<Option<Escrow>>> + Send;
    /// The chain's clock: the latest block's timestamp (reclaim times are on it).
    fn now_s(&self) -> impl Future<Output = Result<u64>> + Send;
    /// Whether escrow `id` was reclaimed by its buyer (`JobReclaimed` is on chain).
    fn reclaimed(&self, id: u64) -> impl Future<Output = Result<bool>> + Send;
    /// Whether a batch with `nonce` and `balances_root` was accepted (its event is on chain).
    fn batch_landed(
        &self,
        nonce: u64,
        balances_root: B256,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Posts a signed batch; returns the transaction hash once it is mined.
    fn post_batch(
        &self,
        batch: &BatchMessage,
        signature: &EvmSignature,
    ) -> impl Future<Output = Result<Posted>> + Send;
    /// Posts a committee-signed slash; returns the transaction hash.
    fn post_slash(
        &self,
        slash: &SlashTerms,
        signature: &EvmSignature,
    ) -> impl Future<Output = Result<B256>> + Send;
    /// Installs `new_key` with a signature by the current key; returns the transaction hash.
    fn rotate_group_key(
        &self,
        new_key: EvmGroupKey,
        signature: &EvmSignature,
    ) -> impl Future<Output = Result<B256>> + Send;
}

/// The terms of one slash, as `ProviderRegistry.slash` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlashTerms {
    /// The provider slashed.
    pub provider: Address,
    /// Stake to take.
    pub amount: alloy::primitives::U256,
    /// Who receives it.
    pub recipient: Address,
    /// The evidence's hash (used once).
    pub evidence_hash: B256,
    /// Chain time after which the signature is void.
    pub expires_at_s: u64,
}

/// How long one post waits for its transaction before the settlement pass moves on, seconds:
/// the next pass follows the same offers (the sender keeps them, and the books across a
/// restart), so a chain whose transaction is stuck at its fee cap does not hold up the posts of
/// the other chains for the policy's whole `give_up_after_s`.
pub const POST_WAIT_S: u64 = 30;

/// A deployed `Settlement` over JSON-RPC: reads need no account, posts are paid by `poster`
/// (it pays gas; it cannot move funds: only the committee's signature settles).
#[derive(Clone, Debug)]
pub struct EvmChain {
    view: ChainView,
    client: EvmClient,
}

impl EvmChain {
    /// The chain of `view`, posting from `poster`.
    pub fn new(view: ChainView, poster: PrivateKeySigner) -> Result<Self> {
        let fees = cx_contracts::FeePolicy {
            give_up_after_s: view.fees.give_up_after_s.min(POST_WAIT_S),
            ..view.fees
        };
        let client =
            EvmClient::connect_at(&view.rpc_urls(), poster, view.deployment)?.with_fees(fees);
        Ok(Self { view, client })
    }

    /// This chain's posts keeping their offers in `book` (nonces in the books).
    pub fn with_book(mut self, book: crate::evm::offers::OfferBook) -> Self {
        self.client = self.client.with_book(book);
        self
    }

    /// The read-only view.
    pub fn view(&self) -> &ChainView {
        &self.view
    }
}

impl Chain for EvmChain {
    fn chain_id(&self) -> u64 {
        self.view.chain_id
    }

    fn settlement(&self) -> Address {
        self.view.deployment.settlement
    }

    fn registry(&self) -> Address {
        self.view.deployment.registry
    }

    async fn post_slash(&self, slash: &SlashTerms, signature: &EvmSignature) -> Result<B256> {
        Ok(self
            .client
            .slash(
                slash.provider,
                slash.amount,
                slash.recipient,
                slash.evidence_hash,
                slash.expires_at_s,
                signature,
            )
            .await?
            .tx_hash)
    }

    async fn batch_nonce(&self) -> Result<u64> {
        self.view.batch_nonce().await
    }

    async fn balances_root(&self) -> Result<B256> {
        self.view.balances_root().await
    }

    async fn group_key(&self) -> Result<OnChainGroupKey> {
        self.view.group_key().await
    }

    async fn open_escrow(&self, id: u64) -> Result<Option<Escrow>> {
        self.view.open_escrow(id).await
    }

    async fn now_s(&self) -> Result<u64> {
        self.view.now_s().await
    }

    async fn reclaimed(&self, id: u64) -> Result<bool> {
        self.view.reclaimed(id).await
    }

    async fn batch_landed(&self, nonce: u64, balances_root: B256) -> Result<bool> {
        self.view.batch_landed(nonce, balances_root).await
    }

    async fn post_batch(&self, batch: &BatchMessage, signature: &EvmSignature) -> Result<Posted> {
        let outcome = self.client.settle_batch(batch, signature).await?;
        Ok(Posted {
            tx_hash: outcome.tx_hash,
            gas_used: Some(outcome.gas_used),
        })
    }

    async fn rotate_group_key(
        &self,
        new_key: EvmGroupKey,
        signature: &EvmSignature,
    ) -> Result<B256> {
        Ok(self
            .client
            .rotate_group_key(new_key, signature)
            .await?
            .tx_hash)
    }
}

#[derive(Debug)]
struct Contract {
    key: OnChainGroupKey,
    nonce: u64,
    balances_root: B256,
    open: BTreeMap<u64, Escrow>,
    reclaimed: Vec<u64>,
    evidence_used: Vec<B256>,
    now_s: u64,
    next_escrow: u64,
    landed: Vec<(u64, B256)>,
    transactions: u64,
    lose_answers: usize,
}

/// `Settlement`'s batch rules in memory, for tests.
#[derive(Debug)]
pub struct MemoryChain {
    chain_id: u64,
    settlement: Address,
    state: Mutex<Contract>,
}

fn reverted(name: &str) -> Error {
    Error::Reverted {
        name: name.to_string(),
        detail: String::new(),
    }
}

/// Verifies a contract-form signature under a contract-form key, as `FrostVerifier` does
/// (RFC 9591 Schnorr verification; the point encodings are the SEC1 compressed forms).
fn verifies(key: EvmGroupKey, message: B256, signature: &EvmSignature) -> bool {
    let mut key_bytes = vec![2 + key.parity];
    key_bytes.extend_from_slice(&key.x.to_be_bytes::<32>());
    let mut sig_bytes = vec![2 + u8::from(signature.r_y.bit(0))];
    sig_bytes.extend_from_slice(&signature.r_x.to_be_bytes::<32>());
    sig_bytes.extend_from_slice(&signature.z.to_be_bytes::<32>());
    match (
        frost::VerifyingKey::deserialize(&key_bytes),
        frost::Signature::deserialize(&sig_bytes),
    ) {
        (Ok(key), Ok(sig)) => key.verify(message.as_slice(), &sig).is_ok(),
        _ => false,
    }
}

impl MemoryChain {
    /// A fresh contract on `chain_id` under `key` (epoch 0, no batch yet).
    pub fn new(chain_id: u64, key: EvmGroupKey) -> Self {
        Self {
            chain_id,
            settlement: Address::from_word(keccak256(chain_id.to_be_bytes())),
            state: Mutex::new(Contract {
                key: OnChainGroupKey { key, epoch: 0 },
                nonce: 0,
                balances_root: ledger::no_balances_root(),
                open: BTreeMap::new(),
                reclaimed: Vec::new(),
                evidence_used: Vec::new(),
                now_s: 1_000_000,
                next_escrow: 0,
                landed: Vec::new(),
                transactions: 0,
                lose_answers: 0,
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Contract) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Opens an escrow of `amount` for `buyer` that is never reclaimable; returns its id.
    pub fn open_job(&self, buyer: Address, amount: u128) -> u64 {
        self.open_job_until(buyer, amount, u64::MAX)
    }

    /// Opens an escrow its buyer may reclaim once the clock passes `reclaimable_at_s`.
    pub fn open_job_until(&self, buyer: Address, amount: u128, reclaimable_at_s: u64) -> u64 {
        self.with(|c| {
            let id = c.next_escrow;
            c.next_escrow += 1;
            c.open.insert(
                id,
                Escrow {
                    escrow_id: id,
                    buyer,
                    amount,
                    reclaimable_at_s,
                },
            );
            id
        })
    }

    /// The chain's clock (unix seconds).
    pub fn clock_s(&self) -> u64 {
        self.with(|c| c.now_s)
    }

    /// Moves the clock forward.
    pub fn advance_s(&self, seconds: u64) {
        self.with(|c| c.now_s += seconds);
    }

    /// The buyer reclaims escrow `id` (`Escrow.reclaim`): only open, only after its time.
    pub fn reclaim(&self, id: u64) -> Result<()> {
        self.with(|c| match c.open.get(&id) {
            Some(e) if c.now_s > e.reclaimable_at_s => {
                c.open.remove(&id);
                c.reclaimed.push(id);
                Ok(())
            }
            Some(_) => Err(reverted("ReclaimTooEarly")),
            None => Err(reverted("EscrowNotOpen")),
        })
    }

    /// The next `count` transactions go through but their answers are lost (the poster sees
    /// an error), as when a connection drops after the node accepted a transaction.
    pub fn lose_answers(&self, count: usize) {
        self.with(|c| c.lose_answers = count);
    }

    /// Transactions accepted so far (batches and rotations).
    pub fn transactions(&self) -> u64 {
        self.with(|c| c.transactions)
    }

    /// Accepted batches as (nonce, balances root), in order.
    pub fn landed(&self) -> Vec<(u64, B256)> {
        self.with(|c| c.landed.clone())
    }

    fn answer(c: &mut Contract) -> Result<B256> {
        c.transactions += 1;
        let tx_hash = keccak256(c.transactions.to_be_bytes());
        if c.lose_answers > 0 {
            c.lose_answers -= 1;
            return Err(Error::Transport(
                "the answer to a transaction was lost".into(),
            ));
        }
        Ok(tx_hash)
    }
}

impl Chain for MemoryChain {
    fn chain_id(&self) -> u64 {
        self.chain_id
    }

    fn settlement(&self) -> Address {
        self.settlement
    }

    fn registry(&self) -> Address {
        Address::from_word(keccak256(self.settlement.as_slice()))
    }

    async fn post_slash(&self, slash: &SlashTerms, signature: &EvmSignature) -> Result<B256> {
        let digest = crate::batch::slash_digest(
            self.chain_id,
            self.registry(),
            slash.provider,
            slash.amount,
            slash.recipient,
            slash.evidence_hash,
            slash.expires_at_s,
        );
        self.with(|c| {
            if c.now_s > slash.expires_at_s {
                return Err(reverted("SlashExpired"));
            }
            if c.evidence_used.contains(&slash.evidence_hash) {
                return Err(reverted("EvidenceAlreadyUsed"));
            }
            if !verifies(c.key.key, digest, signature) {
                return Err(reverted("InvalidSignature"));
            }
            c.evidence_used.push(slash.evidence_hash);
            Self::answer(c)
        })
    }

    async fn batch_nonce(&self) -> Result<u64> {
        Ok(self.with(|c| c.nonce))
    }

    async fn balances_root(&self) -> Result<B256> {
        Ok(self.with(|c| c.balances_root))
    }

    async fn group_key(&self) -> Result<OnChainGroupKey> {
        Ok(self.with(|c| c.key))
    }

    async fn open_escrow(&self, id: u64) -> Result<Option<Escrow>> {
        Ok(self.with(|c| c.open.get(&id).copied()))
    }

    async fn now_s(&self) -> Result<u64> {
        Ok(self.with(|c| c.now_s))
    }

    async fn reclaimed(&self, id: u64) -> Result<bool> {
        Ok(self.with(|c| c.reclaimed.contains(&id)))
    }

    async fn batch_landed(&self, nonce: u64, balances_root: B256) -> Result<bool> {
        Ok(self.with(|c| c.landed.contains(&(nonce, balances_root))))
    }

    async fn post_batch(&self, batch: &BatchMessage, signature: &EvmSignature) -> Result<Posted> {
        self.with(|c| {
            if batch.nonce <= c.nonce {
                return Err(reverted("BatchNonceNotIncreasing"));
            }
            if batch.chain_id != self.chain_id
                || batch.contract != self.settlement
                || !verifies(c.key.key, batch.digest(), signature)
            {
                return Err(reverted("InvalidSignature"));
            }
            let ids: Vec<u64> = batch.ranges.iter().flat_map(|r| r.start..r.end).collect();
            if ids.iter().any(|id| !c.open.contains_key(id)) {
                return Err(reverted("EscrowNotOpen"));
            }
            for id in ids {
                c.open.remove(&id);
            }
            c.nonce = batch.nonce;
            c.balances_root = batch.balances_root;
            c.landed.push((batch.nonce, batch.balances_root));
            Self::answer(c).map(|tx_hash| Posted {
                tx_hash,
                gas_used: None,
            })
        })
    }

    async fn rotate_group_key(
        &self,
        new_key: EvmGroupKey,
        signature: &EvmSignature,
    ) -> Result<B256> {
        self.with(|c| {
            let digest = rotation_digest(
                self.chain_id,
                self.settlement,
                c.key.epoch,
                new_key.x,
                new_key.parity,
            );
            if !verifies(c.key.key, digest, signature) {
                return Err(reverted("InvalidSignature"));
            }
            c.key = OnChainGroupKey {
                key: new_key,
                epoch: c.key.epoch + 1,
            };
            Self::answer(c)
        })
    }
}
