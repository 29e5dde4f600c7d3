#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, for a session that the `device` tool lends one to.
# Nothing here runs in CI or `make test`; on a machine without a GPU every step says so and stops.
#
# 1. Here, on the build machine:   scripts/gpu/session.sh prepare
#    Builds kiln (release) and fills .gpu-session/ (git ignores it) with what the GPU machine
#    needs, in loads that each fit the device tool's 64 MiB working-tree limit:
#      jit/   kiln (stripped, xz) and the ONNX node tests     -> single ops, node tests
#      aot1/  the runtime-only runner and CUDA artifacts (sm_90) of every model in
#             ../shared/models but resnet18, mobilenet_v2 also at --precision tf32
#      aot2/  resnet18 (f32)        aot3/  resnet18 at --precision tf32
# 2. On the GPU machine, through the device tool, from the repository root (one call each; the
#    first is the one that matters most):
#      run(command="scripts/gpu/session.sh ops",          carry=[".gpu-session/jit"])
#        single ops (MatMul 4096^3, the ResNet convolutions, ReduceL2, Softmax, LayerNorm, a
#        depthwise convolution) at f32/tf32/bf16 against PyTorch on the same GPU, each checked
#        against PyTorch's result (scripts/gpu/ops.py), then `ncu` on the f32 MatMul and the
#        3x3 convolution when NCU=1.
#      run(command="scripts/gpu/session.sh node",         carry=[".gpu-session/jit"])
#      run(command="scripts/gpu/session.sh models aot1",  carry=[".gpu-session/aot1"])
#      run(command="scripts/gpu/session.sh models aot2",  carry=[".gpu-session/aot2"])
#      run(command="scripts/gpu/session.sh models aot3",  carry=[".gpu-session/aot3"])
#    (`ops node` runs both steps in one call. TORCH=0 before a models run skips the PyTorch
#    timings.)
#    Each prints a summary and leaves JSON under $OUT: ops.json, node_cuda.json (every node
#    test), models_<load>.json (kiln's match and median time per model next to PyTorch eager
#    with TF32 off and on, and torch.compile, on the same GPU: scripts/gpu/torch_baselines.py).
# 3. Training (issue 37) on the GPU: here `scripts/gpu/session.sh prepare-train` (train_cifar
#    and the digits into .gpu-session/train), then on the machine
#      run(command="scripts/gpu/session.sh train", carry=[".gpu-session/train"])
#    trains the digits on --device cuda and compares with PyTorch (accuracy within a point),
#    then times the CIFAR-10 CNN's step against PyTorch eager on the GPU ($OUT/train_*.txt).
# 4. The CPU at 1, 4 and 16 threads (the machine's 16 cores; no GPU used): here
#      scripts/gpu/session.sh prepare-cpu        (kiln alone into .gpu-session/cpu, 35 MB)
#    then on the machine
#      run(command="scripts/gpu/session.sh cpu-scale", carry=[".gpu-session/cpu"], timeout_s=560)
#    writes the bench models there (scripts/bench_models.py: squeezenet1_1, yolov8n_320,
#    dbnet_mv3_640, and resnet18 and mobilenet_v2 exported by its PyTorch), checks kiln's output
#    on each and prints one table: model, threads, kiln ms, onnxruntime ms, ratio and each
#    engine's speed-up over 1 thread (scripts/bench_threads.py; $OUT/cpu_scale.json, .txt).
#    THREADS_LIST=1,4,16 ROUNDS=3 SECONDS_EACH=0.5 BUDGET=330 (seconds of checks and timing,
#    after which no measurement starts); KILN=PATH PYTHON=PATH run it anywhere, as
#      KILN=target/release/kiln PYTHON=$(scripts/setup-python.sh) THREADS_LIST=1,2 \
#        scripts/gpu/session.sh cpu-scale
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { printf 'gpu-session: %s\n' "$*" >&2; }
OUT="${OUT:-/tmp/gpu-session-out}"
mkdir -p "$OUT"
ARCH="${KILN_CUDA_ARCH:-sm_90}"   # the H100 and H200

