#!/usr/bin/env bash
# Runs the prebuilt gpu-check binary on a GPU machine (which needs no Rust toolchain) and
# prints its tables: CUDA vs CPU SGMV on fresh random inputs (relative error), then SGMV time
# vs the cuBLAS base GEMM.
#
# Build it on a development machine first (no CUDA needed there: cudarc loads the libraries at
# run time):
#     cargo build --release -p cx-kernels --features cuda --bin gpu-check
# Usage:
#     kernels/gpu-check.sh [path/to/gpu-check] [--seed N] [--iters N]
# Exit status: 0 all checks passed, 1 a CUDA result disagreed with the CPU, 2 CUDA unusable.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/../target/release/gpu-check"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    bin="$1"
    shift
fi
if [ ! -x "$bin" ]; then
    echo "gpu-check.sh: no executable at $bin" >&2
    echo "build it with: cargo build --release -p cx-kernels --features cuda --bin gpu-check" >&2
    exit 2
fi

# cudarc dlopens libcuda, libnvrtc and libcublas: add the usual CUDA folders, and those of
# NVIDIA's Python wheels, to the loader path when they exist.
extra=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
    /usr/local/cuda-13*/lib64 /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
    /usr/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$dir" ] && extra="${extra:+$extra:}$dir"
done
export LD_LIBRARY_PATH="${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
exec "$bin" "$@"
