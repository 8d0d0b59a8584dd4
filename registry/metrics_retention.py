"""Metric history in tiers. Samples are cumulative, so thinning them loses nothing a chart
needs: the difference between the last samples of two minutes is exactly that minute's
requests, errors and latency histogram, and their `at`s give the exact rate. Compaction marks
the last sample of every finished minute (level 1) and 10 minutes (level 2), then deletes
level 0 after METRICS_FINE_SECONDS, level 1 after METRICS_MINUTE_SECONDS and everything after
METRICS_RETENTION_SECONDS."""

from __future__ import annotations

import time

from django.conf import settings

from registry.metrics import TIER_SECONDS
from registry.models import MetricSample

CHUNK = 500
# Per level, the first fine bucket not yet marked: a process starts with a full scan, then only
# the periods finished since its previous run are read (light rows: no JSON).
_marked_from: dict[int, int] = {}


def _mark(level: int, now: float) -> int:
    width = settings.METRICS_BUCKET_SECONDS
    step = TIER_SECONDS[level]
    end = int(now) // step * step // width  # the period still filling starts here
    start = _marked_from.get(level, 0)
    rows = (MetricSample.objects.filter(level=level - 1, bucket__gte=start, bucket__lt=end)
            .values_list("pk", "replica", "model_name", "version", "bucket"))
    last: dict[tuple, tuple[int, int]] = {}
    for pk, replica, model, version, bucket in rows.iterator(chunk_size=2000):
        key = (replica, model, version, bucket * width // step)
        if key not in last or bucket > last[key][1]:
            last[key] = (pk, bucket)
    pks = [pk for pk, _ in last.values()]
    for i in range(0, len(pks), CHUNK):
        MetricSample.objects.filter(pk__in=pks[i:i + CHUNK]).update(level=level)
    _marked_from[level] = end
    return len(pks)


def compact(*, now: float | None = None) -> dict:
    """Mark the tiers, then delete the samples each tier no longer keeps. Returns counts."""
    now = time.time() if now is None else now
    width = settings.METRICS_BUCKET_SECONDS
    marked = {level: _mark(level, now) for level in sorted(TIER_SECONDS)}

    def before(seconds: float) -> int:
        return int(now - seconds) // width

    deleted = {
        "fine": MetricSample.objects.filter(
            level=0, bucket__lt=before(settings.METRICS_FINE_SECONDS)).delete()[0],
        "minute": MetricSample.objects.filter(
            level__lte=1, bucket__lt=before(settings.METRICS_MINUTE_SECONDS)).delete()[0],
        "expired": MetricSample.objects.filter(
            bucket__lt=before(settings.METRICS_RETENTION_SECONDS)).delete()[0],
    }
    return {"marked": marked, "deleted": deleted}


def forget_progress() -> None:
    """The next compaction scans everything again (specs replaying timelines)."""
    _marked_from.clear()
