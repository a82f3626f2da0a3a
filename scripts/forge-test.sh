#!/usr/bin/env bash
# Runs the contracts' checks: installs the toolchain (scripts/setup-foundry.sh), runs `forge test`
# (unit, fuzz with the pinned seed, invariant), checks the committed gas snapshot, and checks that
# the committed ABI + bytecode artifacts in contracts/artifacts/ match a fresh compile.
# Exits non-zero on any failure.
#   CX_FORGE_UPDATE=1 scripts/forge-test.sh   rewrites the artifacts and the gas snapshot instead.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup-foundry.sh"
forge="$root/.tools/forge"
cd "$root/contracts"

echo "== forge test" >&2
"$forge" test --summary

# Gas snapshot (invariant runs excluded: their gas is a property of the fuzz sequence).
if [[ "${CX_FORGE_UPDATE:-0}" == 1 ]]; then
  "$forge" snapshot --no-match-test invariant_ >/dev/null
  echo "== gas snapshot written to contracts/.gas-snapshot" >&2
else
  echo "== forge snapshot --check" >&2
  "$forge" snapshot --no-match-test invariant_ --check >/dev/null
fi

# Artifacts: compile into a scratch folder and compare with what is committed.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$forge" build --skip test --out "$scratch/out" --cache-path "$scratch/cache" >/dev/null
node bin/export-artifacts.cjs "$scratch/out" "$scratch/artifacts"
if [[ "${CX_FORGE_UPDATE:-0}" == 1 ]]; then
  rm -rf artifacts && cp -r "$scratch/artifacts" artifacts
  echo "== artifacts written to contracts/artifacts" >&2
elif ! diff -r "$scratch/artifacts" artifacts >/dev/null; then
  echo "forge-test: contracts/artifacts are stale; run CX_FORGE_UPDATE=1 scripts/forge-test.sh and commit" >&2
  exit 1
else
  echo "== artifacts up to date" >&2
fi
