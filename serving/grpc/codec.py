"""KServe v2 gRPC messages <-> the data plane's decoded request and numpy outputs.

The gRPC twin of serving.http.codec: `ModelInferRequest` becomes the same `InferRequest` the HTTP
front decodes, so validation, routing and batching are the data plane's, once. Inputs arrive
either as `raw_input_contents` (one little-endian block per input, BYTES length-prefixed, as
tritonclient.grpc sends them) or as typed `contents`; outputs always leave as
`raw_output_contents`, as Triton answers. The message types are the ones tritonclient[grpc]
ships generated from Triton's grpc_service.proto (package `inference`, the KServe v2 service
plus Triton's extensions).
"""

from __future__ import annotations

import math

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from serving.core.dtypes import DATATYPES
from serving.core.errors import InvalidInput
from serving.core.tensors import (
    InferRequest,
    InputTensor,
    RequestedOutput,
    answered_outputs,
    binary_block,
    binary_bytes,
    datatype_of,
    output_place,
    shared_memory_place,
)

#: Which typed `contents` field carries each datatype (FP16 and BF16 have none: raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters(entries) -> dict:
    """A protobuf `map<string, InferParameter>` as the plain dict the HTTP front sees."""
    out = {}
    for key, value in entries.items():
        which = value.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(value, which)
    return out


#: From this size on a ModelInferRequest's raw_input_contents are left where they lie in the
#: received message (memoryviews) instead of being copied by protobuf: below it, finding them
#: costs more than the copy.
SPLIT_FROM_BYTES = 64 << 10
_RAW_INPUT_CONTENTS = 7  # ModelInferRequest's field number


def parse_model_infer_request(data) -> tuple[pb.ModelInferRequest, list | None]:
    """A received ModelInferRequest (bytes or a memoryview over the call's buffer) as
    (message, raw_input_contents): for a large one the message is parsed without its
    raw_input_contents, which come back as read-only views of `data`; None says "the
    message's own". Anything odd on the wire falls back to protobuf's parse of the whole, so
    its errors are protobuf's."""
    if len(data) < SPLIT_FROM_BYTES:
        return pb.ModelInferRequest.FromString(data), None
    view = memoryview(data).toreadonly()
    kept: list = []
    raws: list = []
    pos, size = 0, len(view)
    try:
        while pos < size:
            start = pos
            tag, pos = _varint(view, pos)
            wire_type = tag & 7
            if wire_type == 2:
                length, pos = _varint(view, pos)
                end = pos + length
                if end > size:
                    raise ValueError
                if tag >> 3 == _RAW_INPUT_CONTENTS:
                    raws.append(view[pos:end])
                    pos = end
                    continue
            elif wire_type == 0:
                end = _varint(view, pos)[1]
            elif wire_type in (1, 5):
                end = pos + (8 if wire_type == 1 else 4)
            else:
                raise ValueError
            if end > size:
                raise ValueError
            kept.append(view[start:end])
            pos = end
    except (ValueError, IndexError):
        return pb.ModelInferRequest.FromString(data), None
    return pb.ModelInferRequest.FromString(b"".join(kept)), raws


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError


def decode_model_infer_request(request: pb.ModelInferRequest, raw=None) -> InferRequest:
    """Check and decode one request; every malformed detail is an InvalidInput naming it.
    Raw inputs become read-only numpy views over the message's bytes (no copy); `raw`, if
    given, stands for its raw_input_contents (parse_model_infer_request)."""
    inputs = request.inputs
    if not inputs:
        raise InvalidInput("'inputs' must be a non-empty list")
    if raw is None:
        raw = request.raw_input_contents
    if raw and len(raw) != len(inputs) and len(raw) != len(inputs) - _in_shared_memory(inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries but the request has {len(inputs)} "
            "inputs: send one per input, in input order (or none, with typed contents), "
            "leaving out those in shared memory")
    decoded = []
    seen = set()
    shared = False
    next_raw = 0
    for index, tensor in enumerate(inputs):
        name = tensor.name
        if not name:
            raise InvalidInput(f"inputs[{index}] needs a name")
        if name in seen:
            raise InvalidInput(f"input '{name}' appears more than once")
        seen.add(name)
        datatype = tensor.datatype
        dtype = DATATYPES.get(datatype)
        if dtype is None:
            raise InvalidInput(
                f"input '{name}': unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})")
        shape = list(tensor.shape)
        if any(d < 0 for d in shape):
            raise InvalidInput(f"input '{name}': shape must be a list of non-negative integers")
        params = parameters(tensor.parameters)
        if params and ("shared_memory_region" in params or "shared_memory_byte_size" in params):
            if tensor.HasField("contents"):
                raise InvalidInput(f"input '{name}' is in shared memory and also has contents: "
                                   "send one")
            place = shared_memory_place(params, f"input '{name}'")
            decoded.append(InputTensor(name, datatype, shape, params, None, place))
            shared = True
            continue
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input '{name}' has both contents and raw_input_contents")
            if next_raw == len(raw):
                raise InvalidInput(f"input '{name}' has no raw_input_contents entry: send one "
                                   "per input that is not in shared memory, in input order")
            array = _raw_input(name, datatype, dtype, shape, raw[next_raw], next_raw)
            next_raw += 1
        else:
            array = _typed_input(name, datatype, dtype, shape, tensor.contents)
        decoded.append(InputTensor(name, datatype, shape, params, array))
    if next_raw != len(raw):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries but {next_raw} inputs "
                           "take one (those in shared memory take none)")
    outputs = None
    if request.outputs:
        outputs = []
        wanted = set()
        for spec in request.outputs:
            if spec.name in wanted:
                raise InvalidInput(f"output '{spec.name}' is requested more than once")
            wanted.add(spec.name)
            params = parameters(spec.parameters)
            k = params.get("classification", 0)
            if type(k) is not int or k < 0:
                raise InvalidInput(
                    f"output '{spec.name}': classification must be a non-negative integer")
            place = None
            if params and ("shared_memory_region" in params
                           or "shared_memory_byte_size" in params):
                place = output_place(params, spec.name)
                shared = True
            outputs.append(RequestedOutput(spec.name, True, params, place))
    return InferRequest(request.id or None, parameters(request.parameters), decoded, outputs,
                        True, shared)


