#!/usr/bin/env bash
# Fetches the ONNX backend test data once into a cache outside the repo and prints its folder.
#   node/ (1765 tests), pytorch-converted/, pytorch-operator/, simple/  from the onnx==1.22.0 wheel
# (1.23 wheels no longer ship them). Cache: $KILN_CACHE or ~/.cache/kiln.
set -euo pipefail
VERSION=1.22.0
CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
DEST="$CACHE/onnx-$VERSION"
if [ -f "$DEST/.complete" ]; then echo "$DEST"; exit 0; fi
say() { printf 'fetch-onnx-tests: %s\n' "$*" >&2; }
mkdir -p "$CACHE"
tmp=$(mktemp -d "$CACHE/.onnx-fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
say "downloading the onnx==$VERSION wheel (test data only is kept) into $DEST"
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "onnx==$VERSION" >&2
wheel=$(ls "$tmp"/onnx-"$VERSION"-*.whl | head -n 1)
python3 - "$wheel" "$tmp/out" <<'PY'
import sys, zipfile, os
wheel, out = sys.argv[1], sys.argv[2]
prefix = "onnx/backend/test/data/"
keep = ("node/", "pytorch-converted/", "pytorch-operator/", "simple/")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and name[len(prefix):].startswith(keep) and not name.endswith("/"):
            target = os.path.join(out, name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as dst:
                dst.write(src.read())
PY
rm -rf "$DEST"
mv "$tmp/out" "$DEST"
touch "$DEST/.complete"
say "$(ls "$DEST/node" | wc -l) node tests ready"
echo "$DEST"
