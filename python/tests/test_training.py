"""kiln.training.TrainSession: steps against the same updates written in numpy, the learning
rate as a setting, parameters read and written, the trained model saved and run, and errors."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
import kiln.training

B, F, C = 8, 4, 3


def linear(w, b):
    """logits[B, C] = x[B, F] @ w + b, fixed sizes."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"])]
    g = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, F])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [B, C])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m.SerializeToString()


def data(seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((F, C)) * 0.5).astype(np.float32)
    b = (rng.standard_normal(C) * 0.1).astype(np.float32)
    x = rng.standard_normal((B, F)).astype(np.float32)
    y = rng.integers(0, C, B).astype(np.int64)
    return w, b, x, y


def grads(w, b, x, y):
    """Mean softmax cross-entropy and its gradients, in float64."""
    z = x.astype(np.float64) @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(B), y]).mean()
    d = p.copy()
    d[np.arange(B), y] -= 1
    d /= B
    return loss, x.T.astype(np.float64) @ d, d.sum(0)


def test_sgd_steps_match_numpy_and_the_rate_changes_without_recompiling():
    w, b, x, y = data()
    ts = kiln.training.TrainSession(linear(w, b), ["w", "b"], "sgd", logits="logits", lr=0.1, momentum=0.9, threads=1)
    assert ts.batch_names == ["x", "labels"] and ts.param_names == ["w", "b"] and ts.loss_name == "loss"
    rw, rb = w.astype(np.float64), b.astype(np.float64)
    vw, vb = np.zeros_like(rw), np.zeros_like(rb)
    for step in range(5):
        if step == 3:
            ts.lr = 0.05
        lr = 0.1 if step < 3 else 0.05
        want, gw, gb = grads(rw, rb, x, y)
        got = ts.step(x, y)
        assert abs(got - want) < 1e-5 * max(1.0, abs(want)), (step, got, want)
        vw, vb = 0.9 * vw + gw, 0.9 * vb + gb
        rw, rb = rw - lr * vw, rb - lr * vb
    np.testing.assert_allclose(ts.param("w"), rw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ts.params()["b"], rb, rtol=1e-4, atol=1e-5)
    assert ts.steps == 5 and ts.lr == 0.05


def test_adam_steps_match_numpy():
    w, b, x, y = data(1)
    ts = kiln.training.TrainSession(linear(w, b), ["w", "b"], "adam", logits="logits", lr=0.01)
    rw, rb = w.astype(np.float64), b.astype(np.float64)
    m = [np.zeros_like(rw), np.zeros_like(rb)]
    v = [np.zeros_like(rw), np.zeros_like(rb)]
    for t in range(1, 4):
        _, gw, gb = grads(rw, rb, x, y)
        ts.step([x, y])
        new = []
        for i, (p, g) in enumerate([(rw, gw), (rb, gb)]):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            mh, vh = m[i] / (1 - 0.9**t), v[i] / (1 - 0.999**t)
            new.append(p - 0.01 * mh / (np.sqrt(vh) + 1e-8))
        rw, rb = new
    np.testing.assert_allclose(ts.param("w"), rw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ts.param("b"), rb, rtol=1e-4, atol=1e-5)


def test_training_lowers_the_loss_and_the_saved_model_runs_with_the_trained_weights(tmp_path):
    w, b, x, y = data(2)
    src = tmp_path / "linear.onnx"
    src.write_bytes(linear(w, b))
    ts = kiln.training.TrainSession(str(src), ["w", "b"], "sgd", logits="logits", lr=0.5)
    first = ts.step(x, y)
    for _ in range(50):
        last = ts.step(x, y)
    assert last < 0.5 * first, (first, last)
    out = tmp_path / "trained.onnx"
    ts.save_onnx(out)
    sess = kiln.InferenceSession(str(out))
    (z,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(z, x @ ts.param("w") + ts.param("b"), rtol=1e-5, atol=1e-5)
    # A parameter set from Python is what the next step starts from.
    ts.set_param("w", np.zeros((F, C), np.float32))
    ts.set_param("b", np.zeros(C, np.float32))
    assert abs(ts.step(x, y) - np.log(C)) < 1e-5


def test_errors_name_what_is_wrong():
    w, b, x, y = data()
    m = linear(w, b)
    with pytest.raises(kiln.KilnError, match="nope"):
        kiln.training.TrainSession(m, ["w", "nope"], logits="logits")
    with pytest.raises(kiln.KilnError, match="loss= .* or logits="):
        kiln.training.TrainSession(m, ["w"])
    with pytest.raises(kiln.KilnError, match="not both"):
        kiln.training.TrainSession(m, ["w"], loss="logits", logits="logits")
    with pytest.raises(kiln.KilnError, match="unknown optimizer `rmsprop`"):
        kiln.training.TrainSession(m, ["w"], "rmsprop", logits="logits")
    with pytest.raises(kiln.KilnError, match="no output `x` to train on"):
        kiln.training.TrainSession(m, ["w"], logits="x")
    ts = kiln.training.TrainSession(m, ["w", "b"], logits="logits")
    with pytest.raises(kiln.KilnError, match="x, labels"):
        ts.step(x)
    with pytest.raises(kiln.KilnError, match="batch input `x`"):
        ts.step(np.zeros((B + 1, F), np.float32), y)
    with pytest.raises(kiln.KilnError, match="parameter `w`"):
        ts.set_param("w", np.zeros((F + 1, C), np.float32))
    with pytest.raises(kiln.KilnError, match="zz"):
        ts.param("zz")
    assert ts.steps == 0
