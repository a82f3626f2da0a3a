#!/usr/bin/env bash
# Stops the chains anvil/start.sh started (by their recorded pids).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for pidfile in "$root"/runtime/anvil/*.pid; do
  [[ -f "$pidfile" ]] || continue
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then kill "$pid"; fi
  rm -f "$pidfile"
done