need_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "SKIPPED: no NVIDIA GPU here (nvidia-smi finds none); run this on the GPU machine"; exit 3
  fi
  nvidia-smi -L >&2
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(help)
# `models` takes its load as the next word: pair them up.
i=0
while [ $i -lt ${#steps[@]} ]; do
step=${steps[$i]}; arg=${steps[$((i + 1))]:-}
i=$((i + 1))
[ "$step" = models ] && i=$((i + 1))
set -- "$step" "$arg"
case "${1:-}" in
prepare)
  EXCLUDE=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$EXCLUDE")"
  grep -qx '/.gpu-session/' "$EXCLUDE" 2>/dev/null || echo '/.gpu-session/' >> "$EXCLUDE"
  say "building kiln and the runtime-only runner (release)"
  cargo build --release -q -p kiln-compiler --bin kiln
  cargo build --release -q -p kiln-runtime --example run_artifact
  NODE="${KILN_CACHE:-$HOME/.cache/kiln}/onnx-1.22.0/node"
  [ -d "$NODE" ] || scripts/fetch-onnx-tests.sh
  MODELS=../shared/models
  rm -rf .gpu-session && mkdir -p .gpu-session/jit .gpu-session/aot1 .gpu-session/aot2 .gpu-session/aot3
  cp target/release/kiln .gpu-session/jit/kiln && strip .gpu-session/jit/kiln && xz -T0 -6 .gpu-session/jit/kiln
  tar -C "$(dirname "$NODE")" -cJf .gpu-session/jit/node.tar.xz node
  compile_model() { # DIR NAME LOAD PRECISION
    local out=".gpu-session/$3/$2"
    mkdir -p "$out"
    say "compiling $2 for CUDA ($ARCH, $4)"
    target/release/kiln compile "$1/model.onnx" --target cuda --cuda-arch "$ARCH" --precision "$4" -o "$out/model.kiln" -q --no-cache
    cp "$1"/test_data_set_0/*.pb "$out/"
  }
  for d in "$MODELS"/*/; do
    name=$(basename "$d"); load=aot1; [ "$name" = resnet18_dynamo_op18 ] && load=aot2
    compile_model "$d" "$name" "$load" f32
    case "$name" in
      resnet18_dynamo_op18) compile_model "$d" "$name@tf32" aot3 tf32 ;;
      mobilenet_v2_dynamo_op18) compile_model "$d" "$name@tf32" aot1 tf32 ;;
    esac
  done
  for load in aot1 aot2 aot3; do cp target/release/examples/run_artifact ".gpu-session/$load/"; strip ".gpu-session/$load/run_artifact"; done
  du -sh .gpu-session/* >&2
  say "ready: see the comment at the top of this script for the device runs"
  ;;
prepare-cpu)
  EXCLUDE=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$EXCLUDE")"
  grep -qx '/.gpu-session/' "$EXCLUDE" 2>/dev/null || echo '/.gpu-session/' >> "$EXCLUDE"
  say "building kiln (release)"
  cargo build --release -q -p kiln-compiler --bin kiln
  rm -rf .gpu-session/cpu && mkdir -p .gpu-session/cpu
  cp target/release/kiln .gpu-session/cpu/kiln && strip .gpu-session/cpu/kiln && xz -T0 -6 .gpu-session/cpu/kiln
  # The launch pool's synchronisation cost at 1 to 16 threads (runtime only: small).
  cargo build --release -q -p kiln-runtime --example pool_cost
  cp target/release/examples/pool_cost .gpu-session/cpu/ && strip .gpu-session/cpu/pool_cost
  du -sh .gpu-session/cpu >&2
  say "ready: run(command=\"scripts/gpu/session.sh cpu-scale\", carry=[\".gpu-session/cpu\"], timeout_s=560)"
  ;;
prepare-train)
  EXCLUDE=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$EXCLUDE")"
  grep -qx '/.gpu-session/' "$EXCLUDE" 2>/dev/null || echo '/.gpu-session/' >> "$EXCLUDE"
  say "building train_cifar (release) and the digits"
  cargo build --release -q -p kiln-compiler --example train_cifar
  rm -rf .gpu-session/train && mkdir -p .gpu-session/train
  cp target/release/examples/train_cifar .gpu-session/train/ && strip .gpu-session/train/train_cifar && xz -T0 -6 .gpu-session/train/train_cifar
  py=$(scripts/setup-train.sh)
  "$py" scripts/train_digits.py prepare /tmp/kiln-digits --epochs 10 >&2
  tar -C /tmp -cJf .gpu-session/train/digits.tar.xz kiln-digits
  du -sh .gpu-session/train >&2
  say "ready: run(command=\"scripts/gpu/session.sh train\", carry=[\".gpu-session/train\"])"
  ;;
train)
  # Issue 37 on the GPU: the digits trained by kiln's compiled step on --device cuda against
  # PyTorch's run of the same network, data order and weights (accuracy within a point), then
  # the CIFAR-10 CNN's step time against PyTorch eager on the same GPU (TF32 off both sides).
  need_gpu
  dir=.gpu-session/train; [ -f "$dir/train_cifar.xz" ] || { say "missing $dir (run 'prepare-train' here and carry it)"; exit 2; }
  xz -dc "$dir/train_cifar.xz" > /tmp/train_cifar && chmod +x /tmp/train_cifar
  rm -rf /tmp/kiln-digits && tar -C /tmp -xJf "$dir/digits.tar.xz"
  args=(--batch 64 --lr 0.01 --momentum 0.9 --threads 2)
  /tmp/train_cifar --data /tmp/kiln-digits "${args[@]}" --every 22 --device cuda | tee "$OUT/train_digits_cuda.txt"
  python3 scripts/train_digits.py compare /tmp/kiln-digits "${args[@]}" | tee -a "$OUT/train_digits_cuda.txt"
  for r in 1 2 3; do
    /tmp/train_cifar --steps 60 --device cuda | grep 'median' | sed "s/^/round $r kiln cuda: /"
    python3 scripts/train_digits.py bench --steps 60 --device cuda | sed "s/^/round $r /"
  done | tee "$OUT/train_step_cuda.txt"
  ;;
cpu-scale)
  # kiln against onnxruntime on the CPU at 1, 4 and 16 threads; needs no GPU.
  PY="${PYTHON:-python3}"
  if [ -z "${KILN:-}" ]; then
    for dir in .gpu-session/cpu .gpu-session/jit; do
      [ -f "$dir/kiln.xz" ] || continue
      xz -dc "$dir/kiln.xz" > /tmp/kiln-cpu && chmod +x /tmp/kiln-cpu && KILN=/tmp/kiln-cpu && break
    done
  fi
  [ -n "${KILN:-}" ] || { say "missing .gpu-session/cpu/kiln.xz (run 'prepare-cpu' here and carry it), or give KILN=PATH"; exit 2; }
  command -v cc >/dev/null || say "no cc on the PATH: kiln links its CPU code with it"
  "$KILN" --version >&2
  say "$(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  models="${BENCH_MODELS_DIR:-/tmp/kiln-bench-models}"
  tv=--torchvision; [ "${TORCHVISION:-1}" = 0 ] && tv=
  # shellcheck disable=SC2086
  "$PY" scripts/bench_models.py "$models" $tv --stats | tee "$OUT/cpu_scale_models.txt" >&2
  # The detectors first: a measurement started past the budget is skipped.
  dirs=()
  for n in yolov8n_320 dbnet_mv3_640 squeezenet1_1 resnet18_dynamo_op18 mobilenet_v2_dynamo_op18; do
    [ ! -f "$models/$n/model.onnx" ] || dirs+=("$models/$n")
  done
  if [ -x .gpu-session/cpu/pool_cost ]; then
    .gpu-session/cpu/pool_cost 20000 | tee "$OUT/pool_cost.txt"
  fi
  PYTHONUNBUFFERED=1 "$PY" scripts/bench_threads.py --kiln "$KILN" --threads "${THREADS_LIST:-1,4,16}" \
    --rounds "${ROUNDS:-3}" --seconds "${SECONDS_EACH:-0.5}" --budget "${BUDGET:-330}" \
    --json "$OUT/cpu_scale.json" "${dirs[@]}" | tee "$OUT/cpu_scale.txt"
  ;;
ops)
  need_gpu
  dir=.gpu-session/jit; [ -f "$dir/kiln.xz" ] || { say "missing $dir (run 'prepare' here and carry it)"; exit 2; }
  [ -x /tmp/kiln ] || { xz -dc "$dir/kiln.xz" > /tmp/kiln && chmod +x /tmp/kiln; }
  /tmp/kiln devices | tee "$OUT/devices.txt" >&2
  PYTHONUNBUFFERED=1 python3 scripts/gpu/ops.py --kiln /tmp/kiln --json "$OUT/ops.json" | tee "$OUT/ops.md"
  if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
    # The two kernels that matter most, with the counters that say why.
    for op in "MatMul" "Conv 3x3, 64->64, 56x56, batch 1"; do
      say "ncu: $op"
      ncu --target-processes all --section SpeedOfLight --section Occupancy --section LaunchStats -k regex:tile_gemm -c 2 \
        python3 scripts/gpu/ops.py --kiln /tmp/kiln --iters 1 --only "$op" > "$OUT/ncu_${op%%,*}.txt" 2>&1 || true
      grep -E "Duration|Throughput|Registers|Occupancy|Shared Memory" "$OUT/ncu_${op%%,*}.txt" | head -30 >&2 || true
    done
  fi
  ;;
node)
  need_gpu
  dir=.gpu-session/jit; [ -f "$dir/kiln.xz" ] || { say "missing $dir (run 'prepare' here and carry it)"; exit 2; }
  [ -x /tmp/kiln ] || { xz -dc "$dir/kiln.xz" > /tmp/kiln && chmod +x /tmp/kiln; }
  rm -rf /tmp/node && tar -C /tmp -xJf "$dir/node.tar.xz"
  /tmp/kiln devices | tee "$OUT/devices.txt" >&2
  start=$(date +%s.%N)
  set +e
  /tmp/kiln check /tmp/node --device cuda --json "$OUT/node_cuda.json" -q > "$OUT/node_cuda.txt" 2>&1
  set -e
  end=$(date +%s.%N)
  tail -n 40 "$OUT/node_cuda.txt"
  echo "node tests on cuda: $(tail -n 1 "$OUT/node_cuda.txt") in $(python3 -c "print(round($end - $start))") s" | tee "$OUT/node_summary.txt"
  ;;
models)
  need_gpu
  load="${2:?which load: aot1 or aot2}"; dir=".gpu-session/$load"
  [ -x "$dir/run_artifact" ] || { say "missing $dir (run 'prepare' here and carry it)"; exit 2; }
  names=()
  : > "$OUT/kiln_$load.jsonl"
  for m in "$dir"/*/; do
    name=$(basename "$m"); names+=("$name")
    inputs=$(ls "$m"input_*.pb | sort -V); expects=$(ls "$m"output_*.pb | sort -V | sed 's/^/--expect /')
    # shellcheck disable=SC2086
    "$dir/run_artifact" "$m/model.kiln" $inputs $expects --bench 200 --profile --json | tee "$m/run.txt" >&2 || true
    tail -n 1 "$m/run.txt" | sed "s/^{/{\"name\": \"$name\", /" >> "$OUT/kiln_$load.jsonl"
  done
  bases=(); for n in "${names[@]}"; do bases+=("${n%@*}"); done
  [ "${TORCH:-1}" = 0 ] || PYTHONUNBUFFERED=1 python3 scripts/gpu/torch_baselines.py --json "$OUT/torch_$load.json" $(printf '%s\n' "${bases[@]}" | sort -u) >&2 || say "PyTorch baselines failed"
  python3 - "$OUT/kiln_$load.jsonl" "$OUT/torch_$load.json" "$OUT/models_$load.json" <<'PY'
