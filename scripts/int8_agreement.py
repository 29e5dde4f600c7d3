"""How far kiln's int8 results are from onnxruntime's on the same QDQ models (`make bench-int8`):
for each OUT/<model>_int8_qdq/model.onnx, SEEDS random normal inputs run by onnxruntime (CPU, 1
thread) and by `kiln run`, and the largest difference of the output in quantization steps (the
scale of the DequantizeLinear that makes it), per input and at most.

    python int8_agreement.py KILN OUT_DIR [SEEDS]
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def output_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that writes the first output (1.0 where there is none)."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = model.graph.output[0].name
    for node in model.graph.node:
        if out in node.output and node.op_type == "DequantizeLinear" and node.input[1] in inits:
            return float(inits[node.input[1]])
    return 1.0


def steps(kiln: str, path: str, seeds: int, work: str) -> list:
    """Per seed, the largest |kiln - onnxruntime| of the first output in quantization steps."""
    model = onnx.load(path)
    step = output_step(model)
    inp = model.graph.input[0]
    shape = [d.dim_value if d.dim_value > 0 else 1 for d in inp.type.tensor_type.shape.dim]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    found = []
    for seed in range(seeds):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        x_path = os.path.join(work, "x.npy")
        np.save(x_path, x)
        want = sess.run(None, {inp.name: x})[0]
        out_dir = os.path.join(work, f"out{seed}")
        subprocess.run(
            [kiln, "run", path, "--input", f"{inp.name}={x_path}", "--output-dir", out_dir, "--threads", "1"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        got = np.load(os.path.join(out_dir, "output_0.npy"))
        found.append(float(np.abs(got.astype(np.float64) - want).max()) / step)
    return found


def main(kiln: str, out_dir: str, seeds: int) -> None:
    print(f"int8 agreement with onnxruntime ({seeds} random inputs): output quantization steps apart")
    for entry in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, entry, "model.onnx")
        if not entry.endswith("_int8_qdq") or not os.path.isfile(path):
            continue
        with tempfile.TemporaryDirectory() as work:
            per_seed = steps(kiln, path, seeds, work)
        print(f"{entry:40s} max {max(per_seed):.0f}  (per input: {' '.join(f'{s:.0f}' for s in per_seed)})")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 8)
