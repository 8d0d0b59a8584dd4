"""Drift computation time for a million captured rows.

    .venv/bin/python bench/drift.py [--rows 1000000] [--features 16] [--rows-per-record 1]

Writes --rows captured rows (an MLP's --features inputs and 10 outputs, --rows-per-record rows
per captured request, as replicas write them: Parquet files through capture_store.
write_records) into a temporary artifact store, gives the version a baseline, and times one
drift task run (registry.services.drift.drift_tick) over them, split into reading the capture
(capture_store.iter_tensors: the files' columns into numpy) and comparing (histograms, PSI,
KS / chi-square). Also times the statistics of a baseline of the same rows, and reading the
same capture as record dicts (capture_store.iter_records: what the console and feedback read).
Embedded mode (SQLite) in a temporary data folder.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def setup_django(data_dir: str) -> None:
    os.environ.update(MMC_DATA_DIR=data_dir, DJANGO_SETTINGS_MODULE="console.settings",
                      LOG_LEVEL="WARNING")
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--rows-per-record", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup_django(tmp)
        from django.db import transaction

        from registry import samples, services
        from registry.audit import Actor
        from registry.models import Baseline, DriftPoint, ModelVersion
        from registry.monitoring import baselines, capture_store, drift
        from registry.services.drift import drift_tick
        from registry.store.artifacts import default_store
        from registry.validation import validate_version

        actor = Actor.system("bench")
        services.model_create(name="mlp", actor=actor)
        blob = default_store().save_bytes(samples.mlp(n_in=args.features, hidden=(32,)))
        with transaction.atomic():
            version, _ = services.version_upload(model_name="mlp", blob=blob, actor=actor)
        validate_version(version.pk)
        deadline = time.time() + 120  # the in-process pool may be validating it as well
        while ModelVersion.objects.get(pk=version.pk).status != "ready" \
                and time.time() < deadline:
            time.sleep(0.2)
        services.endpoint_deploy(model_name="mlp", version_number=1, actor=actor)

        rng = np.random.default_rng(0)
        now = time.time()
        per = args.rows_per_record
        records, written = [], 0
        started = time.perf_counter()
        for start in range(0, args.rows, 100_000):
            n = min(100_000, args.rows - start)
            x = rng.standard_normal((n, args.features)).astype(np.float32)
            y = rng.random((n, 10)).astype(np.float32)
            records = [{"id": f"r{start + i}", "model": "mlp", "version": 1, "role": "stable",
                        "ts": now - 3000 + 2900 * (start + i) / args.rows, "latency_ms": 1.0,
                        "inputs": {"x": {"datatype": "FP32", "shape": [per, args.features],
                                         "data": x[i:i + per].reshape(-1).tolist()}},
                        "outputs": {"y": {"datatype": "FP32", "shape": [per, 10],
                                          "data": y[i:i + per].reshape(-1).tolist()}},
                        "truncated": False} for i in range(0, n, per)]
            capture_store.write_records(records, writer=f"bench-{start}")
            written += len(records)
        write_s = time.perf_counter() - started
        stored = sum(size for _k, size in capture_store.files("mlp", since=now - 3600,
                                                               until=now))

        t = time.perf_counter()
        arrays, n = baselines.record_arrays(capture_store.iter_tensors(
            "mlp", since=now - 3600, until=now, version=1))
        read_s = time.perf_counter() - t
        t = time.perf_counter()
        dicts = sum(1 for _ in capture_store.iter_records("mlp", since=now - 3600, until=now,
                                                          version=1))
        dicts_s = time.perf_counter() - t
        assert n == dicts == written, (n, dicts, written)
        t = time.perf_counter()
        features = baselines.summarise_arrays(arrays)
        stats_s = time.perf_counter() - t
        with transaction.atomic():
            Baseline.objects.create(version=version, source="capture", rows=args.rows,
                                    features=features)
        t = time.perf_counter()
        limits = {"psi_threshold": 0.2, "p_value": 0.01, "min_samples": 200}
        results = drift.compare(features, arrays, **limits)
        compare_s = time.perf_counter() - t

        t = time.perf_counter()
        done = drift_tick(now=now)
        run_s = time.perf_counter() - t
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        assert done["points"] == args.features + 10 and DriftPoint.objects.count() == len(results)
        print(f"rows {args.rows:,} in {written:,} records of {per} row(s), {args.features} input "
              f"features + 10 outputs; capture {stored / 1e6:.1f} MB Parquet "
              f"(written in {write_s:.1f} s)")
        print(f"read capture -> columns   {read_s:7.2f} s")
        print(f"read capture -> dicts     {dicts_s:7.2f} s")
        print(f"baseline statistics       {stats_s:7.2f} s")
        print(f"compare (PSI + KS)        {compare_s:7.2f} s")
        print(f"drift task, whole run     {run_s:7.2f} s  ({done})")
        print(f"peak RSS                  {peak_mb:7.0f} MB")


if __name__ == "__main__":
    main()
