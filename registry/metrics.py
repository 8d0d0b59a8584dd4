"""Per-version serving metrics from replicas' heartbeats: stored as cumulative samples per time
bucket, read back as windows (canary analysis) and series (dashboards), summed over replicas.

Rates divide by the time actually elapsed between two samples (their `at`), never by a nominal
bucket width: heartbeats (2 s) and buckets (5 s) do not align, so the last sample of consecutive
buckets are 4 or 6 s apart and a steady 19.5 req/s would read 15.6 / 23.4. History is kept in
tiers (`level`, see registry/metrics_retention.py): the last sample of each minute and of each
10 minutes stays longer; a series at a coarser tier reads only those samples, and the finer ones
of the periods compaction has not marked yet (the one still filling, the one just finished)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from itertools import groupby

import numpy as np
import orjson
from django.conf import settings
from django.db import connection
from django.db.models import F, Max, Q, TextField, Window
from django.db.models.functions import Cast, RowNumber
from django.utils import timezone

from registry.models import MetricSample
from serving.core.stats import LATENCY_BUCKETS_S, quantile_from_buckets, quantiles_from_bucket_rows

# Point width of each tier after the fine one (level 0 is METRICS_BUCKET_SECONDS wide).
TIER_SECONDS = {1: 60, 2: 600}


def point_seconds(level: int) -> int:
    """How many seconds one chart point of tier `level` covers."""
    width = settings.METRICS_BUCKET_SECONDS
    return max(TIER_SECONDS.get(level, width), width)


def _at_tier(level: int, now: float) -> Q:
    """Samples a series at tier `level` reads: the tier's own, and every sample of the period
    still filling and the one before (compaction marks a period only after it ends, up to
    METRICS_COMPACT_SECONDS late), so a deployment's first minutes show at 24 h and 7 d too.
    Samples are cumulative: reading all of a period gives the same point as its last one."""
    if level not in TIER_SECONDS:
        return Q()
    tier = TIER_SECONDS[level]
    unmarked = (int(now) // tier - 1) * tier // settings.METRICS_BUCKET_SECONDS
    return Q(level__gte=level) | Q(bucket__gte=unmarked)


def record_samples(replica: str, versions: dict[str, dict], *, now: float | None = None) -> None:
    """Store the stats snapshots a heartbeat carries ("model:version" -> {"stats": {...}}).
    `now` (unix seconds) is the heartbeat's arrival; specs feed it to replay a timeline."""
    now = time.time() if now is None else now
    at = datetime.fromtimestamp(now, tz=UTC)
    bucket = int(now) // settings.METRICS_BUCKET_SECONDS
    rows = []
    for key, state in versions.items():
        stats = state.get("stats")
        if not stats or not (stats["count"] or stats["errors"] or state.get("shadow")
                             or state.get("mirror")):
            continue  # nothing counted since its counters started: a sample would say nothing
        model_name, _, version = key.rpartition(":")
        rows.append(MetricSample(
            replica=replica, model_name=model_name, version=int(version), bucket=bucket, at=at,
            count=stats["count"], errors=stats["errors"],
            latency_sum_s=stats.get("latency_sum_s", 0.0),
            latency_buckets=stats["latency_buckets"], counting_since=_since(stats),
            shadow=state.get("shadow"), mirror=state.get("mirror")))
    # One statement per heartbeat, whatever the number of versions (a row per version and
    # transaction was what stopped bench/fanout.py at 1,000 endpoints).
    MetricSample.objects.bulk_create(
        rows, update_conflicts=True,
        unique_fields=["replica", "model_name", "version", "bucket"],
        update_fields=["at", "count", "errors", "latency_sum_s", "latency_buckets",
                       "counting_since", "shadow", "mirror"])


def _since(stats: dict) -> datetime | None:
    """When the replica's counters for the version started (older replicas do not say)."""
    since = stats.get("since")
    return datetime.fromtimestamp(since, tz=UTC) if since else None


def _delta(new: MetricSample, old: MetricSample | None) -> tuple[int, int, list[int]]:
    """Counts between two cumulative samples; a drop means the replica restarted (from zero)."""
    if old is None or new.count < old.count:
        return new.count, new.errors, list(new.latency_buckets)
    return (new.count - old.count, new.errors - old.errors,
            [a - b for a, b in zip(new.latency_buckets, old.latency_buckets, strict=False)])


