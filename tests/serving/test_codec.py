"""The v2 wire format, JSON and binary: what clients send and what they get back."""

from __future__ import annotations

import gzip
import struct
import zlib

import ml_dtypes
import numpy as np
import orjson
import pytest

from serving.core.errors import (
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    QueueFull,
    ServerFault,
    ServingError,
    Unauthorized,
)
from serving.core.tensors import RequestedOutput
from serving.http.codec import (
    DATATYPES,
    decode_infer_request,
    encode_infer_response,
    sagemaker_header_length,
)

SAMPLES = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255], [7, 8, 9]], dtype=np.uint8),
    "UINT16": np.array([[0, 1, 65535], [7, 8, 9]], dtype=np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [7, 8, 9]], dtype=np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [7, 8, 9]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [7, 8, 9]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767], [7, 8, 9]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [7, 8, 9]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [7, 8, 9]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504], [0, 1e-3, 3]], dtype=np.float16),
    "FP32": np.array([[0.1, -1.5, 3.4e38], [0, 1e-7, 3]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.5, 1e300], [0, 1e-300, 3]], dtype=np.float64),
    "BF16": np.array([[0.5, -1.25, 3.0], [0, 2, 3]], dtype=ml_dtypes.bfloat16),
    "BYTES": np.array([[b"a", b"", "é".encode()], [b"xyz", b"0", b"tail"]], dtype=object),
}
JSON_DATATYPES = [d for d in SAMPLES if d != "BF16"]


def json_request(inputs: list[dict], **extra) -> bytes:
    return orjson.dumps({"inputs": inputs, **extra})


def tensor_json(name: str, datatype: str, array: np.ndarray) -> dict:
    """How a JSON client writes a tensor: flat row-major list, BYTES as strings."""
    flat = array.reshape(-1).tolist()
    if datatype == "BYTES":
        flat = [b.decode() for b in flat]
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": flat}


