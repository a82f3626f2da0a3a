//! The coordinator: turns provider-signed receipts into batches signed by any t signers and
//! posts each batch to every chain of the registry exactly once.
//!
//! One batch has one part per chain that holds escrows of its receipts (a chain's claims are
//! paid from that chain's escrows, so each chain keeps its own cumulative balances). The steps,
//! each recorded in the [`Store`] before the next begins (outbox pattern):
//!
//! 1. [`Coordinator::submit`] checks receipts' signatures and keeps them (idempotent by job id);
//! 2. [`Coordinator::build`] reads each chain's next nonce, balances root and the receipts'
//!    escrows, and assembles the parts with [`crate::ledger::assemble`] (`created`);
//! 3. [`Coordinator::sign_pending`] has t signers commit and sign each part, each signer checking
//!    it on its own ([`crate::signer`]), then aggregates and verifies (`signed`);
//! 4. [`Coordinator::post_pending`] sends each signed part to its chain (`posted`), recognising
//!    a part already on chain instead of sending it twice.
//!
//! [`Coordinator::resume`] runs 3 and 4 for whatever a previous process left unfinished, so a
//! crash at any point is followed by the same outcome as no crash. The coordinator holds no key
//! share: it is signer-agnostic and replaceable.
//!
//! The coordinator reaches the outside through three boundaries, each with an in-memory
//! implementation its unit tests use: the [`Store`] (PostgreSQL's [`PgStore`], [`MemoryStore`]),
//! each [`Chain`] ([`EvmChain`] over JSON-RPC, [`MemoryChain`]) and the [`ThresholdSigner`]
//! (signer processes through [`Committee`], [`MemoryCommittee`]).
//!
//! Key rotation ([`Coordinator::rotate`]): a fresh DKG ([`Coordinator::dkg`]) gives a new key;
//! the current key signs `Settlement.rotationDigest` for it on every chain (each signer checks it
//! holds a share of the new key first), and later batches are signed under the new key.

pub mod chain;
pub mod committee;
pub mod postgres;
pub mod signers;
pub mod store;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use alloy::primitives::{Address, B256, U256};
use cx_protocol::pq::PublicIdentity;
use cx_protocol::voucher::Voucher;
use frost_secp256k1 as frost;

pub use chain::{Chain, EvmChain, MemoryChain, Posted, SlashTerms};
pub(crate) use committee::check_rule;
pub use committee::{Committee, choose_signers};
pub use postgres::PgStore;
pub use signers::{MemoryCommittee, ThresholdSigner};
pub use store::{MemoryStore, PartStatus, Store, StoredPart};

use crate::batch::rotation_digest;
use crate::error::{Error, Result};
use crate::frost::{EvmGroupKey, EvmSignature};
use crate::ledger::{self, ChainBatch};
use crate::wire::{PartToSign, Request, SignRotationRequest};

/// How close to its reclaim time (`deadline + gracePeriod_s`, chain time) an escrow may be for
/// the coordinator to put it in a batch. A batch naming an escrow that its buyer reclaims before
/// the batch is mined reverts, and can never land; the margin leaves signing, posting and mining
/// that much time. It is larger than the signers' own [`crate::signer::SIGN_RECLAIM_MARGIN_S`],
/// so a batch built at the edge is still signed a few minutes later. A receipt whose escrow is
/// inside it is rejected with that reason (its buyer may take the escrow back at any moment).
pub const BUILD_RECLAIM_MARGIN_S: u64 = 900;

