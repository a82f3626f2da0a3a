//! Batch assembly, pure: receipts, the escrows they settle and the previous cumulative balances
//! become one chain's part of a batch.
//!
//! The coordinator calls [`assemble`] to build a batch; every signer calls it again with inputs
//! it fetched itself (escrows and the previous balances root read from the chain, receipts
//! checked against keys registered on chain) and signs only when every field comes out equal.
//! Sharing the function is what makes "the signer re-checks the batch" a recomputation rather
//! than a second, drifting implementation.
//!
//! Money: an escrow is a tab that pays many jobs and settles once, whole. For each of its
//! receipts the provider is credited `amount_owed_wei` less the exchange's fee ([`Fee`], basis
//! points, credited to the exchange's operator account), and the buyer is credited the rest of
//! the escrow (`escrow − Σ owed`). The escrow's whole amount is what `Settlement.settleBatch`
//! moves into `totalSettled`, so the credits of a batch add up to exactly what it settles.
//! Balances are cumulative (what a party was ever credited on this chain); `Escrow.claim` pays
//! the difference to what it already withdrew. Each chain keeps its own balances: a claim on one
//! chain is paid from that chain's escrows.

use std::collections::{BTreeMap, HashMap, HashSet};

use alloy::primitives::{Address, B256, U256, keccak256};
use cx_protocol::pq::PublicIdentity;
use cx_protocol::voucher::Voucher;
use serde::{Deserialize, Serialize};

use crate::batch::{BatchMessage, ranges_from_ids};
use crate::checked::CheckedVouchers;
use crate::error::{Error, Result};
use crate::merkle::{BalancesTree, MerkleTree, receipt_leaf};

/// Receipts one chain's part of a batch holds at most. A voucher is ~35 KB of JSON (four
/// ML-DSA-65 signatures, the receipt's key, the buyer's order and its key binding; hex), and a
/// part travels whole in one sign request, which must fit one frame
/// ([`crate::transport::Limits::max_frame_bytes`], 24 MiB): 400 vouchers are ~14 MB, leaving
/// room for the two cumulative-balances lists
/// (previous and new, ~110 bytes a party each) when they travel: with 25,000 parties on the
/// chain a full part with its lists fits. (Usually they do not: the coordinator sends the root
/// and each signer keeps its own lists; the full lists go only to a signer that lacks them.)
/// A tab settles whole in one part, so the exchange holds a tab to this many jobs; more pending
/// tabs settle in more batches (the coordinator takes the oldest first); a signer refuses a part
/// over this size. The test `a_full_part_fits_one_frame` holds these figures to the real
/// encoding.
pub const MAX_RECEIPTS_PER_BATCH: usize = 400;

/// `Escrow.NO_BALANCES_ROOT`: the balances root before any batch.
pub fn no_balances_root() -> B256 {
    keccak256(b"compute-exchange/settlement/no-balances")
}

/// Root of a cumulative-balances list (the constant of an empty one).
pub fn balances_root(entries: &[(Address, U256)]) -> Result<B256> {
    if entries.is_empty() {
        return Ok(no_balances_root());
    }
    Ok(BalancesTree::new(entries.to_vec())?.root())
}

/// One per-job escrow as `Settlement.jobs(id)` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escrow {
    /// Escrow id on its chain.
    pub escrow_id: u64,
    /// Who opened it.
    pub buyer: Address,
    /// Locked amount (wei of the asset; a decimal string in JSON).
    #[serde(with = "cx_protocol::receipt::wei_string")]
    pub amount: u128,
    /// Chain time (unix seconds) after which its buyer may reclaim it: `deadline +
    /// gracePeriod_s`. A batch that names it must land before then, or it reverts forever; so
    /// the coordinator and the signers leave out escrows this close to it (see
    /// [`crate::coordinator::BUILD_RECLAIM_MARGIN_S`] and [`crate::signer::SIGN_RECLAIM_MARGIN_S`]).
    #[serde(default = "never")]
    pub reclaimable_at_s: u64,
}

