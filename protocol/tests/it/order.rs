//! Signed orders: round trips, every bad input that belongs to protocol, and alloy's dynamic
//! EIP-712 implementation over the wallet JSON agreeing with `sol!` + `SolStruct`.
//!
//! Long (~650 lines) because it lists every bad input of issue 12 that protocol checks, each a test
//! named for it, over one shared signing fixture.

use cx_protocol::order::{
    self, Address, B256, Binding, Bytes, Intent, Kind, Order, PqBinding, Rent, RentTarget, Reserve,
    Search, SessionGrant, Signed, SigningKey, TabTerms, U256, typed,
};
use cx_protocol::pq::{Identity, PublicIdentity};
use cx_protocol::{DeterminismClass, Error, Tier};

const NOW_S: u64 = 1_700_000_000;

fn settlement() -> Address {
    Address::repeat_byte(0x5e)
}

fn chain() -> order::Eip712Domain {
    order::domain(31337, settlement())
}

fn account_key() -> SigningKey {
    SigningKey::from_slice(&[0x42; 32]).unwrap()
}

fn pq() -> Identity {
    Identity::from_seed([0x24; 32])
}

pub(crate) fn intent() -> Intent {
    Intent {
        want: "llama-8b".to_owned(),
        adapter_id: Some(B256::repeat_byte(0xad)),
        request_hash: B256::repeat_byte(0x11),
        deadline_s: NOW_S + 60,
        max_price_wei: 5_000_000,
        market_limit: false,
        min_tier: Tier::T1,
        determinism: DeterminismClass::D,
        tab_id: 7,
        nonce: 1,
        expiry_s: NOW_S + 30,
    }
}

pub(crate) fn reserve() -> Reserve {
    Reserve {
        model: "llama-8b".to_owned(),
        tier: Tier::T2,
        window_start_s: NOW_S + 100,
        window_end_s: NOW_S + 3_700,
        compute_ms: 600_000,
        max_price_wei_per_s: 90,
        tab_id: 7,
        nonce: 2,
        expiry_s: NOW_S + 30,
    }
}

pub(crate) fn rent() -> Rent {
    Rent {
        target_kind: RentTarget::Adapter,
        target: B256::repeat_byte(0xad),
        term_s: 3_600,
        max_rent_wei: 1_000_000,
        epsilon_ppm: 10_000,
        tab_id: 7,
        nonce: 3,
        expiry_s: NOW_S + 30,
    }
}

pub(crate) fn search() -> Search {
    let mut target = B256::ZERO;
    target.0[2] = 1; // 2^(256 - 23): 22 leading zero bits
    Search {
        prefix: Bytes::from_static(b"cx-search-demo"),
        target,
        success_ppm: 990_000,
        deadline_s: NOW_S + 600,
        max_price_wei: 2_000_000,
        tab_id: 7,
        nonce: 4,
        expiry_s: NOW_S + 30,
    }
}

pub(crate) fn tab_terms() -> TabTerms {
    TabTerms {
        buyer: order::account_of(&account_key()),
        amount_wei: 100_000_000,
        deadline_s: NOW_S + 86_400,
        nonce: 5,
    }
}

pub(crate) fn session_grant() -> SessionGrant {
    SessionGrant {
        tab_id: 7,
        spend_cap_wei: 50_000_000,
        expiry_s: NOW_S + 3_600,
        default_deadline_s: 30,
        default_tier: Tier::T0,
        default_determinism: DeterminismClass::S,
        default_max_price_wei: 1_000_000,
        bearer_hash: SessionGrant::bearer_hash_of(b"cx-session-secret"),
        nonce: 6,
    }
}

pub(crate) fn pq_binding() -> PqBinding {
    PqBinding {
        account: order::account_of(&account_key()),
        mldsa_key_hash: B256::from(pq().id().0),
        nonce: 1,
    }
}

fn bound(_: &Address) -> Option<PublicIdentity> {
    Some(pq().public())
}

fn signed_intent() -> Signed<Intent> {
    order::sign(intent(), &chain(), &account_key(), &pq()).unwrap()
}

fn round_trip<T: Order>(order: T)
where
    T::Typed: PartialEq + std::fmt::Debug + Clone,
{
    // Rust ↔ EIP-712 struct.
    let typed = order.to_typed();
    assert_eq!(T::from_typed(typed.clone()).unwrap(), order);
    // JSON of the signed envelope.
    let signed = order::sign(order.clone(), &chain(), &account_key(), &pq()).unwrap();
    let json = serde_json::to_string(&signed).unwrap();
    let back: Signed<T> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, signed);
    let verified = back.verify_signatures(&chain(), bound).unwrap();
    assert_eq!(verified.account, order::account_of(&account_key()));
    assert_eq!(verified.digest, order.signing_hash(&chain()));
}

