//! The fuzz targets of compute-exchange, as plain functions over bytes.
//!
//! Each `pub fn <target>(data: &[u8])` hands `data` to the project's own decoder or verifier
//! exactly as a party does when the bytes come off the network or the disk, and asserts what must
//! hold whatever the bytes are: nothing panics; what decodes re-encodes and decodes to the same
//! value; a signature that verifies stops verifying once the message it signs changes.
//!
//! | target | the bytes are | entry point |
//! | --- | --- | --- |
//! | [`intent_submission`] | a `POST /v1/intents` body | `AppJson::<IntentSubmission>::from_bytes` |
//! | [`intent_signature`] | a signed intent (EIP-712 + ML-DSA co-signature) | `Signed::verify`, `recover_signer` |
//! | [`receipt`] | a `POST /v1/jobs/{id}/result` body | `AppJson::<ResultSubmission>::from_bytes`, `SignedReceipt::verify` |
//! | [`receipt_signature`] | a provider's signed receipt (ML-DSA-65) | `SignedReceipt::verify_self_contained`, `PublicIdentity::verify` |
//! | [`pq_handshake`] | handshake frames on a signer's or coordinator's socket | `read_frame`, `Responder::respond`/`finish`, `Initiator::finish` |
//! | [`pq_frames`] | frames on an established committee session | `read_frame`, `Session::open`, `wire::Request`/`Response` |
//! | [`peft_adapter`] | `adapter_config.json` + `adapter_model.safetensors` | `lora::adapter_from_bytes` (what `load_adapter` calls) |
//! | [`model_weights`] | a base model's `model.safetensors` | `model::tensors_from_bytes` (what `Model::load` reads with) |
//!
//! `fuzz/fuzz_targets/<target>.rs` (cargo-fuzz, nightly, `scripts/fuzz.sh`) calls each in one
//! line; `tests/corpus.rs` replays every committed corpus file under `fuzz/corpus/<target>/`
//! on stable in `cargo test`, so a fixed crash stays fixed. [`seeds`] makes the valid inputs
//! the corpora start from (a real signed intent, a real receipt, real frames, a real adapter).
//!
//! ```
//! // Any bytes: refused or accepted, never a panic.
//! cx_fuzz_targets::intent_submission(b"{\"intent\": 1}");
//! cx_fuzz_targets::pq_frames(&[0, 0, 0, 2, b'{', b'}']);
//! ```

mod fixtures;
mod order;
mod pq;
mod receipt;
pub mod seeds;
mod weights;

pub use order::{intent_signature, intent_submission};
pub use pq::{pq_frames, pq_handshake};
pub use receipt::{receipt, receipt_signature};
pub use weights::{model_weights, peft_adapter};

/// A fuzz target: takes any bytes, panics only on a defect.
pub type Target = fn(&[u8]);

/// Every target by name, as `fuzz/fuzz_targets/` and `fuzz/corpus/` name them.
pub const TARGETS: [(&str, Target); 8] = [
    ("intent_submission", intent_submission),
    ("intent_signature", intent_signature),
    ("receipt", receipt),
    ("receipt_signature", receipt_signature),
    ("pq_handshake", pq_handshake),
    ("pq_frames", pq_frames),
    ("peft_adapter", peft_adapter),
    ("model_weights", model_weights),
];

/// `value` encoded as JSON, decoded and encoded again: the same JSON both times, and `decode`
/// accepts what `encode` wrote. Types without `PartialEq` (FROST packages) are compared by
/// their encodings.
fn assert_json_round_trip<T>(value: &T, what: &str)
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let first = serde_json::to_value(value).expect("a decoded value encodes");
    let text = serde_json::to_vec(value).expect("a decoded value encodes");
    let again: T = serde_json::from_slice(&text)
        .unwrap_or_else(|e| panic!("{what}: its own encoding does not decode: {e}"));
    let second = serde_json::to_value(&again).expect("a decoded value encodes");
    assert_eq!(
        first, second,
        "{what}: decode(encode(x)) encodes differently"
    );
}
