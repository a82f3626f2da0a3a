#!/usr/bin/env bash
# Runs every test of compute-exchange: formatting, lints, the exchange server's import circles
# (none), the Rust tests of every crate, and the
# contracts' Foundry tests with the artifact staleness check. Installs what it needs first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh

echo "== cargo fmt --check" >&2
cargo fmt --all -- --check
echo "== cargo clippy" >&2
cargo clippy --workspace --all-targets --locked -- -D warnings
# The CUDA path must compile everywhere, even where it cannot run.
cargo clippy -p cx-kernels --features cuda --all-targets --locked -- -D warnings
# The exchange server's modules stay free of import circles (shared types live in leaf modules).
echo "== import circles (exchange/server)" >&2
python3 scripts/import-circles.py exchange/server/src
echo "== cargo test" >&2
cargo test --workspace --locked
if [[ -x scripts/forge-test.sh ]]; then
  echo "== contracts" >&2
  scripts/forge-test.sh
fi
echo "== all tests passed" >&2
