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
    assert ts.running_stats() == {}  # no BatchNormalization in training mode


def bf16(a):
    """Rounds to bfloat16 (to nearest, ties to even), kept as float32."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def test_bf16_mixed_precision_multiplies_rounded_operands_with_f32_master_weights():
    w, b, x, y = data(2)
    ts = kiln.training.TrainSession(linear(w, b), ["w", "b"], "sgd", logits="logits", lr=0.1, threads=1,
                                    precision="bf16")
    rw, rb = w.astype(np.float64), b.astype(np.float64)
    fw, fb = rw.copy(), rb.copy()  # the same steps without rounding
    for step in range(3):
        # The MatMul reads x and w rounded; its gradient's MatMul reads x and the scores' gradient
        # rounded; the bias, softmax and the update stay f32.
        fz = x @ fw + fb
        fp = np.exp(fz - fz.max(1, keepdims=True))
        fp /= fp.sum(1, keepdims=True)
        fp[np.arange(B), y] -= 1
        fw, fb = fw - 0.1 * (x.T @ (fp / B)), fb - 0.1 * (fp / B).sum(0)
        z = bf16(x) @ bf16(rw) + rb
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        want = -np.log(p[np.arange(B), y]).mean()
        d = p.copy()
        d[np.arange(B), y] -= 1
        d /= B
        got = ts.step(x, y)
        # bf16 operands: a value kiln holds in f32 may round to the neighbouring bf16 (2^-8 apart).
        assert abs(got - want) < 1e-3 * max(1.0, abs(want)), (step, got, want)
        rw, rb = rw - 0.1 * (bf16(x).T @ bf16(d)), rb - 0.1 * d.sum(0)
    assert ts.param("w").dtype == np.float32
    np.testing.assert_allclose(ts.param("w"), rw, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(ts.param("b"), rb, rtol=1e-3, atol=1e-4)
    # The session rounded: its weights are nearer the rounded steps' than the unrounded ones'.
    got_w = ts.param("w").astype(np.float64)
    assert np.abs(got_w - rw).sum() < np.abs(got_w - fw).sum()
    with pytest.raises(kiln.KilnError, match="f16 mixed precision needs a loss scale"):
        kiln.training.TrainSession(linear(w, b), ["w"], logits="logits", precision="f16")
    with pytest.raises(kiln.KilnError, match="unknown precision `fp8`"):
        kiln.training.TrainSession(linear(w, b), ["w"], logits="logits", precision="fp8")


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


def batch_norm_model():
    """x[4, 3, 2, 2] -> BatchNormalization (training_mode 1, momentum 0.9, running mean `rm` and
    variance `rv` initializers, their updates as the node's second and third results) ->
    Flatten -> Gemm(w, b) -> logits[4, 5]: tests/tests/train.rs's model."""
    rng = np.random.default_rng(7)
    inits = {
        "scale": np.array([1.0, 0.5, 2.0], np.float32),
        "shift": np.array([0.1, -0.2, 0.0], np.float32),
        "rm": np.array([0.5, -1.0, 0.0], np.float32),
        "rv": np.array([1.0, 2.0, 0.5], np.float32),
        "w": (rng.standard_normal((5, 12)) * 0.3).astype(np.float32),
        "b": (rng.standard_normal(5) * 0.1).astype(np.float32),
    }
    nodes = [
        helper.make_node(
            "BatchNormalization",
            ["x", "scale", "shift", "rm", "rv"],
            ["y", "rm_out", "rv_out"],
            momentum=0.9,
            training_mode=1,
        ),
        helper.make_node("Flatten", ["y"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w", "b"], ["logits"], transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 2, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 5])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    onnx.checker.check_model(m)
    return m.SerializeToString(), inits


def bn_batch(step):
    """Channel c's values around c - 1, each step's different; labels 0..4."""
    rng = np.random.default_rng(200 + step)
    x = 2 * rng.random((4, 3, 2, 2)) + np.arange(3).reshape(1, 3, 1, 1) - 1
    y = (np.arange(4) + step) % 5
    return x.astype(np.float32), y.astype(np.int64)


def test_batch_norm_running_statistics_follow_onnx_and_are_saved(tmp_path):
    model, inits = batch_norm_model()
    src = tmp_path / "bn.onnx"
    src.write_bytes(model)
    params = ["scale", "shift", "w", "b"]
    ts = kiln.training.TrainSession(str(src), params, "sgd", logits="logits", lr=0.1, momentum=0.9, threads=1)
    # Before a step: the initializers, by name, shaped like params().
    stats = ts.running_stats()
    assert list(stats) == ["rm", "rv"] and list(ts.params()) == params
    np.testing.assert_array_equal(stats["rm"], inits["rm"])
    np.testing.assert_array_equal(stats["rv"], inits["rv"])
    assert stats["rm"].dtype == np.float32 and stats["rm"].shape == (3,)
    # ONNX's formulas in float64: per channel over the batch and spatial axes, the population
    # variance, running = running * momentum + batch * (1 - momentum).
    mean, var = inits["rm"].astype(np.float64), inits["rv"].astype(np.float64)
    for step in range(3):
        x, y = bn_batch(step)
        xd = x.astype(np.float64)
        bm, bv = xd.mean(axis=(0, 2, 3)), xd.var(axis=(0, 2, 3))
        loss = ts.step(x, y)
        if step == 0:
            # The forward pass is normalised by the batch's statistics, not the running ones.
            c = (1, 3, 1, 1)
            z = (xd - bm.reshape(c)) / np.sqrt(bv.reshape(c) + 1e-5) * inits["scale"].reshape(c) + inits["shift"].reshape(c)
            logits = z.reshape(4, 12) @ inits["w"].T.astype(np.float64) + inits["b"]
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            want = -np.log(p[np.arange(4), y]).mean()
            assert abs(loss - want) < 1e-5 * max(1.0, want), (loss, want)
        mean, var = mean * 0.9 + bm * 0.1, var * 0.9 + bv * 0.1
        stats = ts.running_stats()
        np.testing.assert_allclose(stats["rm"], mean, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
        np.testing.assert_allclose(stats["rv"], var, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
    # New arrays each call: writing one changes nothing the session holds.
    stats["rm"][:] = 0
    np.testing.assert_allclose(ts.running_stats()["rm"], mean, rtol=1e-5, atol=1e-6)

    # The saved model's initializers hold the statistics and the parameters now.
    out = tmp_path / "bn-trained.onnx"
    ts.save_onnx(out)
    saved = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    assert sorted(saved) == sorted(inits)
    for name, value in [*ts.running_stats().items(), *ts.params().items()]:
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    assert not np.array_equal(saved["rm"], inits["rm"]) and not np.array_equal(saved["w"], inits["w"])

    # A running statistic is updated by each step, not by the optimizer.
    with pytest.raises(kiln.KilnError, match="`rm` is a running statistic"):
        kiln.training.TrainSession(model, ["w", "rm"], logits="logits")
