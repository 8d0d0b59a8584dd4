"""Captured requests in the artifact store: what versions answered, for drift, quality and replay.

Files, one per flush of one writer (a replica's capture queue, or the console's own serving in
the embedded mode), partitioned by model and hour:

    capture/<model>/<YYYY-MM-DD>/<HH>/<first ts in ms>-<writer>-<seq>.parquet

Parquet, one row per record with tensors as list columns (the schema: serving.core.
capture_files): a replica builds a flush's file from its arrays a column at a time, without
formatting a number in Python, and a data scientist reads a file or an hour folder in one line,
`pandas.read_parquet(path)`. Files written before Parquet (`….jsonl.gz`, gzip JSON Lines, one
record a line) are still read, until retention deletes their day folders.

The readers give every record, whatever its file, as a dict:

    {"id": "<request id>", "model": "iris", "version": 3,
     "role": "stable" | "candidate" | "shadow" | "pinned" | "mirror",
     "ts": 1764943200.123,            # seconds since the epoch, UTC, when the answer left
     "latency_ms": 1.7,
     "inputs":  {"<name>": {"datatype": "FP32", "shape": [1, 4], "data": [flat values]}},
     "outputs": {"<name>": {"datatype": "FP32", "shape": [1, 3], "data": [flat values]}},
     "truncated": false}              # true: tensors beyond the byte cap were left out

"inputs" or "outputs" is absent when the endpoint captures only the other. Values come back as
Python numbers of their datatype: an FP32 0.1 reads 0.10000000149011612 from Parquet (the
float32 itself) where a JSON line gave its shortest decimal. Drift and baselines read tensors as
numpy straight from the columns (`iter_tensors`), without these dicts.
"""

from __future__ import annotations

import gc
import gzip
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import orjson

from registry.store.blobs import ArtifactStore, ArtifactUnavailable
from serving.core import capture_files
from serving.core.capture_files import CaptureFile

ROOT = "capture"
ROLES = ("stable", "candidate", "shadow", "pinned", "mirror")
_WRITER = re.compile(r"[^A-Za-z0-9_.-]+")
PARQUET_MAGIC = b"PAR1"


