"""The capture file format, and how a replica writes it: a flush's records as one Parquet file
per model and hour.

The capture queue hands `encode` a batch of entries (references to each request's arrays,
nothing formatted). The batch is turned into columns, not records: each tensor's arrays are
gathered across the batch and joined into one buffer, its list offsets come from their sizes,
and pyarrow encodes and compresses the table without the GIL. A record costs a few list
comprehension steps, never a Python number per value (bench/results/capture-2026-12-07.md).
registry.monitoring.capture_store reads the files back as record dicts or as numpy arrays;
registry.monitoring.capture_check checks one a replica sent to the control plane.

One row per record:

    id          string    the request id
    model       string    the same in every row of a file
    version     string    "3" (read back as the int 3, as a digits-only version always was)
    role        string    stable | candidate | shadow | pinned | mirror
    ts          float64   seconds since the epoch, UTC, when the answer left
    latency_ms  float64
    truncated   bool      tensors past the endpoint's byte cap were left out
    mode        string    inputs | outputs | both: the parts the record has (null: neither)
    inputs.<name>         list<values>  a tensor's values, flattened; null: not captured
    inputs.<name>.shape   list<int32>   its shape
    outputs.<name>, outputs.<name>.shape   the same for outputs

A tensor's datatype is its values' type (float32: FP32, bool: BOOL, string: BYTES, ...). The
file's key-value metadata says `capture.format` "1" and, in `capture.tensors`, which part,
tensor and column (data or shape) each tensor column is: readers never parse column names (a
tensor may be called "x.shape"). Arrow's own schema is not stored (Parquet's types say it all;
it was half the footer: a file costs ~2 KB before its first record). Records whose same tensor
has two dtypes go to separate files. pandas opens a file or an hour folder in one line:
`pd.read_parquet(path)`.

pyarrow is imported when a batch is first encoded, not with this module: a replica that never
captures does not load it (~45 MB resident once it flushes).
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson

from serving.core.dtypes import DATATYPE_BY_DTYPE, NUMPY_DTYPES

log = logging.getLogger(__name__)

#: Parquet's compression of capture files: zstd level 1 stored the capture bench's records in
#: 9-34 % fewer bytes than snappy or lz4 for at most 0.25 us more per record, spent without the
#: GIL; level 3 was no smaller (bench/results/capture-2026-12-07.md).
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1
#: The file's `capture.format` metadata: what readers and the control plane's check accept.
FORMAT = b"1"
#: The file's metadata naming its tensor columns: {column name: [part, tensor, kind]}, kind
#: "data" (the values) or "shape".
TENSORS = b"capture.tensors"
PARTS = ("inputs", "outputs")
MODES = ("inputs", "outputs", "both")

# A queue entry is a plain tuple (cheaper than an object on the request path):
#   (ts, request id or None, model, version, role, latency ms, inputs or None, outputs or None,
#    byte cap, truncated already, bytes it counts in the queue)


@dataclass(frozen=True)
class CaptureFile:
    """One file of a flush: its model, the time of its first record (the file's hour folder and
    name come from these), its Parquet bytes and how many records of each version it holds."""

    model: str
    first_ts: float
    payload: bytes
    versions: dict[str, int]

    @property
    def rows(self) -> int:
        return sum(self.versions.values())


def arrow():
    """pyarrow and pyarrow.parquet, imported on first use. Unless ARROW_DEFAULT_MEMORY_POOL
    says otherwise, pyarrow allocates with the system allocator: its default (mimalloc) kept
    ~20 MB more resident in a replica that flushes capture files, for no speed we could see."""
    if "pyarrow" not in sys.modules:  # read once, when pyarrow loads
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not _pandas_looked_up:
        _without_pandas(pa)
    return pa, pq


_pandas_looked_up = False
_pandas_lock = threading.Lock()


def _without_pandas(pa) -> None:
    """The first `pa.array()` of a process asks whether pandas can be imported, and imports it
    when it can: where pandas is installed (most ML environments), the first capture flush or
    drift check spent ~1 s importing it with the GIL held (p99 of a replica's requests 5 ms ->
    30-90 ms while it ran) and kept ~40 MB more resident. Nothing here hands pandas objects to
    pyarrow: its first look finds pandas missing, and it does not look again on that path.
    Asked for pandas itself (`Table.to_pandas()`), pyarrow still imports it then."""
    global _pandas_looked_up
    with _pandas_lock:
        if _pandas_looked_up:
            return
        sys.meta_path.insert(0, _NoPandas)
        try:
            pa.array([], pa.int8())
        finally:
            sys.meta_path.remove(_NoPandas)
            _pandas_looked_up = True


class _NoPandas:
    """A finder that answers `import pandas` with ImportError (while pyarrow first looks)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pandas":
            raise ImportError("pandas is not wanted here", name=name)
        return None


