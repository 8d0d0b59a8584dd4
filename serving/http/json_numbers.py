"""A v2 JSON infer body whose `data` arrays go straight into numpy, never through Python floats.

orjson turns a conv input's 150,528 numbers into as many Python floats and numpy then copies them
into an array: ~5.5 ms a megabyte here. simdjson (PyPI `pysimdjson`) validates the whole body and
copies each numeric `data` array into a flat buffer in C: ~1.3 ms (bench/json_parse.py).

This path only ever says "this is what orjson would have produced" or "not sure": `load` returns
None for anything unusual (a non-numeric datatype, ragged or empty nesting, a `[` inside a string,
a duplicate key, a byte order mark, integers a float type might round differently, any simdjson
complaint), and the caller then runs the general parser, which owns every 400 message.
tests/serving/test_json_numbers.py checks that both agree on random and damaged bodies.

pysimdjson is the `[fast-json]` extra: without it `load` always says "not sure" (the general
parser reads every body, as it did before this path) and start-up logs one line naming the extra
(`log_if_unavailable`, from serving.http.app).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import numpy as np

from serving.core.extras import missing

try:
    import simdjson
except ImportError:  # the [fast-json] extra is not installed
    simdjson = None

log = logging.getLogger(__name__)
#: whether this path runs at all (pysimdjson, the [fast-json] extra, is installed)
AVAILABLE = simdjson is not None

#: below this a body goes straight to orjson: simdjson's setup costs as much as it saves
FAST_MIN_BYTES = 16 * 1024
_FLOATS = frozenset({"FP16", "FP32", "FP64"})
_INTEGERS = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})
#: past these magnitudes an integer's float64 (what simdjson gives) may not be what numpy
#: makes of it: int -> float64 -> float32 rounds twice; past 2**63 numpy leaves int64
_EXACT = {"FP16": float(2**53), "FP32": float(2**53), "FP64": float(2**63)}
_MAX_NESTING = 32
_BOM = b"\xef\xbb\xbf"  # simdjson skips it; orjson (and so the general path) refuses it
_Array = simdjson.Array if AVAILABLE else None
_Object = simdjson.Object if AVAILABLE else None
_local = threading.local()


def log_if_unavailable() -> None:
    """One line at start-up when pysimdjson is missing: large numeric bodies still parse, slower."""
    if not AVAILABLE:
        log.warning("%s: large JSON bodies are read by the general parser (slower); "
                    "pip install 'mmc[fast-json]' reads their numeric data straight into numpy",
                    missing("fast-json") or "pysimdjson does not import")


class Numbers:
    """A numeric JSON `data` array, parsed: flat float64 or int64 values and its nesting's dims."""

    __slots__ = ("values", "dims")

    def __init__(self, values: np.ndarray, dims: tuple[int, ...]) -> None:
        self.values = values
        self.dims = dims

    def array(self) -> np.ndarray:
        """What np.asarray would have made of the nested lists (int64 or float64)."""
        return self.values.reshape(self.dims)


class _Unusual(ValueError):
    """Not a body this path vouches for; the general parser decides."""


def load(body: bytes) -> dict | None:
    """The body as orjson.loads would return it, each input's numeric `data` a Numbers; or None
    when the general parser must decide (it also produces every error message)."""
    if not AVAILABLE or body.startswith(_BOM):
        return None
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = simdjson.Parser()
    try:
        try:
            root = parser.parse(body)
        except RuntimeError:  # an earlier document's proxies are still alive (a traceback)
            parser = _local.parser = simdjson.Parser()
            root = parser.parse(body)
        try:
            doc, arrays = _document(root)
        finally:
            del root
    except (ValueError, TypeError, RuntimeError, OverflowError):
        return None
    # every array is one '[' outside strings; more '[' means one inside a string or an array
    # this walk did not see (nested inside a leaf): let orjson decide
    if body.count(b"[") != arrays:
        return None
    return doc


def _document(root: Any) -> tuple[dict, int]:
    if type(root) is not _Object:
        raise _Unusual
    doc: dict = {}
    arrays = 0
    for key, value in _fields(root):
        if key == "inputs":
            if type(value) is not _Array:
                raise _Unusual
            inputs = []
            for spec in value:
                item, n = _input(spec)
                inputs.append(item)
                arrays += n
            doc[key] = inputs
            arrays += 1
        else:
            doc[key], n = _plain(value)
            arrays += n
    return doc, arrays


def _input(spec: Any) -> tuple[dict, int]:
    if type(spec) is not _Object:
        raise _Unusual
    item: dict = {}
    arrays = 0
    data = None
    for key, value in _fields(spec):
        if key == "data":
            data = value
            item[key] = None  # keeps orjson's key order
        else:
            item[key], n = _plain(value)
            arrays += n
    datatype = item.get("datatype")
    if type(data) is not _Array or datatype not in _FLOATS and datatype not in _INTEGERS:
        raise _Unusual
    dims = _dims(data)
    floats = datatype in _FLOATS
    values = np.frombuffer(data.as_buffer(of_type="d" if floats else "i"),
                           np.float64 if floats else np.int64)
    if values.size != math.prod(dims):
        raise _Unusual
    if floats and np.abs(values).max() >= _EXACT[datatype]:
        raise _Unusual
    item["data"] = Numbers(values, dims)
    return item, arrays + sum(math.prod(dims[:level]) for level in range(len(dims)))


def _fields(obj: Any) -> list[tuple[str, Any]]:
    """An object's keys and values (proxies for arrays and objects: simdjson's items() would
    convert them all); duplicate keys are left to orjson."""
    keys = list(obj.keys())
    if len(set(keys)) != len(keys):
        raise _Unusual
    return [(key, obj[key]) for key in keys]


def _dims(data: Any) -> tuple[int, ...]:
    """The nesting's lengths, read down the first elements, then checked on every inner array
    (not on the leaves' elements: the '[' count in load() catches an array hiding there)."""
    dims = []
    node = data
    while True:
        n = len(node)
        if n == 0 or len(dims) == _MAX_NESTING:
            raise _Unusual
        dims.append(n)
        first = node[0]
        if type(first) is not _Array:
            break
        node = first
    if len(dims) > 1:
        _check_regular(data, dims, 0)
    return tuple(dims)


def _check_regular(node: Any, dims: list[int], level: int) -> None:
    inner = level + 1
    if inner == len(dims):
        return
    for child in node:
        if type(child) is not _Array or len(child) != dims[inner]:
            raise _Unusual
        _check_regular(child, dims, inner)


def _plain(value: Any) -> tuple[Any, int]:
    """A JSON value as Python objects, and how many arrays it holds."""
    if type(value) is _Object:
        value = value.as_dict()
    elif type(value) is _Array:
        value = value.as_list()
    else:
        return value, 0
    return value, _count_lists(value, 0)


def _count_lists(value: Any, depth: int) -> int:
    if depth > _MAX_NESTING:
        raise _Unusual
    if type(value) is list:
        return 1 + sum(_count_lists(v, depth + 1) for v in value)
    if type(value) is dict:
        return sum(_count_lists(v, depth + 1) for v in value.values())
    return 0
