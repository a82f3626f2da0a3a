#!/usr/bin/env python3
"""Signs EIP-712 typed data with eth-account, an implementation compute-exchange did not write.

The Rust test `eip712_python` (protocol/tests/it/eip712_python.rs) feeds this script the exact
`eth_signTypedData_v4` JSON that `cx_protocol::order::wallet_typed_data` generates, and checks
that the Rust side computes the same digest and recovers the same account from the signature.

stdin:  {"private_key": "0x…", "cases": [<typed data JSON>, …]}
stdout: {"address": "0x…", "results": [{"digest": "0x…", "signature": "0x…"}, …]}

Run with the project's virtualenv (scripts/setup.sh makes it): .tools/py/bin/python
"""

import json
import sys

try:
    from eth_account import Account
    from eth_account.messages import encode_typed_data, _hash_eip191_message
except ImportError as error:  # pragma: no cover - the message is the point
    sys.exit(f"eth-account is not installed ({error}): run scripts/setup.sh")


def main() -> None:
    request = json.load(sys.stdin)
    account = Account.from_key(request["private_key"])
    results = []
    for typed_data in request["cases"]:
        # The digest as eth-account computes it (EIP-191 version 0x01 over the typed data)...
        digest = _hash_eip191_message(encode_typed_data(full_message=typed_data))
        # ...and the signature a wallet would return for eth_signTypedData_v4.
        signed = Account.sign_typed_data(account.key, full_message=typed_data)
        assert signed.message_hash == digest
        results.append(
            {
                "digest": "0x" + digest.hex(),
                "signature": "0x" + bytes(signed.signature).hex(),
            }
        )
    json.dump({"address": account.address, "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