#[test]
fn every_kind_round_trips_and_verifies() {
    round_trip(intent());
    round_trip(reserve());
    round_trip(rent());
    round_trip(search());
    round_trip(tab_terms());
    round_trip(session_grant());
    round_trip(pq_binding());
}

#[test]
fn intent_verifies_at_intake_and_returns_account_and_digest() {
    let signed = signed_intent();
    let verified = signed.verify(&chain(), NOW_S, bound).unwrap();
    assert_eq!(verified.account, order::account_of(&account_key()));
    assert_eq!(verified.digest, intent().signing_hash(&chain()));
    // The split path (async key lookups) agrees.
    let recovered = signed.recover(&chain()).unwrap();
    assert_eq!(recovered, verified);
    signed
        .check_cosignature(&recovered, &pq().public())
        .unwrap();
}

#[test]
fn encode_type_is_the_documented_string() {
    assert_eq!(
        Kind::Intent.encode_type(),
        "Intent(string want,bytes32 adapterId,bytes32 requestHash,uint64 deadline,uint256 maxPriceWei,bool marketLimit,uint8 minTier,uint8 determinism,uint64 tab,uint64 nonce,uint64 expiry)"
    );
    assert_eq!(
        Kind::PqBinding.encode_type(),
        "PqBinding(address account,bytes32 mldsaKeyHash,uint64 nonce)"
    );
    for kind in Kind::ALL {
        assert_eq!(kind.as_str().parse::<Kind>().unwrap(), kind);
        assert_eq!(kind.primary_type().parse::<Kind>().unwrap(), kind);
    }
    assert_eq!("order".parse::<Kind>().unwrap_err().field(), "kind");
}

#[test]
fn missing_eip712_signature_is_refused() {
    let mut signed = signed_intent();
    signed.signature = Bytes::new();
    let err = signed.verify(&chain(), NOW_S, bound).unwrap_err();
    assert!(matches!(err, Error::SignatureMissing { .. }), "{err}");
    assert_eq!(
        (err.code(), err.field()),
        ("signature_missing", "signature")
    );
    // Absent from JSON entirely: the same precise error, not a parse failure.
    let mut json: serde_json::Value = serde_json::to_value(signed_intent()).unwrap();
    json.as_object_mut().unwrap().remove("signature");
    let parsed: Signed<Intent> = serde_json::from_value(json).unwrap();
    assert_eq!(
        parsed.verify(&chain(), NOW_S, bound).unwrap_err().code(),
        "signature_missing"
    );
}

#[test]
fn wrong_eip712_signature_is_refused() {
    // Signed by another key.
    let other = SigningKey::from_slice(&[0x43; 32]).unwrap();
    let mut signed = signed_intent();
    signed.signature = order::sign(intent(), &chain(), &other, &pq())
        .unwrap()
        .signature;
    let err = signed.verify(&chain(), NOW_S, bound).unwrap_err();
    assert!(matches!(err, Error::SignerMismatch { .. }), "{err}");
    assert_eq!(err.code(), "signature_wrong");
    // Over other data: a field changed after signing.
    let mut tampered = signed_intent();
    tampered.order.max_price_wei += 1;
    assert!(matches!(
        tampered.verify(&chain(), NOW_S, bound).unwrap_err(),
        Error::SignerMismatch { .. }
    ));
    // Garbage of the right length.
    let mut garbage = signed_intent();
    garbage.signature = Bytes::from(vec![0xff; 65]);
    assert!(garbage.verify(&chain(), NOW_S, bound).is_err());
}

#[test]
fn malformed_eip712_signatures_are_refused_by_shape() {
    let base = signed_intent();
    let with = |bytes: Vec<u8>| {
        let mut s = base.clone();
        s.signature = Bytes::from(bytes);
        s.verify(&chain(), NOW_S, bound).unwrap_err()
    };
    // Short.
    let err = with(base.signature[..64].to_vec());
    assert!(matches!(err, Error::SignatureMalformed { .. }), "{err}");
    // v = 37 (an EIP-155 transaction v) and v = 2.
    for v in [2u8, 26, 29, 37] {
        let mut bytes = base.signature.to_vec();
        bytes[64] = v;
        let err = with(bytes);
        assert!(err.to_string().contains("v must be"), "{err}");
    }
    // v as 0/1 instead of 27/28 is the same signature and accepted.
    let mut zero_one = base.clone();
    let mut bytes = base.signature.to_vec();
    bytes[64] -= 27;
    zero_one.signature = Bytes::from(bytes);
    zero_one.verify(&chain(), NOW_S, bound).unwrap();
}

