//! Batch assembly, pure: receipts, the escrows they settle and the previous cumulative balances
//! become one chain's part of a batch.
//!
//! The coordinator calls [`assemble`] to build a batch; every signer calls it again with inputs
//! it fetched itself (escrows and the previous balances root read from the chain, receipts
//! checked against keys registered on chain) and signs only when every field comes out equal.
//! Sharing the function is what makes "the signer re-checks the batch" a recomputation rather
//! than a second, drifting implementation.
//!
//! Money: for each receipt, the provider is credited `amount_owed_wei` and the buyer the rest of
//! the escrow (`escrow − owed`); the escrow's whole amount is what `Settlement.settleBatch` moves
//! into `totalSettled`, so the credits of a batch add up to exactly what it settles. Balances are
//! cumulative (what a party was ever credited on this chain); `Escrow.claim` pays the difference to
//! what it already withdrew. Each chain keeps its own balances: a claim on one chain is paid from
//! that chain's escrows.

use std::collections::{BTreeMap, HashMap, HashSet};

use alloy::primitives::{Address, B256, U256, keccak256};
use cx_protocol::receipt::SignedReceipt;
use serde::{Deserialize, Serialize};

use crate::batch::{BatchMessage, ranges_from_ids};
use crate::error::{Error, Result};
use crate::merkle::{BalancesTree, MerkleTree, receipt_leaf};

/// Receipts one chain's part of a batch holds at most. A signed receipt is ~9 KB of JSON (the
/// ML-DSA-65 signature and key, hex), and a part travels whole in one sign request, which must fit
/// one frame ([`crate::transport::Limits::max_frame_bytes`], 16 MiB): 1,000 receipts are ~9 MB,
/// leaving room for the two cumulative-balances lists (previous and new, ~110 bytes a party
/// each) when they travel: with 25,000 parties on the chain a full part with its lists is
/// 14.7 MB. (Usually they do not: the coordinator sends the root and each signer keeps its own
/// lists; the full lists go only to a signer that lacks them.) More pending receipts settle in more batches (the coordinator takes the oldest
/// first); a signer refuses a part over this size. The test `a_full_part_fits_one_frame` holds
/// these figures to the real encoding.
pub const MAX_RECEIPTS_PER_BATCH: usize = 1_000;

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
    /// The provider-signed receipts, in leaf order.
    pub receipts: Vec<SignedReceipt>,
    /// The escrows the receipts settle, in the same order.
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

