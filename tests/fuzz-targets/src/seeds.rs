//! Valid inputs for every target, made by the project's own code: real signed intents, real
//! receipts, real handshake messages and session requests, a real PEFT adapter and a real base
//! model written by the provider's writers. `fuzz/corpus/` starts from these (`cargo test -p
//! cx-fuzz-targets --test corpus -- --ignored write_seeds` writes them, then `cargo fuzz cmin`).

use std::collections::BTreeMap;

use cx_protocol::matmul::{MATMUL_MODEL, MatmulRequest};
use cx_protocol::order::{self, B256, InferenceRequest, Intent, request_hash};
use cx_protocol::pq::{Initiator, Responder};
use cx_protocol::receipt::{Receipt, SignedReceipt};
use cx_protocol::train::{TrainRequest, train_market};
use cx_protocol::{DeterminismClass, Tier};
use cx_provider::model::{GenModelOptions, Projection, write_generated_model};
use cx_settlement::wire::{
    CommitRequest, Committed, DkgDone, DkgRequest, PeerBody, PeerMessage, Request, Response, Share,
    SignRotationRequest, SignerInfo,
};
use frost_secp256k1 as frost;
use rand_chacha::rand_core::SeedableRng;

use crate::fixtures::{fixtures, responder_limits};
use crate::weights::join_adapter;

/// The seeds of `target`, each a name and its bytes.
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let named = |items: Vec<Vec<u8>>| {
        items
            .into_iter()
            .enumerate()
            .map(|(i, bytes)| (format!("seed-{i}"), bytes))
            .collect()
    };
    match target {
        "intent_submission" => named(intent_submissions()),
        "intent_signature" => named(intent_signatures()),
        "receipt" => named(results()),
        "receipt_signature" => named(signed_receipts()),
        "pq_handshake" => named(handshakes()),
        "pq_frames" => named(session_frames()),
        "peft_adapter" => named(adapters()),
        "model_weights" => named(models()),
        other => panic!("no target {other}"),
    }
}

fn intent(want: &str, request_hash: B256, adapter_id: Option<B256>) -> Intent {
    Intent {
        want: want.into(),
        adapter_id,
        request_hash,
        deadline_s: 2_000,
        max_price_wei: 5_000_000,
        market_limit: false,
        min_tier: Tier::T1,
        determinism: DeterminismClass::D,
        tab_id: 3,
        nonce: 1,
        expiry_s: 1_500,
    }
}

fn sign(intent: Intent) -> order::Signed<Intent> {
    let fx = fixtures();
    order::sign(intent, &fx.domain, &fx.account_key, &fx.agent).expect("signs")
}

fn json(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec_pretty(value).expect("encodes")
}

fn intent_submissions() -> Vec<Vec<u8>> {
    let request = InferenceRequest {
        prompt: order::chat_prompt([("user", "Say hello.")]),
        max_tokens: 16,
        ..Default::default()
    };
    let matmul = MatmulRequest {
        m: 4,
        k: 8,
        n: 2,
        seed_a: 1,
        seed_b: 2,
    };
    let train = TrainRequest::example(&format!("0x{}", "ab".repeat(32)));
    vec![
        json(&serde_json::json!({
            "intent": sign(intent("llama-8b", request_hash(&request), None)),
            "request": request,
        })),
        json(&serde_json::json!({
            "intent": sign(intent("llama-8b", request_hash(&request), Some(B256::repeat_byte(0xad)))),
            "request": request,
            "wait": true,
        })),
        json(&serde_json::json!({
            "intent": sign(intent(MATMUL_MODEL, matmul.hash(), None)),
            "matmul": matmul,
        })),
        json(&serde_json::json!({
            "intent": sign(intent(&train_market("llama-8b"), train.hash(), None)),
            "train": train,
        })),
    ]
}

fn intent_signatures() -> Vec<Vec<u8>> {
    let fx = fixtures();
    let signed = sign(intent("llama-8b", B256::repeat_byte(1), None));
    let digest = signed.digest(&fx.domain);
    let mut raw = order::sign_digest(&fx.account_key, &digest).to_vec();
    raw.extend_from_slice(digest.as_slice());
    vec![
        json(&signed),
        json(&sign(intent(
            "llama-8b",
            B256::repeat_byte(2),
            Some(B256::repeat_byte(3)),
        ))),
        raw,
    ]
}

fn signed_receipt(tokens: u64) -> SignedReceipt {
    let fx = fixtures();
    let receipt = Receipt {
        job_id: [9; 32],
        chain_id: 31337,
        escrow_id: 3,
        input_hash: [1; 32],
        output_hash: [2; 32],
        adapter_hash: [0; 32],
        tokens,
        compute_ms: 12,
        class: DeterminismClass::D,
        provider: [0x11; 20],
        provider_key: fx.provider.id().0,
        amount_owed_wei: 4_000_000,
        buyer: fx.account.0.0,
    };
    SignedReceipt::sign(receipt, &fx.provider).expect("signs")
}

fn results() -> Vec<Vec<u8>> {
    vec![
        json(&serde_json::json!({
            "output": {
                "text": "Hello!",
                "finish_reason": "stop",
                "prompt_tokens": 5,
                "completion_tokens": 2,
            },
            "receipt": signed_receipt(2),
        })),
        json(&serde_json::json!({
            "output": {
                "text": "",
                "finish_reason": "stop",
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "trained": {
                    "adapter_id": format!("0x{}", "cd".repeat(32)),
                    "steps": 30,
                    "loss_first": 5.5,
                    "loss_last": 1.25,
                },
            },
            "receipt": signed_receipt(0),
        })),
    ]
}