def _hour(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(minute=0, second=0, microsecond=0)


def partition(model: str, ts: float) -> str:
    """The hour folder a record taken at `ts` goes to."""
    return f"{ROOT}/{model}/{_hour(ts):%Y-%m-%d/%H}"


def decode(payload: bytes) -> list[dict]:
    """A capture file's records, whichever format it is in (Parquet, or the older gzip JSON
    Lines)."""
    if payload[:4] == PARQUET_MAGIC:
        return _parquet_records(payload)
    return [orjson.loads(line) for line in gzip.decompress(payload).splitlines() if line.strip()]


def _default_store() -> ArtifactStore:
    from registry.store.artifacts import default_store
    return default_store()


_seq = 0


def put_file(*, model: str, first_ts: float, payload: bytes, writer: str,
             store: ArtifactStore | None = None) -> str:
    """Store one capture file (Parquet bytes: one model's records of one hour); its key."""
    global _seq
    store = store or _default_store()
    _seq += 1
    writer = _WRITER.sub("-", writer)[:64] or "writer"
    key = f"{partition(model, first_ts)}/{int(first_ts * 1000)}-{writer}-{_seq}.parquet"
    store.put_object(key, payload)
    return key


def store_file(file: CaptureFile, *, writer: str, store: ArtifactStore | None = None) -> str:
    """A capture queue's file into the store (a replica with the registry's settings)."""
    return put_file(model=file.model, first_ts=file.first_ts, payload=file.payload,
                    writer=writer, store=store)


def write_records(records: Iterable[dict], *, writer: str,
                  store: ArtifactStore | None = None) -> list[str]:
    """Store record dicts (this module's shape, each with "model" and "ts") as the files a
    replica would have written, one per model and hour; the keys. For writers holding dicts:
    tests, benches."""
    entries = [capture_files.entry_of(r) for r in records]
    files, failed = capture_files.encode(entries, new_id=str, pause=lambda: None)
    if failed:
        raise ValueError(f"{len(failed)} records cannot be written (the log says why)")
    return [store_file(f, writer=writer, store=store) for f in files]


def _hours(since: float, until: float) -> Iterator[datetime]:
    hour, last = _hour(since), _hour(until)
    while hour <= last:
        yield hour
        hour += timedelta(hours=1)


def files(model: str, *, since: float, until: float,
          store: ArtifactStore | None = None) -> list[tuple[str, int]]:
    """(key, size) of the capture files of `model` whose hour overlaps [since, until]."""
    store = store or _default_store()
    found = []
    for hour in _hours(since, until):
        found.extend(store.list_objects(f"{ROOT}/{model}/{hour:%Y-%m-%d/%H}/"))
    return found


def iter_records(model: str, *, since: float, until: float | None = None,
                 version: int | None = None, roles: Iterable[str] | None = None,
                 request_id: str | None = None, newest_first: bool = False,
                 limit: int | None = None, store: ArtifactStore | None = None
                 ) -> Iterator[dict]:
    """Captured records of `model` taken in [since, until] (`until` defaults to now), filtered
    by version, route role and request id (in a Parquet file, on its columns before any dict
    is made); a file that vanished meanwhile (retention) is skipped."""
    store = store or _default_store()
    until = time.time() if until is None else until
    wanted = set(roles) if roles is not None else None
    keys = [k for k, _ in files(model, since=since, until=until, store=store)]
    if newest_first:
        keys.reverse()
    given = 0
    for key in keys:
        try:
            payload = store.get_object(key)
        except ArtifactUnavailable:
            continue
        if payload[:4] == PARQUET_MAGIC:
            batch = _parquet_records(payload, since=since, until=until, version=version,
                                     roles=wanted, request_id=request_id,
                                     newest_first=newest_first,
                                     limit=None if limit is None else limit - given)
        else:
            batch = [r for r in decode(payload) if since <= r["ts"] <= until
                     and (version is None or r.get("version") == version)
                     and (wanted is None or r.get("role") in wanted)
                     and (request_id is None or r.get("id") == request_id)]
            if newest_first:
                batch.reverse()
        for record in batch:
            yield record
            given += 1
            if limit is not None and given >= limit:
                return


def find(model: str, request_id: str, *, since: float, until: float | None = None,
         version: int | None = None, store: ArtifactStore | None = None) -> dict | None:
    """The newest captured record of `request_id` (of `version`) in the window, or None."""
    return next(iter_records(model, since=since, until=until, version=version,
                             request_id=request_id, newest_first=True, limit=1, store=store),
                None)


@dataclass
class Tensors:
    """A Parquet file's tensors as numpy, as drift and baselines read them: per (part, tensor)
    a list of (row shape, the values of the rows of that shape, flat), and how many records."""

    arrays: dict[tuple[str, str], list[tuple[tuple, np.ndarray]]]
    records: int


def iter_tensors(model: str, *, since: float, until: float, version: int | None = None,
                 store: ArtifactStore | None = None) -> Iterator[Tensors | dict]:
    """The tensors of `model`'s records in [since, until] of `version`: a Tensors per Parquet
    file, read from its columns with no record dict; the record dicts of an older JSON Lines
    file (registry.monitoring.baselines takes both)."""
    store = store or _default_store()
    for key, _size in files(model, since=since, until=until, store=store):
        try:
            payload = store.get_object(key)
        except ArtifactUnavailable:
            continue
        if payload[:4] == PARQUET_MAGIC:
            yield _parquet_tensors(payload, since=since, until=until, version=version)
            continue
        for record in decode(payload):
            if since <= record["ts"] <= until and (version is None
                                                   or record.get("version") == version):
                yield record


def prune(*, older_than_days: float, now: float | None = None,
          store: ArtifactStore | None = None, per_model: dict[str, float] | None = None) -> int:
    """Delete capture files of hours wholly older than the retention (`per_model`: days by
    model name, for the models it names; `older_than_days` for the others); how many."""
    store = store or _default_store()
    now = time.time() if now is None else now
    at = datetime.fromtimestamp(now, UTC)
    cutoff = at - timedelta(days=older_than_days)
    cutoffs = {m: at - timedelta(days=d) for m, d in (per_model or {}).items()}
    removed = 0
    for key, _size in list(store.list_objects(f"{ROOT}/")):
        parts = key.split("/")  # capture/<model>/<day>/<hour>/<file>
        if len(parts) != 5:
            continue
        try:
            hour = datetime.strptime(f"{parts[2]} {parts[3]}", "%Y-%m-%d %H").replace(tzinfo=UTC)
        except ValueError:
            continue
        if hour + timedelta(hours=1) <= cutoffs.get(parts[1], cutoff):
            store.delete_object(key)
            removed += 1
    return removed


# -- Parquet files ----------------------------------------------------------------------------

def _table(payload: bytes):
    pa, pq = capture_files.arrow()
    return pq.read_table(pa.BufferReader(payload))


def _strings(values: Iterable[str]):
    pa, _ = capture_files.arrow()
    return pa.array(list(values), pa.string())


def _version(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _parquet_records(payload: bytes, *, since: float | None = None, until: float | None = None,
                     version: int | str | None = None, roles: Iterable[str] | None = None,
                     request_id: str | None = None, newest_first: bool = False,
                     limit: int | None = None) -> list[dict]:
    """A Parquet file's records as dicts: those the filters keep (computed on the columns),
    in file order or the reverse, at most `limit`."""
    import pyarrow.compute as pc

    table = _table(payload)
    keep = None
    for condition in (
            since is not None and pc.greater_equal(table["ts"], since),
            until is not None and pc.less_equal(table["ts"], until),
            version is not None and pc.equal(table["version"], str(version)),
            roles is not None and pc.is_in(table["role"], value_set=_strings(roles)),
            request_id is not None and pc.equal(table["id"], request_id)):
        if condition is not False:
            keep = condition if keep is None else pc.and_(keep, condition)
    rows = np.arange(table.num_rows) if keep is None else np.flatnonzero(
        keep.to_numpy(zero_copy_only=False))
    if newest_first:
        rows = rows[::-1]
    if limit is not None:
        rows = rows[:limit]
    if len(rows) != table.num_rows or newest_first:
        table = table.take(rows)
    return _dicts(table)


def _dicts(table) -> list[dict]:
    """Rows as record dicts: each column made Python values once (numpy's tolist for numbers),
    each tensor's values then cut per row by its list offsets."""
    pa, _ = capture_files.arrow()
    datatypes = capture_files.datatypes(pa)
    fixed = [table[name].to_pylist() for name in (
        "id", "model", "version", "role", "ts", "latency_ms", "truncated", "mode")]
    tensors = []
    for part, name, data_at, shape_at in capture_files.tensor_fields(table.schema):
        data = table.column(data_at).combine_chunks()
        shape = table.column(shape_at).combine_chunks()
        datatype = datatypes.get(data.type.value_type, "BYTES")
        values = data.values.to_pylist() if datatype == "BYTES" else \
            data.values.to_numpy(zero_copy_only=False).tolist()
        tensors.append((part, name, datatype, data.is_valid().to_pylist(),
                        data.offsets.to_pylist(), values, shape.offsets.to_pylist(),
                        shape.values.to_pylist()))
    versions = {text: _version(text) for text in set(fixed[2])}
    records = []
    # Many small dicts and lists, no cycles: the cyclic collector's passes over them took ~3/4
    # of the time (100 k records: 2.1 s, 0.55 s without), so it pauses while they are made.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for i, (rid, model, version, role, ts, latency, truncated, mode) in enumerate(zip(
                *fixed, strict=True)):
            record = {"id": rid, "model": model, "version": versions[version], "role": role,
                      "ts": ts, "latency_ms": latency}
            if mode in ("inputs", "both"):
                record["inputs"] = {}
            if mode in ("outputs", "both"):
                record["outputs"] = {}
            for part, name, datatype, valid, offsets, values, shape_offsets, dims in tensors:
                kept = record.get(part)
                if kept is not None and valid[i]:
                    kept[name] = {"datatype": datatype,
                                  "shape": dims[shape_offsets[i]:shape_offsets[i + 1]],
                                  "data": values[offsets[i]:offsets[i + 1]]}
            record["truncated"] = truncated
            records.append(record)
    finally:
        if collecting:
            gc.enable()
    return records


