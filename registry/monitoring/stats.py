"""Statistics of input features and outputs: what a baseline keeps and what drift compares.

A tensor of rows-by-F ([N, F] or [-1, F]) gives F features "x[0]".."x[F-1]"; a [N] or [N, 1]
tensor is one feature named like the tensor; anything with more dimensions per row is summarised
as one flattened feature (its summary says `flattened`). Numeric features keep count, mean, std,
min/max, quantiles, a histogram *with its bin edges* (drift's PSI bins new traffic on the same
edges) and a bounded reservoir sample (drift's two-sample test). BYTES and strings keep the top-k
frequencies plus "other". Everything is vectorised numpy: one pass per feature column.
"""

from __future__ import annotations

import numpy as np

BINS = 10
TOP_K = 20
SAMPLE = 2000
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def feature_columns(name: str, array: np.ndarray) -> list[tuple[str, np.ndarray, bool]]:
    """(feature name, 1-D column, flattened?) for one tensor whose first axis is the rows."""
    array = np.asarray(array)
    if array.ndim == 0:
        return [(name, array.reshape(1), False)]
    if array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1):
        return [(name, array.reshape(-1), False)]
    if array.ndim == 2:
        return [(f"{name}[{i}]", array[:, i], False) for i in range(array.shape[1])]
    return [(name, array.reshape(-1), True)]


def is_numeric(column: np.ndarray) -> bool:
    return column.dtype.kind in "biuf"


def _edges(values: np.ndarray) -> np.ndarray:
    """Bin edges at the baseline's deciles (equal-mass bins make PSI stable), widened to ±inf at
    the ends so later traffic outside the baseline's range still lands in a bin."""
    inner = np.unique(np.quantile(values, np.linspace(0, 1, BINS + 1)[1:-1]))
    return np.concatenate(([-np.inf], inner, [np.inf]))


def numeric_summary(column: np.ndarray, *, seed: int = 0) -> dict:
    values = np.asarray(column, dtype=np.float64)
    values = values[np.isfinite(values)]
    n = int(values.size)
    if n == 0:
        return {"kind": "numeric", "count": 0}
    edges = _edges(values)
    counts = np.histogram(values, bins=edges)[0]
    rng = np.random.default_rng(seed)
    sample = values if n <= SAMPLE else rng.choice(values, SAMPLE, replace=False)
    return {
        "kind": "numeric", "count": n, "mean": float(values.mean()), "std": float(values.std()),
        "min": float(values.min()), "max": float(values.max()),
        "quantiles": {str(q): float(v) for q, v in zip(QUANTILES, np.quantile(values, QUANTILES),
                                                        strict=True)},
        # JSON has no infinities: the outer edges are stored as null and read back as ±inf.
        "edges": [None if not np.isfinite(e) else float(e) for e in edges],
        "counts": counts.astype(int).tolist(),
        "sample": np.sort(sample).astype(float).tolist(),
    }


def as_text(column: np.ndarray) -> np.ndarray:
    if column.dtype.kind == "S":
        return np.char.decode(column, "utf-8", errors="replace")
    if column.dtype.kind == "O":
        return np.array([v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                         for v in column])
    return column.astype(str)


def categorical_summary(column: np.ndarray) -> dict:
    values = as_text(np.asarray(column))
    n = int(values.size)
    uniq, counts = np.unique(values, return_counts=True)
    order = np.argsort(-counts, kind="stable")[:TOP_K]
    top = {str(uniq[i]): int(counts[i]) for i in order}
    return {"kind": "categorical", "count": n, "distinct": int(uniq.size), "top": top,
            "other": n - sum(top.values())}


def summarise(name: str, array: np.ndarray, *, seed: int = 0) -> dict[str, dict]:
    """Feature name -> summary for one tensor (rows on the first axis)."""
    out = {}
    for feature, column, flattened in feature_columns(name, array):
        summary = numeric_summary(column, seed=seed) if is_numeric(column) \
            else categorical_summary(column)
        summary["tensor"] = name
        if flattened:
            summary["flattened"] = True
        out[feature] = summary
    return out


def edges_of(summary: dict) -> np.ndarray:
    edges = summary["edges"]
    return np.array([-np.inf] + [float(e) for e in edges[1:-1]] + [np.inf])


def psi(expected: np.ndarray, actual: np.ndarray, *, floor: float = 1e-4) -> float:
    """Population stability index of two count vectors over the same bins (floored shares)."""
    e = np.maximum(np.asarray(expected, float) / max(np.sum(expected), 1), floor)
    a = np.maximum(np.asarray(actual, float) / max(np.sum(actual), 1), floor)
    return float(np.sum((a - e) * np.log(a / e)))
