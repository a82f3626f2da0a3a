//! Provider-signed receipts: what a provider attests it did for one job, and what it is owed.
//!
//! A receipt names the job (the exchange's 32-byte job id, and the per-job escrow that pays for
//! it: chain id and escrow id), what went in and came out (SHA-256 of input, output and adapter),
//! how much work it was (tokens, compute milliseconds, determinism class), who did it (the
//! provider's payout account and its ML-DSA identity) and the money: the amount the provider is
//! owed in wei and the buyer whose escrow pays it (the rest of the escrow returns to the buyer).
//!
//! The signature is ML-DSA-65 (FIPS 204) over the canonical encoding below, with the FIPS 204
//! context `cx-receipt-v1`, so a receipt signature never verifies as a session transcript or an
//! order and vice versa. The encoding is fixed-width and big-endian, so two parties that hold the
//! same receipt compute the same bytes without agreeing on a serializer:
//!
//! ```text
//! "CXR1" ‖ job_id 32 ‖ chain_id u64 ‖ escrow_id u64 ‖ input_hash 32 ‖ output_hash 32 ‖
//! adapter_hash 32 ‖ tokens u64 ‖ compute_ms u64 ‖ class u8 (D 0, D∞ 1, S 2) ‖ provider 20 ‖
//! provider_key 32 ‖ amount_owed_wei u128 ‖ buyer 20
//! ```
//!
//! ```
//! use cx_protocol::DeterminismClass;
//! use cx_protocol::pq::Identity;
//! use cx_protocol::receipt::{Receipt, SignedReceipt};
//!
//! let provider = Identity::from_seed([7; 32]);
//! let receipt = Receipt {
//!     job_id: [1; 32], chain_id: 31337, escrow_id: 0,
//!     input_hash: [2; 32], output_hash: [3; 32], adapter_hash: [4; 32],
//!     tokens: 128, compute_ms: 40, class: DeterminismClass::D,
//!     provider: [0x11; 20], provider_key: provider.id().0,
//!     amount_owed_wei: 900, buyer: [0x22; 20],
//! };
//! let signed = SignedReceipt::sign(receipt, &provider).unwrap();
//! signed.verify(&provider.public()).unwrap();
//! let mut forged = signed.clone();
//! forged.receipt.amount_owed_wei = 1_000;
//! assert!(forged.verify(&provider.public()).is_err());
//! ```

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::class::DeterminismClass;
use crate::error::{Error, Result};
use crate::order::{Address, B256, InferenceRequest, request_hash};
use crate::pq::{Identity, PublicIdentity};

/// FIPS 204 context of receipt signatures.
pub const RECEIPT_CONTEXT: &[u8] = b"cx-receipt-v1";
const MAGIC: &[u8; 4] = b"CXR1";
/// Bytes of [`Receipt::canonical_bytes`].
pub const RECEIPT_BYTES: usize = 4 + 32 + 8 + 8 + 32 * 3 + 8 + 8 + 1 + 20 + 32 + 16 + 20;

/// Fixed-size byte arrays as lowercase hex in JSON.
pub(crate) mod hex_array {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer, const N: usize>(
        bytes: &[u8; N],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        d: D,
    ) -> Result<[u8; N], D::Error> {
        let text = String::deserialize(d)?;
        let text = text.strip_prefix("0x").unwrap_or(&text);
        let bytes = hex::decode(text).map_err(D::Error::custom)?;
        bytes
            .try_into()
            .map_err(|b: Vec<u8>| D::Error::custom(format!("expected {N} bytes, got {}", b.len())))
    }
}

/// Byte strings as lowercase hex in JSON.
pub(crate) mod hex_vec {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(text.strip_prefix("0x").unwrap_or(&text)).map_err(D::Error::custom)
    }
}

pub use crate::price::wei_string;

/// What a provider attests for one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The exchange's job id.
    #[serde(with = "hex_array")]
    pub job_id: [u8; 32],
    /// EIP-155 id of the chain holding the job's escrow.
    pub chain_id: u64,
    /// The escrow's id on that chain's `Settlement` contract.
    pub escrow_id: u64,
    /// SHA-256 of the job's input.
    #[serde(with = "hex_array")]
    pub input_hash: [u8; 32],
    /// SHA-256 of the job's output.
    #[serde(with = "hex_array")]
    pub output_hash: [u8; 32],
    /// Content id of the adapter the job ran with.
    #[serde(with = "hex_array")]
    pub adapter_hash: [u8; 32],
    /// Tokens processed (prompt and generated).
    pub tokens: u64,
    /// Compute time in milliseconds.
    pub compute_ms: u64,
    /// Determinism class the work was done in.
    pub class: DeterminismClass,
    /// The provider's payout account (EVM address).
    #[serde(with = "hex_array")]
    pub provider: [u8; 20],
    /// SHA-256 of the provider's ML-DSA verification key (its `IdentityId`), as registered on chain.
    #[serde(with = "hex_array")]
    pub provider_key: [u8; 32],
    /// What the provider is owed, in wei of the escrow's asset (a decimal string in JSON).
    #[serde(with = "wei_string")]
    pub amount_owed_wei: u128,
    /// The buyer whose escrow pays (and who is credited what the provider is not owed).
    #[serde(with = "hex_array")]
    pub buyer: [u8; 20],
}