import json, sys
kiln = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
try:
    torch = json.load(open(sys.argv[2]))
except Exception:
    torch = {"models": {}}
rows = []
print(f"{'model':32} {'match':>5} {'kiln ms':>9} {'torch ms':>9} {'compiled':>9} {'kiln/torch':>10}")
for k in kiln:
    base, _, precision = k["name"].partition("@")
    t = torch["models"].get(base, {})
    # A --precision tf32 artifact against PyTorch with TF32 on; f32 against TF32 off.
    kiln_ms, eager = k.get("median_ms"), t.get("eager_tf32_ms" if precision == "tf32" else "eager_ms")
    ratio = kiln_ms / eager if kiln_ms and eager else None
    rows.append({**k, "torch_eager_ms": eager, "torch_compiled_ms": t.get("compiled_ms"), "kiln_over_torch_eager": ratio})
    f = lambda x: f"{x:9.4f}" if isinstance(x, (int, float)) else f"{'-':>9}"
    print(f"{k['name']:32} {str(k['matches']):>5} {f(kiln_ms)} {f(eager)} {f(t.get('compiled_ms'))} {f(ratio):>10}")
json.dump({"device": torch.get("device"), "torch": torch.get("torch"), "models": rows}, open(sys.argv[3], "w"), indent=1)
PY
  ;;
*)
  sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
done
