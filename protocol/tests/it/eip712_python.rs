//! An independent EIP-712 implementation agrees with ours: Python's `eth-account` signs the
//! wallet JSON that `order::wallet_typed_data` generates, and the Rust side computes the same
//! digest and recovers the same account from eth-account's signature (every kind).
//!
//! The interpreter is the project's virtualenv, `.tools/py/bin/python`, which
//! `scripts/setup.sh` makes (CI runs it first). A missing interpreter fails the test, naming the
//! script: a cross-check that silently skips is no check.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use cx_protocol::order::{self, Address, B256, Bytes, Order, Signed, SigningKey};
use cx_protocol::pq::Identity;
use serde_json::{Value, json};

use crate::order::{intent, pq_binding, rent, reserve, search, session_grant, tab_terms};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("protocol/ sits in the workspace root")
        .to_path_buf()
}

/// Runs the signing script over `cases` with `private_key`; returns (address, [(digest, signature)]).
fn eth_account_sign(private_key: &[u8; 32], cases: &[Value]) -> (Address, Vec<(B256, Bytes)>) {
    let root = workspace_root();
    let python = root.join(".tools/py/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh (it installs eth-account into the .tools/py virtualenv)",
        python.display()
    );
    let script = root.join("protocol/tests/eip712/sign_typed_data.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e} (run scripts/setup.sh)",
                python.display()
            )
        });
    let request = json!({
        "private_key": format!("0x{}", hex::encode(private_key)),
        "cases": cases,
    });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    let address: Address = reply["address"].as_str().unwrap().parse().unwrap();
    let results = reply["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["digest"].as_str().unwrap().parse().unwrap(),
                r["signature"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    (address, results)
}

/// An order, its wallet JSON, and a check of eth-account's answer for it.
struct Case {
    typed_data: Value,
    check: Box<dyn Fn(Address, B256, Bytes)>,
}

fn case<T: Order + 'static>(order: T) -> Case {
    let domain = order::domain(31337, Address::repeat_byte(0x5e));
    let typed_data = order.typed_data(&domain);
    Case {
        typed_data,
        check: Box::new(move |account, digest, signature| {
            let name = T::KIND;
            assert_eq!(
                digest,
                order.signing_hash(&domain),
                "{name}: digests differ"
            );
            let pq = Identity::from_seed([0x24; 32]);
            let signed = Signed {
                account,
                chain_id: 31337,
                verifying_contract: domain.verifying_contract.unwrap(),
                order: order.clone(),
                signature,
                mldsa_signature: Bytes::copy_from_slice(
                    &pq.sign(order::ORDER_CONTEXT, digest.as_slice()).unwrap(),
                ),
            };
            let verified = signed
                .verify_signatures(&domain, |_| Some(pq.public()))
                .unwrap_or_else(|e| panic!("{name}: eth-account's signature refused: {e}"));
            assert_eq!(verified.account, account, "{name}");
        }),
    }
}

#[test]
fn eth_account_signatures_over_our_wallet_json_verify_for_every_kind() {
    let private_key = [0x42u8; 32];
    let cases = [
        case(intent()),
        case({
            let mut plain = intent();
            plain.adapter_id = None;
            plain.want = "summarise: ünïcödé ✓".to_owned();
            plain.nonce = u64::MAX; // above 2^53: a decimal string in the message
            plain.max_price_wei = u128::MAX;
            plain
        }),
        case({
            let mut market = intent();
            market.market_limit = true; // a `bool` in the typed data
            market
        }),
        case(reserve()),
        case(rent()),
        case(search()),
        case(tab_terms()),
        case(session_grant()),
        case(pq_binding()),
    ];
    let typed: Vec<Value> = cases.iter().map(|c| c.typed_data.clone()).collect();
    let (address, results) = eth_account_sign(&private_key, &typed);
    let ours = order::account_of(&SigningKey::from_slice(&private_key).unwrap());
    assert_eq!(
        address, ours,
        "eth-account derives another address from the key"
    );
    assert_eq!(results.len(), cases.len());
    for (case, (digest, signature)) in cases.iter().zip(results) {
        (case.check)(address, digest, signature);
    }
}
