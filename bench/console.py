"""Server time of the console's heaviest pages on PostgreSQL with a big catalog.

    .venv/bin/python bench/console.py [--loads 50] [--models 1000] [--versions 20]
                                      [--history-days 7] [--history-deployments 50]

Creates a scratch database (psql on 127.0.0.1:5432, trust auth, user postgres), migrates it,
bulk-creates --models x --versions, endpoints (every 3rd model with a 10 % canary), 3 replicas'
heartbeats and 5 minutes of per-version metric samples for every deployed model, plus
--history-days of history for --history-deployments of them (both versions, every replica) as
the metrics compaction leaves it (registry/metrics_retention.py: every bucket for the last hour,
the last sample of each minute for a day, of each 10 minutes beyond), then times
--loads requests of each page with Django's test Client (server time: URL resolve, middleware,
view, queries, template) and prints a markdown table of p50/p95 ms. Target: p95 < 100 ms.
The scratch database is dropped at the end, also on failure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PG = ["psql", "-h", "127.0.0.1", "-p", "5432", "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-q"]
TARGET_P95_MS = 100.0
REPLICAS = 3


def psql(sql: str) -> None:
    subprocess.run([*PG, "-d", "postgres", "-c", sql], check=True)


def build(models: int, versions: int) -> object:
    """The catalog, in bulk; returns the engineer user the pages are loaded as."""
    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from registry.models import (
        AuditEvent,
        Endpoint,
        MetricSample,
        ModelVersion,
        RegisteredModel,
        ReplicaHeartbeat,
        RouteRevision,
    )
    from registry.services import ensure_roles
    from serving.core.stats import LATENCY_BUCKETS_S

    ensure_roles()
    user = User.objects.create_user("bench-engineer", password="x")
    user.groups.add(Group.objects.get(name="engineer"))
    rows = RegisteredModel.objects.bulk_create(
        RegisteredModel(name=f"model-{i:04d}", tags=["bulk", f"team:{i % 7}"], owner=user,
                        description=f"benchmark model {i}") for i in range(models))
    ModelVersion.objects.bulk_create(
        (ModelVersion(model=m, number=n, sha256=f"{i:032x}{n:032x}", size_bytes=1000 + n,
                      status="ready", created_by=user,
                      signature={"inputs": [{"name": "x", "datatype": "FP32",
                                             "shape": [-1, 4]}],
                                 "outputs": [{"name": "y", "datatype": "FP32",
                                              "shape": [-1, 2]}]})
         for i, m in enumerate(rows) for n in range(1, versions + 1)), batch_size=5_000)
    first = {v.model_id: v for v in ModelVersion.objects.filter(number=1)}
    second = {v.model_id: v for v in ModelVersion.objects.filter(number=2)}
    deployed = rows[::3]
    Endpoint.objects.bulk_create(
        Endpoint(model=m, stable=first[m.pk], candidate=second[m.pk], candidate_weight=10,
                 revision=7) for m in deployed)
    RouteRevision.objects.update_or_create(pk=1, defaults={"value": 7})

    from django.conf import settings

    width = settings.METRICS_BUCKET_SECONDS
    now, at = int(time.time()) // width, timezone.now()
    hist = [0] * (len(LATENCY_BUCKETS_S) + 1)
    samples = []
    for m in deployed:
        for r in range(REPLICAS):
            for version, rate in ((1, 90), (2, 10)):
                for i in range(300 // width + 2):
                    count = rate * width * i
                    hist[9] = count
                    samples.append(MetricSample(
                        replica=f"r{r}", model_name=m.name, version=version,
                        bucket=now - 300 // width - 1 + i, at=at, count=count,
                        errors=count // 500, latency_sum_s=count * 0.002,
                        latency_buckets=list(hist)))
        if len(samples) > 20_000:
            MetricSample.objects.bulk_create(samples, batch_size=5_000)
            samples = []
    MetricSample.objects.bulk_create(samples, batch_size=5_000)
    ReplicaHeartbeat.objects.bulk_create(
        ReplicaHeartbeat(replica=f"r{r}", revision=7, address=f"10.0.0.{r}:8000",
                         started_at=at, last_seen=at,
                         versions={f"{m.name}:{v}": {"state": "READY", "queue_depth": 0,
                                                     "providers": ["CPUExecutionProvider"]}
                                   for m in deployed for v in (1, 2)})
        for r in range(REPLICAS))
    AuditEvent.objects.bulk_create(
        AuditEvent(actor=user, actor_name=user.username, action="endpoint.weight",
                   target_type="endpoint", target=m.name, model_name=m.name,
                   before={"candidate_weight": 5}, after={"candidate_weight": 10})
        for m in deployed for _ in range(30))
    return user


def build_history(days: int, deployments: int) -> int:
    """`days` of tiered samples for the first `deployments` deployed models; returns the rows."""
    from django.conf import settings

    from registry.models import Endpoint, MetricSample
    from serving.core.stats import LATENCY_BUCKETS_S

    width = settings.METRICS_BUCKET_SECONDS
    now = int(time.time())
    # (timestamp, level) of every sample the tiers keep, oldest first
    keep = []
    for t in range(now - days * 86400, now + 1, width):
        age, minute_end = now - t, (t // width + 1) * width % 60 < width
        ten_end = minute_end and ((t // 60) + 1) % 10 == 0
        level = 2 if ten_end else 1 if minute_end else 0
        if age < 320:  # build() wrote the last 5 minutes
            continue
        if age <= 3600 or (age <= 86400 and level >= 1) or level == 2:
            keep.append((t, level))
    names = list(Endpoint.objects.order_by("model__name")
                 .values_list("model__name", flat=True)[:deployments])
    hist, rows, total = [0] * (len(LATENCY_BUCKETS_S) + 1), [], 0
    for name in names:
        for r in range(REPLICAS):
            for version, rate in ((1, 90), (2, 10)):
                for t, level in keep:
                    count = rate * (t - now + days * 86400)
                    hist[9] = count
                    rows.append(MetricSample(
                        replica=f"r{r}", model_name=name, version=version, bucket=t // width,
                        at=datetime.fromtimestamp(t, tz=UTC), count=count,
                        errors=count // 500, latency_sum_s=count * 0.002,
                        latency_buckets=list(hist), level=level))
                if len(rows) > 50_000:
                    MetricSample.objects.bulk_create(rows, batch_size=10_000)
                    total, rows = total + len(rows), []
    MetricSample.objects.bulk_create(rows, batch_size=10_000)
    return total + len(rows)


def time_page(client, url: str, loads: int) -> tuple[float, float, int]:
    client.get(url)  # warm: templates compiled, connection open
    times = []
    for _ in range(loads):
        started = time.perf_counter()
        r = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert r.status_code == 200, (url, r.status_code)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * len(times)) - 1)]
    return statistics.median(times), p95, len(r.content)


def slowest(client, urls: list[str]) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for url in urls:
        with CaptureQueriesContext(connection) as ctx:
            client.get(url)
        print(f"\n{url}: {len(ctx.captured_queries)} queries")
        for q in sorted(ctx.captured_queries, key=lambda q: -float(q["time"]))[:4]:
            print(f"  {float(q['time']) * 1000:7.1f} ms  {q['sql'][:160]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=50)
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--history-days", type=int, default=7)
    parser.add_argument("--history-deployments", type=int, default=50)
    parser.add_argument("--queries", action="store_true",
                        help="also print each page's slowest queries (ms)")
    args = parser.parse_args()

    scratch = f"mmc_bench_console_{os.getpid()}"
    psql(f'CREATE DATABASE "{scratch}"')
    os.environ.update({
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{scratch}",
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "MMC_DATA_DIR": tempfile.mkdtemp(prefix="mmc-bench-console-"),
        "MMC_ROLLOUT_TICK_SECONDS": "0",
    })
    os.environ.pop("REDIS_URL", None)
    sys.path.insert(0, str(REPO))
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client

        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        user = build(args.models, args.versions)
        history = build_history(args.history_days, args.history_deployments)
        built = time.perf_counter() - started
        client = Client()
        client.force_login(user)
        pages = [
            ("models list (25 per page)", "/models/"),
            ("models list (100 per page, page 5)", "/models/?per_page=100&page=5"),
            ("deployment page", "/models/model-0000/deployment/"),
            ("deployment charts partial (polled 2 s)", "/models/model-0000/deployment/charts/"),
            ("deployment live partial (polled 2 s)", "/models/model-0000/deployment/live/"),
            ("deployment page, 24 h of history", "/models/model-0000/deployment/?range=24h"),
            ("deployment charts, 24 h", "/models/model-0000/deployment/charts/?range=24h"),
            ("deployment charts, 7 d", "/models/model-0000/deployment/charts/?range=7d"),
        ]
        results = [(label, url, *time_page(client, url, args.loads)) for label, url in pages]
        if args.queries:
            slowest(client, [url for _, url in pages])
        if os.environ.get("BENCH_PROFILE"):
            import cProfile
            import pstats

            with cProfile.Profile() as prof:
                for _ in range(10):
                    client.get(os.environ["BENCH_PROFILE"])
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        print(f"\n{args.models:,} models x {args.versions} versions on PostgreSQL "
              f"({connection.pg_version // 10000}); {REPLICAS} replicas, 5 min of samples per "
              f"deployed version, {args.history_days} d of tiered history for "
              f"{args.history_deployments} deployments ({history:,} samples); data built in "
              f"{built:.1f} s; {args.loads} loads each, "
              f"Django test Client (server time)\n")
        print("| page | p50 ms | p95 ms | HTML KiB | p95 < 100 ms |")
        print("|---|---:|---:|---:|---|")
        for label, _url, p50, p95, size in results:
            print(f"| {label} | {p50:.1f} | {p95:.1f} | {size / 1024:.0f} | "
                  f"{'yes' if p95 < TARGET_P95_MS else 'NO'} |")
        connection.close()
        return 0 if all(r[4] < TARGET_P95_MS for r in results) else 1
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # django never set up: nothing to close
            pass
        psql(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


if __name__ == "__main__":
    raise SystemExit(main())
