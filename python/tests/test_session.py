"""kiln.InferenceSession against onnxruntime on small models; symbolic sizes; errors for a wrong
name, dtype or shape; threads; compile, load, emit and devices."""

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln


def model(nodes, inputs, outputs, initializers=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m.SerializeToString()


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def mlp(batch="N"):
    """x[N,16] -> MatMul(w1) + b1 -> Relu -> MatMul(w2) -> Softmax."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    return model(nodes, [vi("x", [batch, 16])], [vi("logits", [batch, 8]), vi("probs", [batch, 8])], [w1, b1, w2])


def conv():
    """A 3x3 convolution with bias and a residual add, NCHW."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "x"], ["y"])]
    return model(nodes, [vi("x", [1, 4, 8, 8])], [vi("y", [1, 4, 8, 8])], [w, b])


def reference(m, feeds):
    return ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("make", [mlp, conv])
def test_outputs_match_onnxruntime(make):
    m = make()
    sess = kiln.InferenceSession(m, device="cpu", threads=1)
    feeds = {i.name: np.random.default_rng(2).standard_normal([d if isinstance(d, int) else 3 for d in i.shape]).astype(np.float32) for i in sess.get_inputs()}
    got = sess.run(None, feeds)
    want = reference(m, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_inputs_and_outputs_are_described_with_their_symbols():
    sess = kiln.InferenceSession(mlp(), device="cpu")
    (x,) = sess.get_inputs()
    assert (x.name, x.type, x.shape) == ("x", "tensor(float)", ["N", 16])
    assert [(o.name, o.shape) for o in sess.get_outputs()] == [("logits", ["N", 8]), ("probs", ["N", 8])]
    assert sess.device.startswith("cpu (")


def test_a_symbolic_batch_runs_any_size_and_picks_outputs_by_name():
    m = mlp()
    sess = kiln.InferenceSession(m, device="cpu")
    for n in [1, 5, 8, 1]:
        x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
        (probs,) = sess.run(["probs"], {"x": x})
        np.testing.assert_allclose(probs, reference(m, {"x": x})[1], rtol=1e-4, atol=1e-6)


def test_inputs_that_are_not_contiguous_or_aligned_are_copied():
    m = mlp("N")
    sess = kiln.InferenceSession(m, device="cpu")
    base = np.random.default_rng(3).standard_normal((4, 40)).astype(np.float32)
    strided = base[:, ::2][:, :16]
    unaligned = np.frombuffer(np.zeros(4 * 16 * 4 + 4, np.uint8).tobytes()[4:], np.float32).reshape(4, 16).copy()
    offset = np.frombuffer(bytearray(4 + 4 * 16 * 4), np.float32, count=64, offset=4).reshape(4, 16)
    offset[:] = base[:, :16]
    for x in [strided, unaligned, offset]:
        (got,) = sess.run(["logits"], {"x": x})
        np.testing.assert_allclose(got, reference(m, {"x": np.ascontiguousarray(x)})[0], rtol=1e-4, atol=1e-5)


def test_errors_name_the_input():
    sess = kiln.InferenceSession(mlp(), device="cpu")
    x = np.zeros((2, 16), np.float32)
    with pytest.raises(kiln.KilnError, match="the model has no input `y`; it takes x: tensor\\(float\\)"):
        sess.run(None, {"y": x})
    with pytest.raises(kiln.KilnError, match="missing input `x`"):
        sess.run(None, {})
    with pytest.raises(kiln.KilnError, match="input `x`: expected f32 \\(tensor\\(float\\)\\), got numpy float64"):
        sess.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(kiln.KilnError, match="input `x` is f32\\[N,16\\], got f32\\[2,15\\]"):
        sess.run(None, {"x": np.zeros((2, 15), np.float32)})
    with pytest.raises(kiln.KilnError, match="the model has no output `nope`; its outputs are logits, probs"):
        sess.run(["nope"], {"x": x})
    # A static model checks sizes at run time too.
    static = kiln.InferenceSession(conv(), device="cpu")
    with pytest.raises(kiln.KilnError, match="`x`"):
        static.run(None, {"x": np.zeros((1, 4, 8, 9), np.float32)})
    with pytest.raises(kiln.KilnError, match="not a valid ONNX model|protobuf"):
        kiln.InferenceSession(b"not a model")
    with pytest.raises(kiln.KilnError, match="no such file|No such file"):
        kiln.InferenceSession("/nonexistent/model.onnx")
    with pytest.raises(kiln.KilnError, match="--precision f16 on cpu: kiln's CPU kernels have no f16 arithmetic"):
        kiln.InferenceSession(conv(), device="cpu", precision="f16")
    with pytest.raises(kiln.KilnError, match="unknown precision `fp8`: one of f32, tf32, bf16, f16"):
        kiln.InferenceSession(conv(), precision="fp8")
    with pytest.raises(kiln.KilnError, match="precision=\"bf16\" applies when compiling"):
        kiln.InferenceSession(kiln.compile(conv()), precision="bf16")


def test_bf16_sessions_round_products_and_stay_near_f32():
    m = conv()
    try:
        sess = kiln.InferenceSession(m, device="cpu", precision="bf16")
    except kiln.KilnError as e:
        if "AVX512-BF16" in str(e):
            pytest.skip(f"SKIPPED loudly: {e}")
        raise
    assert "vdpbf16ps" in kiln.emit(m, "schedule", precision="bf16")
    x = np.random.default_rng(5).standard_normal((1, 4, 8, 8)).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    want = reference(m, {"x": x})[0]
    # bf16 keeps 8 significant bits: within a few of its steps of f32, and not f32 itself.
    np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * np.abs(want).max())
    assert np.abs(got - want).max() > 1e-5


def test_sessions_run_from_several_threads():
    m = mlp()
    shared = kiln.InferenceSession(m, device="cpu", threads=1)
    own = [kiln.InferenceSession(m, device="cpu", threads=1) for _ in range(2)]
    xs = [np.random.default_rng(10 + i).standard_normal((4, 16)).astype(np.float32) for i in range(4)]
    want = [reference(m, {"x": x}) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                for sess in [shared, own[i % 2]]:
                    got = sess.run(None, {"x": xs[i]})
                    np.testing.assert_allclose(got[1], want[i][1], rtol=1e-4, atol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_compile_load_and_emit(tmp_path):
    m = mlp()
    path = tmp_path / "mlp.kiln"
    art = kiln.compile(m, target="cpu", output=path)
    assert path.read_bytes() == art
    x = np.random.default_rng(4).standard_normal((5, 16)).astype(np.float32)
    for sess in [kiln.load(path), kiln.load(art)]:
        # Compiled without sizes: one artifact for any batch.
        assert sess.get_inputs()[0].shape[1] == 16
        np.testing.assert_allclose(sess.run(None, {"x": x})[1], reference(m, {"x": x})[1], rtol=1e-4, atol=1e-6)
    fixed = kiln.load(kiln.compile(m, input_shapes={"x": [2, 16]}))
    assert fixed.get_inputs()[0].shape == [2, 16]
    graph = kiln.emit(m, "graph", input_shapes={"x": [2, 16]})
    assert "Softmax" in graph and "f32[2,16]" in graph
    assert "func.func" in kiln.emit(m, "mlir", input_shapes={"x": [2, 16]})
    with pytest.raises(kiln.KilnError, match="there is no stage `nope`"):
        kiln.emit(m, "nope")
    with pytest.raises(kiln.KilnError, match="stage ptx is the cuda target's code"):
        kiln.emit(m, "ptx", input_shapes={"x": [2, 16]})
    with pytest.raises(kiln.KilnError, match="already a compiled artifact"):
        kiln.compile(art)


def test_profile_and_devices():
    sess = kiln.InferenceSession(conv(), device="cpu", profile=True)
    with pytest.raises(kiln.KilnError, match="no run has been profiled yet"):
        sess.profile()
    sess.run(None, {"x": np.ones((1, 4, 8, 8), np.float32)})
    p = sess.profile()
    assert p["launches"] and all(t >= 0 for _, t in p["launches"])
    assert p["bytes_to_device"] == 0
    with pytest.raises(kiln.KilnError, match="profile=True"):
        kiln.InferenceSession(conv(), device="cpu").profile()
    cpu = [d for d in kiln.devices() if d["target"] == "cpu"]
    assert cpu and cpu[0]["usable"]