def raw_bytes(array: np.ndarray, datatype: str) -> bytes:
    """How a binary client writes a tensor: little-endian raw, BYTES length-prefixed."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in array.reshape(-1).tolist())
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def binary_request(tensors: list[tuple[str, str, np.ndarray]], **extra) -> tuple[bytes, int]:
    inputs, blocks = [], []
    for name, datatype, array in tensors:
        block = raw_bytes(array, datatype)
        inputs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                       "parameters": {"binary_data_size": len(block)}})
        blocks.append(block)
    header = orjson.dumps({"inputs": inputs, **extra})
    return header + b"".join(blocks), len(header)


def split_response(body: bytes, headers: dict[str, str]) -> tuple[dict, dict[str, bytes]]:
    """Parse a response as a client does: JSON header, then binary blocks in output order."""
    length = int(headers.get("Inference-Header-Content-Length", len(body)))
    doc = orjson.loads(body[:length])
    blocks, pos = {}, length
    for out in doc["outputs"]:
        size = out.get("parameters", {}).get("binary_data_size")
        if size is not None:
            blocks[out["name"]] = body[pos:pos + size]
            pos += size
    assert pos == len(body)
    return doc, blocks


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    if want.dtype == object:
        assert got.tolist() == want.tolist()
    else:
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def invalid(match: str, body: bytes, **kwargs) -> InvalidInput:
    with pytest.raises(InvalidInput, match=match) as info:
        decode_infer_request(body, **kwargs)
    return info.value


# ------------------------------------------------------------------ datatypes


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
def test_every_datatype_roundtrips_in_json(datatype):
    want = SAMPLES[datatype]
    request = decode_infer_request(json_request([tensor_json("x", datatype, want)]))
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, [2, 3])
    assert_same(tensor.array, want.astype(DATATYPES[datatype]))

    body, headers = encode_infer_response(
        model_name="m", model_version="1", request_id=None, outputs={"y": tensor.array},
        requested=None, binary_output=False)
    assert headers == {"Content-Type": "application/json"}
    out = orjson.loads(body)["outputs"][0]
    assert (out["name"], out["datatype"], out["shape"]) == ("y", datatype, [2, 3])
    if datatype == "BYTES":
        assert out["data"] == tensor_json("y", datatype, want)["data"]
    else:  # JSON numbers print in the dtype's shortest form: compare values
        assert_same(np.asarray(out["data"], DATATYPES[datatype]).reshape(2, 3), want)


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_every_datatype_roundtrips_in_binary(datatype):
    want = SAMPLES[datatype]
    body, length = binary_request([("x", datatype, want)])
    tensor = decode_infer_request(body, header_length=length).inputs[0]
    assert_same(tensor.array, want.astype(DATATYPES[datatype]))

    out_body, headers = encode_infer_response(
        model_name="m", model_version="1", request_id=None, outputs={"y": tensor.array},
        requested=None, binary_output=True)
    assert headers["Content-Type"] == "application/octet-stream"
    doc, blocks = split_response(out_body, headers)
    assert doc["outputs"][0]["datatype"] == datatype
    assert doc["outputs"][0]["shape"] == [2, 3]
    assert "data" not in doc["outputs"][0]
    assert blocks["y"] == raw_bytes(want, datatype)


def test_binary_bytes_tensor_roundtrips_with_length_prefixes():
    values = np.array([b"hello", b"", b"\x00\xff binary"], dtype=object)
    block = b"\x05\x00\x00\x00hello" + b"\x00\x00\x00\x00" + b"\x09\x00\x00\x00\x00\xff binary"
    header = orjson.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [3],
                                       "parameters": {"binary_data_size": len(block)}}]})
    array = decode_infer_request(header + block, header_length=len(header)).inputs[0].array
    assert array.dtype == object and array.tolist() == values.tolist()
    body, headers = encode_infer_response(
        model_name="m", model_version="1", request_id=None, outputs={"s": array},
        requested=None, binary_output=True)
    assert split_response(body, headers)[1]["s"] == block


def test_bool_travels_as_one_byte_per_element():
    body, length = binary_request([("b", "BOOL", np.array([True, False, True]))])
    assert body[length:] == b"\x01\x00\x01"
    assert decode_infer_request(body, header_length=length).inputs[0].array.tolist() == [
        True, False, True]


def test_binary_inputs_are_views_over_the_body_not_copies():
    body, length = binary_request([("x", "FP32", np.ones((1, 3, 8, 8), np.float32))])
    array = decode_infer_request(body, header_length=length).inputs[0].array
    assert not array.flags.owndata and not array.flags.writeable


def test_nested_and_flat_json_data_give_the_same_tensor():
    flat = {"name": "x", "datatype": "INT32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}
    nested = {**flat, "data": [[1, 2, 3], [4, 5, 6]]}
    a = decode_infer_request(json_request([flat])).inputs[0].array
    b = decode_infer_request(json_request([nested])).inputs[0].array
    assert_same(a, b)
    strings = {"name": "s", "datatype": "BYTES", "shape": [2, 1], "data": [["a"], ["b"]]}
    assert decode_infer_request(json_request([strings])).inputs[0].array.tolist() == [
        [b"a"], [b"b"]]


def test_json_fp32_accepts_integers_and_zero_sized_tensors():
    req = json_request([{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2.5]},
                        {"name": "e", "datatype": "INT64", "shape": [0, 4], "data": []}])
    x, e = decode_infer_request(req).inputs
    assert x.array.dtype == np.float32 and x.array.tolist() == [[1.0, 2.5]]
    assert e.array.shape == (0, 4) and e.array.dtype == np.int64


def test_mixed_json_and_binary_inputs_take_blocks_in_input_order():
    a, b = np.arange(4, dtype=np.float32), np.arange(3, dtype=np.int64)
    header = orjson.dumps({"inputs": [
        {"name": "a", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
        {"name": "j", "datatype": "INT8", "shape": [2], "data": [1, 2]},
        {"name": "b", "datatype": "INT64", "shape": [3], "parameters": {"binary_data_size": 24}},
    ]})
    req = decode_infer_request(header + a.tobytes() + b.tobytes(), header_length=len(header))
    assert [t.array.tolist() for t in req.inputs] == [a.tolist(), [1, 2], b.tolist()]


# ----------------------------------------------------------- request fields


def test_request_fields_and_requested_outputs_are_decoded():
    req = decode_infer_request(json_request(
        [tensor_json("x", "FP32", SAMPLES["FP32"])], id="req-7",
        parameters={"binary_data_output": True},
        outputs=[{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}},
                 {"name": "p", "parameters": {"classification": 3}}]))
    assert req.id == "req-7" and req.binary_output is True
    assert [(o.name, o.binary, o.classification) for o in req.outputs] == [
        ("y", True, 0), ("z", False, 0), ("p", True, 3)]


def test_omitted_outputs_means_every_output():
    req = decode_infer_request(json_request([tensor_json("x", "FP32", SAMPLES["FP32"])]))
    assert req.outputs is None and req.id is None and req.binary_output is False


@pytest.mark.parametrize("encoding,compress", [
    ("gzip", gzip.compress), ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b, wbits=-15)),
])
def test_compressed_bodies_are_accepted(encoding, compress):
    body, length = binary_request([("x", "FP32", SAMPLES["FP32"])])
    req = decode_infer_request(compress(body), header_length=length, content_encoding=encoding)
    assert_same(req.inputs[0].array, SAMPLES["FP32"])


def test_sagemaker_binary_content_type_carries_the_header_length():
    ct = "application/vnd.sagemaker-triton.binary+json;json-header-size=123"
    assert sagemaker_header_length(ct) == 123
    assert sagemaker_header_length("application/json") is None
    assert sagemaker_header_length(None) is None
    with pytest.raises(InvalidInput, match="json-header-size"):
        sagemaker_header_length("application/vnd.sagemaker-triton.binary+json")


# ----------------------------------------------------------- request errors


def test_body_that_is_not_json_is_invalid():
    invalid("not valid JSON", b"{nope")
    invalid("JSON object", b"[1, 2]")


@pytest.mark.parametrize("inputs", [None, [], "x"])
def test_inputs_must_be_a_non_empty_list(inputs):
    invalid("'inputs'", orjson.dumps({"inputs": inputs}))


def test_unknown_datatype_names_the_input():
    invalid("input 'x': unknown datatype 'FP8'",
            json_request([{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}]))


@pytest.mark.parametrize("shape", [[2, -1], "2x3", [2.0, 3], None])
def test_bad_shape_names_the_input(shape):
    invalid("input 'x': shape", json_request(
        [{"name": "x", "datatype": "FP32", "shape": shape, "data": [1.0] * 6}]))


def test_data_length_that_disagrees_with_shape_is_invalid():
    err = invalid("input 'x': 'data' has 5 elements but shape \\[2, 3\\] needs 6", json_request(
        [{"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5]}]))
    assert err.status == 400


def test_ragged_nested_data_is_invalid():
    invalid("input 'x': 'data' is not a regular array", json_request(
        [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3]]}]))


@pytest.mark.parametrize("datatype,data,match", [
    ("FP32", ["1.5", "2"], "strings, not FP32"),
    ("FP32", [None, 1.0], "not FP32"),
    ("INT32", [1.5, 2], "non-integer numbers, not INT32"),
    ("UINT8", [300, 1], "out of range for UINT8"),
    ("INT8", [-129, 1], "out of range for INT8"),
    ("UINT64", [2**64 - 1, 1.5], "not UINT64 integers"),
    ("UINT64", [-1, 2**63], "not UINT64 integers"),
    ("BOOL", [1, 0], "integers, not BOOL"),
    ("BYTES", ["a", 2], "BYTES element 1 is int"),
])
def test_json_values_of_the_wrong_kind_are_invalid_not_coerced(datatype, data, match):
    invalid(f"input 'x'.*{match}", json_request(
        [{"name": "x", "datatype": datatype, "shape": [2], "data": data}]))


def test_bf16_is_binary_only():
    invalid("input 'x': BF16 is only accepted as binary", json_request(
        [{"name": "x", "datatype": "BF16", "shape": [1], "data": [1.0]}]))


def test_input_needs_exactly_one_of_data_and_binary_data_size():
    invalid("input 'x' has neither", json_request(
        [{"name": "x", "datatype": "FP32", "shape": [1]}]))
    header = json_request([{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0],
                            "parameters": {"binary_data_size": 4}}])
    invalid("input 'x' has both", header + b"\0" * 4, header_length=len(header))


def test_duplicate_input_names_are_invalid():
    t = tensor_json("x", "FP32", SAMPLES["FP32"])
    invalid("input 'x' appears more than once", json_request([t, t]))


def test_binary_data_size_that_disagrees_with_shape_is_invalid():
    header = json_request([{"name": "x", "datatype": "FP32", "shape": [2, 3],
                            "parameters": {"binary_data_size": 20}}])
    invalid("input 'x': binary_data_size is 20 but shape \\[2, 3\\] of FP32 needs 24",
            header + b"\0" * 20, header_length=len(header))


def test_missing_binary_bytes_are_invalid():
    body, length = binary_request([("x", "FP32", SAMPLES["FP32"])])
    invalid("input 'x': binary_data_size is 24 but only 20 bytes", body[:-4],
            header_length=length)


def test_binary_input_without_the_header_length_header_is_missing_its_bytes():
    body, length = binary_request([("x", "FP32", SAMPLES["FP32"])])
    invalid("input 'x': binary_data_size is 24 but only 0 bytes", body[:length])


def test_leftover_binary_bytes_are_invalid():
    body, length = binary_request([("x", "FP32", SAMPLES["FP32"])])
    invalid("3 bytes of binary data left over", body + b"abc", header_length=length)


def test_header_length_beyond_the_body_is_invalid():
    body, _ = binary_request([("x", "FP32", SAMPLES["FP32"])])
    invalid("Inference-Header-Content-Length", body, header_length=len(body) + 1)


def test_bytes_element_overrunning_its_block_is_invalid():
    block = b"\x09\x00\x00\x00short"
    header = json_request([{"name": "s", "datatype": "BYTES", "shape": [1],
                            "parameters": {"binary_data_size": len(block)}}])
    invalid("input 's': BYTES element 0 declares 9 bytes", header + block,
            header_length=len(header))


def test_bytes_block_with_too_few_or_too_many_elements_is_invalid():
    block = b"\x01\x00\x00\x00a"
    header = json_request([{"name": "s", "datatype": "BYTES", "shape": [2],
                            "parameters": {"binary_data_size": len(block)}}])
    invalid("input 's': binary BYTES data ends before element 1", header + block,
            header_length=len(header))
    block = b"\x01\x00\x00\x00a\x01\x00\x00\x00b"
    header = json_request([{"name": "s", "datatype": "BYTES", "shape": [1],
                            "parameters": {"binary_data_size": len(block)}}])
    invalid("input 's': binary_data_size is 10 but its 1 BYTES elements use 5",
            header + block, header_length=len(header))


def test_unsupported_or_corrupt_content_encoding_is_invalid():
    body = json_request([tensor_json("x", "FP32", SAMPLES["FP32"])])
    invalid("unsupported Content-Encoding 'br'", body, content_encoding="br")
    invalid("Content-Encoding gzip", b"not gzip", content_encoding="gzip")


@pytest.mark.parametrize("params,match", [
    ({"binary_data": "yes"}, "output 'y': binary_data"),
    ({"classification": -1}, "output 'y': classification"),
])
def test_bad_output_parameters_name_the_output(params, match):
    invalid(match, json_request([tensor_json("x", "FP32", SAMPLES["FP32"])],
                                outputs=[{"name": "y", "parameters": params}]))


def test_non_string_id_is_invalid():
    invalid("'id' must be a string", json_request(
        [tensor_json("x", "FP32", SAMPLES["FP32"])], id=5))


# ---------------------------------------------------------------- responses


def test_response_echoes_id_and_returns_only_requested_outputs_in_order():
    outputs = {"a": np.zeros((1, 2), np.float32), "b": np.ones((1, 1), np.int64)}
    body, _ = encode_infer_response(
        model_name="mlp", model_version="3", request_id="r1", outputs=outputs,
        requested=[RequestedOutput("b", False)], binary_output=False)
    doc = orjson.loads(body)
    assert doc["model_name"] == "mlp" and doc["model_version"] == "3" and doc["id"] == "r1"
    assert [o["name"] for o in doc["outputs"]] == ["b"]
    assert doc["outputs"][0]["data"] == [1]


def test_binary_and_json_outputs_mix_per_output():
    outputs = {"a": np.arange(3, dtype=np.float32), "b": np.arange(2, dtype=np.int32)}
    body, headers = encode_infer_response(
        model_name="m", model_version="1", request_id=None, outputs=outputs,
        requested=[RequestedOutput("a", False), RequestedOutput("b", True)],
        binary_output=False)
    doc, blocks = split_response(body, headers)
    assert doc["outputs"][0]["data"] == [0.0, 1.0, 2.0]
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(blocks["b"], "<i4").tolist() == [0, 1]


def test_json_fp32_output_prints_float32_not_float64_digits():
    body, _ = encode_infer_response(
        model_name="m", model_version="1", request_id=None,
        outputs={"y": np.array([0.1], np.float32)}, requested=None, binary_output=False)
    assert b'"data":[0.1]' in body


def test_requesting_an_unknown_output_is_invalid():
    with pytest.raises(InvalidInput, match="unknown output 'zz'"):
        encode_infer_response(model_name="m", model_version="1", request_id=None,
                              outputs={"y": np.zeros(1)}, requested=[RequestedOutput("zz", False)],
                              binary_output=False)


def test_non_utf8_bytes_output_in_json_asks_for_binary():
    with pytest.raises(InvalidInput, match="output 's'.*binary_data"):
        encode_infer_response(model_name="m", model_version="1", request_id=None,
                              outputs={"s": np.array([b"\xff"], dtype=object)},
                              requested=None, binary_output=False)


def test_string_outputs_from_onnxruntime_are_bytes_on_the_wire():
    body, _ = encode_infer_response(
        model_name="m", model_version="1", request_id=None,
        outputs={"s": np.array(["é", "b"], dtype=object)}, requested=None, binary_output=False)
    assert orjson.loads(body)["outputs"][0] == {
        "name": "s", "datatype": "BYTES", "shape": [2], "data": ["é", "b"]}


def test_classification_returns_top_k_score_index_strings_per_row():
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], dtype=np.float32)
    body, _ = encode_infer_response(
        model_name="m", model_version="1", request_id=None, outputs={"p": scores},
        requested=[RequestedOutput("p", False, {"classification": 2})], binary_output=False)
    out = orjson.loads(body)["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 2]
    assert out["data"] == ["0.700000:1", "0.200000:2", "0.500000:0", "0.250000:1"]


def test_classification_clamps_k_and_supports_unbatched_integer_outputs():
    body, headers = encode_infer_response(
        model_name="m", model_version="1", request_id=None,
        outputs={"p": np.array([3, 9, 1], np.int64)},
        requested=[RequestedOutput("p", True, {"classification": 5})], binary_output=False,
        batched=False)
    doc, blocks = split_response(body, headers)
    assert doc["outputs"][0]["shape"] == [3]
    assert blocks["p"] == b"".join(struct.pack("<I", len(s)) + s for s in [b"9:1", b"3:0", b"1:2"])


def test_response_can_be_parsed_by_tritonclient():
    http = pytest.importorskip("tritonclient.http")
    outputs = {"y": SAMPLES["FP32"], "s": SAMPLES["BYTES"], "b": SAMPLES["BOOL"]}
    body, headers = encode_infer_response(
        model_name="m", model_version="1", request_id="9", outputs=outputs, requested=None,
        binary_output=True)
    result = http.InferResult.from_response_body(
        body, header_length=int(headers["Inference-Header-Content-Length"]))
    np.testing.assert_array_equal(result.as_numpy("y"), SAMPLES["FP32"])
    assert result.as_numpy("s").tolist() == SAMPLES["BYTES"].tolist()
    np.testing.assert_array_equal(result.as_numpy("b"), SAMPLES["BOOL"])


def test_request_built_by_tritonclient_decodes():
    http = pytest.importorskip("tritonclient.http")
    from tritonclient.http._utils import _get_inference_request

    inputs = []
    for name, datatype in [("x", "FP32"), ("s", "BYTES"), ("h", "FP16")]:
        tensor = http.InferInput(name, list(SAMPLES[datatype].shape), datatype)
        tensor.set_data_from_numpy(SAMPLES[datatype], binary_data=name != "h")
        inputs.append(tensor)
    outputs = [http.InferRequestedOutput("y", binary_data=True, class_count=2)]
    body, header_length = _get_inference_request(
        inputs, "id-1", outputs, 0, False, False, 0, None, None)
    req = decode_infer_request(body, header_length=header_length)
    assert req.id == "id-1"
    for tensor in req.inputs:
        assert_same(tensor.array, SAMPLES[tensor.datatype])
    assert [(o.name, o.binary, o.classification) for o in req.outputs] == [("y", True, 2)]


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize("error,status", [
    (InvalidInput, 400), (Unauthorized, 401), (ModelNotFound, 404), (ModelNotReady, 503),
    (QueueFull, 503), (ServerFault, 500),
])
def test_errors_render_the_protocol_body_with_their_status(error, status):
    err = error("model 'mlp' version '9' is unknown")
    assert isinstance(err, ServingError) and err.status == status
    assert orjson.loads(err.body()) == {"error": "model 'mlp' version '9' is unknown"}


def test_queue_full_tells_clients_when_to_retry():
    assert QueueFull("queue full", retry_after=2).headers == {"Retry-After": "2"}
    assert ModelNotReady("loading", retry_after=1).headers == {"Retry-After": "1"}
    assert "WWW-Authenticate" in Unauthorized("no key").headers
