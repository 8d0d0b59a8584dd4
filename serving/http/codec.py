"""Open Inference Protocol v2 wire format <-> numpy, JSON and Triton's binary tensor extension.

Pure functions over bytes: nothing here knows HTTP frameworks, Django or models. This is the
request hot path, so binary tensors are views over the body (np.frombuffer, no copy) and JSON
outputs go to orjson as numpy arrays.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson

from serving.core.dtypes import DATATYPES, NOT_IN_NUMPY
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
from serving.http.compression import MAX_BODY_BYTES, decompress
from serving.http.json_numbers import FAST_MIN_BYTES, Numbers
from serving.http.json_numbers import load as load_numeric_json

#: BF16 and the like: JSON cannot carry them (see serving.core.dtypes).
_BINARY_ONLY = NOT_IN_NUMPY
#: which numpy kinds a JSON array may arrive as for each datatype (see _json_numeric).
_JSON_KINDS = {"BOOL": "b", "FP16": "iuf", "FP32": "iuf", "FP64": "iuf"}
_U32 = struct.Struct("<I")
_JSON_CT = {"Content-Type": "application/json"}
_SAGEMAKER_BINARY_CT = "application/vnd.sagemaker-triton.binary+json"
_MISSING = object()


# --------------------------------------------------------------------------- request


def sagemaker_header_length(content_type: str | None) -> int | None:
    """JSON header length from SageMaker's binary content type, None for any other type.

    Triton on SageMaker carries the header length in the Content-Type
    (`application/vnd.sagemaker-triton.binary+json;json-header-size=N`), not in a header.
    """
    if not content_type:
        return None
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != _SAGEMAKER_BINARY_CT:
        return None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "json-header-size":
            value = value.strip()
            if value.isdigit():
                return int(value)
            break
    raise InvalidInput(
        f"Content-Type {_SAGEMAKER_BINARY_CT} needs json-header-size=<bytes>, got {content_type!r}"
    )


def decode_infer_request(
    body: bytes, *, header_length: int | None = None, content_encoding: str | None = None,
    max_bytes: int = MAX_BODY_BYTES, fast_json_min_bytes: int | None = FAST_MIN_BYTES,
) -> InferRequest:
    """Parse a v2 infer request (JSON, or JSON header + binary tensors when header_length).

    Binary inputs become read-only views over `body`; JSON inputs are converted once: a plain
    JSON body of at least `fast_json_min_bytes` (None: never) first tries
    serving.http.json_numbers, which reads numeric `data` straight into numpy and hands anything
    unusual back to orjson. Every malformed detail is an InvalidInput whose message names the
    input or field; a compressed body that inflates past `max_bytes` is PayloadTooLarge.
    """
    if content_encoding:
        body = decompress(body, content_encoding, limit=max_bytes)
    end = len(body)
    if header_length is None:
        header: Any = body
        offset = end
    else:
        if header_length < 0 or header_length > end:
            raise InvalidInput(
                f"Inference-Header-Content-Length {header_length} is outside the body "
                f"of {end} bytes"
            )
        header = body[:header_length]  # a small copy; orjson parses bytes faster than a view
        offset = header_length
    doc = None
    if header_length is None and fast_json_min_bytes is not None \
            and end >= fast_json_min_bytes:
        doc = load_numeric_json(body)
    if doc is None:
        try:
            doc = orjson.loads(header)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    if type(doc) is not dict:
        raise InvalidInput("request body must be a JSON object")

    request_id = doc.get("id")
    if request_id is not None and type(request_id) is not str:
        raise InvalidInput("'id' must be a string")
    parameters = _params(doc.get("parameters"), "request parameters")
    binary_output = parameters.get("binary_data_output", False)
    if type(binary_output) is not bool:
        raise InvalidInput("parameters.binary_data_output must be true or false")

    raw_inputs = doc.get("inputs")
    if type(raw_inputs) is not list or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list")
    inputs = []
    seen = set()
    shared = False
    for index, spec in enumerate(raw_inputs):
        tensor, offset = _decode_input(spec, index, body, offset, end)
        if tensor.name in seen:
            raise InvalidInput(f"input '{tensor.name}' appears more than once")
        seen.add(tensor.name)
        inputs.append(tensor)
        if tensor.place is not None:
            shared = True
    if offset != end:
        raise InvalidInput(
            f"{end - offset} bytes of binary data left over after the last binary input"
        )
    outputs, shared_outputs = _decode_outputs(doc.get("outputs"), binary_output)
    return InferRequest(request_id, parameters, inputs, outputs, binary_output,
                        shared or shared_outputs)


def _params(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if type(value) is not dict:
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def _decode_input(
    spec: Any, index: int, body: bytes, offset: int, end: int,
) -> tuple[InputTensor, int]:
    """One entry of 'inputs' and the offset of the next binary block: its values come either
    from binary data at `offset` (binary_data_size) or from its JSON 'data'."""
    name, datatype, dtype, shape, parameters = _input_header(spec, index)
    if parameters and ("shared_memory_region" in parameters
                       or "shared_memory_byte_size" in parameters):  # the two it needs
        if "data" in spec or "binary_data_size" in parameters:
            raise InvalidInput(f"input '{name}' is in shared memory and also has "
                               f"{'data' if 'data' in spec else 'binary_data_size'}: send one")
        place = shared_memory_place(parameters, f"input '{name}'")
        return InputTensor(name, datatype, shape, parameters, None, place), offset
    data = spec.get("data", _MISSING)
    size = parameters.get("binary_data_size")
    if size is not None:
        if data is not _MISSING:
            raise InvalidInput(f"input '{name}' has both 'data' and binary_data_size")
        array = _binary_input(name, datatype, dtype, shape, size, body, offset, end)
        return InputTensor(name, datatype, shape, parameters, array), offset + size
    array = _json_input(name, datatype, dtype, shape, data)
    return InputTensor(name, datatype, shape, parameters, array), offset


def _input_header(spec: Any, index: int) -> tuple[str, str, np.dtype, list[int], dict]:
    """name, datatype, dtype, shape and parameters of one input, each checked."""
    if type(spec) is not dict:
        raise InvalidInput(f"inputs[{index}] must be a JSON object")
    name = spec.get("name")
    if type(name) is not str or not name:
        raise InvalidInput(f"inputs[{index}] needs a 'name' string")
    datatype = spec.get("datatype")
    dtype = DATATYPES.get(datatype) if type(datatype) is str else None
    if dtype is None:
        raise InvalidInput(
            f"input '{name}': unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})"
        )
    shape = spec.get("shape")
    if type(shape) is not list:
        raise InvalidInput(f"input '{name}': shape must be a list of non-negative integers")
    for d in shape:
        if type(d) is not int or d < 0:
            raise InvalidInput(f"input '{name}': shape must be a list of non-negative integers")
    parameters = _params(spec.get("parameters"), f"input '{name}' parameters")
    return name, datatype, dtype, shape, parameters


def _binary_input(name: str, datatype: str, dtype: np.dtype, shape: list[int], size: Any,
                  body: bytes, offset: int, end: int) -> np.ndarray:
    """The input's `size` bytes at `offset` of the body, as a read-only view where possible."""
    if type(size) is not int or size < 0:
        raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer")
    if offset + size > end:
        raise InvalidInput(
            f"input '{name}': binary_data_size is {size} but only {end - offset} bytes "
            "of binary data remain"
        )
    count = math.prod(shape)
    if datatype == "BYTES":
        return binary_bytes(body, offset, size, count, name).reshape(shape)
    expected = count * dtype.itemsize
    if size != expected:
        raise InvalidInput(
            f"input '{name}': binary_data_size is {size} but shape {shape} of "
            f"{datatype} needs {expected} bytes"
        )
    return np.frombuffer(body, dtype, count, offset).reshape(shape)


