"""Per-version metric history: rates are exact whatever the heartbeat's phase against the
buckets, and history is kept for a week in tiers (every sample for an hour, one a minute for a
day, one per 10 minutes beyond) that read back the same rates. Fed samples: no timing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from registry import metrics_retention
from registry.metrics import record_samples, version_series, version_window
from registry.models import MetricSample
from serving.core.stats import LATENCY_BUCKETS_S

pytestmark = pytest.mark.django_db

T0 = 1_800_000_000.0  # a fixed past "now" the fed timelines end at
SLOTS = len(LATENCY_BUCKETS_S) + 1


@pytest.fixture(autouse=True)
def production_buckets(settings):
    settings.METRICS_BUCKET_SECONDS = 5  # the default outside the test settings
    metrics_retention.forget_progress()
    yield
    metrics_retention.forget_progress()


def stats(count: int) -> dict:
    hist = [0] * SLOTS
    hist[10] = count
    return {"stats": {"count": count, "errors": count // 100, "latency_buckets": hist}}


def heartbeats(rate: float, *, start: float, end: float, every: float = 2.0,
               replica: str = "r1", version: int = 1) -> None:
    """A replica serving `rate` req/s, heartbeating its cumulative count every `every` s."""
    t = start
    while t <= end:
        record_samples(replica, {f"fraud:{version}": stats(round(rate * (t - start)))}, now=t)
        t += every


def test_a_steady_rate_reads_exactly_though_heartbeats_and_buckets_do_not_align():
    heartbeats(19.5, start=T0 - 300.3, end=T0)
    points = version_series("fraud", 1, seconds=240, now=T0)[1:-1]  # edges: partial buckets
    assert len(points) >= 40
    # The cause of the old 16-23 reading: the last heartbeat of consecutive 5 s buckets lies
    # 4 or 6 s after the previous one, and the old rate divided by the nominal 5 s.
    assert {round(p["count"] / 5, 1) for p in points} == {15.6, 23.4}
    assert all(p["rps"] == pytest.approx(19.5, abs=0.01) for p in points)


def test_replicas_in_different_phases_sum_exactly():
    heartbeats(19.5, start=T0 - 300.3, end=T0, replica="r1")
    heartbeats(10.0, start=T0 - 301.1, end=T0, replica="r2", every=3.0)
    points = version_series("fraud", 1, seconds=240, now=T0)[1:-1]
    assert all(p["rps"] == pytest.approx(29.5, abs=0.01) for p in points)


def test_the_canary_window_rate_is_over_the_time_the_samples_span(monkeypatch):
    heartbeats(19.5, start=T0 - 300.3, end=T0)
    monkeypatch.setattr("registry.metrics.timezone.now",
                        lambda: datetime.fromtimestamp(T0 + 1, tz=UTC))
    window = version_window("fraud", 1, datetime.fromtimestamp(T0 - 60, tz=UTC))
    assert window["rps"] == pytest.approx(19.5, abs=0.01)


def week_of_samples(rate: float, every: int = 30, days: int = 9) -> None:
    """A replica's heartbeats for `days` up to T0 every `every` s, in bulk (the speed of a
    real 2 s heartbeat does not change what compaction keeps: one sample per period)."""
    rows, hist = [], [0] * SLOTS
    for i in range(days * 86400 // every + 1):
        t = T0 - days * 86400 + i * every
        count = round(rate * i * every)
        hist[10] = count
        rows.append(MetricSample(replica="r1", model_name="fraud", version=1, bucket=int(t) // 5,
                                 at=datetime.fromtimestamp(t, tz=UTC), count=count,
                                 errors=count // 100, latency_buckets=list(hist)))
    MetricSample.objects.bulk_create(rows, batch_size=2000)


def kept(since_s: float, until_s: float) -> int:
    return MetricSample.objects.filter(bucket__gte=int(T0 - since_s) // 5,
                                       bucket__lt=int(T0 - until_s) // 5).count()


def test_compaction_keeps_a_week_in_tiers_and_every_tier_reads_the_same_rate():
    week_of_samples(12.0)
    assert MetricSample.objects.count() == 9 * 2880 + 1
    result = metrics_retention.compact(now=T0)
    assert result["deleted"]["expired"] > 0
    # the last hour: every sample (2 a minute); then one a minute for the day; then one per
    # 10 minutes for the rest of the retention (8 days)
    assert kept(3600 - 60, 0) == 118
    assert kept(86400 - 600, 3600 + 60) == (86400 - 600 - 3660) // 60
    assert kept(7 * 86400, 86400 + 600) == 6 * 144 - 1
    assert kept(9 * 86400, 8 * 86400 + 600) == 0
    for level, seconds, at_least in ((0, 900, 25), (1, 6 * 3600, 350), (1, 86400, 1400),
                                     (2, 7 * 86400, 1000)):
        points = version_series("fraud", 1, seconds=seconds, level=level, now=T0)
        assert len(points) >= at_least, (level, len(points))
        assert all(p["rps"] == pytest.approx(12.0, abs=0.01) for p in points), level
        assert all(p["error_rate"] == pytest.approx(0.01, abs=0.002) for p in points[1:])
        assert all(p["p99_ms"] is not None for p in points)


def test_compaction_run_every_minute_keeps_what_one_late_run_keeps():
    """The periodic task reads only the periods finished since its last run."""
    heartbeats(5.0, start=T0 - 3 * 3600, end=T0, every=10.0)
    for minute in range(int(T0 - 3 * 3600) // 60 * 60 + 60, int(T0) + 1, 60):
        metrics_retention.compact(now=minute + 7)
    stepwise = sorted(MetricSample.objects.values_list("bucket", "level"))
    MetricSample.objects.all().delete()
    metrics_retention.forget_progress()
    heartbeats(5.0, start=T0 - 3 * 3600, end=T0, every=10.0)
    metrics_retention.compact(now=int(T0) // 60 * 60 + 7)
    assert stepwise == sorted(MetricSample.objects.values_list("bucket", "level"))
    points = version_series("fraud", 1, seconds=2 * 3600, level=1, now=T0)
    assert all(p["rps"] == pytest.approx(5.0, abs=0.01) for p in points)


def test_a_new_replicas_first_point_reads_its_rate_from_when_its_counters_started():
    """A replica that starts inside the chart has no earlier sample: its first point's requests
    are over the seconds since its counters started, not over a nominal bucket."""
    started = T0 - 61.0
    for t in (T0 - 59.0, T0 - 57.0, T0 - 55.0):  # 2 s, then every 2 s, at 10 req/s
        body = stats(round(10.0 * (t - started)))
        body["stats"]["since"] = started
        record_samples("fresh", {"fraud:1": body}, now=t)
    first = version_series("fraud", 1, seconds=120, now=T0)[0]
    assert first["count"] == 40  # its bucket keeps the later of the first two heartbeats
    assert first["rps"] == pytest.approx(10.0, abs=0.01)


def test_a_replica_that_does_not_say_when_it_started_reads_over_one_bucket():
    record_samples("old-replica", {"fraud:1": stats(20)}, now=T0 - 59.0)
    first = version_series("fraud", 1, seconds=120, now=T0)[0]
    assert first["rps"] == pytest.approx(20 / 5)
