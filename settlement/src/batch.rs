//! The batch message: what the committee signs and `Settlement.settleBatch` checks.
//!
//! The digest is keccak256 of the ABI encoding of (BATCH_TAG, chain id, contract address, key
//! epoch, nonce, receipts root, balances root, keccak256 of the packed settled ranges), byte for
//! byte what `Settlement.batchDigest` computes; the 32-byte digest is the FROST message. Binding
//! chain id and contract stops cross-chain and cross-deployment replay; the strictly increasing
//! nonce stops replay on the same contract; the key epoch stops a batch signed under one epoch
//! from landing under another (a key rotated away and back).

use alloy::primitives::{Address, B256, U256, keccak256};
use alloy::sol_types::SolValue;

/// Domain tag of batch messages (`Settlement.BATCH_TAG`).
pub fn batch_tag() -> B256 {
    keccak256(b"compute-exchange/settlement/batch/v2")
}

/// Domain tag of group-key rotations (`Settlement.ROTATE_TAG`).
pub fn rotate_tag() -> B256 {
    keccak256(b"compute-exchange/settlement/rotate-key/v1")
}

/// Domain tag of slash messages (`ProviderRegistry.SLASH_TAG`).
pub fn slash_tag() -> B256 {
    keccak256(b"compute-exchange/registry/slash/v2")
}

/// A contiguous range of escrow ids `[start, end)` settled by a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobRange {
    /// First id.
    pub start: u64,
    /// One past the last id.
    pub end: u64,
}

impl JobRange {
    /// The contract's packing: `start << 64 | end`.
    pub fn packed(self) -> U256 {
        (U256::from(self.start) << 64) | U256::from(self.end)
    }

    /// Number of jobs.
    pub fn len(self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// True when the range holds no job.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }
}

/// The fewest ranges covering `job_ids` exactly (ids sorted and deduplicated first).
pub fn ranges_from_ids(job_ids: &[u64]) -> Vec<JobRange> {
    let mut ids = job_ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut ranges: Vec<JobRange> = Vec::new();
    for id in ids {
        match ranges.last_mut() {
            Some(r) if r.end == id => r.end += 1,
            _ => ranges.push(JobRange {
                start: id,
                end: id + 1,
            }),
        }
    }
    ranges
}

/// One settlement batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchMessage {
    /// Chain the batch is for.
    pub chain_id: u64,
    /// The `Settlement` contract.
    pub contract: Address,
    /// The contract's group-key epoch the batch is signed under (`groupKey().epoch`).
    pub key_epoch: u32,
    /// Strictly increasing batch nonce.
    pub nonce: u64,
    /// Merkle root of the batch's receipts.
    pub receipts_root: B256,
    /// Merkle root of every party's cumulative credits after this batch.
    pub balances_root: B256,
    /// Escrows this batch settles.
    pub ranges: Vec<JobRange>,
}

impl BatchMessage {
    /// The ranges as the contract takes them.
    pub fn packed_ranges(&self) -> Vec<U256> {
        self.ranges.iter().map(|r| r.packed()).collect()
    }

    /// The 32-byte message the committee signs (`Settlement.batchDigest`).
    pub fn digest(&self) -> B256 {
        let packed: Vec<u8> = self
            .packed_ranges()
            .iter()
            .flat_map(|r| r.to_be_bytes::<32>())
            .collect();
        keccak256(
            (
                batch_tag(),
                U256::from(self.chain_id),
                self.contract,
                U256::from(self.key_epoch),
                self.nonce,
                self.receipts_root,
                self.balances_root,
                keccak256(packed),
            )
                .abi_encode_params(),
        )
    }
}

/// The message a group-key rotation signs (`Settlement.rotationDigest`).
pub fn rotation_digest(
    chain_id: u64,
    contract: Address,
    epoch: u32,
    new_x: U256,
    new_parity: u8,
) -> B256 {
    keccak256(
        (
            rotate_tag(),
            U256::from(chain_id),
            contract,
            U256::from(epoch),
            new_x,
            U256::from(new_parity),
        )
            .abi_encode_params(),
    )
}

/// The message a slash signs (`ProviderRegistry.slashDigest`): it binds the chain, the
/// registry, the terms, the evidence and an expiry (unix seconds) after which the contract
/// refuses it.
pub fn slash_digest(
    chain_id: u64,
    registry: Address,
    provider: Address,
    amount: U256,
    recipient: Address,
    evidence_hash: B256,
    expires_at_s: u64,
) -> B256 {
    keccak256(
        (
            slash_tag(),
            U256::from(chain_id),
            registry,
            provider,
            amount,
            recipient,
            evidence_hash,
            U256::from(expires_at_s),
        )
            .abi_encode_params(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_ids_exactly() {
        let ranges = ranges_from_ids(&[9, 3, 4, 5, 5, 11, 10, 0]);
        assert_eq!(
            ranges,
            vec![
                JobRange { start: 0, end: 1 },
                JobRange { start: 3, end: 6 },
                JobRange { start: 9, end: 12 }
            ]
        );
        assert_eq!(ranges.iter().map(|r| r.len()).sum::<u64>(), 7);
        assert!(ranges_from_ids(&[]).is_empty());
    }

    #[test]
    fn packing_matches_the_contract() {
        let r = JobRange {
            start: 256,
            end: 300,
        };
        assert_eq!(r.packed(), (U256::from(256u64) << 64) + U256::from(300u64));
    }

    #[test]
    fn digest_binds_every_field() {
        let base = BatchMessage {
            chain_id: 31337,
            contract: Address::repeat_byte(0xcc),
            key_epoch: 0,
            nonce: 1,
            receipts_root: B256::repeat_byte(1),
            balances_root: B256::repeat_byte(2),
            ranges: vec![JobRange { start: 0, end: 10 }],
        };
        let d = base.digest();
        let variants = [
            BatchMessage {
                chain_id: 31338,
                ..base.clone()
            },
            BatchMessage {
                contract: Address::repeat_byte(0xcd),
                ..base.clone()
            },
            BatchMessage {
                key_epoch: 1,
                ..base.clone()
            },
            BatchMessage {
                nonce: 2,
                ..base.clone()
            },
            BatchMessage {
                receipts_root: B256::repeat_byte(3),
                ..base.clone()
            },
            BatchMessage {
                balances_root: B256::repeat_byte(3),
                ..base.clone()
            },
            BatchMessage {
                ranges: vec![JobRange { start: 0, end: 11 }],
                ..base.clone()
            },
        ];
        for v in variants {
            assert_ne!(v.digest(), d, "{v:?}");
        }
    }
}
