#!/usr/bin/env bash
# A regression guard for speed: builds BASE (a git revision) in a worktree beside this working
# tree, builds the working tree, and runs the quick forms of the benchmarks for both, alternating
# (base, new; then new, base; ...), then prints each figure's median on both sides and its ratio
# new ÷ base, with the CPU it ran on. Not part of CI: it takes ~30 min and a quiet machine.
#
#   scripts/bench-compare.sh [BASE] [--rounds N] [--only clearing,intake,market,sign,lora] [--reuse]
#
# --reuse runs the benches again on the binaries the last run built (runtime/bench-compare/),
# without building: more rounds, or another bench, for the same pair.
#
# BASE defaults to the previous main: the upstream of this branch if it has one; otherwise HEAD
# when the working tree has changes (what you are about to commit against what is committed),
# else HEAD~1 (the last commit against the one before it).
#
# Figures are every number of each bench's JSON line (nested keys joined by '.'); a ratio > 1
# is more of that figure (good for per-second figures, bad for latencies: the name says which);
# a number equal on both sides (the run's shape: bundles, intents) is left out.
# The two builds share the working tree's target directory (CARGO_TARGET_DIR), so dependencies
# are compiled once; each side's sources are touched before its build (see `build`) and its
# binaries copied out before the other is built.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

base=""
rounds=3
only="clearing,intake,market,sign,lora"
reuse=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
    --only) only="${2:?--only needs a list}"; shift 2 ;;
    --reuse) reuse=true; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "bench-compare: unknown option $1" >&2; exit 2 ;;
    *) [[ -z "$base" ]] || { echo "bench-compare: one BASE only" >&2; exit 2; }; base="$1"; shift ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]?$ ]] || { echo "bench-compare: --rounds must be 1..99" >&2; exit 2; }
for b in ${only//,/ }; do
  case "$b" in clearing|intake|market|sign|lora) ;; *)
    echo "bench-compare: unknown bench '$b' (clearing, intake, market, sign, lora)" >&2; exit 2 ;;
  esac
done
if [[ -z "$base" ]]; then
  if git rev-parse --abbrev-ref --symbolic-full-name '@{upstream}' >/dev/null 2>&1; then
    base='@{upstream}'
  elif [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
    base=HEAD
  else
    base=HEAD~1
  fi
fi
base_rev="$(git rev-parse --verify --quiet "$base^{commit}")" \
  || { echo "bench-compare: '$base' is not a commit" >&2; exit 2; }

scripts/setup.sh >&2
export PATH="$root/.tools:$PATH"
# Both sides' binaries find Anvil here, not beside the worktree they were built in (removed).
export CX_ANVIL="$root/.tools/anvil"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
work="$root/runtime/bench-compare"
tree="$(dirname "$root")/.bench-compare-base"

cleanup() { git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# One build of the three binaries from $1 into $2.
#
# Cargo names a workspace crate's artifacts the same whatever folder it is built from, and
# judges them fresh when no source is newer than them: after the base's build in the worktree,
# the working tree's older sources would be "fresh" and its binaries the base's (or a failed
# mix). So every tracked file of the tree is touched first: each side is built from its own.
build() {
  git -C "$1" ls-files -z | (cd "$1" && xargs -0 touch -c)
  (cd "$1" && cargo build --release --locked -p cx-cli --bin cx -p cx-provider --bin cx-provider \
    -p cx-settlement --bin cx-signer >&2)
  cp "$CARGO_TARGET_DIR/release/cx" "$CARGO_TARGET_DIR/release/cx-provider" \
    "$CARGO_TARGET_DIR/release/cx-signer" "$2/"
}
if $reuse; then
  for side in base new; do
    [[ -x "$work/$side/cx" ]] || { echo "bench-compare: --reuse: no $side build in $work" >&2; exit 2; }
  done
  base_rev="$(cat "$work/base/REV")"
  echo "== reusing the last build: base $base_rev and the working tree as it was then" >&2
  rm -rf "$work/results"
  mkdir -p "$work/results"
else
  rm -rf "$work"
  mkdir -p "$work/base" "$work/new" "$work/results"
  cleanup
  echo "== building base $base ($base_rev) in $tree" >&2
  git worktree add --detach "$tree" "$base_rev" >&2
  build "$tree" "$work/base"
  echo "$base_rev" >"$work/base/REV"
  cleanup
  echo "== building the working tree" >&2
  build "$root" "$work/new"
fi

# The quick form of each bench, run with the binaries of $1.
run_bench() {
  local bin="$1" bench="$2"
  # cx finds cx-provider and cx-signer beside itself; the environment says so outright.
  export CX_SIGNER_BIN="$bin/cx-signer" CX_PROVIDER_BIN="$bin/cx-provider"
  case "$bench" in
    clearing) "$bin/cx" bench clearing --bundles 2000 --intents 40000 --scan-intents 500 --json ;;
    intake) "$bin/cx" bench intake --intents 1500 --json ;;
    market) "$bin/cx" bench market --jobs 20 --json ;;
    sign) "$bin/cx" bench sign --rounds 20 --json ;;
    lora) "$bin/cx-provider" bench lora --quick --repeats 3 --json ;;
  esac
}

