"""A large ModelInferRequest's raw_input_contents stay in the received buffer
(serving.grpc.codec.parse_model_infer_request): the rest of the message reads exactly as
protobuf reads it, the tensors are the same bytes, and anything malformed fails as protobuf
fails."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from serving.grpc.codec import (
    SPLIT_FROM_BYTES,
    decode_model_infer_request,
    parse_model_infer_request,
)


def _request(n: int) -> tuple[pb.ModelInferRequest, np.ndarray, np.ndarray]:
    x = np.arange(n, dtype=np.float32)
    y = np.arange(3, dtype=np.int64)
    request = pb.ModelInferRequest(model_name="conv", model_version="2", id="req-9")
    request.parameters["priority"].int64_param = 3
    for name, array, datatype in (("x", x, "FP32"), ("y", y, "INT64")):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[array.size])
        tensor.parameters["p"].string_param = name
    request.outputs.add(name="out")
    request.raw_input_contents.extend([x.tobytes(), y.tobytes()])
    return request, x, y


def test_a_large_request_reads_as_protobuf_reads_it_with_its_tensors_left_in_place():
    request, x, y = _request(SPLIT_FROM_BYTES)  # 256 KB of x
    wire = bytearray(request.SerializeToString())
    message, raw = parse_model_infer_request(memoryview(wire))
    whole = pb.ModelInferRequest.FromString(bytes(wire))
    del whole.raw_input_contents[:]
    assert message == whole  # names, version, id, parameters, inputs, outputs
    assert [bytes(r) for r in raw] == [x.tobytes(), y.tobytes()]
    decoded = decode_model_infer_request(message, raw)
    assert np.array_equal(decoded.inputs[0].array, x)
    assert np.array_equal(decoded.inputs[1].array, y)
    assert not decoded.inputs[0].array.flags.writeable  # a view of the buffer, read-only
    wire[-1] ^= 0xFF  # the buffer is the tensor's memory: no copy was taken
    assert decoded.inputs[1].array[-1] != y[-1]


def test_raw_contents_before_the_inputs_and_unknown_fields_keep_their_meaning():
    request, x, y = _request(SPLIT_FROM_BYTES)
    raws = b"".join(pb.ModelInferRequest(raw_input_contents=[r]).SerializeToString()
                    for r in request.raw_input_contents)
    del request.raw_input_contents[:]
    unknown = bytes([15 << 3 | 0, 42])  # field 15, a varint nobody defined
    message, raw = parse_model_infer_request(raws + unknown + request.SerializeToString())
    assert message.model_name == "conv" and len(message.inputs) == 2
    assert [bytes(r) for r in raw] == [x.tobytes(), y.tobytes()]


def test_a_small_request_is_protobufs_own_parse():
    request, _, _ = _request(16)
    message, raw = parse_model_infer_request(request.SerializeToString())
    assert raw is None and message == request


@pytest.mark.parametrize("cut", [1, 100, SPLIT_FROM_BYTES])
def test_a_malformed_large_request_fails_as_protobuf_fails(cut):
    request, _, _ = _request(SPLIT_FROM_BYTES)
    wire = request.SerializeToString()
    truncated = wire[:-cut]  # a length that runs past the end
    with pytest.raises(DecodeError):
        pb.ModelInferRequest.FromString(truncated)
    with pytest.raises(DecodeError):
        parse_model_infer_request(truncated)
