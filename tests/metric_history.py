"""Fed metric history for the chart specs: yesterday's canary of fraud v3 over v1 (start at
20 %, 50 %, promote), with the samples its replica would have left, compacted into tiers."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from registry import metrics_retention, services
from registry.audit import Actor
from registry.models import AuditEvent, MetricSample
from serving.core.stats import LATENCY_BUCKETS_S

HOUR = 3600
CANARY_AT, WEIGHT_AT, PROMOTE_AT = 20 * HOUR, 19 * HOUR, 18 * HOUR  # seconds ago


def _samples(model: str, version: int, rate: float, start: float, end: float,
             every: int = 30) -> list[MetricSample]:
    width, hist, rows = settings.METRICS_BUCKET_SECONDS, [0] * (len(LATENCY_BUCKETS_S) + 1), []
    t, count = start, 0
    while t <= end:
        hist[8 + version] = count
        rows.append(MetricSample(replica="r1", model_name=model, version=version,
                                 bucket=int(t) // width, at=datetime.fromtimestamp(t, tz=UTC),
                                 count=count, errors=count // 50, latency_buckets=list(hist)))
        t += every
        count += round(rate * every)
    return rows


def yesterdays_rollout(model: str = "fraud", old: int = 1, new: int = 3) -> float:
    """Run the rollout now, then move its audit events back to yesterday; feed v`old` at 30
    req/s until the promote and v`new` at 10 req/s from the canary start until now. Returns
    the `now` it was fed at."""
    system = Actor.system("test")
    services.canary_start(model_name=model, version_number=new, weight=20, actor=system)
    services.canary_weight(model_name=model, weight=50, actor=system)
    services.canary_promote(model_name=model, actor=system)
    now = time.time()
    moved = {"endpoint.deploy": 2 * 24 * HOUR, "endpoint.canary": CANARY_AT,
             "endpoint.weight": WEIGHT_AT, "endpoint.promote": PROMOTE_AT}
    for action, ago in moved.items():
        AuditEvent.objects.filter(model_name=model, action=action).update(
            created_at=timezone.now() - timedelta(seconds=ago))
    MetricSample.objects.bulk_create(
        _samples(model, old, 30.0, now - 26 * HOUR, now - PROMOTE_AT)
        + _samples(model, new, 10.0, now - CANARY_AT, now), batch_size=2000)
    metrics_retention.forget_progress()
    metrics_retention.compact(now=now)
    return now