/// The job a receipt answers, as the exchange's assignment names it.
#[derive(Clone, Copy, Debug)]
pub struct JobTerms<'a> {
    /// The exchange's job id.
    pub job_id: B256,
    /// EIP-155 id of the tab's chain.
    pub chain_id: u64,
    /// The tab (escrow) on that chain.
    pub escrow_id: u64,
    /// The buyer whose tab pays.
    pub buyer: Address,
    /// The request as assigned (its canonical hash is the receipt's `input_hash`).
    pub request: &'a InferenceRequest,
    /// The adapter by content id (64 hex digits), if the job names one.
    pub adapter: Option<&'a str>,
}

/// What the provider did for a job and what it claims.
#[derive(Clone, Copy, Debug)]
pub struct Work<'a> {
    /// The generated text (its UTF-8 bytes' SHA-256 is the receipt's `output_hash`).
    pub output_text: &'a str,
    /// Tokens processed, prompt and generated.
    pub tokens: u64,
    /// Compute time, milliseconds.
    pub compute_ms: u64,
    /// The determinism class the work was done in.
    pub class: DeterminismClass,
    /// What the provider claims, wei (the exchange refuses more than the job's price).
    pub amount_owed_wei: u128,
}

impl Receipt {
    /// The receipt for `work` on `job`, by the provider paid at `payout` whose ML-DSA key id is
    /// `provider_key`. This is the one way the hashes are taken — the request's canonical JSON
    /// ([`request_hash`]), the output text's bytes, the adapter's content id (32 zero bytes for
    /// none) — which is what the exchange recomputes and compares field by field.
    pub fn for_output(
        job: &JobTerms<'_>,
        work: &Work<'_>,
        payout: Address,
        provider_key: [u8; 32],
    ) -> Result<Self> {
        let mut adapter_hash = [0u8; 32];
        if let Some(id) = job.adapter {
            hex::decode_to_slice(id.strip_prefix("0x").unwrap_or(id), &mut adapter_hash).map_err(
                |_| Error::InvalidField {
                    field: "adapter".into(),
                    reason: format!("{id:?} is not a 64-hex-digit content id"),
                },
            )?;
        }
        Ok(Self {
            job_id: job.job_id.0,
            chain_id: job.chain_id,
            escrow_id: job.escrow_id,
            input_hash: request_hash(job.request).0,
            output_hash: Sha256::digest(work.output_text.as_bytes()).into(),
            adapter_hash,
            tokens: work.tokens,
            compute_ms: work.compute_ms,
            class: work.class,
            provider: payout.0.0,
            provider_key,
            amount_owed_wei: work.amount_owed_wei,
            buyer: job.buyer.0.0,
        })
    }

    /// The canonical encoding (see the module notes).
    pub fn canonical_bytes(&self) -> [u8; RECEIPT_BYTES] {
        let class = match self.class {
            DeterminismClass::D => 0u8,
            DeterminismClass::DInf => 1,
            DeterminismClass::S => 2,
        };
        let mut out = [0u8; RECEIPT_BYTES];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(MAGIC);
        put(&self.job_id);
        put(&self.chain_id.to_be_bytes());
        put(&self.escrow_id.to_be_bytes());
        put(&self.input_hash);
        put(&self.output_hash);
        put(&self.adapter_hash);
        put(&self.tokens.to_be_bytes());
        put(&self.compute_ms.to_be_bytes());
        put(&[class]);
        put(&self.provider);
        put(&self.provider_key);
        put(&self.amount_owed_wei.to_be_bytes());
        put(&self.buyer);
        out
    }

    /// SHA-256 of the canonical encoding: the receipt's name in a batch's receipts tree.
    pub fn hash(&self) -> [u8; 32] {
        Sha256::digest(self.canonical_bytes()).into()
    }
}

/// A receipt with the provider's ML-DSA-65 signature and verification key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedReceipt {
    /// The receipt.
    pub receipt: Receipt,
    /// The provider's encoded ML-DSA-65 verification key (its SHA-256 is `receipt.provider_key`).
    #[serde(with = "hex_vec")]
    pub verification_key: Vec<u8>,
    /// ML-DSA-65 signature over the canonical encoding, context `cx-receipt-v1`.
    #[serde(with = "hex_vec")]
    pub signature: Vec<u8>,
}

impl SignedReceipt {
    /// Signs `receipt` as `provider`; refuses when the receipt names another key.
    pub fn sign(receipt: Receipt, provider: &Identity) -> Result<Self> {
        if receipt.provider_key != provider.id().0 {
            return Err(Error::InvalidField {
                field: "receipt.provider_key".into(),
                reason: format!("names a key other than the signer's ({})", provider.id()),
            });
        }
        let signature = provider
            .sign(RECEIPT_CONTEXT, &receipt.canonical_bytes())?
            .to_vec();
        Ok(Self {
            receipt,
            verification_key: provider.public().to_bytes().to_vec(),
            signature,
        })
    }

