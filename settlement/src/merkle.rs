//! Merkle trees of receipts and of cumulative balances, identical to the contracts' checks.
//!
//! Convention (OpenZeppelin's `MerkleProof`, which `Escrow.claim` calls): an inner node is
//! keccak256 of its two children sorted ascending (so a proof needs no left/right flags); a level
//! with an odd number of nodes promotes its last node unchanged. Leaves are hashed twice
//! (keccak256(keccak256(abi.encode(...)))) so that no inner node, being the hash of 64 bytes, can
//! be passed off as a leaf.

use std::collections::HashMap;

use alloy::primitives::{Address, B256, U256, keccak256};
use alloy::sol_types::SolValue;

use crate::error::{Error, Result};

/// keccak256 of the sorted pair.
pub fn hash_pair(a: B256, b: B256) -> B256 {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let mut buf = [0u8; 64];
    buf[..32].copy_from_slice(lo.as_slice());
    buf[32..].copy_from_slice(hi.as_slice());
    keccak256(buf)
}

/// Leaf of the cumulative-balances tree: `Escrow.balanceLeaf(party, cumulative)`.
pub fn balance_leaf(party: Address, cumulative: U256) -> B256 {
    keccak256(keccak256((party, cumulative).abi_encode_params()))
}

/// Leaf of the receipts tree for a receipt's hash.
pub fn receipt_leaf(receipt_hash: B256) -> B256 {
    keccak256(keccak256(receipt_hash.as_slice()))
}

/// A Merkle tree over given leaves; keeps every level so proofs are lookups.
#[derive(Clone, Debug)]
pub struct MerkleTree {
    levels: Vec<Vec<B256>>,
}

impl MerkleTree {
    /// Builds the tree; refuses an empty leaf list (a batch always has at least one leaf).
    pub fn new(leaves: Vec<B256>) -> Result<Self> {
        if leaves.is_empty() {
            return Err(Error::EmptyTree);
        }
        let mut levels = vec![leaves];
        while levels.last().map_or(0, Vec::len) > 1 {
            let level = levels.last().expect("non-empty");
            let next = level
                .chunks(2)
                .map(|pair| {
                    if pair.len() == 2 {
                        hash_pair(pair[0], pair[1])
                    } else {
                        pair[0]
                    }
                })
                .collect();
            levels.push(next);
        }
        Ok(Self { levels })
    }

    /// The root.
    pub fn root(&self) -> B256 {
        self.levels.last().expect("non-empty")[0]
    }

    /// Number of leaves.
    pub fn len(&self) -> usize {
        self.levels[0].len()
    }

    /// Always false (a tree has at least one leaf); here for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Sibling hashes from leaf `index` up to the root.
    pub fn proof(&self, mut index: usize) -> Result<Vec<B256>> {
        if index >= self.len() {
            return Err(Error::LeafOutOfRange {
                index,
                len: self.len(),
            });
        }
        let mut proof = Vec::new();
        for level in &self.levels[..self.levels.len() - 1] {
            let sibling = index ^ 1;
            if sibling < level.len() {
                proof.push(level[sibling]);
            }
            index /= 2;
        }
        Ok(proof)
    }

    /// Whether `proof` leads from `leaf` to `root` (what the contract computes).
    pub fn verify(root: B256, leaf: B256, proof: &[B256]) -> bool {
        proof
            .iter()
            .fold(leaf, |acc, sibling| hash_pair(acc, *sibling))
            == root
    }
}

/// The tree of every party's cumulative credited amount, with lookups by party.
#[derive(Clone, Debug)]
pub struct BalancesTree {
    tree: MerkleTree,
    entries: Vec<(Address, U256)>,
    index: HashMap<Address, usize>,
}

impl BalancesTree {
    /// Builds the tree from (party, cumulative amount) entries; each party at most once.
    pub fn new(entries: Vec<(Address, U256)>) -> Result<Self> {
        let mut index = HashMap::with_capacity(entries.len());
        for (i, (party, _)) in entries.iter().enumerate() {
            if index.insert(*party, i).is_some() {
                return Err(Error::DuplicateParty { party: *party });
            }
        }
        let tree = MerkleTree::new(entries.iter().map(|(p, a)| balance_leaf(*p, *a)).collect())?;
        Ok(Self {
            tree,
            entries,
            index,
        })
    }

    /// The root the batch posts.
    pub fn root(&self) -> B256 {
        self.tree.root()
    }

    /// `party`'s cumulative amount and its proof.
    pub fn proof_for(&self, party: Address) -> Result<(U256, Vec<B256>)> {
        let i = *self
            .index
            .get(&party)
            .ok_or(Error::PartyNotInTree { party })?;
        Ok((self.entries[i].1, self.tree.proof(i)?))
    }

    /// The entries, in leaf order.
    pub fn entries(&self) -> &[(Address, U256)] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: usize) -> Vec<B256> {
        (0..n)
            .map(|i| keccak256((i as u64).to_be_bytes()))
            .collect()
    }

    #[test]
    fn every_proof_verifies_for_every_size_and_index() {
        for n in 1..=33 {
            let tree = MerkleTree::new(leaves(n)).unwrap();
            for i in 0..n {
                let proof = tree.proof(i).unwrap();
                assert!(
                    MerkleTree::verify(tree.root(), leaves(n)[i], &proof),
                    "n={n} i={i}"
                );
                // The proof of one leaf does not prove a neighbour.
                if n > 1 {
                    let other = leaves(n)[(i + 1) % n];
                    assert!(
                        !MerkleTree::verify(tree.root(), other, &proof),
                        "n={n} i={i}"
                    );
                }
            }
            assert!(tree.proof(n).is_err());
        }
    }

    #[test]
    fn a_tampered_sibling_breaks_the_proof() {
        let tree = MerkleTree::new(leaves(10)).unwrap();
        let mut proof = tree.proof(3).unwrap();
        proof[1] = B256::repeat_byte(0xee);
        assert!(!MerkleTree::verify(tree.root(), leaves(10)[3], &proof));
    }

    #[test]
    fn balances_tree_refuses_duplicates_and_proves_amounts() {
        let a = Address::repeat_byte(1);
        let b = Address::repeat_byte(2);
        assert!(BalancesTree::new(vec![(a, U256::from(1)), (a, U256::from(2))]).is_err());
        let tree = BalancesTree::new(vec![(a, U256::from(5)), (b, U256::from(7))]).unwrap();
        let (amount, proof) = tree.proof_for(b).unwrap();
        assert_eq!(amount, U256::from(7));
        assert!(MerkleTree::verify(
            tree.root(),
            balance_leaf(b, amount),
            &proof
        ));
        assert!(!MerkleTree::verify(
            tree.root(),
            balance_leaf(b, amount + U256::from(1)),
            &proof
        ));
        assert!(tree.proof_for(Address::repeat_byte(3)).is_err());
    }

    #[test]
    fn empty_tree_is_refused() {
        assert!(MerkleTree::new(Vec::new()).is_err());
    }
}