def _summary(count: int, errors: int, hist: list[int], seconds: float) -> dict:
    def q(p):
        value = quantile_from_buckets(LATENCY_BUCKETS_S, hist, p) if hist else None
        return round(value * 1000, 3) if value is not None else None

    return {"count": count, "errors": errors,
            "error_rate": errors / count if count else 0.0,
            "p50_ms": q(0.50), "p95_ms": q(0.95), "p99_ms": q(0.99),
            "rps": count / seconds if seconds > 0 else 0.0}


def replica_windows(rows, since_bucket: int):
    """(latest, base) per replica of `rows` (MetricSample) with a sample at or after
    `since_bucket`: its newest sample, and its newest one before the window (None: none), whose
    cumulative counters subtracted give the window's part."""
    for replica in rows.values_list("replica", flat=True).distinct():
        mine = rows.filter(replica=replica)
        latest = mine.order_by("-bucket").first()
        if latest is None or latest.bucket < since_bucket:
            continue
        yield latest, mine.filter(bucket__lt=since_bucket).order_by("-bucket").first()


def version_window(model: str, version: int, since: datetime) -> dict:
    """Requests, errors, latency quantiles and rate for one version since `since`, all replicas."""
    now = timezone.now()
    since_bucket = int(since.timestamp()) // settings.METRICS_BUCKET_SECONDS
    rows = MetricSample.objects.filter(model_name=model, version=version)
    count = errors = 0
    rate = 0.0
    hist = [0] * (len(LATENCY_BUCKETS_S) + 1)
    for latest, base in replica_windows(rows, since_bucket):
        c, e, h = _delta(latest, base)
        count, errors = count + c, errors + e
        hist = [a + b for a, b in zip(hist, h, strict=False)]
        # over the time the two samples span; a replica that started inside: since `since`
        span = (latest.at - (base.at if base else since)).total_seconds()
        rate += c / span if span > 0 else 0.0
    return {**_summary(count, errors, hist, max((now - since).total_seconds(), 1e-9)),
            "rps": rate}