fn never() -> u64 {
    u64::MAX
}

/// One chain's part of a batch: everything a signer needs to recompute it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainBatch {
    /// Chain id.
    pub chain_id: u64,
    /// The chain's `Settlement` contract.
    pub contract: Address,
    /// The contract's group-key epoch the batch is signed under (part of the digest).
    #[serde(default)]
    pub key_epoch: u32,
    /// Batch nonce on that contract.
    pub nonce: u64,
    /// The exchange's fee the credits were computed with.
    pub fee: Fee,
    /// Each job's voucher (order → assignment → provider-signed receipt), receipts in leaf
    /// order.
    pub receipts: Vec<Voucher>,
    /// The escrows (tabs) the receipts settle, each once, by id.
    pub escrows: Vec<Escrow>,
    /// Cumulative balances before this batch (their root is the contract's `balancesRoot`).
    pub previous_balances: Vec<(Address, U256)>,
    /// Cumulative balances after it, sorted by address.
    pub new_balances: Vec<(Address, U256)>,
    /// Merkle root of the receipts.
    pub receipts_root: B256,
    /// Merkle root of `new_balances`.
    pub balances_root: B256,
}

impl ChainBatch {
    /// The message the committee signs and the contract checks.
    pub fn message(&self) -> BatchMessage {
        let ids: Vec<u64> = self.escrows.iter().map(|e| e.escrow_id).collect();
        BatchMessage {
            chain_id: self.chain_id,
            contract: self.contract,
            key_epoch: self.key_epoch,
            nonce: self.nonce,
            receipts_root: self.receipts_root,
            balances_root: self.balances_root,
            ranges: ranges_from_ids(&ids),
        }
    }

    /// The 32-byte FROST message.
    pub fn digest(&self) -> B256 {
        self.message().digest()
    }

    /// `party`'s cumulative amount after this batch and its Merkle proof (what `Escrow.claim`
    /// takes).
    pub fn claim_proof(&self, party: Address) -> Result<(U256, Vec<B256>)> {
        BalancesTree::new(self.new_balances.clone())?.proof_for(party)
    }

    /// Total escrow the batch settles.
    pub fn settled_amount(&self) -> U256 {
        self.escrows.iter().map(|e| U256::from(e.amount)).sum()
    }
}

fn refuse(reason: String) -> Error {
    Error::InvalidBatch(reason)
}

/// The exchange's fee: `bps` basis points of what each receipt is owed, credited to `account`
/// (the provider is credited the rest of what it is owed). The committee pins it in its
/// config, so a batch crediting any other fee does not recompute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fee {
    /// Basis points of each amount owed (at most 10,000).
    pub bps: u16,
    /// Who is credited the fee.
    pub account: Address,
}

impl Fee {
    /// The fee on `owed` wei, rounded down (the provider keeps the remainder).
    pub fn of(&self, owed: u128) -> u128 {
        // owed < 2^128 and bps ≤ 10^4 < 2^14: the product fits U256, and the quotient ≤ owed.
        let fee = U256::from(owed) * U256::from(self.bps) / U256::from(10_000u32);
        fee.to::<u128>()
    }
}

/// Where and under what a part is built: chain, contract, key epoch, nonce and fee.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Chain id.
    pub chain_id: u64,
    /// The chain's `Settlement` contract.
    pub contract: Address,
    /// The contract's group-key epoch.
    pub key_epoch: u32,
    /// Batch nonce.
    pub nonce: u64,
    /// The exchange's fee.
    pub fee: Fee,
}