/// The oldest pending tabs whose receipts together fit `limit`, each tab whole (a tab settles
/// once: a part holding only some of its jobs would close it with the rest unpaid). Tabs are
/// ordered by their oldest receipt; a tab that does not fit waits for the next batch (the
/// exchange holds a tab to `limit` jobs, so every tab fits an empty part).
fn whole_tabs(pending: Vec<Voucher>, limit: usize) -> Vec<Voucher> {
    let mut tabs: Vec<(u64, Vec<Voucher>)> = Vec::new();
    for v in pending {
        let escrow = v.receipt.receipt.escrow_id;
        match tabs.iter_mut().find(|(id, _)| *id == escrow) {
            Some((_, jobs)) => jobs.push(v),
            None => tabs.push((escrow, vec![v])),
        }
    }
    let mut out = Vec::new();
    for (_, jobs) in tabs {
        if out.len() + jobs.len() <= limit {
            out.extend(jobs);
        }
    }
    out
}

/// The coordinator over a store `S`, chains `C` and a committee `K`.
pub struct Coordinator<S: Store, C: Chain = EvmChain, K: ThresholdSigner = Committee> {
    store: S,
    committee: K,
    chains: Vec<C>,
    exchange: PublicIdentity,
    fee: ledger::Fee,
}

impl<S: Store, C: Chain, K: ThresholdSigner + std::fmt::Debug> std::fmt::Debug
    for Coordinator<S, C, K>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Coordinator({:?}, {} chains)",
            self.committee,
            self.chains.len()
        )
    }
}