/// Builds one chain's batch. `escrows` holds each receipt's escrow as read on chain; `previous`
/// the cumulative balances the contract's current root commits to. Refuses (with the reason) a
/// receipt for another chain, a job or escrow named twice, an escrow whose buyer differs from the
/// receipt's, or an amount owed above the escrow.
pub fn assemble(
    chain_id: u64,
    contract: Address,
    key_epoch: u32,
    nonce: u64,
    receipts: Vec<SignedReceipt>,
    escrows: &HashMap<u64, Escrow>,
    previous: Vec<(Address, U256)>,
) -> Result<ChainBatch> {
    if receipts.is_empty() {
        return Err(refuse("a batch needs at least one receipt".into()));
    }
    if receipts.len() > MAX_RECEIPTS_PER_BATCH {
        return Err(refuse(format!(
            "{} receipts is over the {MAX_RECEIPTS_PER_BATCH} a batch part may hold",
            receipts.len()
        )));
    }
    let mut jobs = HashSet::new();
    let mut escrow_ids = HashSet::new();
    let mut balances: BTreeMap<Address, U256> = BTreeMap::new();
    for (party, amount) in &previous {
        if balances.insert(*party, *amount).is_some() {
            return Err(refuse(format!("previous balances name {party} twice")));
        }
    }
    let mut ordered = Vec::with_capacity(receipts.len());
    let mut leaves = Vec::with_capacity(receipts.len());
    for signed in &receipts {
        let r = &signed.receipt;
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
        if !escrow_ids.insert(r.escrow_id) {
            return Err(refuse(format!("escrow {} appears twice", r.escrow_id)));
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
        if r.amount_owed_wei > escrow.amount {
            return Err(refuse(format!(
                "job {job} claims {} wei owed, more than its escrow of {}",
                r.amount_owed_wei, escrow.amount
            )));
        }
        *balances.entry(Address::from(r.provider)).or_default() += U256::from(r.amount_owed_wei);
        let refund = escrow.amount - r.amount_owed_wei;
        if refund > 0 {
            *balances.entry(buyer).or_default() += U256::from(refund);
        }
        ordered.push(*escrow);
        leaves.push(receipt_leaf(B256::from(r.hash())));
    }
    let new_balances: Vec<(Address, U256)> = balances.into_iter().collect();
    let balances_root = BalancesTree::new(new_balances.clone())?.root();
    Ok(ChainBatch {
        chain_id,
        contract,
        key_epoch,
        nonce,
        receipts,
        escrows: ordered,
        previous_balances: previous,
        new_balances,
        receipts_root: MerkleTree::new(leaves)?.root(),
        balances_root,
    })
}

/// Every difference between a proposed batch and the one recomputed from checked inputs, as
/// reasons a signer can give (empty when they agree).
pub fn differences(proposed: &ChainBatch, recomputed: &ChainBatch) -> Vec<String> {
    let mut out = Vec::new();
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
    use cx_protocol::DeterminismClass;
    use cx_protocol::pq::Identity;
    use cx_protocol::receipt::Receipt;

    fn signed(provider: &Identity, escrow_id: u64, owed: u128) -> SignedReceipt {
        let receipt = Receipt {
            job_id: [escrow_id as u8; 32],
            chain_id: 7,
            escrow_id,
            input_hash: [1; 32],
            output_hash: [2; 32],
            adapter_hash: [3; 32],
            tokens: 100,
            compute_ms: 10,
            class: DeterminismClass::D,
            provider: [0xaa; 20],
            provider_key: provider.id().0,
            amount_owed_wei: owed,
            buyer: [0xbb; 20],
        };
        SignedReceipt::sign(receipt, provider).unwrap()
    }

    fn escrows(amount: u128, ids: &[u64]) -> HashMap<u64, Escrow> {
        ids.iter()
            .map(|&id| {
                (
                    id,
                    Escrow {
                        escrow_id: id,
                        buyer: Address::repeat_byte(0xbb),
                        amount,
                        reclaimable_at_s: u64::MAX,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn credits_add_up_to_the_settled_escrow_and_accumulate() {
        let p = Identity::from_seed([3; 32]);
        let first = assemble(
            7,
            Address::ZERO,
            0,
            1,
            vec![signed(&p, 0, 60), signed(&p, 1, 100)],
            &escrows(100, &[0, 1]),
            vec![],
        )
        .unwrap();
        let credited: U256 = first.new_balances.iter().map(|(_, a)| *a).sum();
        assert_eq!(credited, first.settled_amount());
        assert_eq!(
            first.claim_proof(Address::repeat_byte(0xaa)).unwrap().0,
            U256::from(160)
        );
        assert_eq!(
            first.claim_proof(Address::repeat_byte(0xbb)).unwrap().0,
            U256::from(40)
        );
        let second = assemble(
            7,
            Address::ZERO,
            0,
            2,
            vec![signed(&p, 2, 10)],
            &escrows(100, &[2]),
            first.new_balances.clone(),
        )
        .unwrap();
        assert_eq!(
            second.claim_proof(Address::repeat_byte(0xbb)).unwrap().0,
            U256::from(130)
        );
        assert_eq!(second.message().ranges.len(), 1);
    }

    #[test]
    fn overclaims_duplicates_and_wrong_buyers_are_refused() {
        let p = Identity::from_seed([3; 32]);
        let e = escrows(100, &[0, 1]);
        let err = assemble(7, Address::ZERO, 0, 1, vec![signed(&p, 0, 101)], &e, vec![]);
        assert!(
            err.unwrap_err()
                .to_string()
                .contains("more than its escrow")
        );
        let err = assemble(
            7,
            Address::ZERO,
            0,
            1,
            vec![signed(&p, 0, 1), signed(&p, 0, 1)],
            &e,
            vec![],
        );
        assert!(err.unwrap_err().to_string().contains("twice"));
        let mut other = e.clone();
        other.get_mut(&0).unwrap().buyer = Address::repeat_byte(1);
        let err = assemble(
            7,
            Address::ZERO,
            0,
            1,
            vec![signed(&p, 0, 1)],
            &other,
            vec![],
        );
        assert!(err.unwrap_err().to_string().contains("names buyer"));
        let err = assemble(8, Address::ZERO, 0, 1, vec![signed(&p, 0, 1)], &e, vec![]);
        assert!(err.unwrap_err().to_string().contains("not 8"));
    }

    /// What broke: a batch took every pending receipt, and past ~1,500 of them each sign
    /// request was over the 16 MiB frame: refused by the transport, every time, forever. A part
    /// holds at most `MAX_RECEIPTS_PER_BATCH`, and a full one — with 25,000 parties' balances
    /// — still fits one frame.
    #[test]
    fn a_full_part_fits_one_frame() {
        let p = Identity::from_seed([3; 32]);
        let one = signed(&p, 0, 1);
        let receipts: Vec<SignedReceipt> = (0..MAX_RECEIPTS_PER_BATCH as u64)
            .map(|id| {
                // Same encoded size as a real signature over this receipt (not checked here).
                let mut r = one.clone();
                r.receipt.escrow_id = id;
                r.receipt.job_id[..8].copy_from_slice(&id.to_be_bytes());
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
        let batch = assemble(
            7,
            Address::ZERO,
            0,
            1,
            receipts.clone(),
            &escrows(100, &ids),
            previous,
        )
        .unwrap();
        let bytes = serde_json::to_vec(&batch).unwrap().len();
        // The request around it (signing package of up to 16 signers, the envelope) and the
        // frame's AEAD tag are a few KB.
        let limit = crate::transport::Limits::default().max_frame_bytes;
        assert!(bytes + 64 * 1024 < limit, "{bytes} bytes of {limit}");
        let mut over = receipts;
        over.push(signed(&p, 5_000, 1));
        let err = assemble(7, Address::ZERO, 0, 1, over, &escrows(100, &[]), vec![]).unwrap_err();
        assert!(err.to_string().contains("over the 1000"), "{err}");
    }

    #[test]
    fn a_tampered_balance_is_named() {
        let p = Identity::from_seed([3; 32]);
        let e = escrows(100, &[0]);
        let honest = assemble(7, Address::ZERO, 0, 1, vec![signed(&p, 0, 60)], &e, vec![]).unwrap();
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
