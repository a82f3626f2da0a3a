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
//!
//! What a slash takes and who receives it are not the requester's to choose: [`SlashPolicy`],
//! pinned in each signer's market terms and in the exchange's settlement config, makes them a
//! function of the evidence alone — a stated multiple of the price the accused itself signed for
//! the job, paid to a fixed account (the burn address by default). The exchange asks for exactly
//! [`SlashPolicy::terms`], and every signer recomputes it ([`SlashPolicy::check`]) and refuses
//! anything else. Why: a slash paid to the buyer pays a buyer who can outvote an honest provider
//! with providers of its own, and a slash of any amount lets a compromised exchange take whole
//! stakes; bounded and paid away from every party of the job, framing someone pays nobody.

use alloy::primitives::{Address, B256, U256, address, keccak256};
use cx_protocol::DeterminismClass;
use cx_protocol::receipt::SignedReceipt;
use serde::{Deserialize, Serialize};

/// The longest a slash signature may stay valid (chain time), one day.
pub const MAX_SLASH_VALIDITY_S: u64 = 86_400;

/// Where slashed stake goes unless the terms name another account: an address no key controls.
pub const BURN_ADDRESS: Address = address!("0x000000000000000000000000000000000000dEaD");

/// The multiple of the accused job's price a slash takes unless the terms say otherwise.
pub const DEFAULT_SLASH_MULTIPLE: u32 = 10;

/// The largest multiple any terms may name: a signer refuses a config above it, so one mistyped
/// or hostile term cannot turn a small job into a whole stake.
pub const MAX_SLASH_MULTIPLE: u32 = 100;

/// What a slash takes and who receives it, as a market term (every signer pins it; the exchange
/// asks with the same terms): `multiple` × the price the accused signed for the job (its
/// receipt's `amount_owed_wei`; of two conflicting receipts the larger), paid to `recipient`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlashPolicy {
    /// The multiple of the job's price taken, 1..=[`MAX_SLASH_MULTIPLE`].
    pub multiple: u32,
    /// Who receives what is taken: a burn address or an insurance account, never a party the
    /// exchange names per slash.
    pub recipient: Address,
}

impl Default for SlashPolicy {
    fn default() -> Self {
        Self {
            multiple: DEFAULT_SLASH_MULTIPLE,
            recipient: BURN_ADDRESS,
        }
    }
}

impl SlashPolicy {
    /// Refuses terms no slash may be signed under: a multiple of zero or above
    /// [`MAX_SLASH_MULTIPLE`], or the zero recipient (the registry refuses it).
    pub fn validate(&self) -> Result<(), String> {
        if self.multiple == 0 || self.multiple > MAX_SLASH_MULTIPLE {
            return Err(format!(
                "the slash multiple must be 1..={MAX_SLASH_MULTIPLE}, not {}",
                self.multiple
            ));
        }
        if self.recipient.is_zero() {
            return Err("the slash recipient must not be the zero address".into());
        }
        Ok(())
    }

    /// The price of the accused job as the accused signed it: its receipt's amount owed (of two
    /// conflicting receipts, the larger: both are its own word).
    pub fn price_wei(evidence: &SlashEvidence) -> U256 {
        match evidence {
            SlashEvidence::ConflictingReceipts { first, second } => U256::from(
                first
                    .receipt
                    .amount_owed_wei
                    .max(second.receipt.amount_owed_wei),
            ),
            SlashEvidence::ReplicaDisagreement { accused, .. } => {
                U256::from(accused.receipt.amount_owed_wei)
            }
        }
    }

    /// The amount and recipient of the slash `evidence` warrants under these terms: the one
    /// function both the exchange (asking) and every signer (checking) compute.
    pub fn terms(&self, evidence: &SlashEvidence) -> Result<(U256, Address), String> {
        self.validate()?;
        let amount = Self::price_wei(evidence).saturating_mul(U256::from(self.multiple));
        if amount.is_zero() {
            return Err("the accused job's price is zero: there is nothing to slash".into());
        }
        Ok((amount, self.recipient))
    }

