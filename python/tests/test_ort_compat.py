"""kiln as a drop-in for onnxruntime: the usual onnxruntime snippets, unchanged but for the import
(`import kiln as ort`), give onnxruntime's results; and what broke them before (a positional
SessionOptions, `run([], ...)`, providers ignored, thread counts of 0 and -1, plain lists,
big-endian arrays, padded artifacts from Python)."""

import os
import warnings

import numpy as np
import onnxruntime
import pytest

import kiln
import kiln as ort  # the snippets below are onnxruntime's, with this import

from test_session import mlp


def onnxruntime_outputs(m, feeds):
    return onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture
def model_path(tmp_path):
    p = tmp_path / "mlp.onnx"
    p.write_bytes(mlp())
    return str(p)


def feeds_for(n=3):
    return {"x": np.random.default_rng(5).standard_normal((n, 16)).astype(np.float32)}


def test_the_quick_start_snippet(model_path):
    # onnxruntime's README, as it is.
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_name = session.get_outputs()[0].name
    x = feeds_for()["x"]
    result = session.run([output_name], {input_name: x})
    want = onnxruntime_outputs(mlp(), {"x": x})[0]
    np.testing.assert_allclose(result[0], want, rtol=1e-4, atol=1e-5)


def test_session_options_positionally_and_every_output(model_path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    feeds = feeds_for()
    want = onnxruntime_outputs(mlp(), feeds)
    for names in (None, []):
        got = session.run(names, feeds)
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert "(2 threads)" in session.device
    assert session.get_session_options() is so


def test_providers_map_to_devices_and_an_unavailable_one_falls_back_with_a_warning(model_path):
    available = ort.get_available_providers()
    assert available[-1] == "CPUExecutionProvider"
    if "CUDAExecutionProvider" in available:
        pytest.skip("this machine has a CUDA GPU: the fallback cannot be seen here")
    with pytest.warns(UserWarning, match="Specified provider 'CUDAExecutionProvider' is not in available provider names"):
        session = ort.InferenceSession(model_path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    # (name, options) pairs, as onnxruntime takes them.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = ort.InferenceSession(model_path, providers=[("CPUExecutionProvider", {})])
    assert session.run(None, feeds_for())[0].shape == (3, 8)
    with pytest.raises(kiln.KilnError, match="unknown provider `NoSuchExecutionProvider`"):
        ort.InferenceSession(model_path, providers=["NoSuchExecutionProvider"])


@pytest.mark.parametrize("threads", [0, -1])
def test_thread_counts_of_zero_and_below_mean_every_core(model_path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    session = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    cores = os.cpu_count()
    assert f"({cores} thread" in session.device, session.device


def test_lists_and_big_endian_arrays_are_taken():
    session = ort.InferenceSession(mlp(), providers=["CPUExecutionProvider"])
    x = feeds_for()["x"]
    want = session.run(None, {"x": x})
    for given in (x.tolist(), x.astype(">f4"), np.asfortranarray(x.astype(">f4"))):
        got = session.run(None, {"x": given})
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_session_config_entries_set_kilns_options(model_path):
    so = ort.SessionOptions()
    so.add_session_config_entry("kiln.device", "cpu")
    so.add_session_config_entry("kiln.precision", "f32")
    assert so.get_session_config_entry("kiln.device") == "cpu"
    session = ort.InferenceSession(model_path, so)
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_padded_artifacts_from_python(tmp_path):
    # kiln compile --max-size N=16: one program for every batch up to 16.
    out = tmp_path / "mlp_max16.kiln"
    kiln.compile(mlp(), target="cpu", max_size={"N": 16}, output=str(out))
    session = kiln.load(str(out), device="cpu")
    for n in (1, 5, 16):
        feeds = feeds_for(n)
        got = session.run(None, feeds)
        for g, w in zip(got, onnxruntime_outputs(mlp(), feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    with pytest.raises(kiln.KilnError):
        session.run(None, feeds_for(17))
    with pytest.raises(kiln.KilnError, match="max_size pads one symbol"):
        kiln.compile(mlp(), max_size={"N": 4, "M": 4})


def test_portable_artifacts_from_python(tmp_path):
    # kiln compile --target-cpu x86-64-v3: AVX2 code that loads on any CPU that has it.
    out = tmp_path / "mlp_v3.kiln"
    kiln.compile(mlp(), input_shapes={"x": [3, 16]}, target_cpu="x86-64-v3", output=str(out))
    session = kiln.load(str(out), device="cpu")
    feeds = feeds_for()
    for g, w in zip(session.run(None, feeds), onnxruntime_outputs(mlp(), feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="--target-cpu pentium-9000 is not a CPU"):
        kiln.compile(mlp(), input_shapes={"x": [3, 16]}, target_cpu="pentium-9000")
    with pytest.raises(kiln.KilnError, match='is for target="cpu"'):
        kiln.compile(mlp(), target="opencl", target_cpu="x86-64-v3")