#[test]
fn high_s_malleated_signature_is_refused() {
    // n − s with the parity flipped recovers the same key: the malleated twin of a valid
    // signature. Without the EIP-2 check it would pass as a second encoding of one order.
    let n = U256::from_str_radix(
        "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141",
        16,
    )
    .unwrap();
    let signed = signed_intent();
    let s = U256::from_be_slice(&signed.signature[32..64]);
    let mut twin = signed.signature.to_vec();
    twin[32..64].copy_from_slice(&(n - s).to_be_bytes::<32>());
    twin[64] = if twin[64] == 27 { 28 } else { 27 };
    let mut malleated = signed.clone();
    malleated.signature = Bytes::from(twin);
    let err = malleated.verify(&chain(), NOW_S, bound).unwrap_err();
    assert!(
        matches!(&err, Error::SignatureMalformed { reason, .. } if reason.contains("EIP-2")),
        "{err}"
    );
}

#[test]
fn wrong_domain_other_chain_or_contract_is_refused() {
    let other_chain = order::domain(31338, settlement());
    let other_contract = order::domain(31337, Address::repeat_byte(0x77));
    // An honest envelope for another chain is refused by name.
    let for_other_chain = order::sign(intent(), &other_chain, &account_key(), &pq()).unwrap();
    let err = for_other_chain.verify(&chain(), NOW_S, bound).unwrap_err();
    assert!(matches!(err, Error::WrongDomain { .. }), "{err}");
    assert_eq!((err.code(), err.field()), ("wrong_domain", "chain_id"));
    let for_other_contract = order::sign(intent(), &other_contract, &account_key(), &pq()).unwrap();
    let err = for_other_contract
        .verify(&chain(), NOW_S, bound)
        .unwrap_err();
    assert_eq!(err.field(), "verifying_contract");
    // An envelope relabelled to our domain: the signature for the other chain (or contract)
    // recovers some other account under ours, so it fails as a wrong signature.
    for (mut relabelled, other) in [
        (for_other_chain, &other_chain),
        (for_other_contract, &other_contract),
    ] {
        relabelled.chain_id = 31337;
        relabelled.verifying_contract = settlement();
        let digest_ours = relabelled.digest(&chain());
        assert_ne!(digest_ours, relabelled.digest(other));
        let recovered =
            order::recover_signer("signature", &relabelled.signature, &digest_ours).unwrap();
        assert_ne!(recovered, order::account_of(&account_key()));
        let err = relabelled.verify(&chain(), NOW_S, bound).unwrap_err();
        assert!(matches!(err, Error::SignerMismatch { .. }), "{err}");
    }
}

#[test]
fn cosignature_missing_wrong_or_unbound_is_refused() {
    let mut missing = signed_intent();
    missing.mldsa_signature = Bytes::new();
    let err = missing.verify(&chain(), NOW_S, bound).unwrap_err();
    assert_eq!(
        (err.code(), err.field()),
        ("cosignature_missing", "mldsa_signature")
    );

    // Co-signed by a key that is not the bound one.
    let stranger = Identity::from_seed([0x99; 32]);
    let by_stranger = order::sign(intent(), &chain(), &account_key(), &stranger).unwrap();
    let err = by_stranger.verify(&chain(), NOW_S, bound).unwrap_err();
    assert_eq!(err.code(), "cosignature_wrong", "{err}");

    // The right key over another message (another order's digest).
    let mut other = intent();
    other.nonce += 1;
    let mut swapped = signed_intent();
    swapped.mldsa_signature = order::sign(other, &chain(), &account_key(), &pq())
        .unwrap()
        .mldsa_signature;
    assert_eq!(
        swapped.verify(&chain(), NOW_S, bound).unwrap_err().code(),
        "cosignature_wrong"
    );

    // The right signature bytes truncated.
    let mut short = signed_intent();
    short.mldsa_signature = Bytes::copy_from_slice(&short.mldsa_signature[..100]);
    assert_eq!(
        short.verify(&chain(), NOW_S, bound).unwrap_err().code(),
        "cosignature_wrong"
    );

    // No key bound to the account.
    let err = signed_intent()
        .verify(&chain(), NOW_S, |_| None)
        .unwrap_err();
    assert!(matches!(err, Error::Unbound { .. }), "{err}");
    assert_eq!(
        (err.code(), err.field()),
        ("cosignature_unbound", "account")
    );
}

