#!/usr/bin/env bash
# Runs kiln's fuzz targets (fuzz/, cargo-fuzz with libFuzzer on the stable toolchain: no
# sanitizer) for SECONDS each: the ONNX importer, the text-form parser, the .npy reader, the
# artifact reader and one op of every kind with odd operands and attributes, imported and
# evaluated (op_eval), and the compiler run against the interpreter (compile_diff: built with
# `--features compiler`, since it links MLIR and LLVM). Seeds: the ONNX node tests' models, fuzz/seeds/, artifacts kiln compiles here;
# the corpus grows in ~/.cache/kiln/fuzz-corpus. A crash is saved under fuzz/artifacts/TARGET/ and
# fails the script.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (default 60 s, every target)
#   FUZZ_JOBS=N: N processes a target (libFuzzer's fork mode)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(onnx_import text_parse npy_read artifact_read op_eval compile_diff)
JOBS=${FUZZ_JOBS:-1}
say() { printf 'fuzz: %s\n' "$*" >&2; }

./scripts/setup-fuzz.sh

CACHE="${KILN_CACHE:-$HOME/.cache/kiln}/fuzz-corpus"
seed() { # TARGET SOURCE...: copies seeds into the target's corpus
  local t=$1; shift
  mkdir -p "$CACHE/$t"
  for f in "$@"; do [ -f "$f" ] && cp -n "$f" "$CACHE/$t/seed-$(basename "$(dirname "$f")")-$(basename "$f")" || true; done
}
if [ ! -f "$CACHE/.seeded" ]; then
  onnx=$(./scripts/fetch-onnx-tests.sh)
  seed onnx_import "$onnx"/node/*/model.onnx
  seed text_parse fuzz/seeds/text_parse/*
  seed npy_read fuzz/seeds/npy_read/*
  # Artifacts: a few small models compiled here (the CPU target).
  cargo build -q -p kiln-compiler --bin kiln
  mkdir -p "$CACHE/artifact_read"
  for t in test_relu test_add test_matmul_2d test_softmax_axis_1 test_if test_scan9_sum; do
    ./target/debug/kiln compile "$onnx/node/$t/model.onnx" -o "$CACHE/artifact_read/seed-$t.kiln" --no-cache --quiet \
      || say "could not compile the seed $t (skipped)"
  done
  touch "$CACHE/.seeded"
fi

(cd fuzz && cargo fuzz build -s none --release 2>&1 | tail -n 3) >&2 || { say "the fuzz build failed"; exit 1; }
if [[ " ${TARGETS[*]} " == *" compile_diff "* ]]; then
  say "building compile_diff (links MLIR and LLVM: several minutes the first time)"
  (cd fuzz && cargo fuzz build -s none --release --features compiler compile_diff 2>&1 | tail -n 3) >&2 \
    || { say "the compile_diff build failed"; exit 1; }
fi
failed=0
bin=fuzz/target/x86_64-unknown-linux-gnu/release
for t in "${TARGETS[@]}"; do
  mkdir -p "$CACHE/$t"
  # Inputs that crashed a target once (fuzz/regressions/TARGET/) must run clean first.
  if compgen -G "fuzz/regressions/$t/*" >/dev/null; then
    if ! "$bin/$t" fuzz/regressions/"$t"/* >/dev/null 2>&1; then
      say "$t: FAILED on a regression input (fuzz/regressions/$t/); run $bin/$t on each to see which"
      failed=1
      continue
    fi
  fi
  log=$(mktemp)
  features=() timeout=20 fork=()
  # The compiler's target compiles a graph an input (~0.1 s): longer per input, and linked with MLIR.
  [ "$t" = compile_diff ] && features=(--features compiler) timeout=120
  [ "$JOBS" -gt 1 ] && fork=(-fork="$JOBS")
  if (cd fuzz && cargo fuzz run -s none --release "${features[@]}" "$t" "$CACHE/$t" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 -timeout="$timeout" -print_final_stats=1 "${fork[@]}" >"$log" 2>&1); then
    # One process prints its count; fork mode prints the children's total as it goes.
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    [ -n "$runs" ] || runs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
    say "$t: ${runs:-?} runs in ${SECONDS_EACH}s, no crash"
  else
    say "$t: FAILED (the input is under fuzz/artifacts/$t/):"
    grep -E 'ERROR|panicked|SUMMARY|Test unit written' "$log" | head -n 20 >&2
    failed=1
  fi
  rm -f "$log"
done
exit $failed
