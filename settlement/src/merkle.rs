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
            return Err(Error::Merkle("a tree needs at least one leaf".into()));
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
            return Err(Error::Merkle(format!("leaf {index} out of {}", self.len())));
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
                return Err(Error::Merkle(format!("party {party} appears twice")));
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
            .ok_or_else(|| Error::Merkle(format!("party {party} not in tree")))?;
        Ok((self.entries[i].1, self.tree.proof(i)?))
    }

    /// The entries, in leaf order.
    pub fn entries(&self) -> &[(Address, U256)] {
        &self.entries
    }
}