impl<S: Store, C: Chain, K: ThresholdSigner> Coordinator<S, C, K> {
    /// A coordinator settling on `chains` (each posts from its own paying account; that
    /// account cannot move funds: only the committee's signature settles) for the market of
    /// `market` (the exchange key vouchers are checked under, the fee credits are computed
    /// with: the same terms every signer pins).
    pub fn new(
        store: S,
        committee: K,
        chains: Vec<C>,
        market: &crate::config::MarketTerms,
    ) -> Result<Self> {
        Ok(Self {
            store,
            committee,
            chains,
            exchange: market.exchange()?,
            fee: market.fee,
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The committee.
    pub fn committee(&self) -> &K {
        &self.committee
    }

    /// The chains.
    pub fn chains(&self) -> &[C] {
        &self.chains
    }

    fn chain(&self, chain_id: u64) -> Result<&C> {
        self.chains
            .iter()
            .find(|c| c.chain_id() == chain_id)
            .ok_or(Error::UnknownChain { chain_id })
    }

    /// Checks and keeps vouchers (receipts with the order and assignment they answer); returns
    /// how many were new. Refuses the whole call, keeping nothing, when any voucher's chain of
    /// signatures is broken ([`ledger::check_vouchers`]) or names a chain it does not settle.
    /// A tab settles once, whole: submit every job of a tab together, once the tab takes no
    /// more.
    pub async fn submit(&self, receipts: &[Voucher]) -> Result<usize> {
        let mut by_chain: BTreeMap<u64, Vec<Voucher>> = BTreeMap::new();
        for v in receipts {
            by_chain
                .entry(v.receipt.receipt.chain_id)
                .or_default()
                .push(v.clone());
        }
        for (chain_id, vouchers) in &by_chain {
            let chain = self.chain(*chain_id)?;
            let domain = cx_protocol::order::domain(*chain_id, chain.settlement());
            let reasons = ledger::check_vouchers(vouchers, &self.exchange, &domain, |id| {
                self.chain(id)
                    .ok()
                    .map(|c| cx_protocol::order::domain(id, c.settlement()))
            });
            if !reasons.is_empty() {
                return Err(Error::InvalidBatch(reasons.join("; ")));
            }
        }
        let added = self.store.add_receipts(receipts).await?;
        // The signers check the signatures now, so the round that signs the batch finds them
        // done ([`crate::checked`]).
        self.committee.check_ahead(receipts).await;
        Ok(added)
    }

    /// Runs a DKG among all signers for key `epoch` and records the group's public keys.
    pub async fn dkg(&self, epoch: u32) -> Result<frost::keys::PublicKeyPackage> {
        let package = self.committee.dkg(epoch).await?;
        self.store.save_group_key(epoch, &package).await?;
        Ok(package)
    }

    async fn current_key(&self, chain: &C) -> Result<frost::keys::PublicKeyPackage> {
        let on_chain = chain.group_key().await?;
        for (_, package) in self.store.group_keys().await? {
            if EvmGroupKey::from_verifying_key(package.verifying_key())? == on_chain.key {
                return Ok(package);
            }
        }
        Err(Error::ForeignGroupKey {
            chain_id: chain.chain_id(),
        })
    }

    /// Builds the next batch from pending receipts; `None` when there is nothing to settle.
    /// Refuses while an earlier batch is unfinished (nonces must land in order).
    pub async fn build(&self) -> Result<Option<i64>> {
        // A chain with a part still unposted waits for it (its next nonce and balances follow
        // that part); the other chains are batched without it.
        let unfinished = self.store.unfinished().await?;
        let mut by_chain: BTreeMap<u64, Vec<Voucher>> = BTreeMap::new();
        for r in self.store.pending_receipts().await? {
            by_chain
                .entry(r.receipt.receipt.chain_id)
                .or_default()
                .push(r);
        }
        let mut parts = Vec::new();
        let mut blocked = None;
        let mut away = None;
        for (chain_id, pending) in by_chain {
            if let Some(part) = unfinished.iter().find(|p| p.batch.chain_id == chain_id) {
                blocked.get_or_insert(part.batch_id);
                continue;
            }
            let Ok(chain) = self.chain(chain_id) else {
                continue;
            };
            match self.assemble(chain_id, chain, pending).await {
                Ok(Some(part)) => parts.push(part),
                Ok(None) => {}
                // A chain that cannot be read now settles in a later batch; the rest go on.
                Err(e @ (Error::Rpc(_) | Error::Contract(_) | Error::PendingTx(_))) => {
                    away.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        if parts.is_empty() {
            if let Some(e) = away {
                return Err(e);
            }
            if let Some(batch_id) = blocked {
                return Err(Error::Unfinished { batch_id });
            }
            return Ok(None);
        }
        let id = self.store.create_batch(&parts).await?;
        for p in &parts {
            let detail = format!(
                "nonce {}, {} receipts, {} wei settled, digest {}",
                p.nonce,
                p.receipts.len(),
                p.settled_amount(),
                p.digest()
            );
            self.store
                .log_step(id, Some(p.chain_id), "built", &detail)
                .await?;
        }
        Ok(Some(id))
    }

    /// The next part for `chain_id` out of its `pending` vouchers (whole tabs, as many as one
    /// part holds), on the chain's current nonce, balances and key epoch; None if none settles.
    async fn assemble(
        &self,
        chain_id: u64,
        chain: &C,
        pending: Vec<Voucher>,
    ) -> Result<Option<ledger::ChainBatch>> {
        let mut receipts = whole_tabs(pending, ledger::MAX_RECEIPTS_PER_BATCH);
        receipts.sort_by_key(|r| r.receipt.receipt.escrow_id);
        let (settleable, escrows) = self.settleable(chain, receipts).await?;
        if settleable.is_empty() {
            return Ok(None);
        }
        let previous = match self.store.latest_part(chain_id).await? {
            Some(p) => p.batch.new_balances,
            None => Vec::new(),
        };
        let root = chain.balances_root().await?;
        if ledger::balances_root(&previous)? != root {
            return Err(Error::ForeignBalancesRoot { chain_id, root });
        }
        let nonce = chain.batch_nonce().await? + 1;
        let key_epoch = chain.group_key().await?.epoch;
        Ok(Some(ledger::assemble(
            ledger::Head {
                chain_id,
                contract: chain.settlement(),
                key_epoch,
                nonce,
                fee: self.fee,
            },
            settleable,
            &escrows,
            previous,
        )?))
    }

    /// The receipts whose escrows are open and outside [`BUILD_RECLAIM_MARGIN_S`] of their
    /// reclaim time, with those escrows; receipts inside the margin are rejected (the others,
    /// whose escrows are closed, stay as they are).
    async fn settleable(
        &self,
        chain: &C,
        receipts: Vec<Voucher>,
    ) -> Result<(Vec<Voucher>, HashMap<u64, ledger::Escrow>)> {
        let now = chain.now_s().await?;
        let mut escrows = HashMap::new();
        let mut closed = std::collections::HashSet::new();
        let mut settleable = Vec::new();
        for r in receipts {
            let escrow_id = r.receipt.receipt.escrow_id;
            if closed.contains(&escrow_id) {
                continue;
            }
            let e = match escrows.get(&escrow_id) {
                Some(e) => *e,
                None => match chain.open_escrow(escrow_id).await? {
                    Some(e) => e,
                    None => {
                        closed.insert(escrow_id);
                        continue;
                    }
                },
            };
            if e.reclaimable_at_s <= now.saturating_add(BUILD_RECLAIM_MARGIN_S) {
                let reason = format!(
                    "escrow {} becomes reclaimable at {} (chain time {now}): inside the {} s \
                     safety margin, a batch naming it could be reverted by a reclaim",
                    e.escrow_id, e.reclaimable_at_s, BUILD_RECLAIM_MARGIN_S
                );
                self.store
                    .reject_receipt(r.receipt.receipt.job_id, &reason)
                    .await?;
                continue;
            }
            escrows.insert(e.escrow_id, e);
            settleable.push(r);
        }
        Ok((settleable, escrows))
    }

    /// If an escrow of `part` was reclaimed by its buyer (its `JobReclaimed` event is on
    /// chain), the part can never land: `Settlement.settleBatch` reverts on a closed escrow and
    /// a closed escrow never opens again. It is replaced at the same nonce by the rest of its
    /// receipts that are still settleable (signers sign the replacement on the same evidence,
    /// [`crate::signer`]); the receipts left out are rejected. Returns whether it replaced.
    async fn replace_if_dead(&self, part: &StoredPart) -> Result<bool> {
        let b = &part.batch;
        let chain = self.chain(b.chain_id)?;
        let mut reclaimed = Vec::new();
        for e in &b.escrows {
            if chain.reclaimed(e.escrow_id).await? {
                reclaimed.push(e.escrow_id);
            }
        }
        if reclaimed.is_empty() {
            return Ok(false);
        }
        let (keep, escrows) = self.settleable(chain, b.receipts.clone()).await?;
        let replacement = match keep.is_empty() {
            true => None,
            false => Some(ledger::assemble(
                ledger::Head {
                    chain_id: b.chain_id,
                    contract: b.contract,
                    key_epoch: b.key_epoch,
                    nonce: b.nonce,
                    fee: b.fee,
                },
                keep,
                &escrows,
                b.previous_balances.clone(),
            )?),
        };
        self.store
            .replace_part(part.batch_id, b.chain_id, replacement.as_ref())
            .await?;
        for r in &b.receipts {
            let r = &r.receipt.receipt;
            if reclaimed.contains(&r.escrow_id) {
                let reason = format!(
                    "escrow {} was reclaimed by its buyer before batch {} landed",
                    r.escrow_id, b.nonce
                );
                self.store.reject_receipt(r.job_id, &reason).await?;
            }
        }
        let detail = match &replacement {
            Some(n) => format!(
                "nonce {}: escrows {reclaimed:?} were reclaimed, so digest {} can never land; \
                 replaced by digest {} with {} receipts",
                b.nonce,
                b.digest(),
                n.digest(),
                n.receipts.len()
            ),
            None => format!(
                "nonce {}: escrows {reclaimed:?} were reclaimed, so digest {} can never land; \
                 nothing else to settle, the nonce is free again",
                b.nonce,
                b.digest()
            ),
        };
        self.store
            .log_step(part.batch_id, Some(b.chain_id), "replaced", &detail)
            .await?;
        Ok(true)
    }

    /// Signs every `created` part. A refusal is recorded with its reasons and returned, unless
    /// the part can never land (a reclaim): then it is replaced and the replacement signed.
    pub async fn sign_pending(&self) -> Result<()> {
        for part in self.store.unfinished().await? {
            if part.status != PartStatus::Created {
                continue;
            }
            match self.sign_part(&part).await {
                Err(e @ Error::Refused { .. }) => {
                    if !self.replace_if_dead(&part).await? {
                        return Err(e);
                    }
                    let replaced = self.store.parts(part.batch_id).await?;
                    if let Some(new) = replaced
                        .into_iter()
                        .find(|p| p.batch.chain_id == part.batch.chain_id)
                    {
                        self.sign_part(&new).await?;
                    }
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// Signs one part. The request carries the balances root the part builds on and its
    /// vouchers' ids, not the balance lists nor the vouchers (each signer keeps its own lists,
    /// [`crate::signer`], and holds the vouchers it checked as they were taken in,
    /// [`crate::checked`]); only when a signer does not hold one of them is the part sent again
    /// whole.
    async fn sign_part(&self, part: &StoredPart) -> Result<()> {
        let chain = self.chain(part.batch.chain_id)?;
        let key = self.current_key(chain).await?;
        let digest = part.batch.digest();
        let named = PartToSign::named(&part.batch)?;
        let mut how = "balance changes and voucher ids";
        let mut signed = self
            .committee
            .sign(digest.as_slice(), &key, |round, package| {
                named.request(round, package)
            })
            .await;
        // Sending the lists and vouchers to every signer costs only a larger request, so one
        // signer's word is enough here (unlike dropping a job, which the exchange leaves to t
        // signers).
        if let Err(Error::Refused { refusals }) = &signed
            && refusals.iter().any(|r| {
                r.reason.contains(crate::signer::UNKNOWN_BALANCES)
                    || r.reason.contains(crate::checked::UNKNOWN_VOUCHERS)
            })
        {
            how = "the full balances list and vouchers (a signer did not hold the previous list \
                   or a voucher)";
            let whole = PartToSign::whole(&part.batch);
            signed = self
                .committee
                .sign(digest.as_slice(), &key, |round, package| {
                    whole.request(round, package)
                })
                .await;
        }
        let signature = match signed {
            Ok(s) => s,
            Err(e) => {
                let step = match e {
                    Error::Refused { .. } => "refused",
                    _ => "waiting",
                };
                self.store
                    .log_step(
                        part.batch_id,
                        Some(part.batch.chain_id),
                        step,
                        &e.to_string(),
                    )
                    .await?;
                return Err(e);
            }
        };
        self.store
            .record_signature(part.batch_id, part.batch.chain_id, &signature.serialize()?)
            .await?;
        self.store
            .log_step(
                part.batch_id,
                Some(part.batch.chain_id),
                "signed",
                &format!(
                    "digest {digest}, sent with {how}, signers {:?}",
                    self.committee.last_signers()
                ),
            )
            .await?;
        // Who was left out on the way, and why: a cheater named by aggregation, a signer that
        // stalled, a refusal the others did not share (its reason is only its signer's word).
        let left_out = self.committee.last_left_out();
        if !left_out.is_empty() {
            let detail = left_out
                .iter()
                .map(|(index, why)| format!("signer {index} {why}"))
                .collect::<Vec<_>>()
                .join("; ");
            self.store
                .log_step(
                    part.batch_id,
                    Some(part.batch.chain_id),
                    "left out",
                    &detail,
                )
                .await?;
        }
        Ok(())
    }

    /// Posts every `signed` part; returns how many reached their chain now (sent, or found there).
    pub async fn post_pending(&self) -> Result<usize> {
        let mut done = 0;
        let mut failed: Option<Error> = None;
        let mut away: Vec<u64> = Vec::new();
        for part in self.store.unfinished().await? {
            if part.status != PartStatus::Signed || away.contains(&part.batch.chain_id) {
                continue;
            }
            // A chain that fails (its node down, a nonce it disputes) holds back its own parts
            // only, and the rest of them too: a later nonce cannot land before this one.
            match self.post_part(&part).await {
                Ok(true) => done += 1,
                Ok(false) => {}
                Err(e) => {
                    away.push(part.batch.chain_id);
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(done), Err)
    }

    /// Posts one signed part unless the chain has it already; true once it is recorded posted,
    /// false when it was replaced instead (its escrow reclaimed: re-signed at the same nonce).
    async fn post_part(&self, part: &StoredPart) -> Result<bool> {
        let b = &part.batch;
        let chain = self.chain(b.chain_id)?;
        let bytes = part.signature.as_ref().ok_or(Error::MissingSignature {
            batch_id: part.batch_id,
            chain_id: b.chain_id,
        })?;
        let signature = EvmSignature::from_frost(&frost::Signature::deserialize(bytes)?)?;
        let posted = if chain.batch_nonce().await? >= b.nonce {
            None
        } else {
            match chain.post_batch(&b.message(), &signature).await {
                Ok(posted) => Some(posted),
                // The post may have gone through while the answer was lost, or another
                // process posted it: the chain says which.
                Err(e) if !chain.batch_landed(b.nonce, b.balances_root).await? => {
                    // A buyer reclaimed an escrow between signing and mining: this digest
                    // can never land; the rest of the part is re-signed at this nonce.
                    if self.replace_if_dead(part).await? {
                        return Ok(false);
                    }
                    return Err(e);
                }
                Err(_) => None,
            }
        };
        if posted.is_none() && !chain.batch_landed(b.nonce, b.balances_root).await? {
            return Err(Error::NonceTakenOnChain {
                chain_id: b.chain_id,
                nonce: b.nonce,
            });
        }
        self.store
            .record_posted(part.batch_id, b.chain_id, posted.map(|p| p.tx_hash))
            .await?;
        let detail = match posted {
            Some(Posted {
                tx_hash,
                gas_used: Some(gas),
            }) => format!("tx {tx_hash}, gas {gas}"),
            Some(Posted { tx_hash, .. }) => format!("tx {tx_hash}"),
            None => "already on chain; not sent again".to_string(),
        };
        self.store
            .log_step(part.batch_id, Some(b.chain_id), "posted", &detail)
            .await?;
        Ok(true)
    }

    /// Carries on whatever is unfinished: signs `created` parts, posts `signed` ones.
    pub async fn resume(&self) -> Result<()> {
        // A chain that is away fails this first post alone; the second tries it again, after
        // every other chain's created parts were signed.
        let _ = self.post_pending().await;
        self.sign_pending().await?;
        self.post_pending().await?;
        Ok(())
    }

    /// Finishes what is unfinished, then builds, signs and posts the next batch. One chain
    /// being away does not stop the others settling: the batch is still cut and posted where
    /// it can be, and the chain's failure is returned after (its parts wait, signed).
    pub async fn run_once(&self) -> Result<Option<i64>> {
        let resumed = self.resume().await;
        let id = self.build().await?;
        let last = if id.is_some() {
            self.resume().await
        } else {
            resumed
        };
        last.map(|()| id)
    }

    /// Gives up batch `batch_id` after the committee refused it (no part may be signed yet):
    /// its receipts are pending again and its nonces free. Pair with [`Coordinator::reject`] for
    /// the receipts the signers named, or the next batch is refused the same way.
    pub async fn abandon(&self, batch_id: i64, reason: &str) -> Result<()> {
        self.store.abandon_batch(batch_id).await?;
        self.store
            .log_step(batch_id, None, "abandoned", reason)
            .await
    }

    /// Takes a pending receipt out of settlement, keeping it with `reason`.
    pub async fn reject(&self, job_id: [u8; 32], reason: &str) -> Result<bool> {
        self.store.reject_receipt(job_id, reason).await
    }

    /// `party`'s cumulative amount on `chain_id` and its Merkle proof against the chain's
    /// current balances root (what `Escrow.claim` takes).
    pub async fn claim_proof(&self, chain_id: u64, party: Address) -> Result<(U256, Vec<B256>)> {
        let part = self
            .store
            .latest_part(chain_id)
            .await?
            .ok_or(Error::NoBatchYet { chain_id })?;
        let balances = if part.status == PartStatus::Posted {
            part.batch.new_balances
        } else {
            part.batch.previous_balances.clone()
        };
        // The first batch of a chain, not yet on chain: nothing is credited there yet.
        if balances.is_empty() {
            return Err(Error::NoBatchYet { chain_id });
        }
        let as_batch = ChainBatch {
            new_balances: balances,
            ..part.batch
        };
        as_batch.claim_proof(party)
    }

    /// Has the committee sign a slash of the provider `evidence` is against, valid for
    /// `validity_s` seconds of chain time, and posts it. Every signer checks the evidence on its
    /// own ([`crate::slash`]); returns the terms and the transaction hash.
    pub async fn slash(
        &self,
        evidence: &crate::slash::SlashEvidence,
        amount: U256,
        recipient: Address,
        validity_s: u64,
    ) -> Result<(SlashTerms, B256)> {
        let chain_id = evidence.chain_id();
        let chain = self.chain(chain_id)?;
        let key = self.current_key(chain).await?;
        let terms = SlashTerms {
            provider: evidence.provider(),
            amount,
            recipient,
            evidence_hash: evidence.hash(),
            expires_at_s: chain.now_s().await? + validity_s,
        };
        let digest = crate::batch::slash_digest(
            chain_id,
            chain.registry(),
            terms.provider,
            terms.amount,
            terms.recipient,
            terms.evidence_hash,
            terms.expires_at_s,
        );
        let signature = self
            .committee
            .sign(digest.as_slice(), &key, |round_id, signing_package| {
                Request::SignSlash(Box::new(crate::wire::SignSlashRequest {
                    round_id,
                    chain_id,
                    evidence: evidence.clone(),
                    amount,
                    recipient,
                    expires_at_s: terms.expires_at_s,
                    signing_package,
                }))
            })
            .await?;
        let tx = chain
            .post_slash(&terms, &EvmSignature::from_frost(&signature)?)
            .await?;
        Ok((terms, tx))
    }

    /// Installs the key of DKG `new_epoch` on every chain with a signature by the current key.
    /// Chains that already carry it are skipped, so a rotation interrupted halfway is finished by
    /// running it again.
    pub async fn rotate(&self, new_epoch: u32) -> Result<()> {
        let new_package = self
            .store
            .group_keys()
            .await?
            .into_iter()
            .find(|(e, _)| *e == new_epoch)
            .map(|(_, p)| p)
            .ok_or(Error::UnknownEpoch { epoch: new_epoch })?;
        let new_key = EvmGroupKey::from_verifying_key(new_package.verifying_key())?;
        for chain in &self.chains {
            let on_chain = chain.group_key().await?;
            if on_chain.key == new_key {
                continue;
            }
            let current = self.current_key(chain).await?;
            let chain_id = chain.chain_id();
            let digest = rotation_digest(
                chain_id,
                chain.settlement(),
                on_chain.epoch,
                new_key.x,
                new_key.parity,
            );
            let signature = self
                .committee
                .sign(digest.as_slice(), &current, |round_id, signing_package| {
                    Request::SignRotation(SignRotationRequest {
                        round_id,
                        chain_id,
                        new_epoch,
                        signing_package,
                    })
                })
                .await?;
            chain
                .rotate_group_key(new_key, &EvmSignature::from_frost(&signature)?)
                .await?;
        }
        Ok(())
    }
}
