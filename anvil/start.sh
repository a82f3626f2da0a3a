#!/usr/bin/env bash
# Starts the devnet chains of anvil/chains.json (31337 on 8545, 31338 on 8546) from the
# project-local Anvil, with Anvil's deterministic accounts (the default test mnemonic), then
# deploys every contract to every chain with `cx-devnet deploy` (this folder's crate), which writes the
# addresses to runtime/deployments.json (git-ignored). Logs and pids go to runtime/anvil/.
#   anvil/start.sh          start + deploy
#   anvil/stop.sh           stop the chains started here
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup-foundry.sh"
run="$root/runtime/anvil"
mkdir -p "$run"
start_chain() {
  local chain_id="$1" port="$2"
  if [[ -f "$run/$chain_id.pid" ]] && kill -0 "$(cat "$run/$chain_id.pid")" 2>/dev/null; then
    echo "chain $chain_id already running (pid $(cat "$run/$chain_id.pid"))" >&2
    return
  fi
  "$root/.tools/anvil" --host 127.0.0.1 --port "$port" --chain-id "$chain_id" --accounts 40 \
    --balance 1000000 >"$run/$chain_id.log" 2>&1 &
  echo $! >"$run/$chain_id.pid"
  for _ in $(seq 1 200); do
    if "$root/.tools/cast" chain-id --rpc-url "http://127.0.0.1:$port" >/dev/null 2>&1; then
      echo "chain $chain_id on http://127.0.0.1:$port (pid $(cat "$run/$chain_id.pid"))" >&2
      return
    fi
    sleep 0.1
  done
  echo "anvil for chain $chain_id did not answer; see $run/$chain_id.log" >&2
  exit 1
}
start_chain 31337 8545
start_chain 31338 8546
cd "$root"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" cargo run -q -p cx-devnet --bin cx-devnet -- \
  deploy --chains anvil/chains.json --out runtime/deployments.json
