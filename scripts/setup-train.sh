#!/usr/bin/env bash
# The Python environment for the training checks (`make train-digits`, scripts/train_digits.py;
# `make grad-vs-torch`, scripts/grad_vs_torch.py), outside the repo ($KILN_CACHE or
# ~/.cache/kiln, then train-venv/): numpy, scikit-learn (its bundled digits: no download), onnx
# (grad_vs_torch.py writes its models with onnx.helper) and PyTorch's CPU build (the reference
# the digits run, the step timing and the gradient check compare with). PyTorch comes from its
# CPU wheel index when that is reachable, else from PyPI. Prints the venv's python on stdout,
# logs to stderr. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
VENV="$CACHE/train-venv"
say() { printf 'setup-train: %s\n' "$*" >&2; }

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import numpy, sklearn, torch, onnx' 2>/dev/null; then
    say "$VENV present"
else
    say "creating $VENV (numpy, scikit-learn, onnx, torch CPU; a few minutes)"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet numpy scikit-learn onnx >&2
    "$VENV/bin/python" -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu >&2 \
        || "$VENV/bin/python" -m pip install --quiet torch >&2
fi
echo "$VENV/bin/python"
