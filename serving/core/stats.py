"""Per-version serving statistics: Triton's statistics extension, a latency histogram for
dashboards and canary analysis, and a Prometheus collector that reads both at scrape time.

The hot path is plain attribute increments done on the event loop by the batcher (one call per
batch, not per request), so nothing here takes a lock. Prometheus reads the same integers when it
scrapes instead of us keeping a second copy in prometheus_client objects.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

# Latency bucket upper bounds in seconds: 50 µs to 30 s, six steps per decade (1, 1.5, 2, 3,
# 5, 7.5) so a quantile read from buckets is within ~25 % of the truth; the last bucket is +Inf.
_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5)
LATENCY_BUCKETS_S: tuple[float, ...] = tuple(
    b for b in (round(s * 10.0**e, 9) for e in range(-5, 2) for s in _STEPS) if 50e-6 <= b <= 30.0
)
_BOUNDS_NS: list[int] = [round(b * 1e9) for b in LATENCY_BUCKETS_S]


def quantile_from_buckets(
    bounds_s: Sequence[float], counts: Sequence[int], q: float
) -> float | None:
    """The q-quantile (0..1) in seconds from per-bucket counts (len(bounds) + 1, the last being
    +Inf), interpolating linearly inside the bucket; None when there are no observations.

    A module function so a dashboard can compute quantiles from the difference of two snapshots.
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = min(max(q, 0.0), 1.0) * total
    seen = 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i >= len(bounds_s):  # beyond the last bound: the best we can say is that bound
                return float(bounds_s[-1])
            lo = bounds_s[i - 1] if i else 0.0
            hi = bounds_s[i]
            return lo + (hi - lo) * max(rank - seen, 0.0) / c
        seen += c
    return float(bounds_s[-1])


def quantiles_from_bucket_rows(bounds_s: Sequence[float], rows: np.ndarray,
                               q: float) -> np.ndarray:
    """quantile_from_buckets for every row of a (points x buckets) count matrix at once (a
    week's chart has thousands of points); NaN where a row has no observations."""
    rows = np.asarray(rows, dtype=np.float64)
    bounds = np.asarray(bounds_s, dtype=np.float64)
    total = rows.sum(axis=1)
    rank = min(max(q, 0.0), 1.0) * total
    cum = np.cumsum(rows, axis=1)
    hit = (rows > 0) & (cum >= rank[:, None])
    idx = np.where(hit.any(axis=1), hit.argmax(axis=1), len(bounds))
    inside = np.minimum(idx, len(bounds) - 1)
    lo = np.where(inside > 0, bounds[np.maximum(inside - 1, 0)], 0.0)
    hi = bounds[inside]
    count = rows[np.arange(len(rows)), np.minimum(idx, rows.shape[1] - 1)]
    seen = cum[np.arange(len(rows)), np.minimum(idx, rows.shape[1] - 1)] - count
    frac = np.divide(np.maximum(rank - seen, 0.0), count, out=np.zeros(len(rows)),
                     where=count > 0)
    value = np.where(idx >= len(bounds), bounds[-1], lo + (hi - lo) * frac)
    return np.where(total > 0, value, np.nan)


#: VersionStats fields that add up across processes.
_SUMMED = (
    "success_count", "success_ns", "fail_count", "fail_ns", "queue_count", "queue_ns",
    "compute_input_count", "compute_input_ns", "compute_infer_count", "compute_infer_ns",
    "compute_output_count", "compute_output_ns", "inference_count", "execution_count",
    "pending", "latency_sum_ns", "cache_hit_count", "cache_hit_ns", "cache_miss_count",
    "cache_miss_ns", "cold_starts", "cold_start_sum_s", "model_fail_count")