    /// Checks the signature under `expected` (the key the caller trusts for this provider).
    pub fn verify(&self, expected: &PublicIdentity) -> Result<()> {
        if expected.id().0 != self.receipt.provider_key {
            return Err(Error::InvalidField {
                field: "receipt.provider_key".into(),
                reason: format!("is not the key {} it is checked against", expected.id()),
            });
        }
        expected.verify(
            RECEIPT_CONTEXT,
            &self.receipt.canonical_bytes(),
            &self.signature,
        )
    }

    /// Checks the signature under the key the receipt carries, after checking that key is the one
    /// the receipt names. Whoever calls this must still check that the named key is registered
    /// for `receipt.provider` (on chain: `ProviderRegistry.providers(..).mlDsaKeyHash`).
    pub fn verify_self_contained(&self) -> Result<PublicIdentity> {
        let key = PublicIdentity::from_bytes(&self.verification_key)?;
        self.verify(&key)?;
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(provider: &Identity) -> Receipt {
        Receipt {
            job_id: [9; 32],
            chain_id: 1,
            escrow_id: 5,
            input_hash: [1; 32],
            output_hash: [2; 32],
            adapter_hash: [3; 32],
            tokens: 10,
            compute_ms: 20,
            class: DeterminismClass::DInf,
            provider: [4; 20],
            provider_key: provider.id().0,
            amount_owed_wei: u128::MAX,
            buyer: [5; 20],
        }
    }

    #[test]
    fn every_field_changes_the_encoding_and_json_round_trips() {
        let p = Identity::from_seed([1; 32]);
        let r = receipt(&p);
        let base = r.canonical_bytes();
        let mut changed = r.clone();
        changed.escrow_id += 1;
        assert_ne!(base, changed.canonical_bytes());
        let mut changed = r.clone();
        changed.class = DeterminismClass::S;
        assert_ne!(base, changed.canonical_bytes());
        let mut changed = r.clone();
        changed.buyer[19] ^= 1;
        assert_ne!(r.hash(), changed.hash());
        let signed = SignedReceipt::sign(r, &p).unwrap();
        let json = serde_json::to_string(&signed).unwrap();
        let back: SignedReceipt = serde_json::from_str(&json).unwrap();
        assert_eq!(back, signed);
        back.verify_self_contained().unwrap();
    }

    #[test]
    fn for_output_hashes_the_request_the_text_and_the_adapter() {
        let request = InferenceRequest {
            prompt: "hi".into(),
            max_tokens: 4,
            ..Default::default()
        };
        let adapter = "ab".repeat(32);
        let job = JobTerms {
            job_id: B256::repeat_byte(1),
            chain_id: 31337,
            escrow_id: 2,
            buyer: Address::repeat_byte(3),
            request: &request,
            adapter: Some(&adapter),
        };
        let work = Work {
            output_text: "out",
            tokens: 7,
            compute_ms: 5,
            class: DeterminismClass::D,
            amount_owed_wei: 9,
        };
        let r = Receipt::for_output(&job, &work, Address::repeat_byte(4), [5; 32]).unwrap();
        assert_eq!(r.input_hash, request_hash(&request).0);
        assert_eq!(r.output_hash, <[u8; 32]>::from(Sha256::digest(b"out")));
        assert_eq!(r.adapter_hash, [0xab; 32]);
        assert_eq!((r.provider, r.buyer), ([4; 20], [3; 20]));
        let none = JobTerms {
            adapter: None,
            ..job
        };
        let r = Receipt::for_output(&none, &work, Address::ZERO, [5; 32]).unwrap();
        assert_eq!(r.adapter_hash, [0; 32]);
        let bad = JobTerms {
            adapter: Some("xyz"),
            ..job
        };
        let err = Receipt::for_output(&bad, &work, Address::ZERO, [5; 32]).unwrap_err();
        assert!(err.to_string().contains("adapter"), "{err}");
    }

    #[test]
    fn a_signature_under_another_context_or_key_is_refused() {
        let p = Identity::from_seed([1; 32]);
        let mallory = Identity::from_seed([2; 32]);
        let r = receipt(&p);
        assert!(SignedReceipt::sign(r.clone(), &mallory).is_err());
        let mut signed = SignedReceipt::sign(r.clone(), &p).unwrap();
        assert!(signed.verify(&mallory.public()).is_err());
        // Same bytes signed under the session context do not pass as a receipt.
        signed.signature = p
            .sign(b"cx-session-v1/initiator", &r.canonical_bytes())
            .unwrap()
            .to_vec();
        assert!(signed.verify_self_contained().is_err());
        // A carried key that is not the named one is refused before any signature check.
        let mut swapped = SignedReceipt::sign(r, &p).unwrap();
        swapped.verification_key = mallory.public().to_bytes().to_vec();
        assert!(swapped.verify_self_contained().is_err());
    }
}