#[test]
fn expired_order_is_refused_but_signatures_still_check_later() {
    let signed = signed_intent();
    let at = signed.order.expiry_s;
    let err = signed.verify(&chain(), at, bound).unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err}");
    assert_eq!((err.code(), err.field()), ("expired", "order.expiry_s"));
    // A signer re-checking it after settlement does not use the clock.
    signed.verify_signatures(&chain(), bound).unwrap();
}

#[test]
fn deadline_in_the_past_is_refused() {
    let mut late = intent();
    late.expiry_s = NOW_S + 1_000;
    late.deadline_s = NOW_S;
    let signed = order::sign(late, &chain(), &account_key(), &pq()).unwrap();
    let err = signed.verify(&chain(), NOW_S, bound).unwrap_err();
    assert!(matches!(err, Error::DeadlinePassed { .. }), "{err}");
    assert_eq!(
        (err.code(), err.field()),
        ("deadline_passed", "order.deadline_s")
    );
    // A reserve's window that has ended.
    let mut over = reserve();
    over.expiry_s = NOW_S + 10_000;
    let signed = order::sign(over, &chain(), &account_key(), &pq()).unwrap();
    let err = signed.verify(&chain(), NOW_S + 3_700, bound).unwrap_err();
    assert_eq!(err.field(), "order.window_end_s");
}

#[test]
fn attested_and_unknown_codes_are_refused_by_name() {
    let mut t = intent().to_typed();
    t.minTier = 4;
    let err = Intent::from_typed(t.clone()).unwrap_err();
    assert!(matches!(err, Error::AttestedUnavailable { .. }), "{err}");
    assert_eq!(err.field(), "min_tier");
    t.minTier = 9;
    let err = Intent::from_typed(t.clone()).unwrap_err();
    assert!(err.to_string().contains("unknown tier code 9"), "{err}");
    t.minTier = 1;
    t.determinism = 3;
    let err = Intent::from_typed(t).unwrap_err();
    assert!(
        err.to_string().contains("unknown determinism class code 3"),
        "{err}"
    );
    let mut r = rent().to_typed();
    r.targetKind = 3;
    assert!(Rent::from_typed(r).is_err());
    let mut wide = intent().to_typed();
    wide.maxPriceWei = U256::MAX;
    assert_eq!(
        Intent::from_typed(wide).unwrap_err().field(),
        "max_price_wei"
    );

    // An attested intent signed anyway is refused at verification, naming the field.
    let mut attested = intent();
    attested.min_tier = Tier::Attested;
    let signed = order::sign(attested, &chain(), &account_key(), &pq()).unwrap();
    let err = signed.verify(&chain(), NOW_S, bound).unwrap_err();
    assert_eq!(
        (err.code(), err.field()),
        ("tier_unavailable", "order.min_tier")
    );
}

#[test]
fn zero_price_and_unknown_fields_are_refused() {
    let mut free = intent();
    free.max_price_wei = 0;
    let signed = order::sign(free, &chain(), &account_key(), &pq()).unwrap();
    assert_eq!(
        signed.verify(&chain(), NOW_S, bound).unwrap_err().field(),
        "order.max_price_wei"
    );
    let mut json = serde_json::to_value(signed_intent()).unwrap();
    json["order"]["colour"] = "blue".into();
    let err = serde_json::from_value::<Signed<Intent>>(json).unwrap_err();
    assert!(err.to_string().contains("unknown field `colour`"), "{err}");
    let mut json = serde_json::to_value(signed_intent()).unwrap();
    json["extra"] = 1.into();
    assert!(serde_json::from_value::<Signed<Intent>>(json).is_err());
}

/// An intent naming adapter 0x00…00 was accepted and signed exactly as one naming no adapter
/// (the zero word is how "none" is signed), so the order the exchange ran was not the one the
/// wallet showed; found by the `intent_submission` fuzz target (`from_typed(to_typed(x)) != x`).
#[test]
fn an_intent_naming_the_zero_adapter_is_refused() {
    let mut zero = intent();
    zero.adapter_id = Some(B256::ZERO);
    let mut none = intent();
    none.adapter_id = None;
    assert_eq!(zero.signing_hash(&chain()), none.signing_hash(&chain()));
    assert_eq!(zero.validate().unwrap_err().field(), "adapter_id");
    let signed = order::sign(zero, &chain(), &account_key(), &pq()).unwrap();
    assert_eq!(
        signed.verify(&chain(), NOW_S, bound).unwrap_err().field(),
        "order.adapter_id"
    );
    none.validate().unwrap();
    assert_eq!(Intent::from_typed(none.to_typed()).unwrap(), none);
}