class VersionStats:
    """Cumulative counters for one loaded model version (Triton statistics extension names).

    Request-level stats (success, fail, queue, compute_*) count requests, and like Triton each
    request of a batch is charged the whole batch's compute time; `inference_count` counts rows
    and `execution_count` model runs, so their ratio is the achieved batch size.
    """

    __slots__ = (
        "model", "version", "last_inference_ms",
        "success_count", "success_ns", "fail_count", "fail_ns", "queue_count", "queue_ns",
        "compute_input_count", "compute_input_ns", "compute_infer_count", "compute_infer_ns",
        "compute_output_count", "compute_output_ns", "inference_count", "execution_count",
        "batch_stats", "pending", "latency_counts", "latency_sum_ns", "since",
        "cached", "cache_hit_count", "cache_hit_ns", "cache_miss_count", "cache_miss_ns",
        "cold_starts", "cold_start_sum_s", "cold_start_last_s", "cold_start_at",
        "model_fail_count",
    )

    def __init__(self, model: str, version: str) -> None:
        self.model = model
        self.version = version
        self.last_inference_ms = 0
        self.success_count = self.success_ns = 0
        self.fail_count = self.fail_ns = 0
        # Of the failures, those the model itself raised on inputs its signature accepts
        # (serving.core.errors.ModelFailed, a 500): the version's own errors, not its callers'.
        self.model_fail_count = 0
        self.queue_count = self.queue_ns = 0
        self.compute_input_count = self.compute_input_ns = 0
        self.compute_infer_count = self.compute_infer_ns = 0
        self.compute_output_count = self.compute_output_ns = 0
        self.inference_count = 0
        self.execution_count = 0
        # batch size (rows) -> [executions, input_ns, infer_ns, output_ns]
        self.batch_stats: dict[int, list[int]] = {}
        self.pending = 0  # requests queued and not yet executing (set by the batcher)
        self.latency_counts: list[int] = [0] * (len(_BOUNDS_NS) + 1)
        self.latency_sum_ns = 0
        self.since = time.time()  # when these counters started: a first sample's span
        # Response cache (serving.core.response_cache): whether the version uses it, and Triton's
        # cache_hit (lookup and answer) and cache_miss (lookup and insertion) count and time.
        self.cached = False
        self.cache_hit_count = self.cache_hit_ns = 0
        self.cache_miss_count = self.cache_miss_ns = 0
        # Scale to zero: loads a request waited for, their total and the latest (seconds), and
        # when that one finished (unix seconds). The object outlives the unload, so these and
        # the request counters above keep counting across a sleep.
        self.cold_starts = 0
        self.cold_start_sum_s = 0.0
        self.cold_start_last_s: float | None = None
        self.cold_start_at: float | None = None

    # -- recording (hot path) -------------------------------------------------------------

    def record_execution(
        self, requests: int, rows: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One model run that served `requests` requests with `rows` rows in total."""
        self.execution_count += 1
        self.inference_count += rows
        self.compute_input_count += requests
        self.compute_input_ns += input_ns * requests
        self.compute_infer_count += requests
        self.compute_infer_ns += infer_ns * requests
        self.compute_output_count += requests
        self.compute_output_ns += output_ns * requests
        b = self.batch_stats.get(rows)
        if b is None:
            self.batch_stats[rows] = [1, input_ns, infer_ns, output_ns]
        else:
            b[0] += 1
            b[1] += input_ns
            b[2] += infer_ns
            b[3] += output_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_success(self, duration_ns: int) -> None:
        """A request answered: its end-to-end duration goes to the counters and the histogram."""
        self.success_count += 1
        self.success_ns += duration_ns
        self.latency_counts[bisect_left(_BOUNDS_NS, duration_ns)] += 1
        self.latency_sum_ns += duration_ns

    def record_cache_hit(self, duration_ns: int) -> None:
        """A request answered from the response cache: a success like any other (request
        counters and histogram), and a cache hit; no execution, queue or compute time."""
        self.cache_hit_count += 1
        self.cache_hit_ns += duration_ns
        self.record_success(duration_ns)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_cache_miss(self, duration_ns: int) -> None:
        """A cache lookup that found nothing: `duration_ns` is the lookup (the data plane adds
        the insertion's time to cache_miss_ns once the model answered)."""
        self.cache_miss_count += 1
        self.cache_miss_ns += duration_ns

    def record_failure(self, duration_ns: int = 0) -> None:
        """A request that failed anywhere (validation, queue full, model error)."""
        self.fail_count += 1
        self.fail_ns += duration_ns

    def record_model_failure(self) -> None:
        """One of the failures (already counted by `record_failure`) was the model's own."""
        self.model_fail_count += 1

    def record_cold_start(self, seconds: float) -> None:
        """A scaled-to-zero version loaded again because a request asked for it: from the first
        request's arrival until the version could answer."""
        self.cold_starts += 1
        self.cold_start_sum_s += seconds
        self.cold_start_last_s = seconds
        self.cold_start_at = time.time()

    # -- across processes (serving/process/siblings.py) -------------------------------------

    def to_state(self) -> dict:
        """Every field as plain JSON (the batch table as [size, runs, input, infer, output])."""
        state = {name: getattr(self, name) for name in self.__slots__ if name != "batch_stats"}
        state["batch_stats"] = [[size, *b] for size, b in self.batch_stats.items()]
        return state

    @classmethod
    def from_state(cls, state: dict) -> VersionStats:
        stats = cls(state["model"], state["version"])
        for name in cls.__slots__:
            if name in state and name != "batch_stats":
                setattr(stats, name, state[name])
        stats.batch_stats = {int(row[0]): list(row[1:]) for row in state.get("batch_stats", ())}
        return stats

    @classmethod
    def merged(cls, parts: Sequence[VersionStats]) -> VersionStats:
        """One version's counters summed over processes (the workers of one server): counts,
        times, batch table and histogram add up; the latest inference and cold start win."""
        first = parts[0]
        if len(parts) == 1:
            return first
        total = cls(first.model, first.version)
        for name in _SUMMED:
            setattr(total, name, sum(getattr(p, name) for p in parts))
        total.latency_counts = [sum(c) for c in zip(*(p.latency_counts for p in parts),
                                                     strict=True)]
        total.since = min(p.since for p in parts)
        total.last_inference_ms = max(p.last_inference_ms for p in parts)
        total.cached = any(p.cached for p in parts)
        for p in parts:
            for size, b in p.batch_stats.items():
                row = total.batch_stats.setdefault(size, [0, 0, 0, 0])
                for i, v in enumerate(b):
                    row[i] += v
        latest = max(parts, key=lambda p: p.cold_start_at or 0)
        total.cold_start_last_s, total.cold_start_at = latest.cold_start_last_s, \
            latest.cold_start_at
        return total

    # -- reading ---------------------------------------------------------------------------

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1) of successful request latency in seconds since start."""
        return quantile_from_buckets(LATENCY_BUCKETS_S, self.latency_counts, q)

    def snapshot(self) -> dict:
        """Plain cumulative numbers; a dashboard diffs two snapshots to get a window's count,
        error rate and latency buckets (feed the diff to quantile_from_buckets).

        `latency_buckets` counts successful requests only, per bucket (not cumulative), with
        one more entry than `bucket_bounds_s` for +Inf.
        """
        return {
            "model": self.model,
            "version": self.version,
            "at": time.time(),
            "since": self.since,
            "count": self.success_count + self.fail_count,
            "errors": self.fail_count,
            "model_errors": self.model_fail_count,
            "rows": self.inference_count,
            "executions": self.execution_count,
            "latency_sum_s": self.latency_sum_ns / 1e9,
            "bucket_bounds_s": list(LATENCY_BUCKETS_S),
            "latency_buckets": list(self.latency_counts),
            "cache_hits": self.cache_hit_count,
            "cache_misses": self.cache_miss_count,
            "cold_starts": self.cold_starts,
            "cold_start_last_s": self.cold_start_last_s,
            "cold_start_at": self.cold_start_at,
        }

    def to_triton(self) -> dict:
        """One entry of `model_stats` in the answer of `GET /v2/models/{m}/stats` (Triton)."""

        def d(count: int, ns: int) -> dict:
            return {"count": count, "ns": ns}

        return {
            "name": self.model,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": d(self.success_count, self.success_ns),
                "fail": d(self.fail_count, self.fail_ns),
                "queue": d(self.queue_count, self.queue_ns),
                "compute_input": d(self.compute_input_count, self.compute_input_ns),
                "compute_infer": d(self.compute_infer_count, self.compute_infer_ns),
                "compute_output": d(self.compute_output_count, self.compute_output_ns),
                "cache_hit": d(self.cache_hit_count, self.cache_hit_ns),
                "cache_miss": d(self.cache_miss_count, self.cache_miss_ns),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": d(b[0], b[1]),
                    "compute_infer": d(b[0], b[2]),
                    "compute_output": d(b[0], b[3]),
                }
                for size, b in sorted(self.batch_stats.items())
            ],
        }


# -- Prometheus ------------------------------------------------------------------------------

# Triton's counter names (no `_total` suffix: existing Triton dashboards query these exact
# names) -> (help text, function reading the value from VersionStats).
_TRITON_COUNTERS: dict[str, tuple[str, Callable[[VersionStats], float]]] = {
    "nv_inference_request_success": (
        "Number of successful inference requests, all batch sizes", lambda s: s.success_count),
    "nv_inference_request_failure": (
        "Number of failed inference requests, all batch sizes", lambda s: s.fail_count),
    "nv_inference_count": (
        "Number of inferences performed (rows)", lambda s: s.inference_count),
    "nv_inference_exec_count": (
        "Number of model executions performed", lambda s: s.execution_count),
    "nv_inference_request_duration_us": (
        "Cumulative inference request duration in microseconds",
        lambda s: (s.success_ns + s.fail_ns) // 1000),
    "nv_inference_queue_duration_us": (
        "Cumulative inference queuing duration in microseconds", lambda s: s.queue_ns // 1000),
    "nv_inference_compute_infer_duration_us": (
        "Cumulative compute inference duration in microseconds",
        lambda s: s.compute_infer_ns // 1000),
}
# Triton's response-cache counters, exported for versions that use the cache (as Triton
# exports them only for models whose config enables it).
_CACHE_COUNTERS: dict[str, tuple[str, Callable[[VersionStats], float]]] = {
    "nv_cache_num_hits_per_model": (
        "Number of cache hits per model", lambda s: s.cache_hit_count),
    "nv_cache_num_misses_per_model": (
        "Number of cache misses per model", lambda s: s.cache_miss_count),
    "nv_cache_hit_duration_per_model": (
        "Total cache hit duration per model, in microseconds", lambda s: s.cache_hit_ns // 1000),
    "nv_cache_miss_duration_per_model": (
        "Total cache miss (lookup and insertion) duration per model, in microseconds",
        lambda s: s.cache_miss_ns // 1000),
}
_BARE_COUNTERS = frozenset(_TRITON_COUNTERS) | frozenset(_CACHE_COUNTERS)
_LABELS = ("model", "version", "replica")
# The classic text format every Prometheus version parses; our output uses only legacy names.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LE = [floatToGoString(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]


class ServingCollector:
    """A prometheus_client collector reading every loaded version's VersionStats at scrape time.

    `stats_provider` returns the VersionStats of the versions loaded right now, so an unloaded
    version disappears from /metrics without anyone unregistering anything.
    """

    def __init__(self, replica: str, stats_provider: Callable[[], Iterable[VersionStats]],
                 siblings: Callable[[], Iterable[tuple[str, list[VersionStats]]]] | None = None):
        self.replica = replica
        self.stats_provider = stats_provider
        # the other workers of this server (serving/process/siblings.py): (replica, their stats)
        self.siblings = siblings

    def describe(self) -> list[Metric]:
        """Nothing up front: keeps registration from calling the provider before it is ready."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield Triton-named counters, the pending gauge and our latency histogram."""
        groups = [(self.replica, list(self.stats_provider()))]
        if self.siblings is not None:
            groups += self.siblings()
        all_stats = [(replica, s) for replica, stats in groups for s in stats]
        counters = {name: Metric(name, doc, "counter")
                    for name, (doc, _) in _TRITON_COUNTERS.items()}
        cache_counters = {name: Metric(name, doc, "counter")
                          for name, (doc, _) in _CACHE_COUNTERS.items()}
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution", labels=_LABELS)
        hist = HistogramMetricFamily(
            "mmc_inference_request_duration_seconds",
            "Latency of successful inference requests, queue and compute included",
            labels=_LABELS)
        for replica, s in all_stats:
            labels = {"model": s.model, "version": s.version, "replica": replica}
            values = [s.model, s.version, replica]
            for name, (_, read) in _TRITON_COUNTERS.items():
                # Exact sample name (no _total), as Triton exposes it.
                counters[name].add_sample(name, labels, float(read(s)))
            if s.cached:
                for name, (_, read) in _CACHE_COUNTERS.items():
                    cache_counters[name].add_sample(name, labels, float(read(s)))
            pending.add_metric(values, s.pending)
            cumulative, running = [], 0
            for le, c in zip(_LE, s.latency_counts, strict=True):
                running += c
                cumulative.append((le, running))
            hist.add_metric(values, cumulative, s.latency_sum_ns / 1e9)
        model_failures = Metric("mmc_inference_model_failures", "Failed inference requests the "
                                "model itself failed on (500), of nv_inference_request_failure",
                                "counter")
        for replica, s in all_stats:
            model_failures.add_sample("mmc_inference_model_failures_total", {
                "model": s.model, "version": s.version, "replica": replica},
                float(s.model_fail_count))
        cold = Metric("mmc_cold_starts", "Loads of a scaled-to-zero version that a request "
                      "waited for", "counter")
        cold_seconds = Metric("mmc_cold_start_seconds", "Seconds requests waited for "
                              "scaled-to-zero versions to load, in total", "counter")
        cold_last = GaugeMetricFamily("mmc_cold_start_last_seconds",
                                      "Duration of the latest cold start", labels=_LABELS)
        for replica, s in all_stats:
            labels = {"model": s.model, "version": s.version, "replica": replica}
            cold.add_sample("mmc_cold_starts_total", labels, float(s.cold_starts))
            cold_seconds.add_sample("mmc_cold_start_seconds_total", labels, s.cold_start_sum_s)
            if s.cold_start_last_s is not None:
                cold_last.add_metric([s.model, s.version, replica], s.cold_start_last_s)
        yield from counters.values()
        yield from (m for m in cache_counters.values() if m.samples)
        yield pending
        yield hist
        yield model_failures
        yield cold
        yield cold_seconds
        yield cold_last


class _Only:
    """A stand-in registry that yields a fixed list of metrics (for generate_latest)."""

    def __init__(self, metrics: list[Metric]):
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


def _escape_label(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_metrics(registry) -> tuple[bytes, str]:
    """The Prometheus text exposition of `registry` and its content type.

    prometheus_client renames every counter to `<name>_total`; Triton's counters have no such
    suffix and dashboards built for Triton query the bare names, so those are written here and
    everything else goes through prometheus_client unchanged.
    """
    triton, rest = [], []
    for m in registry.collect():
        (triton if m.type == "counter" and m.name in _BARE_COUNTERS else rest).append(m)
    out: list[str] = []
    for m in triton:
        out.append(f"# HELP {m.name} {m.documentation}\n# TYPE {m.name} counter\n")
        for s in m.samples:
            labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(s.labels.items()))
            value = int(s.value) if float(s.value).is_integer() else s.value
            out.append(f"{s.name}{{{labels}}} {value}\n" if labels else f"{s.name} {value}\n")
    body = "".join(out).encode() + generate_latest(_Only(rest))  # type: ignore[arg-type]
    return body, CONTENT_TYPE
