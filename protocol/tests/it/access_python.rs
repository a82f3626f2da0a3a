//! A read credential signed by a wallet we did not write: Python's `eth-account` signs the read
//! message with `personal_sign` (`encode_defunct(text=…)`), and the exchange's check accepts it
//! for that account at that exchange only. The interpreter is `.tools/py/bin/python`
//! (`scripts/setup.sh`); a missing one fails the test rather than skipping it.

use std::process::Command;

use cx_protocol::access::{AccessError, AccessGrant, Scope};
use cx_protocol::order::{Address, B256};

#[test]
fn a_read_credential_signed_by_eth_account_is_accepted_for_its_account_and_exchange_only() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".tools/py/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh",
        python.display()
    );
    let key = "0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318";
    let account: Address = "0x2c7536E3605D9C16a7a3D7b1898e529396a65c23"
        .parse()
        .unwrap();
    let exchange = B256::repeat_byte(0xab);
    let now_s = 1_800_000_000;
    let grant = AccessGrant {
        scope: Scope::Read,
        account,
        exchange,
        expires_s: now_s + 300,
    };
    let script = r#"
import sys
from eth_account import Account
from eth_account.messages import encode_defunct
signed = Account.sign_message(encode_defunct(text=sys.argv[2]), private_key=sys.argv[1])
assert Account.from_key(sys.argv[1]).address == sys.argv[3]
print("0x" + bytes(signed.signature).hex())
"#;
    let output = Command::new(&python)
        .args([
            "-c",
            script,
            key,
            &grant.message(),
            &account.to_checksum(None),
        ])
        .output()
        .expect("the project's python runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let signature = String::from_utf8(output.stdout).unwrap();
    let header = format!(
        "CX-Read account={account},expires={},signature={}",
        grant.expires_s,
        signature.trim()
    );
    assert_eq!(
        AccessGrant::verify(&header, Scope::Read, exchange, now_s),
        Ok(account)
    );
    // The same signature read at another exchange, or claimed for another account, is refused.
    assert_eq!(
        AccessGrant::verify(&header, Scope::Read, B256::repeat_byte(0xcd), now_s),
        Err(AccessError::NotSigner(account))
    );
    let other = Address::repeat_byte(0x11);
    let claimed = header.replace(&account.to_string(), &other.to_string());
    assert_eq!(
        AccessGrant::verify(&claimed, Scope::Read, exchange, now_s),
        Err(AccessError::NotSigner(other))
    );
}