#[test]
fn json_shape_is_snake_case_with_wei_strings() {
    let json = serde_json::to_value(signed_intent()).unwrap();
    let order = &json["order"];
    assert_eq!(order["max_price_wei"], "5000000");
    assert_eq!(order["min_tier"], "T1");
    assert_eq!(order["determinism"], "D");
    assert_eq!(order["deadline_s"], NOW_S + 60);
    assert!(order["request_hash"].as_str().unwrap().starts_with("0x"));
    assert_eq!(json["chain_id"], 31337);
    assert_eq!(
        hex::decode(json["signature"].as_str().unwrap().trim_start_matches("0x"))
            .unwrap()
            .len(),
        65
    );
    // No adapter: the field is absent and is signed as the zero word.
    let mut plain = intent();
    plain.adapter_id = None;
    assert_eq!(plain.to_typed().adapterId, B256::ZERO);
    assert!(
        serde_json::to_value(&plain)
            .unwrap()
            .get("adapter_id")
            .is_none()
    );
}

#[test]
fn binding_verifies_both_ways() {
    let binding = Binding::sign(&account_key(), &pq(), &chain(), 1).unwrap();
    let bound_key = binding.verify(&chain()).unwrap();
    assert_eq!(bound_key.account, order::account_of(&account_key()));
    assert_eq!(bound_key.key, pq().public());
    assert_eq!(bound_key.key_id, pq().id());
    // JSON round trip.
    let json = serde_json::to_string(&binding).unwrap();
    assert_eq!(serde_json::from_str::<Binding>(&json).unwrap(), binding);
    // The account's half is the EIP-712 PqBinding with the key's hash.
    assert_eq!(binding.pq_binding().unwrap(), pq_binding());
    assert_eq!(
        binding.key_message().unwrap().len(),
        cx_protocol::order::binding::KEY_MESSAGE_BYTES
    );
}

#[test]
fn binding_refuses_a_key_claimed_by_another_account() {
    // Mallory takes Alice's public key and its signature and claims the key for himself.
    let alice = Binding::sign(&account_key(), &pq(), &chain(), 1).unwrap();
    let mallory_key = SigningKey::from_slice(&[0x66; 32]).unwrap();
    let mallory_own =
        Binding::sign(&mallory_key, &Identity::from_seed([1; 32]), &chain(), 1).unwrap();
    let mut claim = alice.clone();
    claim.account = order::account_of(&mallory_key);
    // Mallory can sign the PqBinding for his account, but the key's signature names Alice.
    let digest = claim.pq_binding().unwrap().signing_hash(&chain());
    claim.signature = Bytes::copy_from_slice(&order::sign_digest(&mallory_key, &digest));
    let err = claim.verify(&chain()).unwrap_err();
    assert_eq!(err.code(), "cosignature_wrong", "{err}");
    // And an account cannot borrow a key: Mallory's key signature over Alice's binding fails.
    let mut borrow = alice.clone();
    borrow.mldsa_signature = mallory_own.mldsa_signature.clone();
    assert_eq!(
        borrow.verify(&chain()).unwrap_err().code(),
        "cosignature_wrong"
    );
    // A key swapped in under Alice's account signature: the PqBinding hash no longer matches.
    let mut swapped = alice.clone();
    swapped.mldsa_key = mallory_own.mldsa_key.clone();
    swapped.mldsa_signature = mallory_own.mldsa_signature;
    assert_eq!(
        swapped.verify(&chain()).unwrap_err().code(),
        "signature_wrong"
    );
    // Another chain's domain.
    let err = alice.verify(&order::domain(1, settlement())).unwrap_err();
    assert_eq!(err.code(), "wrong_domain");
    let mut relabelled = alice;
    relabelled.chain_id = 1;
    assert_eq!(
        relabelled
            .verify(&order::domain(1, settlement()))
            .unwrap_err()
            .code(),
        "signature_wrong"
    );
}

