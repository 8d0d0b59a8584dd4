"""Per-version serving metrics from replicas' heartbeats: stored as cumulative samples per time
bucket, read back as windows (canary analysis) and series (dashboards), summed over replicas.

Rates divide by the time actually elapsed between two samples (their `at`), never by a nominal
bucket width: heartbeats (2 s) and buckets (5 s) do not align, so the last sample of consecutive
buckets are 4 or 6 s apart and a steady 19.5 req/s would read 15.6 / 23.4. History is kept in
tiers (`level`, see registry/metrics_retention.py): the last sample of each minute and of each
10 minutes stays longer; a series at a coarser tier reads only those samples."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Max, OuterRef, Subquery
from django.utils import timezone

from registry.models import MetricSample
from serving.stats import LATENCY_BUCKETS_S, quantile_from_buckets

# Point width of each tier after the fine one (level 0 is METRICS_BUCKET_SECONDS wide).
TIER_SECONDS = {1: 60, 2: 600}


def point_seconds(level: int) -> int:
    """How many seconds one chart point of tier `level` covers."""
    width = settings.METRICS_BUCKET_SECONDS
    return max(TIER_SECONDS.get(level, width), width)


def record_samples(replica: str, versions: dict[str, dict], *, now: float | None = None) -> None:
    """Store the stats snapshots a heartbeat carries ("model:version" -> {"stats": {...}}).
    `now` (unix seconds) is the heartbeat's arrival; specs feed it to replay a timeline."""
    now = time.time() if now is None else now
    at = datetime.fromtimestamp(now, tz=UTC)
    bucket = int(now) // settings.METRICS_BUCKET_SECONDS
    for key, state in versions.items():
        stats = state.get("stats")
        if not stats:
            continue
        model_name, _, version = key.rpartition(":")
        MetricSample.objects.update_or_create(
            replica=replica, model_name=model_name, version=int(version), bucket=bucket,
            defaults={"at": at, "count": stats["count"], "errors": stats["errors"],
                      "latency_sum_s": stats.get("latency_sum_s", 0.0),
                      "latency_buckets": stats["latency_buckets"],
                      "shadow": state.get("shadow")},
        )


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


def version_window(model: str, version: int, since: datetime) -> dict:
    """Requests, errors, latency quantiles and rate for one version since `since`, all replicas."""
    now = timezone.now()
    since_bucket = int(since.timestamp()) // settings.METRICS_BUCKET_SECONDS
    rows = MetricSample.objects.filter(model_name=model, version=version)
    count = errors = 0
    rate = 0.0
    hist = [0] * (len(LATENCY_BUCKETS_S) + 1)
    for replica in rows.values_list("replica", flat=True).distinct():
        mine = rows.filter(replica=replica)
        latest = mine.order_by("-bucket").first()
        if latest is None or latest.bucket < since_bucket:
            continue
        base = mine.filter(bucket__lt=since_bucket).order_by("-bucket").first()
        c, e, h = _delta(latest, base)
        count, errors = count + c, errors + e
        hist = [a + b for a, b in zip(hist, h, strict=False)]
        # over the time the two samples span; a replica that started inside: since `since`
        span = (latest.at - (base.at if base else since)).total_seconds()
        rate += c / span if span > 0 else 0.0
    return {**_summary(count, errors, hist, max((now - since).total_seconds(), 1e-9)),
            "rps": rate}


def version_series(model: str, version: int, *, seconds: int = 300, level: int = 0,
                   now: float | None = None) -> list[dict]:
    """Points (req/s, error rate, p50/p95/p99) for the last `seconds` at tier `level` (one
    point per `point_seconds(level)`), for charts. Each point's rate is the sum over replicas of
    the requests between two samples over the seconds actually between them."""
    width = settings.METRICS_BUCKET_SECONDS
    step = point_seconds(level)
    now = time.time() if now is None else now
    first = int(now - seconds) // step * step // width
    rows = MetricSample.objects.filter(model_name=model, version=version)
    samples = list(rows.filter(bucket__gte=first, level__gte=level).order_by("replica", "bucket"))
    # Baseline of each replica's first point: its newest sample before the window (heartbeats
    # may skip buckets), found per replica through the unique (replica, model, version, bucket)
    # index in one query. A replica with none started inside the window and counts from zero.
    newest_older = (rows.filter(replica=OuterRef("replica"), bucket__lt=first)
                    .order_by("-bucket").values("pk")[:1])
    baselines = (rows.filter(bucket__gte=first).values("replica").distinct()
                 .annotate(base=Subquery(newest_older)).values("base"))
    previous: dict[str, MetricSample] = {s.replica: s for s in rows.filter(pk__in=baselines)}
    per_point: dict[int, list] = defaultdict(lambda: [0, 0, [0] * (len(LATENCY_BUCKETS_S) + 1),
                                                      defaultdict(lambda: [0, 0.0])])
    for s in samples:
        old = previous.get(s.replica)
        previous[s.replica] = s
        c, e, h = _delta(s, old)
        acc = per_point[s.bucket * width // step * step]
        acc[0] += c
        acc[1] += e
        acc[2] = [a + b for a, b in zip(acc[2], h, strict=False)]
        mine = acc[3][s.replica]  # requests and seconds of this replica inside the point
        mine[0] += c
        mine[1] += (s.at - old.at).total_seconds() if old is not None else step
    return [{"t": t, **_summary(c, e, h, step),
             "rps": sum(n / span for n, span in spans.values() if span > 0)}
            for t, (c, e, h, spans) in sorted(per_point.items())]


def versions_recorded(model: str, *, seconds: int, level: int = 0,
                      now: float | None = None) -> list[int]:
    """Every version with samples at tier `level` in the last `seconds`: retired ones too."""
    now = time.time() if now is None else now
    first = int(now - seconds) // settings.METRICS_BUCKET_SECONDS
    return sorted(set(MetricSample.objects.filter(model_name=model, bucket__gte=first,
                                                  level__gte=level)
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
