//! Orders: the intake's JSON body and the intent's two signatures.

use cx_exchange_server::api::AppJson;
use cx_exchange_server::intake::IntentSubmission;
use cx_protocol::order::{B256, Intent, ORDER_CONTEXT, Order, SolStruct, recover_signer};
use cx_protocol::order::{Signed, typed};
use cx_protocol::workload::Workload;

use crate::assert_json_round_trip;
use crate::fixtures::{NOW_S, fixtures};

/// A `POST /v1/intents` body, decoded as the exchange decodes it (`AppJson`: serde_json with
/// the path of the field to blame), then what intake computes from it before any signature or
/// database: the order's field checks and times, its EIP-712 struct and digest, the request's
/// hash and checks.
///
/// Asserts: nothing panics; every decoded part re-encodes and decodes to itself; an order that
/// passes its field checks survives the trip through its EIP-712 struct (`from_typed ∘
/// to_typed` is the identity), so what is signed is exactly what was sent.
pub fn intent_submission(data: &[u8]) {
    let Ok(AppJson(submission)) = AppJson::<IntentSubmission>::from_bytes(data) else {
        return;
    };
    let signed = &submission.intent;
    assert_json_round_trip(signed, "intent");
    let back: Signed<Intent> =
        serde_json::from_slice(&serde_json::to_vec(signed).expect("encodes")).expect("decodes");
    assert_eq!(&back, signed, "intent: decode(encode(x)) != x");
    let intent = &signed.order;
    let _ = intent.check_times(NOW_S);
    let digest = signed.digest(&fixtures().domain);
    if intent.validate().is_ok() {
        let typed = intent.to_typed();
        assert_eq!(
            typed.eip712_signing_hash(&fixtures().domain),
            digest,
            "the digest is the typed struct's"
        );
        let from_typed = Intent::from_typed(typed).unwrap_or_else(|e| {
            panic!("a valid intent's EIP-712 struct does not convert back: {e}")
        });
        assert_eq!(&from_typed, intent, "from_typed(to_typed(x)) != x");
    }
    // The whole submission survives the trip too: its one workload under its kind's key.
    assert_json_round_trip(&submission, "submission");
    let Ok(workload) = submission.workload() else {
        return;
    };
    let _ = workload.hash() == intent.request_hash;
    let key = workload.kind().key();
    cx_protocol::each_workload!(workload, request => assert_json_round_trip(request, key));
    // What intake computes from a valid request of each kind that has more than its hash.
    if let Workload::Matmul(matmul) = workload
        && matmul.validate().is_ok()
    {
        let _ = (
            matmul.flops(),
            matmul.product_bytes(),
            matmul.working_bytes(),
        );
    }
    if let Workload::Train(train) = workload
        && train.validate().is_ok()
    {
        let _ = train.lora.projections();
    }
}

/// A signed intent as JSON, checked as the exchange checks it (`Signed::verify` at the
/// exchange's clock, the agent's ML-DSA key bound to its account); bytes that are not JSON are
/// taken as a raw 65-byte EIP-712 signature and a 32-byte digest for `recover_signer`.
///
/// Asserts: nothing panics; a verified intent is the bound account's, over its own digest; once
/// any signed field changes (each field in turn), or one bit of the digest, neither signature
/// holds any more.
pub fn intent_signature(data: &[u8]) {
    let fx = fixtures();
    let Ok(AppJson(signed)) = AppJson::<Signed<Intent>>::from_bytes(data) else {
        raw_signature(data);
        return;
    };
    let bound =
        |account: &cx_protocol::order::Address| (*account == fx.account).then(|| fx.agent.public());
    // The signature alone, as the raw check sees it.
    let digest = signed.digest(&fx.domain);
    let recovered = recover_signer("signature", &signed.signature, &digest);
    let Ok(verified) = signed.verify(&fx.domain, NOW_S, bound) else {
        return;
    };
    assert_eq!(
        verified.account, fx.account,
        "verified as an unbound account"
    );
    assert_eq!(verified.digest, digest, "verified over another digest");
    assert_eq!(
        recovered.ok(),
        Some(fx.account),
        "verify and recover disagree"
    );
    for (field, altered) in alterations(&signed.order) {
        let mut other = signed.clone();
        other.order = altered;
        assert!(
            other.verify_signatures(&fx.domain, bound).is_err(),
            "a signed intent still verifies with `{field}` changed"
        );
    }
    for byte in [0, 13, 31] {
        let mut flipped = digest;
        flipped.0[byte] ^= 1;
        assert_ne!(
            recover_signer("signature", &signed.signature, &flipped).ok(),
            Some(fx.account),
            "the EIP-712 signature recovers its account over another digest"
        );
        assert!(
            fx.agent
                .public()
                .verify(ORDER_CONTEXT, flipped.as_slice(), &signed.mldsa_signature)
                .is_err(),
            "the ML-DSA co-signature verifies over another digest"
        );
    }
}

/// `recover_signer` over raw bytes: `signature (65) ‖ digest (32)`. What recovers an account
/// over the digest must not recover the same one over a digest one bit away.
fn raw_signature(data: &[u8]) {
    let Some((signature, rest)) = data.split_at_checked(65) else {
        let _ = recover_signer("signature", data, &B256::ZERO);
        return;
    };
    let Some(digest) = rest.get(..32) else {
        return;
    };
    let mut digest = B256::from_slice(digest);
    if let Ok(account) = recover_signer("signature", signature, &digest) {
        digest.0[0] ^= 0x80;
        assert_ne!(
            recover_signer("signature", signature, &digest).ok(),
            Some(account),
            "one signature recovers the same account over two digests"
        );
    }
}

/// The intent with each signed field changed in turn.
fn alterations(intent: &Intent) -> Vec<(&'static str, Intent)> {
    let with = |f: &dyn Fn(&mut Intent)| {
        let mut other = intent.clone();
        f(&mut other);
        other
    };
    let mut out = vec![
        ("want", with(&|i| i.want.push('x'))),
        ("request_hash", with(&|i| i.request_hash.0[31] ^= 1)),
        ("deadline_s", with(&|i| i.deadline_s ^= 1)),
        ("max_price_wei", with(&|i| i.max_price_wei ^= 1)),
        ("tab_id", with(&|i| i.tab_id ^= 1)),
        ("nonce", with(&|i| i.nonce ^= 1)),
        ("expiry_s", with(&|i| i.expiry_s ^= 1)),
        (
            "adapter_id",
            with(&|i| {
                i.adapter_id = match i.adapter_id {
                    Some(_) => None,
                    None => Some(B256::repeat_byte(1)),
                }
            }),
        ),
    ];
    // The typed struct is what is signed: an alteration the struct cannot tell apart (there is
    // none today) would not be a forgery, so it is left out rather than asserted.
    out.retain(|(_, altered)| {
        typed_of(altered).eip712_hash_struct() != typed_of(intent).eip712_hash_struct()
    });
    out
}

fn typed_of(intent: &Intent) -> typed::Intent {
    intent.to_typed()
}