/// Builds one chain's batch. `escrows` holds each receipt's escrow (tab) as read on chain;
/// `previous` the cumulative balances the contract's current root commits to. Many receipts
/// may draw on one escrow (a tab pays many jobs), and the batch settles it whole: the receipts
/// must be every job the tab pays. Refuses (with the reason) a receipt for another chain, a
/// job named twice, an escrow whose buyer differs from the receipt's, receipts of one escrow
/// owed more than it holds, or a fee above 100%. The vouchers' signatures are not checked here
/// ([`check_vouchers`] does).
pub fn assemble(
    head: Head,
    receipts: Vec<Voucher>,
    escrows: &HashMap<u64, Escrow>,
    previous: Vec<(Address, U256)>,
) -> Result<ChainBatch> {
    let Head {
        chain_id,
        contract,
        key_epoch,
        nonce,
        fee,
    } = head;
    if receipts.is_empty() {
        return Err(refuse("a batch needs at least one receipt".into()));
    }
    if receipts.len() > MAX_RECEIPTS_PER_BATCH {
        return Err(refuse(format!(
            "{} receipts is over the {MAX_RECEIPTS_PER_BATCH} a batch part may hold",
            receipts.len()
        )));
    }
    if fee.bps > 10_000 {
        return Err(refuse(format!("a fee of {} bps is over 100%", fee.bps)));
    }
    let mut jobs = HashSet::new();
    let mut balances: BTreeMap<Address, U256> = BTreeMap::new();
    for (party, amount) in &previous {
        if balances.insert(*party, *amount).is_some() {
            return Err(refuse(format!("previous balances name {party} twice")));
        }
    }
    let mut owed_by_escrow: BTreeMap<u64, u128> = BTreeMap::new();
    let mut fees = U256::ZERO;
    let mut leaves = Vec::with_capacity(receipts.len());
    for voucher in &receipts {
        let r = &voucher.receipt.receipt;
        let job = hex::encode(r.job_id);
        if r.chain_id != chain_id {
            return Err(refuse(format!(
                "receipt for job {job} is for chain {}, not {chain_id}",
                r.chain_id
            )));
        }
        if !jobs.insert(r.job_id) {
            return Err(refuse(format!("job {job} appears twice")));
        }
        let escrow = escrows.get(&r.escrow_id).ok_or_else(|| {
            refuse(format!(
                "escrow {} of job {job} is not open on chain {chain_id}",
                r.escrow_id
            ))
        })?;
        let buyer = Address::from(r.buyer);
        if escrow.buyer != buyer {
            return Err(refuse(format!(
                "escrow {} belongs to {}, but the receipt of job {job} names buyer {buyer}",
                r.escrow_id, escrow.buyer
            )));
        }
        let owed = owed_by_escrow.entry(r.escrow_id).or_default();
        *owed = owed
            .checked_add(r.amount_owed_wei)
            .filter(|total| *total <= escrow.amount)
            .ok_or_else(|| {
                refuse(format!(
                    "the receipts of escrow {} claim more than its escrow of {} wei (job {job} \
                     adds {})",
                    r.escrow_id, escrow.amount, r.amount_owed_wei
                ))
            })?;
        let cut = fee.of(r.amount_owed_wei);
        fees += U256::from(cut);
        *balances.entry(Address::from(r.provider)).or_default() +=
            U256::from(r.amount_owed_wei - cut);
        leaves.push(receipt_leaf(B256::from(r.hash())));
    }
    if fees > U256::ZERO {
        *balances.entry(fee.account).or_default() += fees;
    }
    let mut ordered = Vec::with_capacity(owed_by_escrow.len());
    for (id, owed) in owed_by_escrow {
        let escrow = escrows[&id];
        let refund = escrow.amount - owed;
        if refund > 0 {
            *balances.entry(escrow.buyer).or_default() += U256::from(refund);
        }
        ordered.push(escrow);
    }
    let new_balances: Vec<(Address, U256)> = balances.into_iter().collect();
    let balances_root = BalancesTree::new(new_balances.clone())?.root();
    Ok(ChainBatch {
        chain_id,
        contract,
        key_epoch,
        nonce,
        fee,
        receipts,
        escrows: ordered,
        previous_balances: previous,
        new_balances,
        receipts_root: MerkleTree::new(leaves)?.root(),
        balances_root,
    })
}

