"""Storage of per-version metric history after compaction, on the embedded SQLite.

    .venv/bin/python bench/metric_history.py [--days 9] [--replicas 1]

Feeds one version's samples as a replica heartbeating every 2 s leaves them (the last of each
5 s bucket), with a realistic latency histogram, for --days up to now; runs the compaction;
prints rows per tier and bytes per row (table + indexes, measured as the file's growth after
VACUUM), and so the storage per deployment (one version, per replica) per day.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=9)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    os.environ["MMC_DATA_DIR"] = tempfile.mkdtemp(prefix="mmc-bench-history-")
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from datetime import UTC, datetime

    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from registry.metrics_retention import compact
    from registry.models import MetricSample
    from serving.core.stats import LATENCY_BUCKETS_S

    call_command("migrate", verbosity=0)
    db = Path(settings.DATABASES["default"]["NAME"])

    def size() -> int:
        with connection.cursor() as c:
            c.execute("VACUUM")
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return db.stat().st_size

    empty = size()
    width, now = settings.METRICS_BUCKET_SECONDS, time.time()
    start = now - args.days * 86400
    rows, shape = [], [0.02, 0.05, 0.2, 0.4, 0.2, 0.1, 0.03]  # latency spread over 7 buckets
    for r in range(args.replicas):
        for i in range(int(args.days * 86400 // width)):
            t = start + i * width + 4.0  # the bucket's last 2 s heartbeat
            count = int(20 * (t - start))
            hist = [0] * (len(LATENCY_BUCKETS_S) + 1)
            for k, share in enumerate(shape):
                hist[12 + k] = int(count * share)
            rows.append(MetricSample(replica=f"replica-{r}", model_name="fraud-detector",
                                     version=12, bucket=int(t) // width,
                                     at=datetime.fromtimestamp(t, tz=UTC), count=count,
                                     errors=count // 200, latency_sum_s=count * 0.0021,
                                     latency_buckets=hist))
    written = len(rows)
    MetricSample.objects.bulk_create(rows, batch_size=5000)
    before = size()
    began = time.perf_counter()
    result = compact(now=now)
    took = time.perf_counter() - began
    after = size()
    kept = {level: MetricSample.objects.filter(level=level).count() for level in (0, 1, 2)}
    total = sum(kept.values())
    per_row = (after - empty) / total
    print(f"fed {written} rows ({args.days} d x {args.replicas} replica(s), {width} s buckets): "
          f"{(before - empty) / 1e6:.1f} MB, {(before - empty) / written:.0f} B/row")
    print(f"compaction: {result} in {took:.2f} s")
    print(f"kept: level 0 (every sample, last hour) {kept[0]}, level 1 (a minute, last day) "
          f"{kept[1]}, level 2 (10 min, {settings.METRICS_RETENTION_SECONDS // 86400} d) "
          f"{kept[2]}; {total} rows, {(after - empty) / 1e3:.0f} kB, {per_row:.0f} B/row")
    per_day = 86400 // width
    print(f"per deployment (1 version, 1 replica) per day: written {per_day} rows "
          f"(~{per_day * per_row / 1e6:.1f} MB), kept beyond a day 144 rows "
          f"(~{144 * per_row / 1e3:.0f} kB); steady stock {total // args.replicas} rows "
          f"(~{total // args.replicas * per_row / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
