#!/usr/bin/env bash
# The main job: the market simulation (until `cx devnet` lands). Installs what it needs, builds
# `cx` in release, replays one seeded trace through every allocator and eviction policy, and
# writes out/simulate/report.json and out/simulate/simulation.svg. Extra arguments go to
# `cx simulate` (e.g. --seed 9 --jobs 20000).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
cargo build --release --locked -p cx-cli --bin cx
exec target/release/cx simulate --out out/simulate "$@"
