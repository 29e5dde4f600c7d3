#!/usr/bin/env bash
# What a new user does after scripts/setup.sh, outside this repository (so only
# ~/.cargo/config.toml tells cargo where LLVM/MLIR 22 is): `cargo install --path compiler
# --locked` puts `kiln` on a PATH, and a host crate depending on `kiln` by path builds and runs.
# Release builds in a target folder of their own under ~/.cache/kiln/install-check (cached
# between runs, outside the repo): from nothing, about 20 minutes on 2 cores.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${KILN_CACHE:-$HOME/.cache/kiln}/install-check
mkdir -p "$work"
say() { printf 'install-check: %s\n' "$*" >&2; }

say "cargo install --path compiler --locked (into $work/root)"
(cd "$work" && cargo install -q --locked --path "$repo/compiler" --root "$work/root" --target-dir "$work/target")
# (Whole outputs: under pipefail, a reader that stops early would fail the check by SIGPIPE.)
"$work/root/bin/kiln" --version
demo=$("$work/root/bin/kiln" demo --out "$work/demo")
printf '%s\n' "$demo" | tail -n 2

say "a host crate outside the repository, depending on kiln by path"
host="$work/host"
rm -rf "$host" && mkdir -p "$host"
cp -r "$repo/examples/host/src" "$host/"
sed -e "s|path = \"../../kiln\"|path = \"$repo/kiln\"|" "$repo/examples/host/Cargo.toml" > "$host/Cargo.toml"
printf '\n[workspace]\n' >> "$host/Cargo.toml"
cp "$repo/Cargo.lock" "$host/Cargo.lock" # the workspace's versions, pruned by cargo to what it uses
(cd "$host" && CARGO_TARGET_DIR="$work/target" cargo run -q --release)
say "pip install ./python in a fresh venv"
rm -rf "$work/venv" && python3 -m venv "$work/venv"
(cd "$work" && CARGO_TARGET_DIR="$work/target" "$work/venv/bin/pip" install -q "$repo/python")
"$work/venv/bin/pip" install -q onnx # only to write the test model
"$work/venv/bin/python" - <<'PY'
import numpy as np, kiln, onnx
from onnx import helper, TensorProto
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
sess = kiln.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
a = np.array([[-1, 2, -3, 4]], np.float32)
(out,) = sess.run(None, {"x": a})
assert (out == np.maximum(a, 0)).all(), out
print("python: kiln", kiln.__version__ if hasattr(kiln, "__version__") else "", "runs on", sess.device)
PY
say "ok"
