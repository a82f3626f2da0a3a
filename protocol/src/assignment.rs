//! Exchange-signed assignments: the exchange's word that a job goes to one provider at one
//! price, the middle link of the chain buyer-signed order → exchange-signed assignment →
//! provider-signed receipt (SPEC §9) that every party can check on its own.
//!
//! The signature is ML-DSA-65 (FIPS 204) by the exchange's identity over a fixed-width,
//! big-endian encoding with the context `cx-assignment-v1`, so it never verifies as a receipt,
//! an offer or an order:
//!
//! ```text
//! "CXA1" ‖ job_id 32 ‖ chain_id u64 ‖ escrow_id u64 ‖ buyer 20 ‖ provider_key 32 ‖
//! price_wei u128 ‖ deadline_s u64 ‖ input_hash 32 ‖ adapter_hash 32
//! ```
//!
//! ```
//! use cx_protocol::assignment::{Assignment, SignedAssignment};
//! use cx_protocol::pq::Identity;
//!
//! let exchange = Identity::from_seed([1; 32]);
//! let terms = Assignment {
//!     job_id: [7; 32], chain_id: 31337, escrow_id: 3, buyer: [2; 20], provider_key: [4; 32],
//!     price_wei: 900, deadline_s: 2_000, input_hash: [5; 32], adapter_hash: [0; 32],
//! };
//! let signed = SignedAssignment::sign(terms, &exchange).unwrap();
//! signed.verify(&exchange.public()).unwrap();
//! let mut dearer = signed.clone();
//! dearer.assignment.price_wei = 901;
//! assert!(dearer.verify(&exchange.public()).is_err());
//! ```

use crate::error::{Error, Result};
use crate::pq::{Identity, PublicIdentity};
use crate::receipt::{hex_array, hex_vec};
use serde::{Deserialize, Serialize};

/// FIPS 204 context of assignment signatures.
pub const ASSIGNMENT_CONTEXT: &[u8] = b"cx-assignment-v1";
const MAGIC: &[u8; 4] = b"CXA1";
/// Bytes of [`Assignment::canonical_bytes`].
pub const ASSIGNMENT_BYTES: usize = 4 + 32 + 8 + 8 + 20 + 32 + 16 + 8 + 32 + 32;

/// What the exchange assigns: one job, to one provider key, at most at one price, by a deadline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    /// The job id.
    #[serde(with = "hex_array")]
    pub job_id: [u8; 32],
    /// The tab's chain.
    pub chain_id: u64,
    /// The tab (escrow id) that pays.
    pub escrow_id: u64,
    /// The buyer whose tab pays.
    #[serde(with = "hex_array")]
    pub buyer: [u8; 20],
    /// SHA-256 of the provider's ML-DSA-65 key: the only key whose receipt is taken.
    #[serde(with = "hex_array")]
    pub provider_key: [u8; 32],
    /// The most the provider's receipt may claim, wei (a decimal string in JSON); at most the
    /// buyer's signed limit.
    #[serde(with = "crate::price::wei_string")]
    pub price_wei: u128,
    /// When the result must be in, unix seconds.
    pub deadline_s: u64,
    /// SHA-256 of the request's canonical JSON (the buyer-signed `request_hash`; the receipt's
    /// `input_hash`).
    #[serde(with = "hex_array")]
    pub input_hash: [u8; 32],
    /// The adapter's content id, or zero.
    #[serde(with = "hex_array")]
    pub adapter_hash: [u8; 32],
}

impl Assignment {
    /// The encoding that is signed (see the module docs).
    pub fn canonical_bytes(&self) -> [u8; ASSIGNMENT_BYTES] {
        let mut out = [0u8; ASSIGNMENT_BYTES];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(MAGIC);
        put(&self.job_id);
        put(&self.chain_id.to_be_bytes());
        put(&self.escrow_id.to_be_bytes());
        put(&self.buyer);
        put(&self.provider_key);
        put(&self.price_wei.to_be_bytes());
        put(&self.deadline_s.to_be_bytes());
        put(&self.input_hash);
        put(&self.adapter_hash);
        out
    }
}

/// An assignment with the exchange's ML-DSA-65 signature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedAssignment {
    /// The terms.
    pub assignment: Assignment,
    /// ML-DSA-65 signature over [`Assignment::canonical_bytes`], context `cx-assignment-v1`.
    #[serde(with = "hex_vec")]
    pub signature: Vec<u8>,
}

impl SignedAssignment {
    /// Signs `assignment` as the exchange.
    pub fn sign(assignment: Assignment, exchange: &Identity) -> Result<Self> {
        let signature = exchange
            .sign(ASSIGNMENT_CONTEXT, &assignment.canonical_bytes())?
            .to_vec();
        Ok(Self {
            assignment,
            signature,
        })
    }

    /// Checks the signature under `exchange`, the exchange key the checker pinned.
    pub fn verify(&self, exchange: &PublicIdentity) -> Result<()> {
        exchange
            .verify(
                ASSIGNMENT_CONTEXT,
                &self.assignment.canonical_bytes(),
                &self.signature,
            )
            .map_err(|e| Error::SignatureMalformed {
                field: "assignment.signature".into(),
                reason: e.to_string(),
            })
    }
}
