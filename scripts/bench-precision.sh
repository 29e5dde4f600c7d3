#!/usr/bin/env bash
# `make bench-precision`: kiln at --precision bf16 against kiln in f32 on the shared models, as a
# table: the median latency of each (same threads, taking turns), the speed-up, and how far bf16
# lies from f32 on SAMPLES random inputs (the largest deviation, over the largest |f32|, and in
# how many rows along the outputs' last axis the largest element, a classifier's top-1, is the
# same).
#
#   scripts/bench-precision.sh [MODELS_DIR]   default: ../shared/models next to the repo ($MODELS)
#   THREADS=2 ITERS=30 WARMUP=5 ROUNDS=3      as for scripts/bench.sh
#   PRECISION=bf16 SAMPLES=100                the precision against f32; random inputs compared
#
# A model kiln cannot compile at the precision says so in its row.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
MODELS="${1:-${MODELS:-$REPO/../shared/models}}"
THREADS="${THREADS:-2}"
ITERS="${ITERS:-30}"
WARMUP="${WARMUP:-5}"
ROUNDS="${ROUNDS:-3}"
PRECISION="${PRECISION:-bf16}"
SAMPLES="${SAMPLES:-100}"
say() { printf 'bench-precision: %s\n' "$*" >&2; }

if [ ! -d "$MODELS" ]; then
    say "no models folder at $MODELS (give one: scripts/bench-precision.sh DIR, or MODELS=DIR)"
    exit 1
fi
say "building kiln (release)"
cargo build --release -q -p kiln-compiler --bin kiln >&2
KILN="${CARGO_TARGET_DIR:-$REPO/target}/release/kiln"
BENCH_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-cache.XXXXXX")
trap 'rm -rf "$BENCH_CACHE"' EXIT

# Prints kiln bench's JSON line for a model at a precision, with a number of timed runs (and
# extra flags), or nothing.
kiln_json() {
    local model=$1 precision=$2 iters=$3
    shift 3
    KILN_CACHE="$BENCH_CACHE" "$KILN" bench "$model" --precision "$precision" --threads "$THREADS" \
        --iters "$iters" --warmup "$WARMUP" --json --quiet "$@" 2>/dev/null | tail -n 1 || true
}
field() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2], {}, d))' "$1" "$2" 2>/dev/null || true; }
median() {
    [ $# -gt 0 ] || return 0
    python3 -c 'import sys, statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"
}
fmt() { if [ -n "$1" ]; then printf '%.3f' "$1"; else printf 'n/a'; fi; }

say "models in $MODELS, $THREADS threads, $ROUNDS rounds of $ITERS runs each, $PRECISION against f32 on $SAMPLES random inputs; load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
printf '%-34s %10s %10s %9s %12s %12s %10s\n' model "f32 ms" "$PRECISION ms" speed-up "max |diff|" "relative" "top-1 same"
for dir in "$MODELS"/*/; do
    dir=${dir%/}
    model="$dir/model.onnx"
    [ -f "$model" ] || continue
    name=$(basename "$dir")
    # The first run at the precision also compares it with f32 (and warms the cache).
    first=$(kiln_json "$model" "$PRECISION" 1 --deviation --deviation-samples "$SAMPLES")
    if [ -z "$first" ]; then
        printf '%-34s %s\n' "$name" "(kiln cannot run it at $PRECISION: kiln bench $model --precision $PRECISION)"
        continue
    fi
    f32_runs=()
    low_runs=()
    for _ in $(seq "$ROUNDS"); do
        a=$(field "$(kiln_json "$model" f32 "$ITERS")" median_ms)
        [ -z "$a" ] || f32_runs+=("$a")
        b=$(field "$(kiln_json "$model" "$PRECISION" "$ITERS")" median_ms)
        [ -z "$b" ] || low_runs+=("$b")
    done
    f32_ms=$(median "${f32_runs[@]}")
    low_ms=$(median "${low_runs[@]}")
    speedup=""
    if [ -n "$f32_ms" ] && [ -n "$low_ms" ]; then
        speedup=$(python3 -c 'import sys; print("%.2fx" % (float(sys.argv[1]) / float(sys.argv[2])))' "$f32_ms" "$low_ms")
    fi
    printf '%-34s %10s %10s %9s %12s %12s %10s\n' "$name" "$(fmt "$f32_ms")" "$(fmt "$low_ms")" "${speedup:-n/a}" \
        "$(field "$first" '"%.3e" % deviation["max_abs"]')" "$(field "$first" '"%.3e" % deviation["max_relative"]')" \
        "$(field "$first" '"%d/%d" % (deviation["same_top1"], deviation["rows"])')"
done
say "f32 ms, $PRECISION ms: kiln's median latency (median over rounds, taking turns); speed-up: f32 / $PRECISION; max |diff|: the largest deviation of an output element from f32 over the samples, relative: over the largest |f32|; top-1 same: rows (along the outputs' last axis, over the samples) whose largest element is the same; load average now: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
