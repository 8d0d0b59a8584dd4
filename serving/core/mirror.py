"""A canary candidate's answers compared with the stable's on the same inputs.

While a canary analysis judges answers, a replica runs a share of the stable's requests on the
candidate too (fire-and-forget, never returned: serving/core/dataplane.py) and counts here how
the two answers compare. The counters only grow, like VersionStats': the heartbeat carries them
and the registry differences two samples for any window (registry/monitoring/agreement.py), as
it does for error rate and p99. Differences and output values go to fixed histograms so a
window's largest difference and the two output distributions can be read from a difference too.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

# Absolute differences: 1e-6 .. 1e6 in 1, 2, 5 steps; the last bucket is "more".
DIFF_BOUNDS: tuple[float, ...] = tuple(
    round(s * 10.0**e, 12) for e in range(-6, 7) for s in (1.0, 2.0, 5.0))
# Output values, signed: -1e6 .. -1e-6, 0, 1e-6 .. 1e6 (1, 2, 5 steps); the ends are "beyond".
VALUE_BOUNDS: tuple[float, ...] = tuple(
    [-b for b in reversed(DIFF_BOUNDS)] + [0.0] + list(DIFF_BOUNDS))
_MAX_VALUES = 4096  # values per request taken into the distributions (a bound on the work)


def picked(percent: int) -> bool:
    """Whether this request is in the mirrored share."""
    return percent >= 100 or (percent > 0 and random.random() * 100 < percent)


@dataclass
class MirrorStats:
    """Cumulative comparison of `version` (the candidate) with `against` (the stable)."""

    version: str
    against: str
    requests: int = 0
    errors: int = 0
    compared_rows: int = 0     # rows whose answer has a class dimension (> 1 values)
    argmax_agree: int = 0
    values: int = 0            # output values compared one by one
    abs_diff_sum: float = 0.0
    diff_buckets: list[int] = field(default_factory=lambda: [0] * (len(DIFF_BOUNDS) + 1))
    stable_values: list[int] = field(default_factory=lambda: [0] * (len(VALUE_BOUNDS) + 1))
    candidate_values: list[int] = field(
        default_factory=lambda: [0] * (len(VALUE_BOUNDS) + 1))
    last_error: str | None = None

    def failed(self, exc: BaseException) -> None:
        self.requests += 1
        self.errors += 1
        self.last_error = str(exc)[:300]

    def compare(self, stable: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> None:
        """Count one request's two answers: the first numeric output both gave in one shape."""
        self.requests += 1
        for name, a in stable.items():
            b = candidate.get(name)
            if b is None or a.shape != b.shape or a.dtype.kind not in "biuf" or not a.size:
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            diff = np.abs(a64 - b64).ravel()
            finite = diff[np.isfinite(diff)]
            self.values += int(finite.size)
            self.abs_diff_sum += float(finite.sum())
            for i, n in zip(*np.unique(np.searchsorted(DIFF_BOUNDS, finite, side="left"),
                                       return_counts=True), strict=True):
                self.diff_buckets[int(i)] += int(n)
            for values, hist in ((a64, self.stable_values), (b64, self.candidate_values)):
                flat = values.ravel()[:_MAX_VALUES]
                flat = flat[np.isfinite(flat)]
                for i, n in zip(*np.unique(np.searchsorted(VALUE_BOUNDS, flat, side="left"),
                                           return_counts=True), strict=True):
                    hist[int(i)] += int(n)
            if a.ndim >= 2 and a.shape[-1] > 1:
                rows = a64.reshape(-1, a.shape[-1])
                other = b64.reshape(rows.shape)
                self.compared_rows += rows.shape[0]
                self.argmax_agree += int(np.sum(rows.argmax(1) == other.argmax(1)))
            return

    def to_json(self) -> dict:
        return {"version": self.version, "against": self.against, "requests": self.requests,
                "errors": self.errors, "compared_rows": self.compared_rows,
                "argmax_agree": self.argmax_agree, "values": self.values,
                "abs_diff_sum": self.abs_diff_sum if math.isfinite(self.abs_diff_sum) else 0.0,
                "diff_buckets": list(self.diff_buckets),
                "stable_values": list(self.stable_values),
                "candidate_values": list(self.candidate_values),
                "last_error": self.last_error}


def largest_diff(buckets: list[int]) -> float | None:
    """The upper bound of the highest non-empty difference bucket (inf: beyond the last)."""
    for i in range(len(buckets) - 1, -1, -1):
        if buckets[i] > 0:
            return DIFF_BOUNDS[i] if i < len(DIFF_BOUNDS) else math.inf
    return None