/// Every broken link among a part's vouchers, as reasons: each voucher's chain of signatures
/// under the pinned `exchange` key and the chain's `domain` ([`Voucher::check`]), the buyer's
/// ML-DSA co-signature under the key its binding names, the binding itself under the domain of
/// the chain it names (`binding_domain`: the checker's own registry, `None` for a chain it does
/// not know; each distinct binding is checked once), and, per order, that what its jobs are owed
/// together stays within its limit: a session grant's cap over its calls, an intent's limit over
/// its job and the job's verification runs. (A tab settles once, whole, so every job of an order
/// is in the same part.) The caller still checks that each receipt's key is the one its provider
/// registered on chain.
pub fn check_vouchers(
    receipts: &[Voucher],
    exchange: &PublicIdentity,
    domain: &alloy::sol_types::Eip712Domain,
    binding_domain: impl Fn(u64) -> Option<alloy::sol_types::Eip712Domain>,
) -> Vec<String> {
    check(receipts, None, exchange, domain, binding_domain)
}

/// [`check_vouchers`], skipping the signatures of a voucher whose check `checked` remembers
/// (under the same domains) and remembering each voucher that passes. `ids` are the vouchers'
/// [`crate::checked::voucher_id`]s, in order, as the caller computed them or held the vouchers
/// under (a hit is trusted: an id that is not its voucher's would lend it another's check). The
/// sums per order are always redone. `checked` is locked only to
/// look up and to keep, never while verifying, so a signing round's check does not wait behind
/// vouchers being checked as they arrive.
pub fn check_vouchers_once(
    receipts: &[Voucher],
    ids: &[B256],
    exchange: &PublicIdentity,
    domain: &alloy::sol_types::Eip712Domain,
    binding_domain: impl Fn(u64) -> Option<alloy::sol_types::Eip712Domain>,
    checked: &std::sync::Mutex<CheckedVouchers>,
) -> Vec<String> {
    if ids.len() != receipts.len() {
        return vec![format!(
            "{} voucher ids for {} vouchers",
            ids.len(),
            receipts.len()
        )];
    }
    check(
        receipts,
        Some((ids, checked)),
        exchange,
        domain,
        binding_domain,
    )
}

fn lock(checked: &std::sync::Mutex<CheckedVouchers>) -> std::sync::MutexGuard<'_, CheckedVouchers> {
    // A panic while holding it leaves plain data behind (a remembered check is whole or absent).
    checked.lock().unwrap_or_else(|p| p.into_inner())
}