def _json_input(name: str, datatype: str, dtype: np.dtype, shape: list[int],
                data: Any) -> np.ndarray:
    """The input's JSON 'data', converted once and checked against the shape."""
    if data is _MISSING:
        raise InvalidInput(f"input '{name}' has neither 'data' nor binary_data_size")
    if type(data) is Numbers:  # serving.http.json_numbers read it; only numeric datatypes get here
        array = _json_numeric(data, datatype, dtype, name)
    elif type(data) is not list:
        raise InvalidInput(f"input '{name}': 'data' must be a list")
    elif datatype == "BYTES":
        array = _json_bytes(data, name)
    elif datatype in _BINARY_ONLY:
        raise InvalidInput(f"input '{name}': {datatype} is only accepted as binary data")
    else:
        array = _json_numeric(data, datatype, dtype, name)
    count = math.prod(shape)
    if array.size != count:
        raise InvalidInput(
            f"input '{name}': 'data' has {array.size} elements but shape {shape} needs {count}"
        )
    return array.reshape(shape)


def _json_numeric(data: list | Numbers, datatype: str, dtype: np.dtype,
                  name: str) -> np.ndarray:
    """Convert JSON numbers, refusing what numpy would silently coerce (strings, null, 1.5 as
    an integer, 300 as UINT8): let numpy infer first, then check kind and range."""
    if type(data) is Numbers:
        inferred = data.array()  # int64 or float64, as numpy would infer from the lists
    else:
        try:
            inferred = np.asarray(data)
        except ValueError as exc:  # ragged nesting
            raise InvalidInput(
                f"input '{name}': 'data' is not a regular array ({exc})") from None
    if inferred.dtype == dtype:
        return inferred
    if inferred.size == 0:
        return inferred.astype(dtype)
    kind = inferred.dtype.kind
    if kind == "f" and datatype == "UINT64":  # numpy infers float64 for ints past INT64 max
        return _json_uint64(data, inferred, name)
    if kind not in _JSON_KINDS.get(datatype, "iu"):
        raise InvalidInput(
            f"input '{name}': 'data' holds {_describe_kind(kind)}, not {datatype} values"
        )
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if inferred.min() < info.min or inferred.max() > info.max:
            raise InvalidInput(f"input '{name}': 'data' has values out of range for {datatype}")
    return inferred.astype(dtype)


