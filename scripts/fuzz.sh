#!/usr/bin/env bash
# Runs kiln's fuzz targets (fuzz/, cargo-fuzz with libFuzzer on the stable toolchain: no
# sanitizer) for SECONDS each: the ONNX importer, the text-form parser, the .npy reader, the
# artifact reader and one op of every kind with odd operands and attributes, imported and
# evaluated (op_eval). Seeds: the ONNX node tests' models, fuzz/seeds/, artifacts kiln compiles here;
# the corpus grows in ~/.cache/kiln/fuzz-corpus. A crash is saved under fuzz/artifacts/TARGET/ and
# fails the script.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (default 60 s, every target)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(onnx_import text_parse npy_read artifact_read op_eval)
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
  if (cd fuzz && cargo fuzz run -s none --release "$t" "$CACHE/$t" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 -timeout=20 -print_final_stats=1 >"$log" 2>&1); then
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    say "$t: ${runs:-?} runs in ${SECONDS_EACH}s, no crash"
  else
    say "$t: FAILED (the input is under fuzz/artifacts/$t/):"
    grep -E 'ERROR|panicked|SUMMARY|Test unit written' "$log" | head -n 20 >&2
    failed=1
  fi
  rm -f "$log"
done
exit $failed
