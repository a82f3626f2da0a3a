#!/usr/bin/env bash
# Schema-driven fuzzing of the exchange's HTTP API: schemathesis (PyPI, pinned) against the
# /openapi.json of a `cx serve` on loopback (plain HTTP, a throwaway database, no chains), every
# check on. It is the long, exploratory part of the hostile-input tests and is not run by
# scripts/test.sh; what it found and what was fixed is in docs/reliability.md.
#
#   scripts/schemathesis.sh                 # 30 examples per operation
#   EXAMPLES=200 scripts/schemathesis.sh    # more; extra arguments go to `st run`
#
# The exit status is schemathesis's (non-zero while it reports failures).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh >&2

venv=.tools/schemathesis
if ! "$venv/bin/st" --version >/dev/null 2>&1; then
  echo "schemathesis: installing schemathesis into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'schemathesis==4.32.5'
fi

cargo build -q -p cx-cli --bin cx
port="${PORT:-18443}"
db="${SCHEMATHESIS_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/cx_schemathesis}"
log="$(mktemp -t cx-schemathesis-serve.XXXXXX.log)"
target/debug/cx serve --listen "127.0.0.1:$port" --insecure-http --database-url "$db" \
  >"$log" 2>&1 &
serve=$!
trap 'kill "$serve" 2>/dev/null || true; wait "$serve" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  kill -0 "$serve" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.2
done
echo "schemathesis: cx serve on 127.0.0.1:$port (log $log)" >&2
"$venv/bin/st" run "http://127.0.0.1:$port/openapi.json" \
  --max-examples "${EXAMPLES:-30}" --workers 1 --checks all "$@"
