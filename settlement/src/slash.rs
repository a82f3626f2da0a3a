//! Slashing evidence the committee can check on its own, and the limits on a slash signature.
//!
//! Two kinds of evidence. [`SlashEvidence::ReplicaDisagreement`]: a class-D job verified by
//! replication (tiers T1 and T3, `cx_protocol::replica`), where receipts of distinct providers,
//! each signed by a key registered on chain, agree on the output and the accused's receipt for
//! the same work differs — the majority of independent stake says its bytes are not the job's.
//! [`SlashEvidence::ConflictingReceipts`]: two receipts one provider signed for one class-D job
//! with different outputs. Class D is bit-reproducible (the same job gives the same bytes), so two outputs for
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
// Evidence is rare and short-lived (checked, signed over, dropped): two receipts inline cost
// nothing worth a box on every access.
#[allow(clippy::large_enum_variant)]
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
    /// Receipts of distinct providers for the same class-D work (job `original` or its
    /// verification runs: same chain, escrow, buyer, input and adapter): the `majority` (at least
    /// two) agree on the output, the `accused` differs. Every signing key must be registered on
    /// chain for its provider, so a majority of throwaway keys is no majority.
    ReplicaDisagreement {
        /// The verified job (run 0): every receipt's job id is it or one of its runs.
        original: B256,
        /// The outvoted provider's receipt.
        accused: SignedReceipt,
        /// The agreeing receipts of the other providers.
        majority: Vec<SignedReceipt>,
    },
}

impl SlashEvidence {
    /// The provider (payout account) the evidence is against.
    pub fn provider(&self) -> Address {
        Address::from(self.accused().receipt.provider)
    }

    /// The provider's ML-DSA key id that signed the evidence.
    pub fn provider_key(&self) -> B256 {
        B256::from(self.accused().receipt.provider_key)
    }

    /// The chain whose escrow the receipts name.
    pub fn chain_id(&self) -> u64 {
        self.accused().receipt.chain_id
    }

    /// A receipt of the provider the evidence is against.
    fn accused(&self) -> &SignedReceipt {
        match self {
            Self::ConflictingReceipts { first, .. } => first,
            Self::ReplicaDisagreement { accused, .. } => accused,
        }
    }

    /// Every (provider, key id) whose key signed a receipt of the evidence: a signer checks
    /// each against the key that provider registered on chain.
    pub fn signers(&self) -> Vec<(Address, B256)> {
        let of = |r: &SignedReceipt| {
            (
                Address::from(r.receipt.provider),
                B256::from(r.receipt.provider_key),
            )
        };
        match self {
            Self::ConflictingReceipts { first, .. } => vec![of(first)],
            Self::ReplicaDisagreement {
                accused, majority, ..
            } => std::iter::once(accused).chain(majority).map(of).collect(),
        }
    }

    /// Checks that every key that signed the evidence is the one its provider registered on
    /// chain: `registered` holds, for each of [`SlashEvidence::signers`]' providers, the key hash
    /// the registry has for it (zero when it has none).
    pub fn check_registered(&self, registered: &[(Address, B256)]) -> Result<(), String> {
        for (provider, key) in self.signers() {
            let on_chain = registered
                .iter()
                .find(|(p, _)| *p == provider)
                .map(|(_, k)| *k);
            if on_chain != Some(key) {
                return Err(format!(
                    "provider {provider} has not registered the key that signed the evidence"
                ));
            }
        }
        Ok(())
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
            // One slash per outvoted receipt, whichever majority outvoted it.
            Self::ReplicaDisagreement { accused, .. } => {
                let mut bytes = b"compute-exchange/slash/replica-disagreement/v1".to_vec();
                bytes.extend_from_slice(&accused.receipt.job_id);
                bytes.extend_from_slice(&accused.receipt.hash());
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
            Self::ReplicaDisagreement {
                original,
                accused,
                majority,
            } => check_disagreement(original.0, accused, majority),
        }
    }
}

