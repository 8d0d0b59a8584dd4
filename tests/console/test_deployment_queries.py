"""The deployment page and its polled partials cost a constant number of queries: the same for a
model with 20 versions as with 2, with 3 replicas as with 30, and with minutes of metric samples."""

from __future__ import annotations

import re
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from registry.models import (
    Endpoint,
    MetricSample,
    ModelVersion,
    RegisteredModel,
    ReplicaHeartbeat,
)
from serving.core.stats import LATENCY_BUCKETS_S

URLS = ("/models/{}/deployment/", "/models/{}/deployment/charts/", "/models/{}/deployment/live/")


def heartbeats(n: int, models: list[str]) -> None:
    now = timezone.now()
    ReplicaHeartbeat.objects.all().delete()
    ReplicaHeartbeat.objects.bulk_create(
        ReplicaHeartbeat(replica=f"r{i}", revision=1, started_at=now, last_seen=now,
                         versions={f"{m}:{v}": {"state": "READY", "queue_depth": i % 4,
                                                "providers": ["CPUExecutionProvider"]}
                                   for m in models for v in (1, 2)})
        for i in range(n))


def metric_samples(model: str, replicas: int, seconds: int = 300) -> None:
    """Cumulative samples for v1 and v2 over the chart window (1 s buckets in tests)."""
    now, at = int(time.time()), timezone.now()
    hist = [0] * (len(LATENCY_BUCKETS_S) + 1)
    rows = []
    for r in range(replicas):
        for version in (1, 2):
            for i in range(seconds + 1):
                count = 30 * i
                hist[8] = count
                rows.append(MetricSample(replica=f"r{r}", model_name=model, version=version,
                                         bucket=now - seconds + i, at=at, count=count,
                                         errors=i // 10, latency_buckets=list(hist)))
    MetricSample.objects.bulk_create(rows, batch_size=2_000)


def small_model(user) -> str:
    model = RegisteredModel.objects.create(name="tiny", owner=user)
    v1, v2 = ModelVersion.objects.bulk_create(
        ModelVersion(model=model, number=n, sha256=f"{n:064x}", size_bytes=1, status="ready")
        for n in (1, 2))
    Endpoint.objects.create(model=model, stable=v1, candidate=v2, candidate_weight=10)
    return model.name


def count(client, url: str) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as ctx:
        r = client.get(url)
    assert r.status_code == 200, r.content[:300]
    return len(ctx.captured_queries), r.content.decode()


@pytest.mark.django_db
def test_deployment_page_queries_stay_flat_with_versions_replicas_and_samples(
        client, big_catalog):
    client.force_login(big_catalog)
    big, tiny = "model-0000", small_model(big_catalog)
    assert ModelVersion.objects.filter(model__name=big).count() == 20
    metric_samples(big, replicas=3)
    metric_samples(tiny, replicas=3)
    counts: dict[tuple, int] = {}
    for replicas in (3, 30):
        heartbeats(replicas, [big, tiny])
        for name in (big, tiny):
            for url in URLS:
                n, html = count(client, url.format(name))
                counts[(replicas, name, url)] = n
                if url.endswith("/deployment/"):
                    assert f"{replicas}/{replicas} replicas at revision" in html
                    assert 'hx-trigger="load, every 2s"' in html  # charts come right after
                if url.endswith("/charts/"):
                    points = re.search(r'data-label="v2 candidate" data-points="(\d+)"', html)
                    assert int(points[1]) >= 290  # the window moves while the test runs
    print("\nqueries:", counts)
    for url in URLS:
        per_url = {n for (_, _, u), n in counts.items() if u == url}
        assert len(per_url) == 1, (url, counts)
    # 20 before teams; +2: the owning team of the model and the user's memberships
    assert counts[(3, big, URLS[0])] <= 22, counts


@pytest.mark.django_db
def test_deployment_page_is_fast_enough_with_the_big_catalog(client, big_catalog):
    """A smoke bound (bench/console.py measures properly, on PostgreSQL)."""
    client.force_login(big_catalog)
    metric_samples("model-0000", replicas=3)
    heartbeats(3, ["model-0000"])
    client.get("/models/model-0000/deployment/")
    started = time.perf_counter()
    for _ in range(5):
        assert client.get("/models/model-0000/deployment/").status_code == 200
    assert (time.perf_counter() - started) / 5 < 1.0
