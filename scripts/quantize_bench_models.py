"""Quantizes the shared models' CNNs (resnet18, mobilenet_v2) with onnxruntime's quantize_static,
as a user deploying on CPUs would (QDQ; u8 activations, s8 per-channel weights; calibrated on 8
seeded random images), into OUT/<model>_int8_qdq/model.onnx, next to links to the f32 originals,
so that scripts/bench.sh OUT times kiln and onnxruntime on both in one run (`make bench-int8`).

    python quantize_bench_models.py MODELS_DIR OUT_DIR

A model already quantized into OUT is kept.
"""

import os
import sys

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

MODELS = ["resnet18", "mobilenet_v2"]


def main(models_dir: str, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for entry in sorted(os.listdir(models_dir)):
        if not any(entry.startswith(m) for m in MODELS) or entry.endswith("_int8_qdq"):
            continue
        src = os.path.join(models_dir, entry, "model.onnx")
        if not os.path.isfile(src):
            continue
        link = os.path.join(out_dir, entry)
        if not os.path.exists(link):
            os.symlink(os.path.abspath(os.path.join(models_dir, entry)), link)
        dst_dir = os.path.join(out_dir, entry + "_int8_qdq")
        dst = os.path.join(dst_dir, "model.onnx")
        if os.path.isfile(dst):
            continue
        sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
        inp = sess.get_inputs()[0]
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]

        class Images(CalibrationDataReader):
            def __init__(self) -> None:
                rng = np.random.default_rng(0)
                self.data = iter([{inp.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

            def get_next(self):
                return next(self.data, None)

        os.makedirs(dst_dir, exist_ok=True)
        quantize_static(
            src,
            dst,
            Images(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
        print(f"quantized {entry} -> {dst}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
