#!/usr/bin/env bash
# The Python environment for serving kiln with Ray Serve (examples/serving/, `make serve-demo`),
# outside the repo ($KILN_CACHE or ~/.cache/kiln, then serve-venv/): ray[serve] at one exact
# version, numpy, onnx and onnxruntime (the reference answers), maturin, and kiln's own package
# built from ./python in release mode. The build goes through the workspace's target/ (as `make
# python` does, with --no-build-isolation), so an unchanged tree rebuilds nothing; kiln is
# reinstalled only when a file it is built from is newer than the last install (a build that fails
# is an error: the demo serves this tree's kiln, never an older one). Prints the venv's
# python on stdout, logs to stderr. Safe to run again.
#
#   KILN_SERVE_PROFILE=dev   build kiln in the dev profile instead (reuses `cargo test`'s build;
#                            slower Rust glue around the same generated kernels)
#   KILN_SERVE_REBUILD=1     reinstall kiln even when nothing changed
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION=2.60.0
CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
VENV="$CACHE/serve-venv"
PROFILE="${KILN_SERVE_PROFILE:-release}"
STAMP="$VENV/.kiln-installed-$PROFILE"
say() { printf 'setup-serve: %s\n' "$*" >&2; }

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$RAY_VERSION" 2>/dev/null <<'EOF'
import sys
import maturin, numpy, onnx, onnxruntime, ray
from ray import serve
sys.exit(ray.__version__ != sys.argv[1])
EOF
then
    say "$VENV present (ray $RAY_VERSION)"
else
    say "creating $VENV (ray[serve]==$RAY_VERSION, numpy, onnx, onnxruntime, maturin; a few minutes)"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet "ray[serve]==$RAY_VERSION" numpy "onnx==1.22.0" onnxruntime \
        "maturin>=1.5,<2" >&2
    rm -f "$VENV"/.kiln-installed-*
fi

# kiln: rebuilt when missing, asked for, or older than any file it is built from.
newer=""
if [ -f "$STAMP" ] && [ -z "${KILN_SERVE_REBUILD:-}" ]; then
    newer=$(find ir compiler runtime python/src python/kiln python/Cargo.toml python/pyproject.toml \
        Cargo.toml Cargo.lock -type f -newer "$STAMP" -print -quit 2>/dev/null || true)
fi
if [ -f "$STAMP" ] && [ -z "${KILN_SERVE_REBUILD:-}" ] && [ -z "$newer" ] \
    && (cd /tmp && "$VENV/bin/python" -c 'import kiln' 2>/dev/null); then
    say "kiln ($PROFILE) up to date"
else
    say "installing kiln from ./python ($PROFILE profile${newer:+; $newer changed}; minutes if the Rust changed)"
    touch "$VENV/.kiln-building"
    if PATH="$VENV/bin:$PATH" MATURIN_PEP517_ARGS="--profile $PROFILE" \
        "$VENV/bin/python" -m pip install --quiet --no-build-isolation --force-reinstall --no-deps ./python >&2 \
        && (cd /tmp && "$VENV/bin/python" -c 'import kiln' >&2); then
        rm -f "$VENV"/.kiln-installed-*
        mv "$VENV/.kiln-building" "$STAMP"
    else
        rm -f "$VENV/.kiln-building"
        say "building kiln failed (above): the demo serves the kiln of this tree, not an older one"
        exit 1
    fi
fi
echo "$VENV/bin/python"
