"""Models quantized the three ways onnxruntime's quantizer writes them (QDQ and QOperator with
quantize_static: u8 activations, s8 per-channel weights; dynamic with quantize_dynamic), made
here from small float models, run on kiln against onnxruntime's run of the same file."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

import kiln

rng = np.random.default_rng(0)


def weights(name, shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def save(graph, path):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def cnn(path):
    """Conv, Relu, strided Conv, Relu, GlobalAveragePool, Flatten, Gemm: a tiny classifier."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], transB=1),
    ]
    inits = [weights("w1", [8, 3, 3, 3]), weights("b1", [8]), weights("w2", [16, 8, 3, 3]), weights("b2", [16]), weights("w3", [10, 16]), weights("b3", [10])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])
    save(helper.make_graph(nodes, "cnn", [x], [y], inits), path)


def mlp(path):
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["logits"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])
    save(helper.make_graph(nodes, "mlp", [x], [y], [weights("w1", [64, 128]), weights("b1", [128]), weights("w2", [128, 10])]), path)


class Calibration(CalibrationDataReader):
    def __init__(self):
        self.data = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.data, None)


def check(path, x, device="cpu"):
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = kiln.InferenceSession(path, device=device).run(None, {"x": x})[0]
    # The same integers through the same rounding: within a quantization step of the output.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
    assert (got.argmax(-1) == want.argmax(-1)).all()


DEVICES = ["cpu", "opencl"]


def usable(device):
    if not any(d["target"] == device and d["usable"] for d in kiln.devices()):
        pytest.skip(f"SKIPPED: no usable {device} device here (run `eval \"$(scripts/setup-opencl.sh)\"`)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activations", [QuantType.QUInt8, QuantType.QInt8])
@pytest.mark.parametrize("fmt", [QuantFormat.QDQ, QuantFormat.QOperator])
def test_static_quantization(tmp_path, fmt, activations, device):
    usable(device)
    f32, q = str(tmp_path / "cnn.onnx"), str(tmp_path / "cnn_q.onnx")
    cnn(f32)
    quantize_static(f32, q, Calibration(), quant_format=fmt, activation_type=activations, weight_type=QuantType.QInt8, per_channel=True)
    ops = {n.op_type for n in onnx.load(q).graph.node}
    assert ("QLinearConv" in ops) == (fmt == QuantFormat.QOperator), ops
    if device == "cpu":
        # Both forms reach the CPU's integer kernels: the two convolutions and the Gemm.
        schedule = kiln.emit(q, "schedule")
        assert schedule.count("microkernel: integer conv") == 2, schedule
        assert schedule.count("microkernel: integer matrix product") == 1, schedule
    for seed in range(3):
        check(q, np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32), device)


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_quantization(tmp_path, device):
    usable(device)
    f32, q = str(tmp_path / "mlp.onnx"), str(tmp_path / "mlp_q.onnx")
    mlp(f32)
    quantize_dynamic(f32, q, weight_type=QuantType.QInt8)
    assert "MatMulInteger" in {n.op_type for n in onnx.load(q).graph.node}
    for n in [1, 4]:
        check(q, np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32), device)
