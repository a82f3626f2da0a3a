#!/usr/bin/env bash
# The long part of the reliability suite (issue 16), not run by scripts/test.sh: the load
# generator on intake and on the OpenAI door (the knee, 1×/2×/4× past it, a 10-minute soak each,
# release build), schemathesis against /openapi.json, and the cargo fuzz targets for a bounded
# time each. Reports go to out/long/ (one JSON per run); docs/reliability.md records the figures.
#
#   scripts/long.sh                    # everything, ~35 min on 2 cores
#   SOAK_S=60 FUZZ_SECONDS=30 scripts/long.sh   # shorter
#
# Exits non-zero if any part failed (an unexpected answer under load counts as a failure).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh >&2
out=out/long
mkdir -p "$out"
soak="${SOAK_S:-600}"
status=0

cargo build -q --release -p cx-cli --bin cx
for target in intake door; do
  echo "== load: $target (soak ${soak} s)" >&2
  if target/release/cx bench load --target "$target" --soak-s "$soak" --json \
    | tee "$out/load-$target.txt"; then
    tail -n 1 "$out/load-$target.txt" >"$out/load-$target.json"
    python3 - "$out/load-$target.json" <<'PY' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
if report["unexpected"]:
    sys.exit(f"load {report['target']}: {report['unexpected']} unexpected answers")
PY
  else
    status=1
  fi
done

echo "== schemathesis" >&2
scripts/schemathesis.sh || status=1

echo "== cargo fuzz" >&2
scripts/fuzz.sh || status=1
exit "$status"
