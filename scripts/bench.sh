#!/usr/bin/env bash
# `make bench`: kiln against onnxruntime on the shared models and four generated ones, as a
# table: median latency of each (same thread count), their ratio, and kiln's compile time cold
# (empty cache) and from the compile cache.
#
#   scripts/bench.sh [MODELS_DIR...]   default: ../shared/models next to the repo ($MODELS), then
#                                       squeezenet1_1, yolov8n_320, dbnet_mv3_640 and bert_tiny_128, written once
#                                       by scripts/bench_models.py into $KILN_CACHE/bench-models
#                                       (onnx.helper at seeded random weights, in the venv of
#                                       scripts/setup-python.sh); GENERATED=0 leaves them out
#   THREADS=2 ITERS=30 WARMUP=5         thread count for both, timed runs, warm-up runs
#   ROUNDS=3                            kiln and onnxruntime take turns this many times per model;
#                                       each column is the median of the rounds' medians (a shared
#                                       machine's load changes from one minute to the next)
#
# onnxruntime comes from PyPI into a venv outside the repo ($KILN_CACHE or ~/.cache/kiln, then
# bench-venv/), created once; without it the onnxruntime columns say n/a. kiln's numbers come
# from the last line of `kiln bench --json`.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
DIRS=("$@")
GENERATED="${GENERATED:-1}"
[ ${#DIRS[@]} -gt 0 ] || DIRS=("${MODELS:-$REPO/../shared/models}")
[ $# -eq 0 ] || GENERATED=0
THREADS="${THREADS:-2}"
ITERS="${ITERS:-30}"
WARMUP="${WARMUP:-5}"
ROUNDS="${ROUNDS:-3}"
CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
VENV="$CACHE/bench-venv"
say() { printf 'bench: %s\n' "$*" >&2; }

if [ ! -d "${DIRS[0]}" ]; then
    say "no models folder at ${DIRS[0]} (give one: scripts/bench.sh DIR, or MODELS=DIR)"
    [ "$GENERATED" != 0 ] || exit 1
fi
MODELS="${DIRS[0]}"

# The generated models (squeezenet 1.1, a YOLOv8n detector, a DBNet text detector), once.
if [ "$GENERATED" != 0 ]; then
    GEN="$CACHE/bench-models"
    if PY=$("$REPO/scripts/setup-python.sh") && "$PY" "$REPO/scripts/bench_models.py" "$GEN" >&2; then
        DIRS+=("$GEN")
    else
        say "could not write the generated models into $GEN: they are left out"
    fi
fi

# onnxruntime, once.
ORT_PY=""
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import onnxruntime, numpy' 2>/dev/null; then
    ORT_PY="$VENV/bin/python"
else
    say "installing onnxruntime and numpy into $VENV"
    if python3 -m venv "$VENV" >&2 && "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2 &&
        "$VENV/bin/python" -m pip install --quiet onnxruntime numpy >&2; then
        ORT_PY="$VENV/bin/python"
    else
        say "could not install onnxruntime (no network?): its columns will say n/a"
    fi
fi

say "building kiln (release)"
cargo build --release -q -p kiln-compiler --bin kiln >&2
KILN="${CARGO_TARGET_DIR:-$REPO/target}/release/kiln"

# A throwaway compile cache: the first run compiles cold, the second loads from it.
BENCH_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-cache.XXXXXX")
trap 'rm -rf "$BENCH_CACHE"' EXIT

# Prints `median_ms compile_ms` from kiln bench's JSON line, or nothing on failure.
kiln_bench() {
    local out
    out=$(KILN_CACHE="$BENCH_CACHE" "$KILN" bench "$1" --device cpu --threads "$THREADS" --iters "$ITERS" --warmup "$WARMUP" --json --quiet 2>/dev/null | tail -n 1) || return 0
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["median_ms"], d["compile_ms"])' "$out" 2>/dev/null || true
}

ort_bench() {
    [ -n "$ORT_PY" ] || return 0
    "$ORT_PY" - "$1" "$THREADS" "$ITERS" "$WARMUP" 2>/dev/null <<'PY' || true
import sys, time
import numpy as np
import onnxruntime as ort
path, threads, iters, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
opts = ort.SessionOptions()
opts.intra_op_num_threads = threads
opts.inter_op_num_threads = 1
opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(1000)
types = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
         "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float16)": np.float16}
feeds = {}
for i in sess.get_inputs():
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
    t = types.get(i.type)
    if t is None:
        sys.exit(0)
    if np.issubdtype(t, np.integer):
        feeds[i.name] = rng.integers(0, 10, size=shape).astype(t)
    elif t is np.bool_:
        feeds[i.name] = rng.integers(0, 2, size=shape).astype(bool)
    else:
        feeds[i.name] = rng.standard_normal(shape).astype(t)
for _ in range(warmup):
    sess.run(None, feeds)
times = []
for _ in range(iters):
    t0 = time.perf_counter()
    sess.run(None, feeds)
    times.append(time.perf_counter() - t0)
times.sort()
print(times[len(times) // 2] * 1e3)
PY
}

fmt() { if [ -n "$1" ]; then printf '%.3f' "$1"; else printf 'n/a'; fi; }

# The median of its arguments (empty without any).
median() {
    [ $# -gt 0 ] || return 0
    python3 -c 'import sys, statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"
}

say "models in ${DIRS[*]}, $THREADS threads, $ROUNDS rounds of $ITERS runs each; load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
printf '%-34s %12s %12s %8s %14s %14s\n' model "kiln ms" "onnxrt ms" ratio "compile ms" "cached ms"
for name in mlp gpt_block mobilenet_v2 resnet18; do
    if ! ls -d "$MODELS/$name"*/ >/dev/null 2>&1; then
        printf '%-34s (missing from %s: skipped)\n' "$name" "$MODELS"
    fi
done
ALL=()
for d in "${DIRS[@]}"; do [ ! -d "$d" ] || ALL+=("$d"/*/); done
for dir in "${ALL[@]}"; do
    dir=${dir%/}
    model="$dir/model.onnx"
    [ -f "$model" ] || continue
    name=$(basename "$dir")
    cold=$(kiln_bench "$model")
    if [ -z "$cold" ]; then
        printf '%-34s %12s\n' "$name" "(kiln cannot run it: kiln bench $model)"
        continue
    fi
    compile_cold=${cold##* }
    kiln_runs=()
    ort_runs=()
    compile_warm=""
    for _ in $(seq "$ROUNDS"); do
        warm=$(kiln_bench "$model")
        if [ -n "$warm" ]; then
            kiln_runs+=("${warm%% *}")
            compile_warm=${warm##* }
        fi
        ort=$(ort_bench "$model")
        [ -z "$ort" ] || ort_runs+=("$ort")
    done
    kiln_ms=$(median "${kiln_runs[@]}")
    ort_ms=$(median "${ort_runs[@]}")
    ratio=""
    if [ -n "$ort_ms" ] && [ -n "$kiln_ms" ]; then
        ratio=$(python3 -c 'import sys; print(float(sys.argv[1]) / float(sys.argv[2]))' "$kiln_ms" "$ort_ms")
    fi
    printf '%-34s %12s %12s %8s %14s %14s\n' "$name" "$(fmt "$kiln_ms")" "$(fmt "$ort_ms")" \
        "$(if [ -n "$ratio" ]; then printf '%.2fx' "$ratio"; else printf 'n/a'; fi)" "$(fmt "$compile_cold")" "$(fmt "$compile_warm")"
done
say "kiln ms and onnxrt ms: median latency (median over rounds); ratio: kiln / onnxruntime; compile: kiln bench's compile_ms cold (empty cache) and from the cache (both include loading); load average now: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