/// [`SlashEvidence::check`] of a replica disagreement.
fn check_disagreement(
    original: [u8; 32],
    accused: &SignedReceipt,
    majority: &[SignedReceipt],
) -> Result<(), String> {
    use cx_protocol::replica::{MAX_RUNS, run_of};
    if majority.len() < 2 || majority.len() > usize::from(MAX_RUNS) {
        return Err(format!(
            "a majority is 2..={MAX_RUNS} agreeing receipts besides the accused's, not {}",
            majority.len()
        ));
    }
    let all: Vec<&SignedReceipt> = std::iter::once(accused).chain(majority).collect();
    let mut runs = Vec::with_capacity(all.len());
    let mut providers = Vec::with_capacity(all.len());
    for r in &all {
        r.verify_self_contained()
            .map_err(|e| format!("receipt of job {}: {e}", hex::encode(r.receipt.job_id)))?;
        let run = run_of(original, r.receipt.job_id).ok_or_else(|| {
            format!(
                "receipt of job {} is not job {} or one of its verification runs",
                hex::encode(r.receipt.job_id),
                hex::encode(original)
            )
        })?;
        if runs.contains(&run) {
            return Err(format!("two receipts are for run {run} of the job"));
        }
        runs.push(run);
        if r.receipt.class != DeterminismClass::D {
            return Err(
                "only class-D jobs are bit-reproducible: disagreeing outputs of another class                  are not evidence"
                    .into(),
            );
        }
        let a = &accused.receipt;
        let b = &r.receipt;
        if (
            a.chain_id,
            a.escrow_id,
            a.buyer,
            a.input_hash,
            a.adapter_hash,
        ) != (
            b.chain_id,
            b.escrow_id,
            b.buyer,
            b.input_hash,
            b.adapter_hash,
        ) {
            return Err(
                "the receipts describe different work (escrow, buyer, input or adapter)".into(),
            );
        }
        for (provider, key) in &providers {
            if *provider == b.provider || *key == b.provider_key {
                return Err(
                    "two receipts are by one provider: replicas must be distinct providers".into(),
                );
            }
        }
        providers.push((b.provider, b.provider_key));
    }
    let agreed = majority[0].receipt.output_hash;
    if majority.iter().any(|r| r.receipt.output_hash != agreed) {
        return Err("the majority does not agree on the output".into());
    }
    if accused.receipt.output_hash == agreed {
        return Err("the accused agrees with the majority: nothing conflicts".into());
    }
    Ok(())
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

    /// The receipt `seed`'s provider signs for run `run` of job `[1; 32]` with output `output`.
    fn run_receipt(seed: u8, run: u8, output: u8) -> SignedReceipt {
        let provider = Identity::from_seed([seed; 32]);
        let job_id = match run {
            0 => [1; 32],
            k => cx_protocol::replica::run_job_id([1; 32], k),
        };
        let receipt = Receipt {
            job_id,
            chain_id: 7,
            escrow_id: 3,
            input_hash: [2; 32],
            output_hash: [output; 32],
            adapter_hash: [4; 32],
            tokens: 1,
            compute_ms: 1,
            class: DeterminismClass::D,
            provider: [seed; 20],
            provider_key: provider.id().0,
            amount_owed_wei: 1,
            buyer: [0xbb; 20],
        };
        SignedReceipt::sign(receipt, &provider).unwrap()
    }

    fn disagreement(accused: SignedReceipt, majority: Vec<SignedReceipt>) -> SlashEvidence {
        SlashEvidence::ReplicaDisagreement {
            original: B256::repeat_byte(1),
            accused,
            majority,
        }
    }

    #[test]
    fn an_outvoted_replica_is_evidence_against_its_provider_alone() {
        // Run 0 cheated (output 9); runs 1 and 2 of two other providers agree (output 3).
        let good = disagreement(
            run_receipt(10, 0, 9),
            vec![run_receipt(11, 1, 3), run_receipt(12, 2, 3)],
        );
        good.check().unwrap();
        assert_eq!(good.provider(), Address::repeat_byte(10));
        assert_eq!(good.chain_id(), 7);
        assert_eq!(good.signers().len(), 3, "every key is checked on chain");
        assert_ne!(
            good.hash(),
            SlashEvidence::ConflictingReceipts {
                first: run_receipt(10, 0, 9),
                second: run_receipt(10, 0, 3),
            }
            .hash()
        );
        // The same accused receipt outvoted by the majority in the other order: one evidence.
        let reordered = disagreement(
            run_receipt(10, 0, 9),
            vec![run_receipt(12, 2, 3), run_receipt(11, 1, 3)],
        );
        assert_eq!(good.hash(), reordered.hash());
    }

    #[test]
    fn every_key_of_a_disagreement_must_be_registered_on_chain() {
        let evidence = disagreement(
            run_receipt(10, 0, 9),
            vec![run_receipt(11, 1, 3), run_receipt(12, 2, 3)],
        );
        let registered: Vec<(Address, B256)> = evidence.signers();
        evidence.check_registered(&registered).unwrap();
        // A majority receipt signed by a key its provider never registered (another key on
        // chain, or none at all).
        for changed in [B256::repeat_byte(0xee), B256::ZERO] {
            let mut other = registered.clone();
            other[2].1 = changed;
            let err = evidence.check_registered(&other).unwrap_err();
            assert!(err.contains("has not registered"), "{err}");
        }
        let err = evidence.check_registered(&registered[..2]).unwrap_err();
        assert!(err.contains(&Address::repeat_byte(12).to_string()), "{err}");
    }

    #[test]
    fn a_replica_disagreement_that_proves_nothing_is_refused() {
        let refused = |e: SlashEvidence, why: &str| {
            let err = e.check().unwrap_err();
            assert!(err.contains(why), "{err}");
        };
        // The same provider twice in the "majority" (two of its own runs agree).
        refused(
            disagreement(
                run_receipt(10, 0, 9),
                vec![run_receipt(11, 1, 3), run_receipt(11, 2, 3)],
            ),
            "one provider",
        );
        // The accused counted in its own majority.
        refused(
            disagreement(
                run_receipt(10, 0, 9),
                vec![run_receipt(10, 1, 3), run_receipt(12, 2, 3)],
            ),
            "one provider",
        );
        // A majority that does not agree.
        refused(
            disagreement(
                run_receipt(10, 0, 9),
                vec![run_receipt(11, 1, 3), run_receipt(12, 2, 4)],
            ),
            "does not agree",
        );
        // One agreeing receipt is no majority.
        refused(
            disagreement(run_receipt(10, 0, 9), vec![run_receipt(11, 1, 3)]),
            "majority is",
        );
        // The accused agrees.
        refused(
            disagreement(
                run_receipt(10, 0, 3),
                vec![run_receipt(11, 1, 3), run_receipt(12, 2, 3)],
            ),
            "nothing conflicts",
        );
        // A receipt of unrelated work: another job's id.
        let mut stranger = run_receipt(12, 2, 3);
        stranger.receipt.job_id = [5; 32];
        let stranger =
            SignedReceipt::sign(stranger.receipt, &Identity::from_seed([12; 32])).unwrap();
        refused(
            disagreement(run_receipt(10, 0, 9), vec![run_receipt(11, 1, 3), stranger]),
            "verification runs",
        );
        // A receipt altered after signing.
        let mut forged = run_receipt(12, 2, 3);
        forged.receipt.output_hash = [3; 32];
        forged.receipt.tokens = 99;
        refused(
            disagreement(run_receipt(10, 0, 9), vec![run_receipt(11, 1, 3), forged]),
            "receipt of job",
        );
    }
}
