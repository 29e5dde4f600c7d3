"""Quantizes the shared models' CNNs (resnet18, mobilenet_v2) with onnxruntime's quantize_static,
as a user deploying on CPUs would (QDQ; u8 activations, s8 per-channel weights; calibrated on 8
seeded random images), into OUT/<model>_int8_qdq/model.onnx, and the transformers (the shared
gpt_block, and BERT-tiny's encoder written by bench_models.py into OUT/bert_tiny_128) with its
quantize_dynamic, as BERT-style models are quantized for CPUs (DynamicQuantizeLinear +
MatMulInteger: u8 activations quantized at run time, s8 weights), into
OUT/<model>_int8_dynamic/model.onnx, and gpt_block's MatMuls to 4-bit weights with its
MatMulNBitsQuantizer (com.microsoft MatMulNBits, as int4 LLM exports hold them: blocks of 32
with zero points) into OUT/<model>_int4/model.onnx, next to links to (or copies of) the f32 originals, so that
scripts/bench.sh OUT times kiln and onnxruntime on all of them in one run (`make bench-int8`).

    python quantize_bench_models.py MODELS_DIR OUT_DIR

A model already quantized into OUT is kept.
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

MODELS = ["resnet18", "mobilenet_v2"]
# Quantized dynamically: the shared models', and bench_models.py's written into OUT.
DYNAMIC = ["gpt_block"]
GENERATED_DYNAMIC = ["bert_tiny_128"]


def dynamic(src: str, out_dir: str, entry: str) -> None:
    """OUT/<entry>_int8_dynamic/model.onnx from the f32 model at src, unless it is there."""
    dst_dir = os.path.join(out_dir, entry + "_int8_dynamic")
    dst = os.path.join(dst_dir, "model.onnx")
    if os.path.isfile(dst):
        return
    os.makedirs(dst_dir, exist_ok=True)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    print(f"quantized {entry} dynamically -> {dst}", file=sys.stderr)


def nbits(src: str, out_dir: str, entry: str) -> None:
    """OUT/<entry>_int4/model.onnx: src's MatMuls with 4-bit weights (MatMulNBits), unless it is there."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    dst_dir = os.path.join(out_dir, entry + "_int4")
    dst = os.path.join(dst_dir, "model.onnx")
    if os.path.isfile(dst):
        return
    os.makedirs(dst_dir, exist_ok=True)
    quant = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=False)
    quant.process()
    quant.model.save_model_to_file(dst, use_external_data_format=False)
    print(f"quantized {entry} to 4-bit weights -> {dst}", file=sys.stderr)


def main(models_dir: str, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_models

    for name in GENERATED_DYNAMIC:
        folder = bench_models.write(name, out_dir, lambda path, f=bench_models.MODELS[name]: onnx.save(f(), path))
        dynamic(os.path.join(folder, "model.onnx"), out_dir, name)
    for entry in sorted(os.listdir(models_dir)):
        src = os.path.join(models_dir, entry, "model.onnx")
        if any(entry.startswith(m) for m in DYNAMIC) and os.path.isfile(src):
            link = os.path.join(out_dir, entry)
            if not os.path.exists(link):
                os.symlink(os.path.abspath(os.path.join(models_dir, entry)), link)
            dynamic(src, out_dir, entry)
            nbits(src, out_dir, entry)
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