def fixed_schema(pa) -> tuple:
    """The columns every file starts with, in this order."""
    return (pa.field("id", pa.string(), nullable=False),
            pa.field("model", pa.string(), nullable=False),
            pa.field("version", pa.string(), nullable=False),
            pa.field("role", pa.string(), nullable=False),
            pa.field("ts", pa.float64(), nullable=False),
            pa.field("latency_ms", pa.float64(), nullable=False),
            pa.field("truncated", pa.bool_(), nullable=False),
            pa.field("mode", pa.string()))


def datatypes(pa) -> dict:
    """Arrow value type -> v2 datatype, derived from the one numpy table (serving.core.dtypes)."""
    types = {pa.from_numpy_dtype(dt): name for dt, name in DATATYPE_BY_DTYPE.items()
             if name in NUMPY_DTYPES}
    types[pa.string()] = "BYTES"
    return types


def tensor_fields(schema) -> list[tuple[str, str, int, int]]:
    """(part, tensor, data column index, shape column index) of each tensor of a file's schema,
    from its `capture.tensors` metadata (a file with none has no tensors)."""
    named = orjson.loads((schema.metadata or {}).get(TENSORS, b"{}"))
    data: dict[tuple[str, str], int] = {}
    shape: dict[tuple[str, str], int] = {}
    for column, (part, name, kind) in named.items():
        (data if kind == "data" else shape)[(part, name)] = schema.get_field_index(column)
    return [(part, name, i, shape[(part, name)]) for (part, name), i in data.items()
            if (part, name) in shape]


# -- writing ----------------------------------------------------------------------------------

TEXT_DTYPE = np.dtype(object)  # BYTES tensors, whatever numpy kind holds them (O, S or U)
_NONE: dict = {}
_NO_TYPE = type(None)
_NDARRAY_OR_NONE = {np.ndarray, _NO_TYPE}
_MODE = {(True, True): "both", (True, False): "inputs", (False, True): "outputs",
         (False, False): None}


def pause() -> None:
    time.sleep(0)  # the GIL to the event loop: requests before records


class _Pacer:
    """Calls `pause` when at least `every_s` went by since it last did: called between small
    steps, it bounds how long the flusher holds the GIL (each step is ~0.3 ms at most for a
    batch of 2,000 records), without a pause after every step."""

    def __init__(self, pause: Callable[[], None], every_s: float = 0.0005) -> None:
        self.pause, self.every_s = pause, every_s
        self.last = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self.last >= self.every_s:
            self.pause()
            self.last = time.perf_counter()


def encode(entries: list[tuple], *, new_id: Callable[[], str],
           pause: Callable[[], None] = pause) -> tuple[list[CaptureFile], list[tuple]]:
    """A flush batch as files (one per model and hour; more where a tensor's dtype changed) and
    the entries that could not be written (logged). `pause` lets other threads have the GIL;
    it is called about every half millisecond of work."""
    pace = _Pacer(pause)
    files: list[CaptureFile] = []
    failed: list[tuple] = []
    for group in _by_file(entries):
        pace()
        done, lost = _encode_group(group, new_id, pace)
        files.extend(done)
        failed.extend(lost)
    return files, failed