#[test]
fn binding_missing_halves_are_refused() {
    let binding = Binding::sign(&account_key(), &pq(), &chain(), 1).unwrap();
    let mut no_sig = binding.clone();
    no_sig.signature = Bytes::new();
    assert_eq!(
        no_sig.verify(&chain()).unwrap_err().code(),
        "signature_missing"
    );
    let mut no_pq = binding.clone();
    no_pq.mldsa_signature = Bytes::new();
    assert_eq!(
        no_pq.verify(&chain()).unwrap_err().code(),
        "cosignature_missing"
    );
    let mut short_key = binding;
    short_key.mldsa_key = Bytes::from_static(&[1, 2, 3]);
    assert_eq!(short_key.verify(&chain()).unwrap_err().field(), "mldsa_key");
}

#[test]
fn session_grant_names_its_bearer_by_hash() {
    let grant = session_grant();
    assert!(grant.bearer_matches(b"cx-session-secret"));
    assert!(!grant.bearer_matches(b"cx-session-secreT"));
    // A grant past its expiry is refused like an expired order.
    let signed = order::sign(grant.clone(), &chain(), &account_key(), &pq()).unwrap();
    signed.verify(&chain(), NOW_S, bound).unwrap();
    let err = signed.verify(&chain(), grant.expiry_s, bound).unwrap_err();
    assert_eq!(err.code(), "expired");
}

#[test]
fn tab_terms_must_be_signed_by_their_buyer() {
    // Terms naming someone else as buyer, signed by our account, are refused: a tab's ref must
    // commit to terms its buyer signed.
    let mut terms = tab_terms();
    terms.buyer = Address::repeat_byte(0xbb);
    let signed = order::sign(terms, &chain(), &account_key(), &pq()).unwrap();
    let err = signed.verify(&chain(), NOW_S, bound).unwrap_err();
    assert_eq!(
        (err.code(), err.field()),
        ("signature_wrong", "order.buyer")
    );
    let mut binding = pq_binding();
    binding.account = Address::repeat_byte(0xbb);
    let signed = order::sign(binding, &chain(), &account_key(), &pq()).unwrap();
    assert_eq!(
        signed
            .verify_signatures(&chain(), bound)
            .unwrap_err()
            .field(),
        "order.account"
    );
}

#[test]
fn tab_ref_binds_chain_and_contract() {
    let terms = tab_terms();
    let here = terms.tab_ref(&chain());
    assert_eq!(here, terms.signing_hash(&chain()));
    assert_ne!(here, terms.tab_ref(&order::domain(31338, settlement())));
    assert_ne!(
        here,
        terms.tab_ref(&order::domain(31337, Address::repeat_byte(1)))
    );
}

#[test]
fn wallet_json_hashes_to_the_sol_digest_in_alloys_dynamic_eip712() {
    use alloy_dyn_abi::eip712::TypedData;
    fn check<T: Order>(order: T) {
        let json = order.typed_data(&chain());
        let typed: TypedData = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(
            typed.eip712_signing_hash().unwrap(),
            order.signing_hash(&chain()),
            "{json:#}"
        );
    }
    check(intent());
    check(reserve());
    check(rent());
    check(search());
    check(tab_terms());
    check(session_grant());
    check(pq_binding());
}

#[test]
fn wallet_json_has_the_eth_sign_typed_data_v4_shape() {
    let schema = order::wallet_typed_data(Kind::Intent, &chain(), None);
    assert_eq!(schema["primaryType"], "Intent");
    assert!(schema.get("message").is_none());
    let domain_types: Vec<&str> = schema["types"]["EIP712Domain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        domain_types,
        ["name", "version", "chainId", "verifyingContract"]
    );
    assert_eq!(schema["domain"]["name"], "compute-exchange");
    assert_eq!(schema["domain"]["version"], "1");
    assert_eq!(schema["domain"]["chainId"], 31337);
    assert_eq!(
        schema["domain"]["verifyingContract"],
        settlement().to_checksum(None)
    );
    assert_eq!(
        schema["types"]["Intent"][0],
        serde_json::json!({"name": "want", "type": "string"})
    );
    let full = intent().typed_data(&chain());
    let message = &full["message"];
    assert_eq!(message["want"], "llama-8b");
    assert_eq!(message["maxPriceWei"], "5000000");
    assert_eq!(message["minTier"], 1);
    assert_eq!(message["deadline"], (NOW_S + 60).to_string());
    assert_eq!(message["adapterId"], format!("0x{}", "ad".repeat(32)));
    // The sol! value the message came from.
    let _: typed::Intent = intent().to_typed();
}
