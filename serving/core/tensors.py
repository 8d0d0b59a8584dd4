"""Tensors as the protocol core sees them, whatever the transport: a decoded infer request
(inputs as numpy arrays, the outputs asked for), the v2 datatype of an output, which outputs an
answer carries (top-k classified where asked), and the raw byte layout of a tensor that the binary
tensor extension and gRPC's raw contents share (BYTES: each element a 4-byte little-endian length,
then its bytes), and where a tensor lies in a registered system shared-memory region (Triton's
`shared_memory_*` parameters, the same on every transport). Each transport's codec turns its wire
format into these and back."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.core.dtypes import DATATYPE_BY_DTYPE
from serving.core.errors import InvalidInput, ServerFault

_U32 = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class SharedMemoryPlace:
    """Where a tensor lies: `byte_size` bytes at `offset` of the registered region `region`."""

    region: str
    offset: int
    byte_size: int


@dataclass(slots=True)
class InputTensor:
    """One decoded input: `array` already has the declared shape and the datatype's dtype; an
    input in shared memory (`place`) has none until the data plane reads it from its region."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict
    array: np.ndarray | None
    place: SharedMemoryPlace | None = None


@dataclass(slots=True)
class RequestedOutput:
    """An output the client named; `binary` already folds in `binary_data_output`. One with a
    `place` is written into that shared-memory region and the answer carries no data for it."""

    name: str
    binary: bool
    parameters: dict = field(default_factory=dict)
    place: SharedMemoryPlace | None = None

    @property
    def classification(self) -> int:
        """Top-k classes wanted (classification extension); 0 = the raw tensor."""
        return self.parameters.get("classification", 0) or 0


@dataclass(slots=True)
class InferRequest:
    """A decoded v2 infer request. `outputs` None means "every output"."""

    id: str | None
    parameters: dict
    inputs: list[InputTensor]
    outputs: list[RequestedOutput] | None
    binary_output: bool
    shared_memory: bool = False  # an input or an output has a place in shared memory


def shared_memory_place(parameters: dict, what: str) -> SharedMemoryPlace:
    """The place a tensor's `shared_memory_*` parameters name (offset 0 unless given); `what`
    ("input 'x'") names the tensor in the refusal of a missing or malformed one. The codecs
    call it when a tensor has shared_memory_region or shared_memory_byte_size (two dict
    lookups: what an ordinary request pays)."""
    region = parameters.get("shared_memory_region")
    size = parameters.get("shared_memory_byte_size")
    offset = parameters.get("shared_memory_offset", 0)
    if type(region) is not str or not region:
        raise InvalidInput(f"{what}: shared_memory_region must name a registered region, got "
                           f"{region!r}")
    if type(size) is not int or size < 0:
        raise InvalidInput(f"{what}: shared_memory_byte_size must be a non-negative integer, "
                           f"got {size!r}")
    if type(offset) is not int or offset < 0:
        raise InvalidInput(f"{what}: shared_memory_offset must be a non-negative integer, got "
                           f"{offset!r}")
    return SharedMemoryPlace(region, offset, size)


def output_place(parameters: dict, name: str) -> SharedMemoryPlace:
    """The shared-memory place of requested output `name`: its raw tensor, never top-k
    classes (Triton refuses the pair too)."""
    if parameters.get("classification"):
        raise InvalidInput(f"output '{name}': classification and shared memory cannot go "
                           "together; ask for the raw tensor in shared memory")
    return shared_memory_place(parameters, f"output '{name}'")


def binary_bytes(body: bytes, offset: int, size: int, count: int, name: str) -> np.ndarray:
    """Split one BYTES block: each element is a 4-byte little-endian length then its bytes."""
    stop = offset + size
    items = []
    pos = offset
    unpack = _U32.unpack_from
    for i in range(count):
        if pos + 4 > stop:
            raise InvalidInput(
                f"input '{name}': binary BYTES data ends before element {i} of {count}"
            )
        (length,) = unpack(body, pos)
        pos += 4
        if pos + length > stop:
            raise InvalidInput(
                f"input '{name}': BYTES element {i} declares {length} bytes but only "
                f"{stop - pos} remain in its binary_data_size"
            )
        items.append(bytes(body[pos:pos + length]))
        pos += length
    if pos != stop:
        raise InvalidInput(
            f"input '{name}': binary_data_size is {size} but its {count} BYTES elements "
            f"use {size - (stop - pos)}"
        )
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


def datatype_of(array: np.ndarray) -> str:
    """The v2 datatype name for a numpy array a runtime produced."""
    name = DATATYPE_BY_DTYPE.get(array.dtype)
    if name is not None:
        return name
    if array.dtype.kind in "OUS":
        return "BYTES"
    if not array.dtype.isnative:
        name = DATATYPE_BY_DTYPE.get(array.dtype.newbyteorder("="))
        if name is not None:
            return name
    raise ServerFault(f"numpy dtype {array.dtype} has no v2 datatype")


def answered_outputs(
    outputs: dict[str, np.ndarray], requested: list[RequestedOutput] | None,
    binary_output: bool, batched: bool,
) -> list[tuple[str, np.ndarray, bool]]:
    """(name, array, binary) of each output a response carries, in answer order: the ones the
    client named (top-k classified where it asked for classification), else every output.
    `binary` is None for an output written into shared memory: the answer names it (datatype,
    shape) and carries no data. Every front (HTTP JSON/binary, gRPC) answers with this
    selection."""
    if requested is None:
        return [(name, array, binary_output) for name, array in outputs.items()]
    answer = []
    for req in requested:
        array = outputs.get(req.name)
        if array is None:
            raise InvalidInput(
                f"unknown output '{req.name}' (the model produces {', '.join(outputs)})"
            )
        k = req.classification
        if k:
            array = _classify(array, k, batched, req.name)
        answer.append((req.name, array, req.binary if req.place is None else None))
    return answer


def binary_block(array: np.ndarray, datatype: str) -> Any:
    """Raw little-endian bytes of one output; a buffer view where no conversion is needed."""
    if datatype == "BYTES":
        parts = []
        for item in array.reshape(-1).tolist():
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts.append(_U32.pack(len(raw)))
            parts.append(raw)
        return b"".join(parts)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _classify(array: np.ndarray, k: int, batched: bool, name: str) -> np.ndarray:
    """Classification extension: top-k "score:index" strings per row (Triton's format:
    C++ to_string, so floats print with six decimals)."""
    if array.dtype.kind not in "biuf":
        raise InvalidInput(f"output '{name}': classification needs a numeric output")
    per_row = batched and array.ndim >= 2
    rows = array.reshape(array.shape[0], -1) if per_row else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :k]
    as_float = array.dtype.kind == "f"
    result = np.empty((rows.shape[0], k), dtype=object)
    for r, (row, idx) in enumerate(zip(rows.tolist(), order.tolist(), strict=True)):
        result[r] = [
            (f"{row[i]:f}:{i}" if as_float else f"{int(row[i])}:{i}").encode() for i in idx
        ]
    return result if per_row else result.reshape(k)


def output_bytes(outputs: dict[str, np.ndarray]) -> int:
    """What a request's outputs weigh, as the binary extension carries them (BYTES: a 4-byte
    length plus the bytes of each element): the measure of the output budget."""
    total = 0
    for array in outputs.values():
        if array.dtype.kind == "O":
            total += sum(4 + len(item) for item in array.ravel().tolist())
        else:
            total += array.nbytes
    return total