fn check(
    receipts: &[Voucher],
    memo: Option<(&[B256], &std::sync::Mutex<CheckedVouchers>)>,
    exchange: &PublicIdentity,
    domain: &alloy::sol_types::Eip712Domain,
    binding_domain: impl Fn(u64) -> Option<alloy::sol_types::Eip712Domain>,
) -> Vec<String> {
    let mut reasons = Vec::new();
    let mut spent: BTreeMap<B256, (u128, u128)> = BTreeMap::new();
    // A tab is one buyer's: a part holds few distinct bindings, each checked once.
    let mut bindings: Vec<(
        &cx_protocol::order::binding::Binding,
        std::result::Result<PublicIdentity, String>,
    )> = Vec::new();
    for (i, v) in receipts.iter().enumerate() {
        let job = hex::encode(v.job_id());
        let Some(binding_domain) = binding_domain(v.binding.chain_id) else {
            reasons.push(format!(
                "voucher of job {job}: binding.chain_id: chain {} is not in this signer's registry",
                v.binding.chain_id
            ));
            continue;
        };
        let memo = memo.map(|(ids, checked)| {
            (
                CheckedVouchers::key(&ids[i], domain, &binding_domain),
                checked,
            )
        });
        let known = memo.and_then(|(key, checked)| lock(checked).get(&key));
        let spend = match known {
            Some(spend) => spend,
            None => {
                let key = match bindings.iter().find(|(b, _)| *b == &v.binding) {
                    Some((_, key)) => key.clone(),
                    None => {
                        let key = v.check_binding(&binding_domain).map_err(|e| e.to_string());
                        bindings.push((&v.binding, key.clone()));
                        key
                    }
                };
                let key = match key {
                    Ok(key) => key,
                    Err(e) => {
                        reasons.push(format!("voucher of job {job}: {e}"));
                        continue;
                    }
                };
                match v.check(exchange, domain, &key) {
                    Err(e) => {
                        reasons.push(format!("voucher of job {job}: {e}"));
                        continue;
                    }
                    Ok(spend) => {
                        if let Some((key, checked)) = memo {
                            lock(checked).insert(key, spend);
                        }
                        spend
                    }
                }
            }
        };
        if let Some(spend) = spend {
            let (total, cap) = spent.entry(spend.order).or_insert((0, spend.cap_wei));
            *total = total.saturating_add(spend.owed_wei);
            *cap = (*cap).min(spend.cap_wei);
        }
    }
    for (order, (total, cap)) in spent {
        if total > cap {
            reasons.push(format!(
                "order {order}: its jobs (calls of a session, a job and its verification runs, \
                 or a rent's holders) are owed {total} wei, over the {cap} wei its buyer signed \
                 for"
            ));
        }
    }
    reasons
}

