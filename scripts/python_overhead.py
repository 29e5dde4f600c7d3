"""Python's per-call overhead over Rust: a tiny model (x[1,16] -> Relu -> Add x) run through
kiln.InferenceSession.run and through Executable::run (the `overhead` example, path given), on
one thread, in interleaved rounds; prints each side's median per-call time and the difference."""

import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import kiln

CALLS = 20000
x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
model = helper.make_model(helper.make_graph(nodes, "tiny", [x_info], [y_info]), opset_imports=[helper.make_opsetid("", 17)])
with tempfile.NamedTemporaryFile(suffix=".onnx", delete=False) as f:
    f.write(model.SerializeToString())
    path = f.name

sess = kiln.InferenceSession(path, device="cpu", threads=1)
feeds = {"x": np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)}
run = sess.run
py, rust = [], []
for _ in range(5):
    rust.append(float(subprocess.check_output([sys.argv[1], path, str(CALLS)]).decode()))
    rounds = []
    for _ in range(15):
        start = time.perf_counter()
        for _ in range(CALLS):
            run(None, feeds)
        rounds.append((time.perf_counter() - start) * 1e6 / CALLS)
    py.append(statistics.median(rounds))
p, r = statistics.median(py), statistics.median(rust)
print(f"per call: python {p:.2f} us, rust {r:.2f} us, overhead {p - r:.2f} us (medians of 5 interleaved rounds)")
