"""Batch forming and splitting as plain functions over data (MLServer's `BatchedRequests` idea).

The DynamicBatcher owns the threads, futures, timers and stats; what a batch *is* lives here, so
it can be read and tested without any of them. A pending request is described by its
`(rows, key)`: requests merge only when their keys are equal (see `batch_key`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

Tensors = dict[str, np.ndarray]
#: (rows, key) of one queued request; key None = it joins no batch (or it has gone away).
Pending = tuple[int, tuple | None]


def batch_key(inputs: Tensors) -> tuple[int, tuple | None]:
    """(rows, key): requests with equal keys (names, dtypes, trailing dims) can be merged.

    A request whose inputs disagree on the first dimension, or has a scalar, gets key None and
    runs on its own. The one-input case is the common one and has its own short path.
    """
    if len(inputs) == 1:
        name, a = next(iter(inputs.items()))
        shape = a.shape
        if not shape:
            return 1, None
        return shape[0], (name, a.dtype.num, shape[1:])
    rows = -1
    parts = []
    for name, a in inputs.items():
        shape = a.shape
        if not shape or (rows >= 0 and shape[0] != rows):
            return max(rows, 1), None
        rows = shape[0]
        parts.append((name, a.dtype.num, shape[1:]))
    if rows < 0:
        return 1, None
    parts.sort()
    return rows, tuple(parts)


class BatchDecision(NamedTuple):
    """What to do with the queue now: take these positions (arrival order), or wait."""

    take: tuple[int, ...] = ()
    #: > 0: take nothing yet; the queue delay for the head request ends in this many ns.
    wait_ns: int = 0


def form_batch(
    pending: Iterable[Pending], *, max_rows: int, preferred: frozenset[int] = frozenset(),
    delay_ns: int = 0, waited_ns: int = 0,
) -> BatchDecision:
    """Triton's dynamic batching decision for a non-empty queue whose head is still wanted.

    The head request leads; later requests with its key join in arrival order up to `max_rows`
    rows (0 = no batching: the head goes alone). Without a delay whatever is compatible goes at
    once. With one (`delay_ns`, the head having waited `waited_ns`), a batch that is not full
    leaves early only at its largest `preferred` size, else it waits until the delay is spent.
    """
    chosen: list[int] = []
    sizes: list[int] = []
    rows = 0
    full = False
    head_key = None
    for i, (r_rows, key) in enumerate(pending):
        if i == 0:
            head_key = key
            if key is None or not max_rows:
                return BatchDecision((0,))
        elif key != head_key:
            continue
        if chosen and rows + r_rows > max_rows:
            full = True
            break
        chosen.append(i)
        sizes.append(r_rows)
        rows += r_rows
        if rows >= max_rows:
            full = True
            break
    if delay_ns and not full:
        best = _preferred_prefix(sizes, preferred)
        if best:
            return BatchDecision(tuple(chosen[:best]))
        if waited_ns < delay_ns:
            return BatchDecision((), delay_ns - waited_ns)
    return BatchDecision(tuple(chosen))


def _preferred_prefix(sizes: list[int], preferred: frozenset[int]) -> int:
    """How many of the candidates make the largest preferred batch (0: none does)."""
    total, best = 0, 0
    for n, size in enumerate(sizes, 1):
        total += size
        if total in preferred:
            best = n
    return best


def merge_inputs(parts: Sequence[Tensors]) -> Tensors:
    """One feed for the model: every request's inputs concatenated along axis 0, in order."""
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def split_outputs(outputs: Tensors, rows: Sequence[int]) -> list[Tensors]:
    """Each request's rows of every output (views, no copies); `rows` per request, in order."""
    if len(rows) == 1:
        return [outputs]
    total = sum(rows)
    for name, a in outputs.items():
        if a.ndim == 0 or a.shape[0] != total:
            raise ValueError(f"output {name!r} has shape {list(a.shape)}: no batch dimension of "
                             f"{total} rows to split between {len(rows)} requests")
    parts = []
    start = 0
    for n in rows:
        end = start + n
        parts.append({name: a[start:end] for name, a in outputs.items()})
        start = end
    return parts