for ((r = 1; r <= rounds; r++)); do
  # Alternate which side goes first, so drift (heat, a neighbour) falls on both.
  if ((r % 2)); then order="base new"; else order="new base"; fi
  for bench in ${only//,/ }; do
    for side in $order; do
      echo "== round $r/$rounds: $bench ($side)" >&2
      out="$work/results/$bench.$side.$r"
      if ! run_bench "$work/$side" "$bench" >"$out.log" 2>"$out.err"; then
        echo "bench-compare: $bench ($side) failed, see $out.err" >&2
        continue
      fi
      grep '^{' "$out.log" | tail -n 1 >"$out.json" || true
    done
  done
done

cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo
echo "base $base_rev vs the working tree; $rounds round(s), medians; $cpu, $(nproc) threads"
python3 - "$work/results" "$only" <<'PY'
import json, os, statistics, sys

results, only = sys.argv[1], sys.argv[2].split(",")

def leaves(value, prefix=""):
    """Every number in a JSON value, by its dotted path (list items by index)."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield prefix, float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list) and len(value) <= 16:
        for i, v in enumerate(value):
            # A list of objects with a name is read by that name, not by position.
            key = v.get("name") or v.get("policy") or v.get("case") if isinstance(v, dict) else None
            yield from leaves(v, f"{prefix}[{key if key is not None else i}]")

print(f"| {'bench':<8} | {'figure':<48} | {'base':>12} | {'new':>12} | {'new/base':>8} |")
print(f"|{'-' * 10}|{'-' * 50}|{'-' * 14}|{'-' * 14}|{'-' * 10}|")
for bench in only:
    sides = {}
    for side in ("base", "new"):
        figures = {}
        for name in sorted(os.listdir(results)):
            if name.startswith(f"{bench}.{side}.") and name.endswith(".json"):
                text = open(os.path.join(results, name)).read().strip()
                if not text:
                    continue
                for key, v in leaves(json.loads(text)):
                    figures.setdefault(key, []).append(v)
        sides[side] = {k: statistics.median(v) for k, v in figures.items()}
    if not sides["base"] or not sides["new"]:
        print(f"| {bench:<8} | {'(no result on one side: see runtime/bench-compare/results)':<48} | {'':>12} | {'':>12} | {'':>8} |")
        continue
    for key in sides["new"]:
        if key not in sides["base"]:
            continue
        b, n = sides["base"][key], sides["new"][key]
        if b == n:
            continue  # the run's shape (bundles, intents, ...), not a measurement
        ratio = f"{n / b:.2f}" if b not in (0.0,) and b == b and n == n else "-"
        print(f"| {bench:<8} | {key[:48]:<48} | {b:>12.4g} | {n:>12.4g} | {ratio:>8} |")
PY