def _parquet_tensors(payload: bytes, *, since: float, until: float,
                     version: int | str | None) -> Tensors:
    """A Parquet file's tensors, rows in [since, until] of `version`, grouped by row shape
    (the dimensions after the first) with numpy: no Python per row or value."""
    import pyarrow.compute as pc

    table = _table(payload)
    keep = pc.and_(pc.greater_equal(table["ts"], since), pc.less_equal(table["ts"], until))
    if version is not None:
        keep = pc.and_(keep, pc.equal(table["version"], str(version)))
    table = table.filter(keep)
    modes = table["mode"].to_numpy(zero_copy_only=False)
    out: dict[tuple[str, str], list[tuple[tuple, np.ndarray]]] = {}
    for part, name, data_at, shape_at in capture_files.tensor_fields(table.schema):
        data = table.column(data_at).combine_chunks()
        shape = table.column(shape_at).combine_chunks()
        wanted = data.is_valid().to_numpy(zero_copy_only=False) & np.isin(modes, (part, "both"))
        if not wanted.any():
            continue
        offsets = data.offsets.to_numpy()
        values = data.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
        lengths = np.diff(offsets)
        ndims = np.diff(shape.offsets.to_numpy())
        starts = shape.offsets.to_numpy()[:-1]
        dims = shape.values.to_numpy(zero_copy_only=False)
        found = out.setdefault((part, name), [])
        for nd in np.unique(ndims[wanted]).tolist():
            rows = np.flatnonzero(wanted & (ndims == nd))
            if nd <= 1:  # a scalar or a vector: no row shape
                keys, inverse = [()], np.zeros(len(rows), np.int64)
            else:
                keys, inverse = np.unique(dims[starts[rows][:, None] + np.arange(1, nd)],
                                          axis=0, return_inverse=True)
            for k, row_shape in enumerate(keys):
                chosen = np.zeros(len(lengths), np.bool_)
                chosen[rows[inverse.reshape(-1) == k]] = True
                found.append((tuple(int(d) for d in row_shape),
                               values[np.repeat(chosen, lengths)]))
    return Tensors(out, table.num_rows)
