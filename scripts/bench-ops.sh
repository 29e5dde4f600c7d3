#!/usr/bin/env bash
# `make bench-ops`: kiln against onnxruntime one op at a time (GEMMs, convolutions, pooling,
# reductions, softmax, layer norm, elementwise, data movement, GRU/LSTM) on real models' shapes, as
# one table: median latency of each (same thread count), their ratio, kiln's GFLOP/s and share of
# this machine's measured fp32 peak (or GB/s for the memory-bound ops), then a summary.
#
#   scripts/bench-ops.sh [--json OUT] [--list]   arguments go to scripts/bench_ops.py
#   THREADS=2 ROUNDS=3 WARMUP=3                  thread count for both, turns per shape, warm-up runs
#   ITERS=                                       timed runs a round; unset: about 0.2 s of runs each
#   ONLY=REGEX                                   only the shapes whose name matches (see --list)
#   KILN=PATH                                    another kiln binary (then this builds none)
#
# The generated models are kept in $KILN_CACHE or ~/.cache/kiln, then bench-ops/models/.
# onnxruntime, numpy and onnx come from PyPI into the venv that `make bench` uses
# (bench-venv/ in that folder), once.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
VENV="$CACHE/bench-venv"
say() { printf 'bench-ops: %s\n' "$*" >&2; }

# The venv is shared with bench.sh, which checks for onnxruntime and numpy only: onnx is added
# to it here without touching what is there.
if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import onnxruntime, numpy, onnx' 2>/dev/null; }; then
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating $VENV"
        python3 -m venv "$VENV" >&2
        "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    fi
    missing=()
    for pkg in onnxruntime numpy onnx; do
        "$VENV/bin/python" -c "import $pkg" 2>/dev/null || missing+=("$pkg")
    done
    say "installing ${missing[*]} into $VENV"
    if ! "$VENV/bin/python" -m pip install --quiet "${missing[@]}" >&2; then
        say "could not install ${missing[*]} (no network?)"
        exit 1
    fi
fi

if [ -z "${KILN:-}" ]; then
    say "building kiln (release)"
    cargo build --release -q -p kiln-compiler --bin kiln >&2
    export KILN="${CARGO_TARGET_DIR:-$REPO/target}/release/kiln"
fi

# A throwaway compile cache for kiln alone (the models stay in $CACHE): each shape's first run
# compiles cold, the timed rounds load from it.
KILN_BENCH_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-ops-cache.XXXXXX")
export KILN_BENCH_CACHE
trap 'rm -rf "$KILN_BENCH_CACHE"' EXIT

"$VENV/bin/python" scripts/bench_ops.py "$@"