def version_series(model: str, version: int, *, seconds: int = 300, level: int = 0,
                   now: float | None = None, step: int | None = None) -> list[dict]:
    """Points (req/s, error rate, p50/p95/p99) for the last `seconds` at tier `level`, one
    per `step` seconds (at least `point_seconds(level)`), for charts. Each point's rate is the
    sum over replicas of the requests between two samples over the seconds actually between
    them.

    A week is thousands of samples per version: they are read as plain tuples and differenced
    per replica as arrays, not as model instances one by one (bench/console.py)."""
    width = settings.METRICS_BUCKET_SECONDS
    step = max(step or 0, point_seconds(level))
    now = time.time() if now is None else now
    first = int(now - seconds) // step * step // width
    rows = MetricSample.objects.filter(model_name=model, version=version)
    # the histogram as its JSON text, decoded by orjson: Django's JSONField decoding of
    # thousands of rows was the largest cost of a week's chart
    fields = ("replica", "bucket", "at", "count", "errors",
              Cast("latency_buckets", output_field=TextField()), "counting_since")
    last = int(now) // width  # a custom range may end in the past
    samples = list(rows.filter(_at_tier(level, now), bucket__gte=first, bucket__lte=last)
                   .order_by("replica", "bucket").values_list(*fields))
    if not samples:
        return []
    # Baseline of each replica's first point: its newest sample before the window (heartbeats
    # may skip buckets), one indexed row per replica through the unique (replica, model, version,
    # bucket) index, in one UNION query (a correlated subquery here was planned as a nested loop
    # over the whole window on a freshly loaded table). A replica with none started inside the
    # window and counts from zero.
    older = rows.filter(bucket__lt=first)
    if connection.features.supports_slicing_ordering_in_compound:
        newest_older = [older.filter(replica=replica).order_by("-bucket").values_list(*fields)[:1]
                        for replica in dict.fromkeys(row[0] for row in samples)]
        found = newest_older[0].union(*newest_older[1:], all=True)
    else:  # SQLite: no LIMIT inside a UNION; the newest per replica by a window instead
        newest = Window(RowNumber(), partition_by=F("replica"), order_by=F("bucket").desc())
        found = older.annotate(newest=newest).filter(newest=1).values_list(*fields)
    previous = {row[0]: row for row in found}
    buckets = len(LATENCY_BUCKETS_S) + 1
    points, counts, errors, hists, rates = [], [], [], [], []
    for replica, group in groupby(samples, key=lambda row: row[0]):
        group = list(group)
        base = previous.get(replica)
        at = np.array([row[2].timestamp() for row in group])
        count = np.array([row[3] for row in group], dtype=np.int64)
        error = np.array([row[4] for row in group], dtype=np.int64)
        hist = np.array([_padded(orjson.loads(row[5]), buckets) for row in group],
                        dtype=np.int64)
        if base is not None:
            base_at, base_c, base_e = base[2].timestamp(), base[3], base[4]
            base_h = np.array(_padded(orjson.loads(base[5]), buckets), dtype=np.int64)
        else:
            # none earlier: it counts from zero since its counters started (if it said when)
            since = group[0][6]
            base_at = since.timestamp() if since is not None else at[0] - step
            base_c = base_e = 0
            base_h = np.zeros(buckets, dtype=np.int64)
        prev_c = np.concatenate(([base_c], count[:-1]))
        prev_e = np.concatenate(([base_e], error[:-1]))
        prev_h = np.vstack((base_h, hist[:-1]))
        restarted = count < prev_c  # a drop: the replica restarted and counts from zero
        dc = np.where(restarted, count, count - prev_c)
        de = np.where(restarted, error, error - prev_e)
        dh = np.where(restarted[:, None], hist, hist - prev_h)
        span = at - np.concatenate(([base_at], at[:-1]))
        point = np.array([row[1] for row in group], dtype=np.int64) * width // step * step
        points.append(point)
        counts.append(dc)
        errors.append(de)
        hists.append(dh)
        # this replica's rate in each point: its requests there over the seconds they span
        mine, inside = np.unique(point, return_inverse=True)
        n = np.bincount(inside, weights=dc, minlength=len(mine))
        took = np.bincount(inside, weights=span, minlength=len(mine))
        rates.append((mine, np.divide(n, took, out=np.zeros(len(mine)), where=took > 0)))
    t = np.concatenate(points)
    keys, where = np.unique(t, return_inverse=True)
    total_c = np.bincount(where, weights=np.concatenate(counts), minlength=len(keys))
    total_e = np.bincount(where, weights=np.concatenate(errors), minlength=len(keys))
    total_h = np.zeros((len(keys), buckets), dtype=np.int64)
    np.add.at(total_h, where, np.concatenate(hists))
    total_rate = np.zeros(len(keys))
    for mine, rate in rates:
        total_rate[np.searchsorted(keys, mine)] += rate
    quantiles = {name: quantiles_from_bucket_rows(LATENCY_BUCKETS_S, total_h, q) * 1000
                 for name, q in (("p50_ms", 0.50), ("p95_ms", 0.95), ("p99_ms", 0.99))}
    out = []
    for i, key in enumerate(keys.tolist()):
        n, e = int(total_c[i]), int(total_e[i])
        point = {"t": key, "count": n, "errors": e, "error_rate": e / n if n else 0.0,
                 "rps": float(total_rate[i])}
        for name, values in quantiles.items():
            point[name] = None if np.isnan(values[i]) else round(float(values[i]), 3)
        out.append(point)
    return out


def _padded(hist: list[int] | None, size: int) -> list[int]:
    """A sample's histogram at the current bucket count (an empty one reads as zeros)."""
    hist = list(hist or ())
    return (hist + [0] * size)[:size]


def versions_recorded(model: str, *, seconds: int, level: int = 0,
                      now: float | None = None) -> list[int]:
    """Every version with samples at tier `level` (_at_tier) in the last `seconds`: retired
    ones too."""
    now = time.time() if now is None else now
    first = int(now - seconds) // settings.METRICS_BUCKET_SECONDS
    last = int(now) // settings.METRICS_BUCKET_SECONDS
    return sorted(set(MetricSample.objects.filter(_at_tier(level, now), model_name=model,
                                                  bucket__gte=first, bucket__lte=last)
                      .values_list("version", flat=True).distinct()), reverse=True)


def latest_shadow(model: str) -> dict | None:
    """The newest shadow comparison any replica reported for the model."""
    newest = (MetricSample.objects.filter(model_name=model, shadow__isnull=False)
              .aggregate(b=Max("bucket"))["b"])
    if newest is None:
        return None
    row = MetricSample.objects.filter(model_name=model, bucket=newest,
                                      shadow__isnull=False).first()
    return row.shadow if row else None