/// Every difference between a proposed batch and the one recomputed from checked inputs, as
/// reasons a signer can give (empty when they agree).
pub fn differences(proposed: &ChainBatch, recomputed: &ChainBatch) -> Vec<String> {
    let mut out = Vec::new();
    if proposed.fee != recomputed.fee {
        out.push(format!(
            "fee {:?} is not the committee's {:?}",
            proposed.fee, recomputed.fee
        ));
    }
    if proposed.key_epoch != recomputed.key_epoch {
        out.push(format!(
            "key epoch {} is not the contract's current epoch {}",
            proposed.key_epoch, recomputed.key_epoch
        ));
    }
    if proposed.escrows != recomputed.escrows {
        out.push("escrows differ from what the chain reports".to_string());
    }
    if proposed.new_balances != recomputed.new_balances {
        let expected: BTreeMap<_, _> = recomputed.new_balances.iter().copied().collect();
        let mut named = false;
        for (party, amount) in &proposed.new_balances {
            if expected.get(party) != Some(amount) {
                out.push(format!(
                    "new balance of {party} is {amount}, expected {}",
                    expected.get(party).copied().unwrap_or_default()
                ));
                named = true;
            }
        }
        if !named {
            out.push("new balances omit a party the receipts credit".to_string());
        }
    }
    if proposed.balances_root != recomputed.balances_root {
        out.push(format!(
            "balances root {} is not the previous balances plus the receipts ({})",
            proposed.balances_root, recomputed.balances_root
        ));
    }
    if proposed.receipts_root != recomputed.receipts_root {
        out.push(format!(
            "receipts root {} is not the receipts' root ({})",
            proposed.receipts_root, recomputed.receipts_root
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checked::voucher_id;
    use cx_protocol::pq::Identity;
    use cx_protocol::voucher::Parties;
    use k256::ecdsa::SigningKey;

    struct World {
        buyer: SigningKey,
        buyer_identity: Identity,
        exchange: Identity,
        provider: Identity,
    }

    fn world() -> World {
        World {
            buyer: SigningKey::from_slice(&[5; 32]).unwrap(),
            buyer_identity: Identity::from_seed([1; 32]),
            exchange: Identity::from_seed([2; 32]),
            provider: Identity::from_seed([3; 32]),
        }
    }

    fn domain() -> alloy::sol_types::Eip712Domain {
        cx_protocol::order::domain(7, Address::ZERO)
    }

    /// The registry of the tests' one chain, as a signer's: the domain of chain 7 only.
    fn known(chain_id: u64) -> Option<alloy::sol_types::Eip712Domain> {
        (chain_id == 7).then(domain)
    }

    impl World {
        fn buyer(&self) -> Address {
            cx_protocol::order::account_of(&self.buyer)
        }

        fn voucher(&self, escrow_id: u64, nonce: u64, owed: u128) -> Voucher {
            Parties {
                buyer: &self.buyer,
                buyer_identity: &self.buyer_identity,
                exchange: &self.exchange,
                provider: &self.provider,
                payout: Address::repeat_byte(0xaa),
            }
            .intent_job(&domain(), escrow_id, nonce, owed.max(1), owed, owed)
            .unwrap()
        }

        fn escrows(&self, amount: u128, ids: &[u64]) -> HashMap<u64, Escrow> {
            ids.iter()
                .map(|&id| {
                    (
                        id,
                        Escrow {
                            escrow_id: id,
                            buyer: self.buyer(),
                            amount,
                            reclaimable_at_s: u64::MAX,
                        },
                    )
                })
                .collect()
        }
    }

    fn head(nonce: u64) -> Head {
        Head {
            chain_id: 7,
            contract: Address::ZERO,
            key_epoch: 0,
            nonce,
            fee: Fee::default(),
        }
    }

    #[test]
    fn credits_add_up_to_the_settled_escrow_and_accumulate() {
        let w = world();
        let first = assemble(
            head(1),
            vec![w.voucher(0, 1, 60), w.voucher(1, 2, 100)],
            &w.escrows(100, &[0, 1]),
            vec![],
        )
        .unwrap();
        let credited: U256 = first.new_balances.iter().map(|(_, a)| *a).sum();
        assert_eq!(credited, first.settled_amount());
        assert_eq!(
            first.claim_proof(Address::repeat_byte(0xaa)).unwrap().0,
            U256::from(160)
        );
        assert_eq!(first.claim_proof(w.buyer()).unwrap().0, U256::from(40));
        let second = assemble(
            head(2),
            vec![w.voucher(2, 3, 10)],
            &w.escrows(100, &[2]),
            first.new_balances.clone(),
        )
        .unwrap();
        assert_eq!(second.claim_proof(w.buyer()).unwrap().0, U256::from(130));
        assert_eq!(second.message().ranges.len(), 1);
    }

    #[test]
    fn one_tab_pays_many_jobs_and_the_fee_goes_to_the_exchange() {
        let w = world();
        let exchange = Address::repeat_byte(0xee);
        let batch = assemble(
            Head {
                fee: Fee {
                    bps: 250,
                    account: exchange,
                },
                ..head(1)
            },
            vec![
                w.voucher(3, 1, 400),
                w.voucher(3, 2, 199),
                w.voucher(4, 3, 10),
            ],
            &w.escrows(1_000, &[3, 4]),
            vec![],
        )
        .unwrap();
        // Each escrow settles once, in id order, whatever the receipts' order.
        assert_eq!(
            batch
                .escrows
                .iter()
                .map(|e| e.escrow_id)
                .collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert_eq!(batch.settled_amount(), U256::from(2_000));
        let credit = |a: Address| batch.claim_proof(a).map(|(v, _)| v).unwrap_or_default();
        // 2.5% of 400 is 10, of 199 is 4 (rounded down), of 10 is 0.
        assert_eq!(credit(exchange), U256::from(14));
        assert_eq!(
            credit(Address::repeat_byte(0xaa)),
            U256::from(400 + 199 + 10 - 14)
        );
        assert_eq!(credit(w.buyer()), U256::from(2_000 - 609));
        let credited: U256 = batch.new_balances.iter().map(|(_, a)| *a).sum();
        assert_eq!(credited, batch.settled_amount());

        // Together over the tab: refused, naming the escrow.
        let err = assemble(
            head(1),
            vec![w.voucher(3, 1, 600), w.voucher(3, 2, 401)],
            &w.escrows(1_000, &[3]),
            vec![],
        )
        .unwrap_err();
        assert!(err.to_string().contains("escrow 3 claim more"), "{err}");
    }

    #[test]
    fn overclaims_duplicates_and_wrong_buyers_are_refused() {
        let w = world();
        let e = w.escrows(100, &[0, 1]);
        let err = assemble(head(1), vec![w.voucher(0, 1, 101)], &e, vec![]);
        assert!(
            err.unwrap_err()
                .to_string()
                .contains("more than its escrow")
        );
        let twice = w.voucher(0, 1, 1);
        let err = assemble(head(1), vec![twice.clone(), twice], &e, vec![]);
        assert!(err.unwrap_err().to_string().contains("twice"));
        let mut other = e.clone();
        other.get_mut(&0).unwrap().buyer = Address::repeat_byte(1);
        let err = assemble(head(1), vec![w.voucher(0, 1, 1)], &other, vec![]);
        assert!(err.unwrap_err().to_string().contains("names buyer"));
        let err = assemble(
            Head {
                chain_id: 8,
                ..head(1)
            },
            vec![w.voucher(0, 1, 1)],
            &e,
            vec![],
        );
        assert!(err.unwrap_err().to_string().contains("not 8"));
    }

    #[test]
    fn vouchers_are_checked_link_by_link() {
        let w = world();
        let good = w.voucher(0, 1, 5);
        assert!(
            check_vouchers(
                std::slice::from_ref(&good),
                &w.exchange.public(),
                &domain(),
                known
            )
            .is_empty()
        );
        let stranger = Identity::from_seed([9; 32]);
        let reasons = check_vouchers(&[good], &stranger.public(), &domain(), known);
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(reasons[0].contains("assignment"), "{reasons:?}");
    }

    /// A voucher checked as it arrived is not verified again in the signing round, but only the
    /// very voucher under the very domains: one changed in any field, or read under another
    /// chain's domain, is checked afresh and refused; a refused one is never remembered.
    #[test]
    fn a_voucher_checked_ahead_counts_only_for_the_same_bytes_and_domains() {
        let w = world();
        let checked = std::sync::Mutex::new(CheckedVouchers::new(16, 0));
        let good = w.voucher(0, 1, 5);
        let exchange = w.exchange.public();
        let once = |vouchers: &[Voucher], domain: &alloy::sol_types::Eip712Domain| {
            let ids: Vec<B256> = vouchers.iter().map(voucher_id).collect();
            check_vouchers_once(vouchers, &ids, &exchange, domain, known, &checked)
        };
        assert!(once(std::slice::from_ref(&good), &domain()).is_empty());
        assert_eq!(checked.lock().unwrap().len(), 1);
        // Claiming more than the provider signed for: a different voucher, checked and refused.
        let mut inflated = good.clone();
        inflated.receipt.receipt.amount_owed_wei += 1;
        let reasons = once(std::slice::from_ref(&inflated), &domain());
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(reasons[0].contains("receipt"), "{reasons:?}");
        // The same voucher presented as another chain's: its order was not signed there.
        let elsewhere = cx_protocol::order::domain(7, Address::repeat_byte(1));
        assert_eq!(once(std::slice::from_ref(&good), &elsewhere).len(), 1);
        assert_eq!(checked.lock().unwrap().len(), 1, "refusals are not kept");
        // The sums per order are redone whatever was remembered: the remembered voucher twice
        // is owed 10 against its intent's limit of 5.
        let reasons = once(&[good.clone(), good], &domain());
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(reasons[0].contains("over the"), "{reasons:?}");
    }

    #[test]
    fn an_intents_job_and_its_verification_runs_are_owed_together_within_its_limit() {
        let w = world();
        let parties = Parties {
            buyer: &w.buyer,
            buyer_identity: &w.buyer_identity,
            exchange: &w.exchange,
            provider: &w.provider,
            payout: Address::repeat_byte(0xaa),
        };
        let original = parties
            .intent_job(&domain(), 0, 1, 1_000, 500, 500)
            .unwrap();
        let second = Identity::from_seed([6; 32]);
        let replica = Parties {
            provider: &second,
            payout: Address::repeat_byte(0xbb),
            ..parties
        };
        let within = replica.run_job(&original, 1, 500, 500, "output").unwrap();
        assert!(
            check_vouchers(
                &[original.clone(), within],
                &w.exchange.public(),
                &domain(),
                known
            )
            .is_empty()
        );
        // Each link is fine alone (500 ≤ 1,000 each), but together 1,100 > 1,000.
        let over = replica.run_job(&original, 1, 600, 600, "output").unwrap();
        let reasons = check_vouchers(&[original, over], &w.exchange.public(), &domain(), known);
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(
            reasons[0].contains("1100 wei, over the 1000 wei"),
            "{reasons:?}"
        );
    }

    /// What broke: a batch took every pending receipt, and past ~1,500 of them each sign
    /// request was over the 16 MiB frame: refused by the transport, every time, forever. A part
    /// holds at most `MAX_RECEIPTS_PER_BATCH` vouchers, and a full one — with 25,000 parties'
    /// balances — still fits one frame.
    #[test]
    fn a_full_part_fits_one_frame() {
        let w = world();
        let one = w.voucher(0, 1, 1);
        let receipts: Vec<Voucher> = (0..MAX_RECEIPTS_PER_BATCH as u64)
            .map(|id| {
                // Same encoded size as real signatures over this receipt (not checked here).
                let mut r = one.clone();
                r.receipt.receipt.escrow_id = id;
                r.receipt.receipt.job_id[..8].copy_from_slice(&id.to_be_bytes());
                r
            })
            .collect();
        let ids: Vec<u64> = (0..MAX_RECEIPTS_PER_BATCH as u64).collect();
        let previous: Vec<(Address, U256)> = (0..25_000u64)
            .map(|i| {
                let mut a = [0xffu8; 20];
                a[..8].copy_from_slice(&i.to_be_bytes());
                (Address::from(a), U256::from(u64::MAX - i))
            })
            .collect();
        let batch = assemble(head(1), receipts.clone(), &w.escrows(100, &ids), previous).unwrap();
        let bytes = serde_json::to_vec(&batch).unwrap().len();
        // The request around it (signing package of up to 16 signers, the envelope) and the
        // frame's AEAD tag are a few KB.
        let limit = crate::transport::Limits::default().max_frame_bytes;
        assert!(bytes + 64 * 1024 < limit, "{bytes} bytes of {limit}");
        let mut over = receipts;
        over.push(w.voucher(5_000, 2, 1));
        let err = assemble(head(1), over, &w.escrows(100, &[]), vec![]).unwrap_err();
        assert!(err.to_string().contains("over the 400"), "{err}");
    }

    #[test]
    fn a_tampered_balance_is_named() {
        let w = world();
        let e = w.escrows(100, &[0]);
        let honest = assemble(head(1), vec![w.voucher(0, 1, 60)], &e, vec![]).unwrap();
        let mut tampered = honest.clone();
        tampered.new_balances[0].1 += U256::from(1);
        tampered.balances_root = BalancesTree::new(tampered.new_balances.clone())
            .unwrap()
            .root();
        let reasons = differences(&tampered, &honest);
        assert!(
            reasons.iter().any(|r| r.contains("expected")),
            "{reasons:?}"
        );
        assert!(differences(&honest, &honest).is_empty());
    }
}