fn signed_receipts() -> Vec<Vec<u8>> {
    let fx = fixtures();
    let signed = signed_receipt(7);
    let mut raw = fx.provider.public().to_bytes().to_vec();
    raw.extend_from_slice(&signed.signature);
    raw.extend_from_slice(&signed.receipt.canonical_bytes());
    vec![json(&signed), raw]
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn handshakes() -> Vec<Vec<u8>> {
    let fx = fixtures();
    let directory = |id: &cx_protocol::pq::IdentityId| {
        (*id == fx.coordinator.id()).then(|| fx.coordinator.public())
    };
    let (initiator, m1) = Initiator::start(&fx.coordinator, fx.signer.public());
    let (_responder, m2) = Responder::respond(&fx.signer, directory, &m1).expect("answers");
    let (_session, m3) = initiator.finish(&m2).expect("finishes");
    assert!(m1.len().max(m3.len()) <= responder_limits().max_frame_bytes);
    vec![
        [vec![0], frame(&m1), frame(&m3)].concat(),
        [vec![1], frame(&m2)].concat(),
        [vec![2], frame(&m3)].concat(),
    ]
}

fn session_frames() -> Vec<Vec<u8>> {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
    let (shares, public) =
        frost::keys::generate_with_dealer(3, 2, frost::keys::IdentifierList::Default, &mut rng)
            .expect("deals");
    let packages: BTreeMap<_, _> = shares
        .into_iter()
        .map(|(id, share)| {
            (
                id,
                frost::keys::KeyPackage::try_from(share).expect("verifies"),
            )
        })
        .collect();
    let mut nonces = BTreeMap::new();
    let mut commitments = BTreeMap::new();
    for (id, package) in packages.iter().take(2) {
        let (n, c) = frost::round1::commit(package.signing_share(), &mut rng);
        nonces.insert(*id, n);
        commitments.insert(*id, c);
    }
    let first = *commitments.keys().next().expect("two signers");
    let signing_package = frost::SigningPackage::new(commitments.clone(), b"rotate to epoch 2");
    let share =
        frost::round2::sign(&signing_package, &nonces[&first], &packages[&first]).expect("signs");
    let round_id = B256::repeat_byte(0x42);
    let requests = [
        Request::Ping,
        Request::Info,
        Request::Dkg(DkgRequest {
            epoch: 2,
            min_signers: 2,
            participants: vec![1, 2, 3],
        }),
        Request::Commit(CommitRequest {
            round_id,
            group_key: *public.verifying_key(),
        }),
        Request::SignRotation(SignRotationRequest {
            round_id,
            chain_id: 31337,
            new_epoch: 2,
            signing_package,
        }),
        Request::Peer(PeerMessage {
            epoch: 2,
            from: 1,
            body: PeerBody::Echo(B256::repeat_byte(7)),
        }),
    ];
    let responses = [
        Response::Pong,
        Response::Ack,
        Response::Info(SignerInfo {
            index: 1,
            operator: "op-1".into(),
            region: "eu".into(),
            epochs: vec![1, 2],
        }),
        Response::DkgDone(DkgDone {
            epoch: 2,
            public_key_package: public,
        }),
        Response::Committed(Committed {
            round_id,
            commitments: commitments[&first],
        }),
        Response::Share(Share { round_id, share }),
        Response::Refused {
            reason: "no".into(),
        },
    ];
    let mut out: Vec<Vec<u8>> = requests
        .iter()
        .map(|r| frame(&serde_json::to_vec(r).expect("encodes")))
        .collect();
    out.extend(
        responses
            .iter()
            .map(|r| frame(&serde_json::to_vec(r).expect("encodes"))),
    );
    // A conversation: several frames in one input.
    out.push(
        requests[..3]
            .iter()
            .flat_map(|r| frame(&serde_json::to_vec(r).expect("encodes")))
            .collect(),
    );
    out
}

fn temp_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cx-fuzz-seeds-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn adapters() -> Vec<Vec<u8>> {
    use cx_provider::lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, write_random_adapter};
    let fx = fixtures();
    let mut out = Vec::new();
    for (i, (rank, targets)) in [
        (2, vec![Projection::Q, Projection::V]),
        (4, Projection::ALL.to_vec()),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = temp_dir(&format!("adapter-{i}"));
        write_random_adapter(&dir, &fx.base, rank, &targets, 0.01, i as u64).expect("writes");
        let config = std::fs::read(dir.join(ADAPTER_CONFIG)).expect("reads");
        let weights = std::fs::read(dir.join(ADAPTER_WEIGHTS)).expect("reads");
        out.push(join_adapter(&config, &weights));
        let _ = std::fs::remove_dir_all(&dir);
    }
    out
}

fn models() -> Vec<Vec<u8>> {
    use cx_provider::model::DType;
    let mut out = Vec::new();
    for (i, dtype) in [DType::F32, DType::Bf16].into_iter().enumerate() {
        let dir = temp_dir(&format!("model-{i}"));
        write_generated_model(
            &dir,
            &GenModelOptions {
                hidden: 8,
                layers: 1,
                heads: 2,
                kv_heads: 1,
                intermediate: 8,
                vocab: 258,
                max_positions: 32,
                tie: true,
                dtype,
                seed: i as u64,
            },
        )
        .expect("writes");
        out.push(std::fs::read(dir.join("model.safetensors")).expect("reads"));
        let _ = std::fs::remove_dir_all(&dir);
    }
    out
}
