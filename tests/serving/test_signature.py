"""Model signatures: extracted from real ONNX graphs, used to validate requests before the model
runs and to tell whether a canary can take the stable version's traffic."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import orjson
import pytest
from onnx import TensorProto, helper

from registry import samples
from registry.signatures import (
    extract_signature,
    runtime_compatibility_problem,
    runtime_limits,
    signature_differences,
)
from serving.core.errors import InvalidInput
from serving.core.tensor_signature import batch_dimension, validate_inputs, validate_outputs
from serving.http.codec import decode_infer_request


def model(inputs, outputs, *, ir_version=9, opset=17, producer=("exporter", "2.1")):
    """A graph of Identity nodes: input i -> output i, with the given value infos."""
    nodes = [helper.make_node("Identity", [i.name], [o.name])
             for i, o in zip(inputs, outputs, strict=True)]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, ir_version=ir_version, producer_name=producer[0],
                             producer_version=producer[1],
                             opset_imports=[helper.make_opsetid("", opset)])


def vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def request(*tensors):
    """Decode a JSON request with tensors given as (name, datatype, shape)."""
    inputs = []
    for name, datatype, shape in tensors:
        count = int(np.prod(shape))
        data = ["s"] * count if datatype == "BYTES" else [0] * count
        if datatype == "BOOL":
            data = [False] * count
        inputs.append({"name": name, "datatype": datatype, "shape": shape, "data": data})
    return decode_infer_request(orjson.dumps({"inputs": inputs})).inputs


MLP_SIGNATURE = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 10]}],
    "ir_version": 9, "opsets": {"": 17}, "producer": "mmc-samples",
}
TWO_INPUTS = {
    "inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1, 8]},
               {"name": "mask", "datatype": "BOOL", "shape": [-1, 8]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
}
FIXED = {
    "inputs": [{"name": "img", "datatype": "FP16", "shape": [1, 3, 4, 4]}],
    "outputs": [{"name": "y", "datatype": "FP16", "shape": [1, 3, 4, 4]}],
}


# ---------------------------------------------------------------- extraction


def test_signature_of_the_sample_mlp_has_a_dynamic_batch():
    signature = extract_signature(onnx.load_from_string(samples.mlp()))
    assert signature == MLP_SIGNATURE
    assert batch_dimension(signature)


@pytest.mark.parametrize("elem_type,datatype", [
    (TensorProto.FLOAT, "FP32"), (TensorProto.INT64, "INT64"), (TensorProto.STRING, "BYTES"),
    (TensorProto.BOOL, "BOOL"), (TensorProto.FLOAT16, "FP16"), (TensorProto.DOUBLE, "FP64"),
    (TensorProto.UINT8, "UINT8"), (TensorProto.INT8, "INT8"), (TensorProto.INT32, "INT32"),
    (TensorProto.BFLOAT16, "BF16"),
])
def test_onnx_element_types_map_to_v2_datatypes(elem_type, datatype):
    signature = extract_signature(onnx.load_from_string(samples.identity(elem_type, ["n", 3])))
    assert signature["inputs"] == [{"name": "x", "datatype": datatype, "shape": [-1, 3]}]
    assert signature["outputs"] == [{"name": "y", "datatype": datatype, "shape": [-1, 3]}]


def test_fixed_symbolic_unnamed_and_unknown_dims():
    m = model([vi("a", TensorProto.FLOAT, [2, "seq", None]), vi("b", TensorProto.INT64, None)],
              [vi("c", TensorProto.FLOAT, [2, "seq", None]), vi("d", TensorProto.INT64, None)])
    signature = extract_signature(m)
    assert [s["shape"] for s in signature["inputs"]] == [[2, -1, -1], None]
    assert signature["ir_version"] == 9 and signature["opsets"] == {"": 17}
    assert signature["producer"] == "exporter 2.1"
    assert not batch_dimension(signature)


def test_initializers_listed_as_graph_inputs_are_not_request_inputs():
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [vi("x", TensorProto.FLOAT, ["batch", 2]), vi("w", TensorProto.FLOAT, [2])],
        [vi("y", TensorProto.FLOAT, ["batch", 2])], [w])
    m = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    assert [s["name"] for s in extract_signature(m)["inputs"]] == ["x"]


def test_unsupported_element_type_is_a_clear_error():
    m = model([vi("z", TensorProto.COMPLEX64, [2])], [vi("out", TensorProto.COMPLEX64, [2])])
    with pytest.raises(ValueError, match="input 'z' has element type COMPLEX64"):
        extract_signature(m)


def test_non_tensor_output_is_a_clear_error():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    m = model([vi("x", TensorProto.FLOAT, [2])], [seq])
    with pytest.raises(ValueError, match="output 's' is a sequence_type, not a tensor"):
        extract_signature(m)


# ------------------------------------------------------------- compatibility


def test_runtime_limits_match_what_onnxruntime_loads():
    max_ir, max_opset = runtime_limits()
    ok = model([vi("x", TensorProto.FLOAT, [1])], [vi("y", TensorProto.FLOAT, [1])],
               ir_version=max_ir, opset=max_opset)
    ort.InferenceSession(ok.SerializeToString(), providers=["CPUExecutionProvider"])
    assert runtime_compatibility_problem(ok) is None


def test_ir_14_model_is_refused_naming_both_ir_versions():
    m = onnx.load_from_string(samples.mlp())
    m.ir_version = 14
    max_ir, _ = runtime_limits()
    if max_ir >= 14:
        pytest.skip(f"this onnxruntime loads IR {max_ir}")
    problem = runtime_compatibility_problem(m)
    assert "IR version 14" in problem and f"max IR version {max_ir}" in problem
    with pytest.raises(Exception, match=f"max supported IR version: {max_ir}"):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def test_too_new_opset_is_refused_naming_both_opsets():
    _, max_opset = runtime_limits()
    m = model([vi("x", TensorProto.FLOAT, [1])], [vi("y", TensorProto.FLOAT, [1])],
              opset=max_opset + 1)
    problem = runtime_compatibility_problem(m)
    assert f"opset {max_opset + 1}" in problem and f"max opset {max_opset}" in problem


def test_sample_models_are_compatible():
    assert runtime_compatibility_problem(onnx.load_from_string(samples.conv_net(size=32))) is None


# ---------------------------------------------------------------- validation


def test_valid_request_returns_arrays_by_input_name():
    feeds = validate_inputs(request(("x", "FP32", [3, 64])), MLP_SIGNATURE, max_batch_size=8)
    assert list(feeds) == ["x"] and feeds["x"].shape == (3, 64)


def test_unknown_input_is_invalid_and_lists_the_model_inputs():
    with pytest.raises(InvalidInput, match="unknown input 'z' \\(the model takes x\\)"):
        validate_inputs(request(("z", "FP32", [1, 64])), MLP_SIGNATURE, 8)


def test_missing_input_is_invalid():
    with pytest.raises(InvalidInput, match="missing input 'mask'"):
        validate_inputs(request(("ids", "INT64", [1, 8])), TWO_INPUTS, 8)


def test_wrong_datatype_is_invalid():
    with pytest.raises(InvalidInput, match="input 'x': datatype FP64 does not match .* FP32"):
        validate_inputs(request(("x", "FP64", [1, 64])), MLP_SIGNATURE, 8)


def test_wrong_rank_is_invalid():
    with pytest.raises(InvalidInput, match="input 'x': shape \\[64\\] has rank 1 .* rank 2"):
        validate_inputs(request(("x", "FP32", [64])), MLP_SIGNATURE, 8)


def test_every_fixed_dimension_is_checked():
    with pytest.raises(InvalidInput, match="input 'x': .* has 32 at dimension 1 .* expects 64"):
        validate_inputs(request(("x", "FP32", [1, 32])), MLP_SIGNATURE, 8)
    with pytest.raises(InvalidInput, match="input 'img': .* has 5 at dimension 3"):
        validate_inputs(request(("img", "FP16", [1, 3, 4, 5])), FIXED, 0)
    assert validate_inputs(request(("img", "FP16", [1, 3, 4, 4])), FIXED, 0)["img"].shape == (
        1, 3, 4, 4)


def test_batch_beyond_max_batch_size_is_invalid():
    with pytest.raises(InvalidInput, match="input 'x': batch size 9 exceeds max_batch_size 8"):
        validate_inputs(request(("x", "FP32", [9, 64])), MLP_SIGNATURE, 8)
    assert validate_inputs(request(("x", "FP32", [9, 64])), MLP_SIGNATURE, 0)


def test_inputs_must_share_one_batch_size():
    with pytest.raises(InvalidInput, match="input 'mask': batch size 3 differs from input 'ids'"):
        validate_inputs(request(("ids", "INT64", [2, 8]), ("mask", "BOOL", [3, 8])),
                        TWO_INPUTS, 8)


def test_requested_outputs_must_exist():
    validate_outputs(["y"], MLP_SIGNATURE)
    with pytest.raises(InvalidInput, match="unknown output 'logits'"):
        validate_outputs(["logits"], MLP_SIGNATURE)


def test_validated_arrays_run_on_onnxruntime():
    session = ort.InferenceSession(samples.mlp(), providers=["CPUExecutionProvider"])
    feeds = validate_inputs(request(("x", "FP32", [2, 64])), MLP_SIGNATURE, 8)
    assert session.run(None, feeds)[0].shape == (2, 10)


# ------------------------------------------------------------- canary checks


def test_identical_signatures_have_no_differences():
    assert signature_differences(MLP_SIGNATURE, MLP_SIGNATURE) == []


def test_candidate_that_generalises_a_fixed_dim_is_compatible():
    candidate = {**FIXED, "inputs": [{"name": "img", "datatype": "FP16",
                                      "shape": [-1, 3, -1, -1]}]}
    assert signature_differences(FIXED, candidate) == []


def test_input_name_datatype_and_shape_changes_are_reported():
    candidate = {
        "inputs": [{"name": "ids", "datatype": "INT32", "shape": [-1, 16]},
                   {"name": "extra", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
    }
    assert signature_differences(TWO_INPUTS, candidate) == [
        "input 'ids' datatype changes from INT64 to INT32",
        "input 'ids' shape [-1, 16] does not accept everything the stable's [-1, 8] accepts",
        "input 'mask' is missing from the candidate",
        "candidate requires an extra input 'extra'",
    ]


def test_narrowing_a_dynamic_batch_to_a_fixed_one_is_reported():
    candidate = {**MLP_SIGNATURE, "inputs": [{"name": "x", "datatype": "FP32",
                                              "shape": [1, 64]}]}
    assert signature_differences(MLP_SIGNATURE, candidate) == [
        "input 'x' shape [1, 64] does not accept everything the stable's [-1, 64] accepts"]


def test_output_differences_are_reported_and_extra_outputs_are_not():
    candidate = {**MLP_SIGNATURE, "outputs": [
        {"name": "y", "datatype": "FP16", "shape": [-1, 12]},
        {"name": "probs", "datatype": "FP32", "shape": [-1, 10]}]}
    assert signature_differences(MLP_SIGNATURE, candidate) == [
        "output 'y' datatype changes from FP32 to FP16",
        "output 'y' shape changes from [-1, 10] to [-1, 12]",
    ]
    renamed = {**MLP_SIGNATURE, "outputs": [{"name": "z", "datatype": "FP32",
                                             "shape": [-1, 10]}]}
    assert signature_differences(MLP_SIGNATURE, renamed) == [
        "output 'y' is missing from the candidate"]
