#!/usr/bin/env bash
# The checks that need an NVIDIA GPU (issue 5), for a session that the `device` tool lends one to.
# Nothing here runs in CI or `make test`; on a machine without a GPU every step says so and stops.
#
# 1. Here, on the build machine:   scripts/gpu/session.sh prepare
#    Builds kiln (release) and fills .gpu-session/ (git ignores it) with what the GPU machine
#    needs, in loads that each fit the device tool's 64 MiB working-tree limit:
#      jit/   kiln (stripped, xz) and the ONNX node tests     -> the node tests on --device cuda
#      aot1/  the runtime-only runner and CUDA artifacts of every model in ../shared/models but
#             resnet18, with their test data                   -> correctness and timings
#      aot2/  the same for resnet18
# 2. On the GPU machine, through the device tool, from the repository root:
#      run(command="scripts/gpu/session.sh node",        carry=[".gpu-session/jit"])
#      run(command="scripts/gpu/session.sh models aot1", carry=[".gpu-session/aot1"])
#      run(command="scripts/gpu/session.sh models aot2", carry=[".gpu-session/aot2"])
#    (TORCH=0 before a models run skips the PyTorch timings.)
#    Each prints a summary and leaves JSON under $OUT: node_cuda.json (every node test), and
#    models_<load>.json (kiln's match and median time per model next to PyTorch eager and
#    torch.compile on the same GPU, from scripts/gpu/torch_baselines.py).
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
  rm -rf .gpu-session && mkdir -p .gpu-session/jit .gpu-session/aot1 .gpu-session/aot2
  cp target/release/kiln .gpu-session/jit/kiln && strip .gpu-session/jit/kiln && xz -T0 -6 .gpu-session/jit/kiln
  tar -C "$(dirname "$NODE")" -cJf .gpu-session/jit/node.tar.xz node
  for d in "$MODELS"/*/; do
    name=$(basename "$d"); load=aot1; [ "$name" = resnet18_dynamo_op18 ] && load=aot2
    mkdir -p ".gpu-session/$load/$name"
    say "compiling $name for CUDA ($ARCH)"
    target/release/kiln compile "$d/model.onnx" --target cuda --cuda-arch "$ARCH" -o ".gpu-session/$load/$name/model.kiln" -q --no-cache
    cp "$d"/test_data_set_0/*.pb ".gpu-session/$load/$name/"
  done
  for load in aot1 aot2; do cp target/release/examples/run_artifact ".gpu-session/$load/"; strip ".gpu-session/$load/run_artifact"; done
  du -sh .gpu-session/* >&2
  say "ready: see the comment at the top of this script for the three device runs"
  ;;
node)
  need_gpu
  dir=.gpu-session/jit; [ -f "$dir/kiln.xz" ] || { say "missing $dir (run 'prepare' here and carry it)"; exit 2; }
  xz -dc "$dir/kiln.xz" > /tmp/kiln && chmod +x /tmp/kiln
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
  [ "${TORCH:-1}" = 0 ] || PYTHONUNBUFFERED=1 python3 scripts/gpu/torch_baselines.py --json "$OUT/torch_$load.json" "${names[@]}" >&2 || say "PyTorch baselines failed"
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
    t = torch["models"].get(k["name"], {})
    kiln_ms, eager = k.get("median_ms"), t.get("eager_ms")
    ratio = kiln_ms / eager if kiln_ms and eager else None
    rows.append({**k, "torch_eager_ms": eager, "torch_compiled_ms": t.get("compiled_ms"), "kiln_over_torch_eager": ratio})
    f = lambda x: f"{x:9.4f}" if isinstance(x, (int, float)) else f"{'-':>9}"
    print(f"{k['name']:32} {str(k['matches']):>5} {f(kiln_ms)} {f(eager)} {f(t.get('compiled_ms'))} {f(ratio):>10}")
json.dump({"device": torch.get("device"), "torch": torch.get("torch"), "models": rows}, open(sys.argv[3], "w"), indent=1)
PY
  ;;
*)
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
