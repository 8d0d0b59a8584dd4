"""The control plane's check of a capture file a replica sent (POST /api/v1/replica/capture):
the request faces the network, so the file is judged by its footer before any data is read,
then by its values, and refused with a message naming what is wrong.

In order: Parquet magic at both ends; a footer pyarrow can read; at most `max_records` rows;
exactly the schema of serving.core.capture_files (the fixed columns with their types and
nullability, then tensor columns that its capture.tensors metadata names as part, tensor and
kind, a data and a shape column each, of a capture datatype and of int32); at most
`max_decoded_bytes` once decompressed and decoded, as the footer declares them (only the
encodings capture files use: no dictionary or delta runs); then the data: one valid model
name, every record in one hour with a finite time, known roles and modes, no null inside a
list, and shapes whose product is the number of values. What passes is stored as it came.

What the footer does not bound: each data page's header declares its own sizes and value
counts, which pyarrow trusts when it reads the page, so a crafted file could hold pages larger
than its footer says. The body limit and the replica credential the endpoint requires are
what stand in front of that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import orjson

from registry.monitoring.capture_store import ROLES
from serving.core import capture_files
from serving.core.capture_files import FORMAT, MODES, PARTS

#: The model names a capture file may carry (its key's folder): as the JSON Lines check had it.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_TENSOR_NAME = 256


class BadCapture(ValueError):
    """A capture payload that is not a capture file (the message says what is wrong)."""


@dataclass(frozen=True)
class CheckedFile:
    """What the store needs of a checked file (its key); rows 0: nothing to store."""

    model: str
    first_ts: float
    rows: int


def check(payload: bytes, *, max_records: int, max_decoded_bytes: int) -> CheckedFile:
    """A file a replica sent, checked footer first, then values; raises BadCapture."""
    pa, pq = capture_files.arrow()
    if payload[:2] == b"\x1f\x8b":  # what replicas sent before capture files were Parquet
        raise BadCapture("body: gzip JSON Lines, from a replica older than this control plane; "
                         "capture files are Parquet now: upgrade the replica")
    if len(payload) < 12 or payload[:4] != b"PAR1" or payload[-4:] != b"PAR1":
        raise BadCapture("body: not a Parquet file")
    try:
        parquet = pq.ParquetFile(pa.BufferReader(payload))
        meta, schema = parquet.metadata, parquet.schema_arrow
    except Exception as exc:  # noqa: BLE001 - whatever pyarrow says about a bad footer
        raise BadCapture(f"body: unreadable Parquet footer ({str(exc)[:200]})") from None
    if meta.num_rows > max_records:
        raise BadCapture(f"body: more than {max_records} records ({meta.num_rows})")
    _check_schema(pa, schema)
    decoded = _decoded_bytes(meta)
    if decoded > max_decoded_bytes:
        raise BadCapture(f"body: more than {max_decoded_bytes} bytes once decompressed "
                         f"({decoded})")
    try:
        table = parquet.read()
    except Exception as exc:  # noqa: BLE001 - a data page that does not decode
        raise BadCapture(f"body: unreadable Parquet data ({str(exc)[:200]})") from None
    if table.num_rows != meta.num_rows:
        raise BadCapture("body: its data does not match its footer")
    return _check_values(pa, table)


#: The encodings capture files are written with. Dictionary and delta encodings are refused:
#: they let a few bytes decode to many values (a million zeros in a run), which the footer's
#: sizes would not show.
ENCODINGS = {"PLAIN", "RLE", "BIT_PACKED", "BYTE_STREAM_SPLIT"}
_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def _decoded_bytes(meta) -> int:
    """What the footer says the file takes once read: the larger of its decompressed pages and
    its values at their width (a value, null or not, takes its slot; strings their PLAIN bytes
    and an offset each); raises BadCapture for an encoding capture files do not use."""
    pages = values = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        pages += group.total_byte_size
        for c in range(group.num_columns):
            chunk = group.column(c)
            odd = set(chunk.encodings) - ENCODINGS
            if odd:
                raise BadCapture(f"body: column {chunk.path_in_schema[:64]!r} is encoded "
                                 f"{', '.join(sorted(odd))}; capture files use "
                                 f"{', '.join(sorted(ENCODINGS))}")
            kind = chunk.physical_type
            width = meta.schema.column(c).length if kind == "FIXED_LEN_BYTE_ARRAY" \
                else _WIDTHS.get(kind, 4)
            values += chunk.num_values * (width + 1)
            if kind == "BYTE_ARRAY":
                values += chunk.total_uncompressed_size
    return max(pages, values)


def _check_schema(pa, schema) -> None:
    meta = schema.metadata or {}
    if meta.get(b"capture.format") != FORMAT:
        raise BadCapture(f"schema: not a capture file of format {FORMAT.decode()} (its "
                         "capture.format metadata)")
    fixed = capture_files.fixed_schema(pa)
    for i, want in enumerate(fixed):
        if i >= len(schema) or schema.field(i).name != want.name:
            raise BadCapture(f"schema: column {i + 1} must be {want.name!r}")
        got = schema.field(i)
        if got.type != want.type or got.nullable != want.nullable:
            raise BadCapture(f"schema: {want.name} must be {_typed(want)}, not {_typed(got)}")
    try:
        named = orjson.loads(meta.get(capture_files.TENSORS, b"{}"))
    except orjson.JSONDecodeError:
        raise BadCapture("schema: capture.tensors is not JSON") from None
    if type(named) is not dict:
        raise BadCapture("schema: capture.tensors must map column names to [part, tensor, "
                         "kind]")
    columns = [f.name for f in list(schema)[len(fixed):]]
    if sorted(named) != sorted(columns) or len(set(columns)) != len(columns):
        raise BadCapture("schema: capture.tensors must name every column after the first "
                         f"{len(fixed)}, once each")
    datatypes = capture_files.datatypes(pa)
    seen: dict[tuple[str, str], set[str]] = {}
    for column in columns:
        field, said = schema.field(column), named[column]
        where = f"schema: column {column[:64]!r}"
        if type(said) is not list or len(said) != 3 or said[0] not in PARTS \
                or type(said[1]) is not str or not 0 < len(said[1]) <= MAX_TENSOR_NAME \
                or said[2] not in ("data", "shape"):
            raise BadCapture(f"{where}: capture.tensors must say [part, tensor, kind]: part "
                             f"inputs or outputs, a tensor name of 1 to {MAX_TENSOR_NAME} "
                             "characters, kind data or shape")
        part, name, kind = said
        if not pa.types.is_list(field.type):
            raise BadCapture(f"{where}: must be a list, not {field.type}")
        value = field.type.value_type
        if kind == "data" and value not in datatypes:
            raise BadCapture(f"{where}: {value} values are no capture datatype")
        if kind == "shape" and value != pa.int32():
            raise BadCapture(f"{where}: a shape is a list of int32, not of {value}")
        kinds = seen.setdefault((part, name), set())
        if kind in kinds:
            raise BadCapture(f"{where}: a second {kind} column of {part}.{name[:64]}")
        kinds.add(kind)
    for (part, name), kinds in seen.items():
        if kinds != {"data", "shape"}:
            raise BadCapture(f"schema: {part}.{name[:64]} needs a data and a shape column")


def _typed(field) -> str:
    return f"{field.type}{'' if field.nullable else ' not null'}"


def _check_values(pa, table) -> CheckedFile:
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return CheckedFile(model="", first_ts=0.0, rows=0)
    models = pc.unique(table["model"]).to_pylist()
    if len(models) != 1:
        raise BadCapture(f"model: a file holds one model, not {len(models)}")
    if not MODEL_NAME.fullmatch(models[0]):
        raise BadCapture(f"model: {models[0][:64]!r} is not a model name")
    for column, allowed in (("role", ROLES), ("mode", MODES)):
        values = table[column]
        unknown = pc.filter(values, pc.invert(pc.is_in(values, value_set=pa.array(allowed))))
        unknown = [v for v in unknown.to_pylist() if v is not None]
        if unknown:
            raise BadCapture(f"{column}: {unknown[0][:64]!r} is not one of {', '.join(allowed)}")
    ts = table["ts"].to_numpy()
    if not np.isfinite(ts).all() or ts.min() < 0:
        raise BadCapture("ts: every record needs a finite time since the epoch")
    if ts.min() // 3600 != ts.max() // 3600:
        raise BadCapture("ts: a file holds the records of one hour")
    if not np.isfinite(table["latency_ms"].to_numpy()).all():
        raise BadCapture("latency_ms: not a finite number")
    for part, name, data_at, shape_at in capture_files.tensor_fields(table.schema):
        data = table.column(data_at).combine_chunks()
        shape = table.column(shape_at).combine_chunks()
        where = f"{part}.{name[:64]}"
        if data.values.null_count or shape.values.null_count:
            raise BadCapture(f"{where}: a null inside a tensor")
        valid = data.is_valid().to_numpy(zero_copy_only=False)
        if not np.array_equal(valid, shape.is_valid().to_numpy(zero_copy_only=False)):
            raise BadCapture(f"{where}: values and shape must be null in the same rows")
        sizes = _sizes(shape, where)
        lengths = np.diff(data.offsets.to_numpy())
        wrong = np.flatnonzero(valid & (sizes != lengths))
        if wrong.size:
            row = int(wrong[0])
            raise BadCapture(f"{where}: row {row + 1} has {int(lengths[row])} values for a "
                             f"shape of {int(sizes[row])}")
    return CheckedFile(model=models[0], first_ts=float(ts.min()), rows=table.num_rows)


def _sizes(shape, where: str) -> np.ndarray:
    """The number of values each row's shape says (a shape without dimensions: one)."""
    offsets = shape.offsets.to_numpy()
    dims = shape.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]].astype(np.int64)
    if (dims < 0).any():
        raise BadCapture(f"{where}: a negative dimension")
    starts, ndims = offsets[:-1] - offsets[0], np.diff(offsets)
    if not len(dims):
        return np.ones(len(ndims), np.int64)
    # reduceat gives a row without dimensions the value at its start: set to 1 after
    padded = np.append(dims, 1)
    if (np.add.reduceat(np.log2(np.maximum(padded, 1)), starts)[ndims > 0] > 62).any():
        raise BadCapture(f"{where}: a shape of more than 2**62 values")
    sizes = np.multiply.reduceat(padded, starts)
    sizes[ndims == 0] = 1
    return sizes