def _by_file(entries: list[tuple]) -> list[list[tuple]]:
    """Entries by model and hour (a batch is nearly always one model in one hour)."""
    if len({e[2] for e in entries}) <= 1 and len({e[0] // 3600 for e in entries}) <= 1:
        return [entries] if entries else []
    groups: dict[tuple[str, float], list[tuple]] = {}
    for entry in entries:
        groups.setdefault((entry[2], entry[0] // 3600), []).append(entry)
    return list(groups.values())


def _encode_group(entries: list[tuple], new_id, pace) -> tuple[list[CaptureFile], list[tuple]]:
    """One model's records of one hour as one file (or several where dtypes disagree)."""
    columns = _columns(entries, pace)
    dtypes: dict[tuple[str, str], set[np.dtype]] = {}
    sizes: dict[tuple[str, str], list[int]] = {}
    bad: dict[int, str] = {}
    for key, arrays in columns.items():
        dtypes[key], sizes[key] = _prepare(key, arrays, bad)
        pace()
    if bad:  # records with a tensor this format cannot hold: lost alone, the others written
        for i, why in list(bad.items())[:3]:
            log.warning("capture: a record of %s:%s not written: %s", entries[i][2],
                        entries[i][3], why[:200])
        kept = [e for i, e in enumerate(entries) if i not in bad]
        files, failed = _encode_group(kept, new_id, pace) if kept else ([], [])
        return files, failed + [entries[i] for i in bad]
    if any(len(kinds) > 1 for kinds in dtypes.values()):
        files, failed = [], []
        for run in _runs(entries):
            done, lost = _encode_group(run, new_id, pace)
            files.extend(done)
            failed.extend(lost)
        return files, failed
    cut = _cut(entries, columns, sizes)
    pace()
    try:
        payload = _parquet(entries, columns, dtypes, cut, new_id, pace)
    except Exception as exc:  # noqa: BLE001 - one file lost, not the flusher
        log.warning("capture: %d records of %s not written: %s: %s", len(entries),
                    entries[0][2], type(exc).__name__, str(exc)[:200])
        return [], list(entries)
    return [CaptureFile(model=entries[0][2], first_ts=min(e[0] for e in entries),
                        payload=payload, versions=dict(Counter(e[3] for e in entries)))], []


def _parquet(entries: list[tuple], columns: dict, dtypes: dict, cut: list[bool], new_id,
             pace) -> bytes:
    """The file of a group of entries: the fixed columns, then each tensor's columns."""
    pa, _ = arrow()
    ts, ids, _, versions, roles, latency, ins, outs, _, _, _ = zip(*entries, strict=True)
    fixed = _fixed(pa, entries[0][2], [i or new_id() for i in ids], versions, roles, ts,
                   latency, cut, ins, outs)
    tensors = []
    for (part, name), column in columns.items():
        pace()
        dtype = next(iter(dtypes[(part, name)]), None)
        tensors.append((part, name, dtype, _tensor_columns(pa, dtype, column, pace)))
    pace()
    return _write(fixed, tensors)


def _fixed(pa, model: str, ids, versions, roles, ts, latency, cut, ins, outs) -> list:
    """The fixed columns' arrays (fixed_schema's order), one value per record."""
    return [pa.array(ids, pa.string()), pa.repeat(pa.scalar(model, pa.string()), len(ids)),
            pa.array(versions, pa.string()), pa.array(roles, pa.string()),
            pa.array(ts, pa.float64()), pa.array(np.round(np.array(latency, np.float64), 3)),
            pa.array(cut, pa.bool_()), _modes(pa, ins, outs)]


def _write(fixed: list, tensors: list[tuple]) -> bytes:
    """The Parquet bytes: the fixed columns, then each tensor's (part, name, dtype, (values,
    shape) or None) data and shape columns, written with zstd (byte-stream-split floats
    compress ~8-10 % smaller for the same time)."""
    pa, pq = arrow()
    fields = list(fixed_schema(pa))
    arrays = list(fixed)
    named: dict[str, list[str]] = {}
    split = ["ts", "latency_ms"]
    for part, name, dtype, built in tensors:
        for kind, array in zip(("data", "shape"), built or (), strict=False):
            label = f"{part}.{name}" if kind == "data" else f"{part}.{name}.shape"
            while label in named:  # (a tensor "x.shape" beside "x"): names are for people only
                label += "_"
            named[label] = [part, name, kind]
            fields.append(pa.field(label, array.type))
            arrays.append(array)
            if kind == "data" and dtype.kind == "f":
                split.append(f"{label}.list.element")
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    out = pa.BufferOutputStream()
    with pq.ParquetWriter(out, table.schema, compression=COMPRESSION,
                          compression_level=COMPRESSION_LEVEL, use_byte_stream_split=split,
                          use_dictionary=False, write_statistics=False,
                          store_schema=False) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({b"capture.format": FORMAT, TENSORS: orjson.dumps(named)})
    return out.getvalue().to_pybytes()


def encode_columns(columns, *, new_id: Callable[[], str],
                   pause: Callable[[], None] = pause) -> CaptureFile:
    """A regular buffer's requests (serving.core.capture_wire.columns: one model and hour, the
    same numeric tensors in every record) as one file, written from the columns as they came:
    no Python object per request. The file is the one `encode` makes of the same records.
    `pause`: as in `encode`."""
    pa, _ = arrow()
    pace = _Pacer(pause)
    n = len(columns.ts)
    if type(columns.ids) is tuple:  # every id given and ASCII: Arrow's string layout already
        raw, offsets = columns.ids
        ids = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw))
    else:
        ids = [i if i is not None else new_id() for i in columns.ids]
    kinds = columns.kinds
    fixed = _fixed(pa, columns.model, ids, columns.versions, columns.roles, columns.ts,
                   columns.latency, columns.truncated,  # (parts: _modes's)
                   (True if kinds[0] else None,) * n, (True if kinds[1] else None,) * n)
    tensors = []
    for (part, name, dtype), (values, sizes, shapes) in zip(kinds[2:], columns.tensors,
                                                            strict=True):
        pace()
        tensors.append((part, name, dtype, (
            _lists(pa, None, n, sizes, pa.array(values)),
            _lists(pa, None, n, np.full(n, shapes.shape[1], np.int64),
                   pa.array(shapes.ravel())))))
    pace()
    return CaptureFile(model=columns.model, first_ts=columns.first_ts,
                       payload=_write(fixed, tensors), versions=dict(columns.counts))


def _modes(pa, ins: tuple, outs: tuple):
    """The mode column: which parts each record has."""
    if None not in ins and None not in outs:
        return pa.repeat(pa.scalar("both", pa.string()), len(ins))
    return pa.array([_MODE[(i is not None, o is not None)] for i, o in zip(ins, outs, strict=True)],
                    pa.string())


def _columns(entries: list[tuple], pace) -> dict[tuple[str, str], list]:
    """Each tensor's arrays across the records (None where a record has none), by (part, name)
    in the order first seen."""
    columns = {}
    for part, at in (("inputs", 6), ("outputs", 7)):
        dicts = [e[at] or _NONE for e in entries]
        for name in dict.fromkeys(itertools.chain.from_iterable(dicts)):
            columns[(part, name)] = [d.get(name) for d in dicts]
            pace()
    return columns


def kind_of(array) -> np.dtype:
    """The dtype a tensor is written as: its own (in native byte order), or text for BYTES;
    raises TypeError for one this format cannot hold (complex, datetime, bfloat16...)."""
    dtype = array.dtype
    if dtype.kind in "biuf":
        return dtype if dtype.isnative else dtype.newbyteorder("=")
    if dtype.kind in "OSU":
        return TEXT_DTYPE
    raise TypeError(f"numpy dtype {dtype} is not capturable")


def text_bytes(array: np.ndarray) -> int:
    """A BYTES tensor's size against the byte cap."""
    return sum(len(x) if isinstance(x, bytes | str) else 8 for x in array.ravel().tolist())


def as_text(x) -> str:
    """One BYTES element as the text a capture file holds."""
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def _prepare(key: tuple[str, str], arrays: list, bad: dict[int, str]
             ) -> tuple[set[np.dtype], list[int]]:
    """One tensor's arrays checked and made writable in place (numpy, native byte order); their
    dtypes and sizes in bytes (0: none). Records whose array cannot be written go to `bad`."""
    if type(key[1]) is str and set(map(type, arrays)) <= _NDARRAY_OR_NONE:
        dtypes = {a.dtype for a in arrays if a is not None}
        dtype = next(iter(dtypes)) if len(dtypes) == 1 else None
        if dtype is not None and dtype.kind in "biuf" and dtype.isnative:  # nearly always
            return dtypes, [0 if a is None else a.nbytes for a in arrays]
    dtypes, sizes = set(), []
    for i, array in enumerate(arrays):
        if array is None:
            sizes.append(0)
            continue
        try:
            if type(key[1]) is not str:
                raise TypeError(f"tensor name {key[1]!r} is not a string")
            array = np.asarray(array)
            dtype = kind_of(array)
            if dtype is TEXT_DTYPE:
                size = text_bytes(array)
            else:
                array = array.astype(dtype, copy=False)
                size = array.nbytes
        except Exception as exc:  # noqa: BLE001 - this record only
            bad[i] = f"{key[0]}.{str(key[1])[:64]}: {type(exc).__name__}: {exc}"
            arrays[i] = None
            sizes.append(0)
            continue
        arrays[i] = array
        dtypes.add(dtype)
        sizes.append(size)
    return dtypes, sizes


def _runs(entries: list[tuple]) -> list[list[tuple]]:
    """Entries in runs whose tensors agree on dtypes, each entry in the first run it fits."""
    runs: list[tuple[dict, list[tuple]]] = []
    for entry in entries:
        kinds = {(part, name): kind_of(np.asarray(array))
                 for part, tensors in zip(PARTS, entry[6:8], strict=True)
                 for name, array in (tensors or {}).items()}
        for known, members in runs:
            if all(known.get(k, d) == d for k, d in kinds.items()):
                known.update(kinds)
                members.append(entry)
                break
        else:
            runs.append((kinds, [entry]))
    return [members for _, members in runs]


def _cut(entries: list[tuple], columns: dict, sizes: dict) -> list[bool]:
    """Tensors past each record's byte cap left out (set to None in `columns`), in the record's
    order (inputs, then outputs): whether each record was truncated. Vectorized: only records
    whose tensors add up to more than their cap are walked one by one."""
    cut = [e[9] for e in entries]
    if not sizes:
        return cut
    total = np.sum(np.array(list(sizes.values()), np.int64), axis=0)
    caps = np.array([e[8] for e in entries], np.int64)
    for i in np.flatnonzero(total > caps).tolist():
        budget = entries[i][8]
        for part, tensors in (("inputs", entries[i][6]), ("outputs", entries[i][7])):
            for name in tensors or ():
                size = sizes[(part, name)][i]
                if size > budget:
                    columns[(part, name)][i] = None
                    cut[i] = True
                else:
                    budget -= size
    return cut


def _lists(pa, rows: list[int] | None, n: int, lengths: np.ndarray, values):
    """A list column of `n` rows: `rows` (None: all) hold `lengths` values each, the others are
    null."""
    counts, mask = lengths, None
    if rows is not None:
        counts = np.zeros(n, np.int64)
        counts[rows] = lengths
        mask = np.ones(n, np.bool_)
        mask[rows] = False
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("more than 2**31 values of one tensor in a flush")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values,
                                    mask=None if mask is None else pa.array(mask))


def _tensor_columns(pa, dtype: np.dtype | None, arrays: list, pace) -> tuple | None:
    """A tensor's (values, shape) list columns from its arrays (None: a record without it), or
    None when no record kept it. One join of the arrays' buffers, no Python per value (except
    for BYTES, made text one element at a time)."""
    rows = None if _NO_TYPE not in set(map(type, arrays)) else [  # (`in` would compare arrays)
        i for i, a in enumerate(arrays) if a is not None]
    if rows == []:
        return None
    present = arrays if rows is None else [arrays[i] for i in rows]
    shapes = [a.shape for a in present]
    if len(set(shapes)) == 1:  # one shape (a model's fixed input, batches of one size)
        ndims = np.full(len(shapes), len(shapes[0]), np.int64)
        dims = np.tile(np.array(shapes[0], np.int32), len(shapes))
        sizes = np.full(len(shapes), present[0].size, np.int64)
    else:
        ndims = np.fromiter(map(len, shapes), np.int64, len(shapes))
        dims = np.fromiter(itertools.chain.from_iterable(shapes), np.int32, int(ndims.sum()))
        sizes = np.fromiter(map(np.prod, shapes), np.int64, len(shapes)) if len(dims) \
            else np.ones(len(shapes), np.int64)
    pace()
    if dtype is TEXT_DTYPE:
        values = pa.array([as_text(x) for a in present for x in a.ravel().tolist()],
                          pa.string())
    else:
        try:  # the arrays' buffers joined: ~5x cheaper than np.concatenate on small arrays
            flat = np.frombuffer(b"".join(present), dtype)
        except (TypeError, BufferError):  # one is not contiguous
            flat = np.concatenate(present, axis=None).astype(dtype, copy=False)
        values = pa.array(flat)
    return (_lists(pa, rows, len(arrays), sizes, values),
            _lists(pa, rows, len(arrays), ndims, pa.array(dims)))


def entry_of(record: dict) -> tuple:
    """A record dict (capture_store's) as a queue entry, for writers that hold dicts."""
    parts = []
    for part in PARTS:
        tensors = record.get(part)
        parts.append(None if tensors is None else {name: np.asarray(
            t["data"], dtype=NUMPY_DTYPES.get(t["datatype"], TEXT_DTYPE)).reshape(t["shape"])
            for name, t in tensors.items()})
    return (record["ts"], record["id"], record["model"], str(record["version"]), record["role"],
            record.get("latency_ms", 0.0), parts[0], parts[1], 2**62,
            bool(record.get("truncated", False)), 0)
