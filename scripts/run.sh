#!/usr/bin/env bash
# The main job: `cx devnet`, the whole market on this machine. Installs what it needs
# (scripts/setup.sh: Foundry into .tools/, PostgreSQL if none runs; each step checks first),
# builds `cx`, `cx-provider` and `cx-signer` in release, and starts two Anvil chains, 5 signers,
# the exchange on https://127.0.0.1:8443, 3 providers and 3 agents sending traffic, each its own
# process with its log under runtime/devnet/. Ctrl-C stops them all. Extra arguments go to
# `cx devnet` (e.g. --exit-after-settled 20, --no-traffic, --providers 5, --port-offset 1000).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
cargo build --release --locked -p cx-cli --bin cx -p cx-provider --bin cx-provider \
  -p cx-settlement --bin cx-signer
exec target/release/cx devnet "$@"
