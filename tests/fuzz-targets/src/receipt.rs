//! Receipts: a provider's result body and the ML-DSA-65 signature on its receipt.

use cx_exchange_server::api::AppJson;
use cx_protocol::order::ORDER_CONTEXT;
use cx_protocol::pq::PublicIdentity;
use cx_protocol::pq::identity::{SIGNATURE_BYTES, VERIFICATION_KEY_BYTES};
use cx_protocol::receipt::{RECEIPT_BYTES, RECEIPT_CONTEXT, SignedReceipt};
use cx_protocol::wire::ResultSubmission;
use sha2::{Digest, Sha256};

use crate::assert_json_round_trip;
use crate::fixtures::fixtures;

/// A `POST /v1/jobs/{id}/result` body, decoded as the exchange decodes it (`AppJson`), then what
/// `accept_result` does before the books: the receipt's signature under the provider's
/// registered key.
///
/// Asserts: nothing panics; the receipt and the output re-encode and decode to themselves; the
/// receipt's canonical encoding has its fixed length and its hash is that encoding's SHA-256;
/// a trained adapter's output hash is computable.
pub fn receipt(data: &[u8]) {
    let Ok(AppJson(submission)) = AppJson::<ResultSubmission>::from_bytes(data) else {
        return;
    };
    let signed = &submission.receipt;
    let back: SignedReceipt =
        serde_json::from_slice(&serde_json::to_vec(signed).expect("encodes")).expect("decodes");
    assert_eq!(&back, signed, "receipt: decode(encode(x)) != x");
    let output = &submission.output;
    let back: cx_protocol::wire::Output =
        serde_json::from_slice(&serde_json::to_vec(output).expect("encodes")).expect("decodes");
    assert_eq!(&back, output, "output: decode(encode(x)) != x");
    let canonical = signed.receipt.canonical_bytes();
    assert_eq!(canonical.len(), RECEIPT_BYTES);
    assert_eq!(
        signed.receipt.hash(),
        <[u8; 32]>::from(Sha256::digest(canonical))
    );
    if let Some(trained) = &output.trained {
        assert_json_round_trip(trained, "trained");
        let _ = trained.output_hash();
    }
    let provider = fixtures().provider.public();
    if signed.verify(&provider).is_ok() {
        assert_eq!(signed.receipt.provider_key, provider.id().0);
    }
}

/// A signed receipt as JSON, checked under the key it carries (`verify_self_contained`, what a
/// signer and the exchange do before checking that key is registered); bytes that are not JSON
/// are taken as `key (1952) ‖ signature (3309) ‖ message` for `PublicIdentity::verify`.
///
/// Asserts: nothing panics; a receipt that verifies names the key that verified it; once any
/// byte of its canonical encoding changes (a spread of positions, both ends included), or the
/// context is another party's, the signature no longer verifies.
pub fn receipt_signature(data: &[u8]) {
    let Ok(signed) = serde_json::from_slice::<SignedReceipt>(data) else {
        raw_signature(data);
        return;
    };
    let Ok(key) = signed.verify_self_contained() else {
        return;
    };
    assert_eq!(key.id().0, signed.receipt.provider_key);
    assert_eq!(
        PublicIdentity::from_bytes(&key.to_bytes()).ok().as_ref(),
        Some(&key),
        "the key's encoding does not decode to itself"
    );
    let message = signed.receipt.canonical_bytes();
    assert!(
        key.verify(ORDER_CONTEXT, &message, &signed.signature)
            .is_err(),
        "a receipt signature verifies as an order co-signature"
    );
    for at in (0..RECEIPT_BYTES).step_by(17).chain([RECEIPT_BYTES - 1]) {
        let mut altered = message;
        altered[at] ^= 1;
        assert!(
            key.verify(RECEIPT_CONTEXT, &altered, &signed.signature)
                .is_err(),
            "a receipt signature still verifies with byte {at} changed"
        );
    }
}

/// `PublicIdentity::from_bytes` and `verify` over raw bytes; what verifies over a message must
/// not verify over the message with its first byte changed.
fn raw_signature(data: &[u8]) {
    let Some((key, rest)) = data.split_at_checked(VERIFICATION_KEY_BYTES) else {
        let _ = PublicIdentity::from_bytes(data);
        return;
    };
    let Ok(key) = PublicIdentity::from_bytes(key) else {
        return;
    };
    let (signature, message) = rest.split_at(rest.len().min(SIGNATURE_BYTES));
    if key.verify(RECEIPT_CONTEXT, message, signature).is_ok() {
        let mut altered = message.to_vec();
        match altered.first_mut() {
            Some(first) => *first ^= 1,
            None => altered.push(0),
        }
        assert!(
            key.verify(RECEIPT_CONTEXT, &altered, signature).is_err(),
            "one ML-DSA signature verifies over two messages"
        );
    }
}
