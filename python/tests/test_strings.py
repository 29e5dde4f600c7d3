"""String inputs and outputs, as onnxruntime takes and gives them: numpy arrays of dtype object
(or str, or lists of str) in, arrays of dtype object out; the string ops run on the host after
the compiled part. Compared with onnxruntime, which runs these ops too."""

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import kiln


def model(nodes, inputs, outputs, opsets=(("", 20), ("ai.onnx.ml", 4))):
    graph = helper.make_graph(nodes, "strings", inputs, outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 10
    return m.SerializeToString()


def normalizer_then_labels():
    # StringNormalizer (upper case, drop "monday" whatever its case), then LabelEncoder from the
    # day to a number.
    return model(
        [
            helper.make_node(
                "StringNormalizer",
                ["x"],
                ["y"],
                case_change_action="UPPER",
                stopwords=["monday"],
                # onnxruntime builds the locale (en_US by default, often not installed); kiln
                # ignores it.
                locale="C",
            ),
            helper.make_node(
                "LabelEncoder",
                ["y"],
                ["z"],
                domain="ai.onnx.ml",
                keys_strings=["TUESDAY", "WEDNESDAY"],
                values_int64s=[2, 3],
                default_int64=-7,
            ),
        ],
        [helper.make_tensor_value_info("x", TensorProto.STRING, [4])],
        [
            helper.make_tensor_value_info("y", TensorProto.STRING, [None]),
            helper.make_tensor_value_info("z", TensorProto.INT64, [None]),
        ],
    )


def onnxruntime_outputs(m, feeds):
    return onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("feed", ["object", "str", "list"])
def test_string_ops_match_onnxruntime(feed):
    days = ["Monday", "tuesday", "Wednesday", "friday"]
    x = {"object": np.array(days, dtype=object), "str": np.array(days), "list": days}[feed]
    m = normalizer_then_labels()
    got = kiln.InferenceSession(m).run(None, {"x": x})
    want = onnxruntime_outputs(m, {"x": np.array(days, dtype=object)})
    assert got[0].dtype == object and list(got[0]) == list(want[0]) == ["TUESDAY", "WEDNESDAY", "FRIDAY"]
    np.testing.assert_array_equal(got[1], want[1])


def test_a_string_input_type_is_reported_as_onnxruntime_does():
    s = kiln.InferenceSession(normalizer_then_labels())
    assert s.get_inputs()[0].type == "tensor(string)"


def test_numbers_for_a_string_input_are_refused():
    s = kiln.InferenceSession(normalizer_then_labels())
    with pytest.raises(Exception, match="expected strings"):
        s.run(None, {"x": np.array([1.0, 2.0, 3.0, 4.0], dtype=object)})
