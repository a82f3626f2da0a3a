//! Writes `contracts/test/fixtures/frost.json`: signatures made by the `frost-secp256k1` crate
//! (trusted dealer, 3-of-5) that `contracts/test/FrostVerifier.t.sol` checks on chain. The
//! randomness is seeded, so the file is identical on every run; a test here also checks each
//! case's verdict against the crate itself, so the Solidity test compares against the crate's
//! verdicts and not our assumptions.

use std::path::PathBuf;

use alloy::primitives::{B256, U256, keccak256};
use cx_settlement::frost::{DealerCommittee, EvmGroupKey, EvmSignature};
use frost_secp256k1 as frost;
use frost_secp256k1::{Ciphersuite, Field};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;
use serde_json::{Map, Value, json};

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../contracts/test/fixtures/frost.json")
}

/// The RFC 9591 challenge H2(enc(R) || enc(PK) || msg), computed by the crate's ciphersuite.
fn challenge(signature: &frost::Signature, key: &frost::VerifyingKey, message: &[u8]) -> U256 {
    let sig = signature.serialize().expect("serialize signature");
    let mut preimage = sig[..33].to_vec();
    preimage.extend(key.serialize().expect("serialize key"));
    preimage.extend_from_slice(message);
    let c = frost::Secp256K1Sha256::H2(&preimage);
    U256::from_be_slice(&frost::Secp256K1ScalarField::serialize(&c))
}

fn case(
    key: &frost::VerifyingKey,
    signature: &frost::Signature,
    message: B256,
    challenge_value: Option<U256>,
) -> Value {
    let evm_key = EvmGroupKey::from_verifying_key(key).expect("key");
    let evm_sig = EvmSignature::from_frost(signature).expect("signature");
    let valid = key.verify(message.as_slice(), signature).is_ok();
    let mut v = json!({
        "key_x": evm_key.x.to_string(),
        "key_parity": evm_key.parity,
        "message": message.to_string(),
        "r_x": evm_sig.r_x.to_string(),
        "r_y": evm_sig.r_y.to_string(),
        "z": evm_sig.z.to_string(),
        "valid": valid,
    });
    if let Some(c) = challenge_value {
        v["challenge"] = json!(c.to_string());
    }
    v
}

/// Rebuilds a signature with a different z (R unchanged).
fn with_z(signature: &frost::Signature, z_delta: u8) -> frost::Signature {
    let mut bytes = signature.serialize().expect("serialize");
    // Add to the last byte of z, staying a canonical scalar (z < n is overwhelmingly likely to
    // stay true; deserialize refuses otherwise and the test would say so).
    bytes[64] = bytes[64].wrapping_add(z_delta);
    frost::Signature::deserialize(&bytes).expect("tampered z still a scalar")
}

/// Rebuilds a signature with R replaced by the R of another signature (a valid point, wrong R).
fn with_r_of(signature: &frost::Signature, other: &frost::Signature) -> frost::Signature {
    let mut bytes = signature.serialize().expect("serialize");
    bytes[..33].copy_from_slice(&other.serialize().expect("serialize")[..33]);
    frost::Signature::deserialize(&bytes).expect("valid point")
}

#[test]
fn frost_fixtures_match_the_crate_and_are_written_for_forge() {
    let mut rng = ChaCha20Rng::from_seed([7u8; 32]);
    let committee = DealerCommittee::generate(5, 3, &mut rng).expect("dealer");
    let other_committee = DealerCommittee::generate(5, 3, &mut rng).expect("dealer");
    let key = committee.verifying_key();
    let mut cases = Map::new();
    let mut valid_count = 0;
    for i in 0..4u8 {
        let message = keccak256([b"cx-settlement fixture ".as_slice(), &[i]].concat());
        let signature = committee.sign(message.as_slice(), &mut rng).expect("sign");
        assert!(
            key.verify(message.as_slice(), &signature).is_ok(),
            "crate refuses its own signature"
        );
        let c = challenge(&signature, key, message.as_slice());
        cases.insert(
            format!("valid_{i}"),
            case(key, &signature, message, Some(c)),
        );
        valid_count += 1;
        if i == 0 {
            let other_sig = committee.sign(message.as_slice(), &mut rng).expect("sign");
            let tampered_z = with_z(&signature, 1);
            let tampered_r = with_r_of(&signature, &other_sig);
            let wrong_message = keccak256(b"a different batch");
            cases.insert("tampered_z".into(), case(key, &tampered_z, message, None));
            cases.insert("tampered_r".into(), case(key, &tampered_r, message, None));
            cases.insert(
                "wrong_key".into(),
                case(other_committee.verifying_key(), &signature, message, None),
            );
            cases.insert(
                "wrong_message".into(),
                case(key, &signature, wrong_message, None),
            );
            // A different subset of signers (2, 4, 5) gives a valid signature too.
            let ids = committee.identifiers();
            let subset = [ids[1], ids[3], ids[4]];
            let by_subset = committee
                .sign_with(&subset, message.as_slice(), &mut rng)
                .expect("sign");
            let c2 = challenge(&by_subset, key, message.as_slice());
            cases.insert(
                "valid_other_signers".into(),
                case(key, &by_subset, message, Some(c2)),
            );
        }
    }
    for name in ["tampered_z", "tampered_r", "wrong_key", "wrong_message"] {
        assert_eq!(
            cases[name]["valid"],
            json!(false),
            "{name} must be invalid per the crate"
        );
    }
    assert_eq!(cases["valid_other_signers"]["valid"], json!(true));
    assert_eq!(valid_count, 4);
    let doc = json!({
        "about": "FROST(secp256k1, SHA-256) signatures by the frost-secp256k1 crate (RFC 9591); written by settlement/tests/it/fixtures.rs, checked by contracts/test/FrostVerifier.t.sol",
        "cases": cases,
    });
    let text = serde_json::to_string_pretty(&doc).expect("json") + "\n";
    let path = fixture_path();
    let previous = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, &text).expect("write fixtures");
    // Seeded randomness: a run must reproduce the committed file exactly.
    if !previous.contains("\"cases\": {}") && !previous.is_empty() {
        assert_eq!(
            previous, text,
            "fixtures changed; commit contracts/test/fixtures/frost.json"
        );
    }
}