    /// Refuses a slash request whose amount or recipient is not exactly [`SlashPolicy::terms`].
    pub fn check(
        &self,
        evidence: &SlashEvidence,
        amount: U256,
        recipient: Address,
    ) -> Result<(), String> {
        let (bound, to) = self.terms(evidence)?;
        if amount != bound {
            return Err(format!(
                "the slash asks {amount} wei; this signer's terms take exactly {bound} wei \
                 ({}x the job's price {})",
                self.multiple,
                Self::price_wei(evidence)
            ));
        }
        if recipient != to {
            return Err(format!(
                "the slash pays {recipient}; this signer's terms pay slashed stake to {to} only"
            ));
        }
        Ok(())
    }
}

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

    /// Checks that every key that signed the evidence answers for its provider on chain
    /// (`ProviderRegistry.keyAnswers`: the registered key, or one replaced less than the
    /// unbonding delay ago — a provider that changes keys after signing a wrong result is still
    /// answerable for it): `answers` holds, for each of [`SlashEvidence::signers`], whether the
    /// registry says its key answers for its provider.
    pub fn check_keys_answer(&self, answers: &[(Address, B256, bool)]) -> Result<(), String> {
        for (provider, key) in self.signers() {
            let answers = answers
                .iter()
                .any(|(p, k, answers)| *p == provider && *k == key && *answers);
            if !answers {
                return Err(format!(
                    "provider {provider} has not registered the key {key} that signed the \
                     evidence (nor replaced it within the unbonding delay)"
                ));
            }
        }
        Ok(())
    }

    /// The providers whose agreement the evidence rests on (a replica disagreement's majority;
    /// none for conflicting receipts, which rest on the accused's own signatures).
    pub fn witnesses(&self) -> Vec<Address> {
        match self {
            Self::ConflictingReceipts { .. } => Vec::new(),
            Self::ReplicaDisagreement { majority, .. } => majority
                .iter()
                .map(|r| Address::from(r.receipt.provider))
                .collect(),
        }
    }

    /// Checks that every witness ([`SlashEvidence::witnesses`]) is a distinct provider with at
    /// least `min_stake` (and something) at stake on chain: `staked` holds what the registry has
    /// for each. A majority counts registered, staked identities, never throwaway accounts.
    pub fn check_staked(&self, staked: &[(Address, U256)], min_stake: U256) -> Result<(), String> {
        let witnesses = self.witnesses();
        for (i, provider) in witnesses.iter().enumerate() {
            if witnesses[..i].contains(provider) {
                return Err(format!(
                    "provider {provider} appears twice in the majority: it counts once"
                ));
            }
            let stake = staked
                .iter()
                .find(|(p, _)| p == provider)
                .map_or(U256::ZERO, |(_, s)| *s);
            if stake.is_zero() || stake < min_stake {
                return Err(format!(
                    "provider {provider} of the majority has {stake} wei at stake, below the \
                     registry's minimum {min_stake}: an unstaked identity is no vote"
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
    fn every_key_of_a_disagreement_must_answer_for_its_provider_on_chain() {
        let evidence = disagreement(
            run_receipt(10, 0, 9),
            vec![run_receipt(11, 1, 3), run_receipt(12, 2, 3)],
        );
        let answering: Vec<(Address, B256, bool)> = evidence
            .signers()
            .into_iter()
            .map(|(p, k)| (p, k, true))
            .collect();
        evidence.check_keys_answer(&answering).unwrap();
        // A majority receipt signed by a key that does not answer for its provider (never
        // registered, or replaced longer than the unbonding delay ago).
        let mut stale = answering.clone();
        stale[2].2 = false;
        let err = evidence.check_keys_answer(&stale).unwrap_err();
        assert!(err.contains("has not registered"), "{err}");
        // An answer about another key of the same provider proves nothing about this one.
        let mut other = answering.clone();
        other[2].1 = B256::repeat_byte(0xee);
        assert!(evidence.check_keys_answer(&other).is_err());
        let err = evidence.check_keys_answer(&answering[..2]).unwrap_err();
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

    /// What broke: a signer checked only that a slash's amount and recipient were non-zero, so
    /// the exchange could ask `U256::MAX` of an outvoted provider's stake paid to the buyer (a
    /// buyer who outvotes an honest provider with two of its own took the whole stake), or to
    /// itself. Now the amount is exactly the pinned multiple of the accused's signed price and
    /// the recipient exactly the pinned account; anything else is refused.
    #[test]
    fn a_signer_refuses_a_slash_above_the_bound_or_to_another_recipient() {
        let evidence = disagreement(
            run_receipt(10, 0, 9),
            vec![run_receipt(11, 1, 3), run_receipt(12, 2, 3)],
        );
        let terms = SlashPolicy::default();
        let (amount, recipient) = terms.terms(&evidence).unwrap();
        // The receipts above owe 1 wei: ten times it, burnt.
        assert_eq!(amount, U256::from(10));
        assert_eq!(recipient, BURN_ADDRESS);
        terms.check(&evidence, amount, recipient).unwrap();
        let buyer = Address::repeat_byte(0xbb);
        for (amount, recipient, why) in [
            (U256::MAX, recipient, "take exactly"),
            (amount + U256::from(1), recipient, "take exactly"),
            (amount - U256::from(1), recipient, "take exactly"),
            (amount, buyer, "pay slashed stake to"),
            (amount, Address::repeat_byte(0xee), "pay slashed stake to"),
        ] {
            let err = terms.check(&evidence, amount, recipient).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        // An insurance account and another multiple, as a market pins them.
        let insured = SlashPolicy {
            multiple: 3,
            recipient: Address::repeat_byte(0x1c),
        };
        insured
            .check(&evidence, U256::from(3), Address::repeat_byte(0x1c))
            .unwrap();
        // Terms no signer may hold: no multiple, an unbounded one, the zero recipient.
        for bad in [
            SlashPolicy {
                multiple: 0,
                ..terms
            },
            SlashPolicy {
                multiple: MAX_SLASH_MULTIPLE + 1,
                ..terms
            },
            SlashPolicy {
                recipient: Address::ZERO,
                ..terms
            },
        ] {
            assert!(bad.terms(&evidence).is_err(), "{bad:?}");
        }
        // The terms as JSON: absent means the defaults.
        let market: crate::config::MarketTerms = serde_json::from_value(serde_json::json!({
            "exchange_key": "00", "fee": {"bps": 0, "account": Address::ZERO},
        }))
        .unwrap();
        assert_eq!(market.slash, SlashPolicy::default());
    }

    #[test]
    fn a_majority_counts_distinct_staked_providers_only() {
        let evidence = disagreement(
            run_receipt(10, 0, 9),
            vec![run_receipt(11, 1, 3), run_receipt(12, 2, 3)],
        );
        let min = U256::from(100);
        let staked = |a: u64, b: u64| {
            vec![
                (Address::repeat_byte(11), U256::from(a)),
                (Address::repeat_byte(12), U256::from(b)),
            ]
        };
        evidence.check_staked(&staked(100, 500), min).unwrap();
        for (a, b) in [(0, 500), (100, 99)] {
            let err = evidence.check_staked(&staked(a, b), min).unwrap_err();
            assert!(err.contains("is no vote"), "{err}");
        }
        let err = evidence
            .check_staked(&staked(100, 500)[..1], min)
            .unwrap_err();
        assert!(err.contains("is no vote"), "{err}");
        // Conflicting receipts rest on the accused's signatures alone: no witnesses.
        let (a, b) = pair(DeterminismClass::D);
        let own = SlashEvidence::ConflictingReceipts {
            first: a,
            second: b,
        };
        assert!(own.witnesses().is_empty());
        own.check_staked(&[], min).unwrap();
    }
}