def _in_shared_memory(inputs) -> int:
    """How many of a request's inputs name a shared-memory place (they take no raw entry)."""
    return sum(1 for tensor in inputs if "shared_memory_region" in tensor.parameters
               or "shared_memory_byte_size" in tensor.parameters)


def _raw_input(name: str, datatype: str, dtype: np.dtype, shape: list[int], data: bytes,
               index: int) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return binary_bytes(data, 0, len(data), count, name).reshape(shape)
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise InvalidInput(
            f"input '{name}': raw_input_contents[{index}] has {len(data)} bytes but shape "
            f"{shape} of {datatype} needs {expected} bytes")
    return np.frombuffer(data, dtype, count).reshape(shape)


def _typed_input(name: str, datatype: str, dtype: np.dtype, shape: list[int],
                 contents: pb.InferTensorContents) -> np.ndarray:
    count = math.prod(shape)
    field = CONTENTS_FIELD.get(datatype)
    present = [f.name for f, _ in contents.ListFields()]
    if field is None:
        raise InvalidInput(f"input '{name}': {datatype} travels only in raw_input_contents")
    stray = [f for f in present if f != field]
    if stray:
        raise InvalidInput(f"input '{name}': {datatype} values belong in contents.{field}, "
                           f"not {', '.join('contents.' + f for f in stray)}")
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidInput(f"input '{name}': contents.{field} has {len(values)} elements but "
                           f"shape {shape} needs {count}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    wide = np.array(values, dtype=np.uint64 if datatype == "UINT64" else None)
    if dtype.kind in "iu" and wide.size and wide.dtype != dtype:
        info = np.iinfo(dtype)
        if wide.min() < info.min or wide.max() > info.max:
            raise InvalidInput(f"input '{name}': contents.{field} has values out of range for "
                               f"{datatype}")
    return wide.astype(dtype, copy=False).reshape(shape)


def encode_model_infer_response(
    *, model_name: str, model_version: str, request: InferRequest,
    outputs: dict[str, np.ndarray], batched: bool,
) -> pb.ModelInferResponse:
    """The answer with every output's bytes in `raw_output_contents`, in output order."""
    tensors = []
    raw = []
    for name, array, binary in answered_outputs(outputs, request.outputs, True, batched):
        datatype = datatype_of(array)
        tensors.append(pb.ModelInferResponse.InferOutputTensor(
            name=name, datatype=datatype, shape=array.shape))
        # an output written into shared memory keeps its position with no bytes
        raw.append(bytes(binary_block(array, datatype)) if binary is not None else b"")
    return pb.ModelInferResponse(model_name=model_name, model_version=model_version,
                                 id=request.id or "", outputs=tensors, raw_output_contents=raw)


# -- the trace and logging extensions' settings (serving.core.operator_settings) ---------------


def trace_setting_changes(request: pb.TraceSettingRequest) -> dict:
    """TraceSettingRequest's settings as the JSON the HTTP front takes: a setting with no value
    is null (clear it), trace_level a list, the others their one string."""
    changes: dict = {}
    for name, setting in request.settings.items():
        values = list(setting.value)
        if not values:
            changes[name] = None
        elif name == "trace_level":
            changes[name] = values
        elif len(values) == 1:
            changes[name] = values[0]
        else:
            raise InvalidInput(f"{name} takes one value, got {len(values)}")
    return changes


def trace_setting_response(settings: dict) -> pb.TraceSettingResponse:
    value = pb.TraceSettingResponse.SettingValue
    return pb.TraceSettingResponse(settings={
        name: value(value=v if isinstance(v, list) else [v]) for name, v in settings.items()})


def log_settings_changes(request: pb.LogSettingsRequest) -> dict:
    """LogSettingsRequest's settings as JSON values (bool, int, str; none set: null)."""
    changes: dict = {}
    for name, setting in request.settings.items():
        which = setting.WhichOneof("parameter_choice")
        changes[name] = None if which is None else getattr(setting, which)
    return changes


def log_settings_response(settings: dict) -> pb.LogSettingsResponse:
    value = pb.LogSettingsResponse.SettingValue

    def one(v) -> pb.LogSettingsResponse.SettingValue:
        if isinstance(v, bool):
            return value(bool_param=v)
        if isinstance(v, int):
            return value(uint32_param=v)
        return value(string_param=v)

    return pb.LogSettingsResponse(settings={name: one(v) for name, v in settings.items()})
