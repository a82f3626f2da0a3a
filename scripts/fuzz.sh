#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo fuzz, libFuzzer) of what comes off the network or the disk:
# order bodies, both signatures, receipts, the committee's post-quantum session frames, PEFT
# adapters and model weights. The targets are plain functions in tests/fuzz-targets (their
# assertions are there); fuzz/ is the cargo-fuzz project that wraps each in one line. Like
# scripts/schemathesis.sh it is the long, exploratory part and is not run by scripts/test.sh;
# `cargo test` only replays the committed corpus. What it found is in docs/reliability.md.
#
#   scripts/fuzz.sh                                  # every target, 60 s each
#   FUZZ_SECONDS=600 FUZZ_TARGETS="receipt pq_frames" scripts/fuzz.sh
#   FUZZ_UPDATE=1 scripts/fuzz.sh                    # then minimise new inputs into fuzz/corpus
#
# New inputs go to fuzz/scratch/<target>/ (ignored), not to the committed corpus. With
# FUZZ_UPDATE=1 the corpus and the scratch inputs are then minimised together into the corpus:
# libFuzzer's set-cover merge over edges (`-set_cover_merge=1 -use_counters=0`), the smallest set
# that reaches every edge any of them reaches. Plain `cargo fuzz cmin` keeps every hit-count
# feature too: 6 700 files, 5.7 MB after 120 s a target, where this keeps the corpus under 2 MB. FUZZ_SANITIZER (default address) is passed to `cargo fuzz --sanitizer`; `none` builds
# and runs faster. A crash stops its target, leaves the input in fuzz/artifacts/<target>/, and
# the script exits non-zero after the table.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

seconds="${FUZZ_SECONDS:-60}"
sanitizer="${FUZZ_SANITIZER:-address}"
all_targets="intent_submission intent_signature receipt receipt_signature pq_handshake pq_frames peft_adapter model_weights"
targets="${FUZZ_TARGETS:-$all_targets}"

# Longest input per target, bytes: about twice the largest valid one (a signed intent or receipt
# carries a 3 309-byte ML-DSA signature and a 1 952-byte key as hex; M2 is 4 493 bytes).
max_len() {
  case "$1" in
    intent_submission | intent_signature) echo 24576 ;;
    receipt | receipt_signature) echo 32768 ;;
    pq_handshake) echo 12288 ;;
    pq_frames) echo 8192 ;;
    peft_adapter | model_weights) echo 65536 ;;
    *) echo "fuzz: unknown target $1" >&2; exit 2 ;;
  esac
}

# cargo-fuzz, project-local (like Foundry and schemathesis under .tools/).
export PATH="$root/.tools/cargo-fuzz/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz into .tools/cargo-fuzz" >&2
  cargo install cargo-fuzz --locked --root .tools/cargo-fuzz
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: cargo fuzz needs a nightly toolchain: rustup toolchain install nightly" >&2
  exit 2
fi

echo "fuzz: building ($sanitizer sanitizer)" >&2
cargo +nightly fuzz build --sanitizer "$sanitizer" >&2

mkdir -p fuzz/scratch/logs
host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
failed=0
rows=()
for target in $targets; do
  corpus="fuzz/corpus/$target"
  mkdir -p "$corpus" "fuzz/artifacts/$target"
  # libFuzzer writes new inputs into the first directory and reads them all.
  dirs=("fuzz/scratch/$target" "$corpus")
  mkdir -p "fuzz/scratch/$target"
  log="fuzz/scratch/logs/$target.log"
  before=$(find "fuzz/artifacts/$target" -type f | wc -l)
  echo "fuzz: $target for ${seconds}s (log $log)" >&2
  status=0
  cargo +nightly fuzz run --sanitizer "$sanitizer" "$target" "${dirs[@]}" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -max_len="$(max_len "$target")" \
    -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
  after=$(find "fuzz/artifacts/$target" -type f | wc -l)
  crashes=$((after - before))
  final_stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  execs=$(final_stat number_of_executed_units)
  rate=$(final_stat average_exec_per_sec)
  added=$(final_stat new_units_added)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  rows+=("$(printf '%-18s %8s %12s %8s %8s %6s %8s' "$target" "$seconds" "${execs:-?}" \
    "${rate:-?}" "${added:-?}" "${cov:-?}" "$crashes")")
  if [[ "$status" != 0 || "$crashes" != 0 ]]; then
    failed=1
    echo "fuzz: $target FAILED (exit $status); the input is in fuzz/artifacts/$target/:" >&2
    grep -E "panicked at|ERROR: libFuzzer|SUMMARY" "$log" | head -5 >&2 || true
  fi
  if [[ "${FUZZ_UPDATE:-0}" == 1 && "$status" == 0 ]]; then
    merged="fuzz/scratch/merged-$target"
    rm -rf "$merged" && mkdir -p "$merged"
    "fuzz/target/$host/release/$target" -set_cover_merge=1 -use_counters=0 \
      -max_len="$(max_len "$target")" -rss_limit_mb=2048 "$merged" "$corpus" \
      "fuzz/scratch/$target" >>"$log" 2>&1
    # Inputs named by hand (seeds, fixed crashes) stay under their names.
    find "$corpus" -type f ! -name 'seed-*' ! -name 'crash-*' -delete
    cp -n "$merged"/* "$corpus"/ 2>/dev/null || true
    rm -rf "$merged"
  fi
done

printf '%-18s %8s %12s %8s %8s %6s %8s\n' target seconds executions exec/s "new" cov crashes
printf '%s\n' "${rows[@]}"
exit "$failed"
