//! Slashing evidence the committee can check on its own, and the limits on a slash signature.
//!
//! The one kind of evidence: two receipts one provider signed for one class-D job with different
//! outputs. Class D is bit-reproducible (the same job gives the same bytes), so two outputs for
//! one job mean one of them is not the job's result, and both carry the provider's ML-DSA-65
//! signature: no one else can have made them. Every signer checks the pair itself (signatures,
//! same job, same inputs, different outputs, the key registered on chain for that provider) and
//! that the evidence was not used on chain, before it signs `ProviderRegistry.slashDigest`.
//! The digest carries an expiry, so a signature cannot be held back and used much later; a
//! signer refuses one that has passed or that reaches further than [`MAX_SLASH_VALIDITY_S`].

use alloy::primitives::{Address, B256, keccak256};
use cx_protocol::DeterminismClass;
use cx_protocol::receipt::SignedReceipt;
use serde::{Deserialize, Serialize};

/// The longest a slash signature may stay valid (chain time), one day.
pub const MAX_SLASH_VALIDITY_S: u64 = 86_400;

/// Evidence of provider misbehaviour.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SlashEvidence {
    /// Two receipts by one provider for one class-D job with different output hashes.
    ConflictingReceipts {
        /// One receipt.
        first: SignedReceipt,
        /// The other.
        second: SignedReceipt,
    },
}

impl SlashEvidence {
    /// The provider (payout account) the evidence is against.
    pub fn provider(&self) -> Address {
        match self {
            Self::ConflictingReceipts { first, .. } => Address::from(first.receipt.provider),
        }
    }

    /// The provider's ML-DSA key id that signed the evidence.
    pub fn provider_key(&self) -> B256 {
        match self {
            Self::ConflictingReceipts { first, .. } => B256::from(first.receipt.provider_key),
        }
    }

    /// The chain whose escrow the receipts name.
    pub fn chain_id(&self) -> u64 {
        match self {
            Self::ConflictingReceipts { first, .. } => first.receipt.chain_id,
        }
    }

    /// The evidence hash the registry records (once used, never again): keccak256 of a tag, the
    /// job and both receipt hashes in ascending order, so the pair in either order is one piece
    /// of evidence.
    pub fn hash(&self) -> B256 {
        match self {
            Self::ConflictingReceipts { first, second } => {
                let mut hashes = [first.receipt.hash(), second.receipt.hash()];
                hashes.sort_unstable();
                let mut bytes = b"compute-exchange/slash/conflicting-receipts/v1".to_vec();
                bytes.extend_from_slice(&first.receipt.job_id);
                bytes.extend_from_slice(&hashes[0]);
                bytes.extend_from_slice(&hashes[1]);
                keccak256(bytes)
            }
        }
    }

    /// Checks what needs no chain: both signatures, one provider and key, one class-D job with
    /// the same inputs, two different outputs.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Self::ConflictingReceipts { first, second } => {
                for r in [first, second] {
                    r.verify_self_contained().map_err(|e| {
                        format!("receipt of job {}: {e}", hex::encode(r.receipt.job_id))
                    })?;
                }
                let (a, b) = (&first.receipt, &second.receipt);
                if a.job_id != b.job_id {
                    return Err("the receipts are for different jobs".into());
                }
                if (a.provider, a.provider_key) != (b.provider, b.provider_key) {
                    return Err("the receipts are by different providers".into());
                }
                if a.class != DeterminismClass::D || b.class != DeterminismClass::D {
                    return Err(
                        "only class-D jobs are bit-reproducible: conflicting outputs of \
                                another class are not evidence"
                            .into(),
                    );
                }
                if (a.chain_id, a.escrow_id, a.input_hash, a.adapter_hash)
                    != (b.chain_id, b.escrow_id, b.input_hash, b.adapter_hash)
                {
                    return Err(
                        "the receipts describe different work (escrow, input or adapter)".into(),
                    );
                }
                if a.output_hash == b.output_hash {
                    return Err("the receipts agree on the output: nothing conflicts".into());
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cx_protocol::pq::Identity;
    use cx_protocol::receipt::Receipt;

    fn pair(class: DeterminismClass) -> (SignedReceipt, SignedReceipt) {
        let provider = Identity::from_seed([4; 32]);
        let receipt = Receipt {
            job_id: [1; 32],
            chain_id: 7,
            escrow_id: 3,
            input_hash: [2; 32],
            output_hash: [3; 32],
            adapter_hash: [4; 32],
            tokens: 1,
            compute_ms: 1,
            class,
            provider: [0xaa; 20],
            provider_key: provider.id().0,
            amount_owed_wei: 1,
            buyer: [0xbb; 20],
        };
        let mut other = receipt.clone();
        other.output_hash = [9; 32];
        (
            SignedReceipt::sign(receipt, &provider).unwrap(),
            SignedReceipt::sign(other, &provider).unwrap(),
        )
    }

    #[test]
    fn conflicting_class_d_receipts_are_evidence_once_whatever_their_order() {
        let (a, b) = pair(DeterminismClass::D);
        let ab = SlashEvidence::ConflictingReceipts {
            first: a.clone(),
            second: b.clone(),
        };
        let ba = SlashEvidence::ConflictingReceipts {
            first: b.clone(),
            second: a.clone(),
        };
        ab.check().unwrap();
        assert_eq!(ab.hash(), ba.hash());
        let same = SlashEvidence::ConflictingReceipts {
            first: a.clone(),
            second: a.clone(),
        };
        assert!(same.check().unwrap_err().contains("nothing conflicts"));
        let (s1, s2) = pair(DeterminismClass::S);
        let sampled = SlashEvidence::ConflictingReceipts {
            first: s1,
            second: s2,
        };
        assert!(sampled.check().unwrap_err().contains("class-D"));
        let mut forged = b;
        forged.receipt.output_hash = [7; 32];
        let forged = SlashEvidence::ConflictingReceipts {
            first: a,
            second: forged,
        };
        assert!(forged.check().is_err(), "a receipt altered after signing");
    }
}