def _json_uint64(data: list, inferred: np.ndarray, name: str) -> np.ndarray:
    try:
        exact = np.asarray(data, dtype=np.uint64)
    except (OverflowError, ValueError, TypeError):
        exact = None
    if exact is None or not np.array_equal(exact.astype(np.float64), inferred):
        raise InvalidInput(f"input '{name}': 'data' has values that are not UINT64 integers")
    return exact


def _describe_kind(kind: str) -> str:
    return {
        "b": "booleans", "i": "integers", "u": "integers", "f": "non-integer numbers",
        "U": "strings", "O": "mixed or null values",
    }.get(kind, "values")


def _json_bytes(data: list, name: str) -> np.ndarray:
    """JSON carries BYTES as strings; the array holds their UTF-8 bytes."""
    try:
        items = [s.encode() for s in data]  # flat list of strings: the common case
    except AttributeError:
        items = _nested_strings(data, name)
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _nested_strings(data: list, name: str) -> list[bytes]:
    try:
        nested = np.array(data, dtype=object)
    except ValueError as exc:
        raise InvalidInput(f"input '{name}': 'data' is not a regular array ({exc})") from None
    items = []
    for i, s in enumerate(nested.ravel()):
        if type(s) is not str:
            raise InvalidInput(
                f"input '{name}': BYTES element {i} is {type(s).__name__}, expected a string"
            )
        items.append(s.encode())
    return items


def _decode_outputs(raw: Any, binary_output: bool) -> tuple[list[RequestedOutput] | None, bool]:
    """The outputs asked for (None: every output), and whether one goes to shared memory."""
    if raw is None:
        return None, False
    if type(raw) is not list:
        raise InvalidInput("'outputs' must be a list")
    outputs = []
    seen = set()
    shared = False
    for index, spec in enumerate(raw):
        if type(spec) is not dict or type(spec.get("name")) is not str:
            raise InvalidInput(f"outputs[{index}] needs a 'name' string")
        name = spec["name"]
        if name in seen:
            raise InvalidInput(f"output '{name}' is requested more than once")
        seen.add(name)
        parameters = _params(spec.get("parameters"), f"output '{name}' parameters")
        binary = parameters.get("binary_data", binary_output)
        if type(binary) is not bool:
            raise InvalidInput(f"output '{name}': binary_data must be true or false")
        k = parameters.get("classification", 0)
        if type(k) is not int or k < 0:
            raise InvalidInput(f"output '{name}': classification must be a non-negative integer")
        place = None
        if parameters and ("shared_memory_region" in parameters
                           or "shared_memory_byte_size" in parameters):
            place = output_place(parameters, name)
            shared = True
        outputs.append(RequestedOutput(name, binary, parameters, place))
    return outputs, shared


# -------------------------------------------------------------------------- response


def encode_infer_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: dict[str, np.ndarray],
    requested: list[RequestedOutput] | None,
    binary_output: bool,
    parameters: dict | None = None,
    batched: bool = True,
) -> tuple[bytes, dict[str, str]]:
    """Render a v2 infer response; returns the body and the HTTP headers it needs.

    Binary outputs follow the JSON header in output order, with Inference-Header-Content-Length.
    `batched` says the outputs' first dimension is the batch (classification ranks per row).
    """
    docs = []
    blocks: list[Any] = []
    for name, array, binary in answered_outputs(outputs, requested, binary_output, batched):
        datatype = datatype_of(array)
        doc: dict[str, Any] = {"name": name, "datatype": datatype, "shape": array.shape}
        if binary:
            block = binary_block(array, datatype)
            doc["parameters"] = {"binary_data_size": len(block)}
            blocks.append(block)
        elif binary is not None:
            doc["data"] = _json_data(array, datatype, name)
        # else: written into its shared-memory region; the answer only names it
        docs.append(doc)

    response: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        response["id"] = request_id
    if parameters:
        response["parameters"] = parameters
    response["outputs"] = docs
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blocks:
        return header, _JSON_CT.copy()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return b"".join([header, *blocks]), headers


def _json_data(array: np.ndarray, datatype: str, name: str) -> Any:
    if datatype == "BYTES":
        try:
            return [
                item.decode() if isinstance(item, bytes) else str(item)
                for item in array.reshape(-1).tolist()
            ]
        except UnicodeDecodeError:
            raise InvalidInput(
                f"output '{name}' holds bytes that are not UTF-8; request it with binary_data"
            ) from None
    if datatype in _BINARY_ONLY:
        raise InvalidInput(f"output '{name}' is {datatype}; request it with binary_data")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return np.ascontiguousarray(array).reshape(-1)  # orjson writes it as one flat list
