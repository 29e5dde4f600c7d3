#!/usr/bin/env bash
# Fails if kiln-runtime depends, directly or not, on MLIR or LLVM: AOT artifacts must run without them.
set -euo pipefail
cd "$(dirname "$0")/.."
heavy=$(cargo tree -q -p kiln-runtime -e normal,build --prefix none | grep -E '^(melior|mlir-sys|inkwell|llvm-sys|tblgen)' || true)
if [ -n "$heavy" ]; then
  echo "kiln-runtime must not depend on MLIR or LLVM, but it pulls in:"; echo "$heavy" | sort -u; exit 1
fi
echo "check-runtime-deps: kiln-runtime links no MLIR/LLVM"
