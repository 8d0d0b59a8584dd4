"""Per-version serving metrics from replicas' heartbeats: stored as cumulative samples per time
bucket, read back as windows (canary analysis) and series (dashboards), summed over replicas."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max, OuterRef, Subquery
from django.utils import timezone

from registry.models import MetricSample
from serving.stats import LATENCY_BUCKETS_S, quantile_from_buckets

_last_trim = 0.0


def record_samples(replica: str, versions: dict[str, dict]) -> None:
    """Store the stats snapshots a heartbeat carries ("model:version" -> {"stats": {...}})."""
    global _last_trim
    now = timezone.now()
    bucket = int(time.time()) // settings.METRICS_BUCKET_SECONDS
    for key, state in versions.items():
        stats = state.get("stats")
        if not stats:
            continue
        model_name, _, version = key.rpartition(":")
        MetricSample.objects.update_or_create(
            replica=replica, model_name=model_name, version=int(version), bucket=bucket,
            defaults={"at": now, "count": stats["count"], "errors": stats["errors"],
                      "latency_sum_s": stats.get("latency_sum_s", 0.0),
                      "latency_buckets": stats["latency_buckets"],
                      "shadow": state.get("shadow")},
        )
    if time.monotonic() - _last_trim > 60:
        _last_trim = time.monotonic()
        cutoff = now - timedelta(seconds=settings.METRICS_RETENTION_SECONDS)
        MetricSample.objects.filter(at__lt=cutoff).delete()


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
    return _summary(count, errors, hist, max((now - since).total_seconds(), 1e-9))


def version_series(model: str, version: int, *, seconds: int = 300) -> list[dict]:
    """Per-bucket points (req/s, error rate, p50/p95/p99) for the last `seconds`, for charts."""
    width = settings.METRICS_BUCKET_SECONDS
    first = int(time.time()) // width - seconds // width
    rows = MetricSample.objects.filter(model_name=model, version=version)
    samples = list(rows.filter(bucket__gte=first).order_by("replica", "bucket"))
    # Baseline of each replica's first point: its newest sample before the window (heartbeats
    # may skip buckets), found per replica through the unique (replica, model, version, bucket)
    # index in one query. A replica with none started inside the window and counts from zero.
    newest_older = (rows.filter(replica=OuterRef("replica"), bucket__lt=first)
                    .order_by("-bucket").values("pk")[:1])
    baselines = (rows.filter(bucket__gte=first).values("replica").distinct()
                 .annotate(base=Subquery(newest_older)).values("base"))
    previous: dict[str, MetricSample] = {s.replica: s for s in rows.filter(pk__in=baselines)}
    per_bucket: dict[int, list] = defaultdict(lambda: [0, 0, [0] * (len(LATENCY_BUCKETS_S) + 1)])
    for s in samples:
        old = previous.get(s.replica)
        previous[s.replica] = s
        c, e, h = _delta(s, old)
        acc = per_bucket[s.bucket]
        acc[0] += c
        acc[1] += e
        acc[2] = [a + b for a, b in zip(acc[2], h, strict=False)]
    return [{"t": b * width, **_summary(c, e, h, width)}
            for b, (c, e, h) in sorted(per_bucket.items())]


def latest_shadow(model: str) -> dict | None:
    """The newest shadow comparison any replica reported for the model."""
    newest = (MetricSample.objects.filter(model_name=model, shadow__isnull=False)
              .aggregate(b=Max("bucket"))["b"])
    if newest is None:
        return None
    row = MetricSample.objects.filter(model_name=model, bucket=newest,
                                      shadow__isnull=False).first()
    return row.shadow if row else None
