#!/usr/bin/env bash
# The Python environment for kiln's package tests, outside the repo ($KILN_CACHE or ~/.cache/kiln,
# then python-venv/), created once: maturin (which builds the package), pytest, numpy, onnx (the
# backend test suite), onnxruntime (the reference sessions are compared with) and onnx_ir (which
# onnxruntime's MatMulNBitsQuantizer needs). Prints the
# venv's python. Safe to run again.
set -euo pipefail
CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
VENV="$CACHE/python-venv"
say() { printf 'setup-python: %s\n' "$*" >&2; }
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import maturin, pytest, xdist, numpy, onnx, onnx_ir, onnxruntime' 2>/dev/null; then
    say "$VENV present"
else
    say "creating $VENV (maturin, pytest, numpy, onnx, onnxruntime; about a minute)"
    python3 -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet "maturin>=1.5,<2" pytest pytest-xdist numpy "onnx==1.22.0" onnx_ir onnxruntime >&2
fi
echo "$VENV/bin/python"
