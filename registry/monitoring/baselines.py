"""A version's baseline: statistics of every input feature (and output, from capture) computed
from an uploaded dataset or from captured traffic in a window (registry.services.baselines
stores it; drift compares recent capture with it)."""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from registry.monitoring import capture_store
from registry.monitoring.stats import summarise
from serving.core.dtypes import DATATYPES

PARTS = ("inputs", "outputs")


def _dtype(datatype: str):
    return np.object_ if datatype == "BYTES" else DATATYPES.get(datatype, np.float64)


#: Values a column gathers as Python numbers before they become one numpy chunk (a million
#: captured rows of 64 floats would otherwise hold 64 M Python floats at once).
CHUNK_VALUES = 1 << 20


class _Column:
    """One tensor's values of one row shape, gathered from records in bounded chunks."""

    def __init__(self, dtype):
        self.dtype, self.pending, self.chunks, self.size = dtype, [], [], 0

    def extend(self, values: list) -> None:
        self.pending.extend(values)
        self.size += len(values)
        if len(self.pending) >= CHUNK_VALUES:
            self.chunks.append(np.asarray(self.pending, dtype=self.dtype))
            self.pending = []

    def add(self, values: np.ndarray) -> None:
        """Values already in numpy (a Parquet file's column): kept as they are."""
        if self.pending:
            self.chunks.append(np.asarray(self.pending, dtype=self.dtype))
            self.pending = []
        self.chunks.append(values)
        self.size += len(values)

    def array(self) -> np.ndarray:
        if self.pending:
            self.chunks.append(np.asarray(self.pending, dtype=self.dtype))
            self.pending = []
        return np.concatenate(self.chunks) if self.chunks else np.empty(0, self.dtype)


def record_arrays(records: Iterable[dict | capture_store.Tensors],
                  ) -> tuple[dict[str, dict[str, np.ndarray]], int]:
    """Captured records (dicts, or a Parquet file's tensors already in numpy, as capture_store.
    iter_tensors gives them) as one array per part and tensor (rows on the first axis), and how
    many records were read. A tensor whose row shape differs from its most common one is left
    out of that record (a batch of another width cannot share a column)."""
    columns: dict[tuple[str, str], dict[tuple, _Column]] = defaultdict(dict)
    n = 0
    # The decoded records are many small dicts and lists with no cycles: the cyclic collector's
    # passes over them took ~45 % of the time (bench/drift.py), so it pauses while they stream.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for record in records:
            if isinstance(record, capture_store.Tensors):
                n += record.records
                for key, groups in record.arrays.items():
                    for row, values in groups:
                        column = columns[key].get(row)
                        if column is None:
                            column = columns[key][row] = _Column(values.dtype)
                        column.add(values)
                continue
            n += 1
            for part in PARTS:
                for name, tensor in (record.get(part) or {}).items():
                    shape = tensor.get("shape") or [len(tensor["data"])]
                    row = tuple(shape[1:])
                    by_row = columns[(part, name)]
                    column = by_row.get(row)
                    if column is None:
                        column = by_row[row] = _Column(_dtype(tensor.get("datatype", "FP32")))
                    column.extend(tensor["data"])
    finally:
        if collecting:
            gc.enable()
    out: dict[str, dict[str, np.ndarray]] = {p: {} for p in PARTS}
    for (part, name), by_row in columns.items():
        row, column = max(by_row.items(), key=lambda item: item[1].size)
        flat = column.array()
        out[part][name] = flat.reshape(-1, *row) if row else flat
    return out, n


def summarise_arrays(arrays: dict[str, dict[str, np.ndarray]]) -> dict[str, dict]:
    """{"inputs": {feature: summary}, "outputs": {...}} for arrays by part and tensor."""
    return {part: {feature: s for name, array in sorted(arrays.get(part, {}).items())
                   for feature, s in summarise(name, array).items()}
            for part in PARTS}


def from_capture(model: str, *, version: int, since: float, until: float,
                 store=None) -> tuple[dict, int]:
    """(features, rows) of a version's captured traffic in [since, until]."""
    arrays, _n = record_arrays(capture_store.iter_tensors(model, since=since, until=until,
                                                         version=version, store=store))
    rows = max((len(a) for part in arrays.values() for a in part.values()), default=0)
    return summarise_arrays(arrays), rows
