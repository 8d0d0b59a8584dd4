"""Batch transform: throughput against raw onnxruntime, and peak memory against dataset size.

    .venv/bin/python bench/batch.py [--rows 1000000] [--batch 32] [--big-rows 11000000]

1. Rows/s of a whole batch job (claim, mmap'd .npy read, chunks run in batches, part files,
   progress rows, assembly of the output .npy, audit) as a ratio to a tight loop of the same
   onnxruntime session over the same rows, in memory, at the same batch size. Best of 3 each,
   interleaved. Target: >= 0.8.
2. Peak RSS (VmHWM) of a fresh worker process transforming a dataset of --rows and one of
   --big-rows (11x): streaming means the peak does not grow with the dataset, and the big
   dataset is ten times the memory budget (MMC_BENCH_BUDGET_MB, default 256) it stays under.
Embedded mode (SQLite) in a temporary data folder; nothing else is started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def write_npy(path: Path, rows: int, width: int = 64, seed: int = 0) -> None:
    """A float32 (rows, width) .npy written block by block (never whole in memory)."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (rows, width)})
        for start in range(0, rows, 200_000):
            n = min(200_000, rows - start)
            f.write(rng.standard_normal((n, width), dtype=np.float32).data)


def proc_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def setup_django(data_dir: str):
    os.environ.update(MMC_DATA_DIR=data_dir, DJANGO_SETTINGS_MODULE="console.settings",
                      LOG_LEVEL="WARNING", MMC_JOB_TICK_SECONDS="0")
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    from django.db import transaction

    from registry import samples, services
    from registry.audit import Actor
    from registry.models import ModelVersion
    from registry.services import jobs as job_services
    from registry.store.artifacts import default_store
    from registry.validation import validate_version

    job_services.enqueue_job = lambda job_id: None  # this process runs the job itself
    actor = Actor.system("bench")
    services.model_create(name="mlp", actor=actor)
    blob = default_store().save_bytes(samples.mlp())
    with transaction.atomic():
        version, _ = services.version_upload(model_name="mlp", blob=blob, actor=actor)
    validate_version(version.pk)
    return ModelVersion.objects.get(pk=version.pk), actor


def register(path: Path, actor):
    """The dataset as the API would register it, linked instead of copied."""
    from registry.models import Dataset
    from registry.store.files import dataset_path, inspect_dataset

    rows, columns = inspect_dataset(path, "npy")
    ds = Dataset(filename=path.name, format="npy", size_bytes=path.stat().st_size,
                 sha256="-", rows=rows, columns=columns)
    dataset_path(ds).parent.mkdir(parents=True, exist_ok=True)
    os.link(path, dataset_path(ds))
    ds.save(force_insert=True)
    return ds


def run_one(ds, actor, batch: int) -> tuple[float, dict]:
    from registry.jobs.runner import run_job
    from registry.models import Job
    from registry.services.jobs import batch_create

    job = batch_create(model_name="mlp", dataset_id=ds.pk, actor=actor, batch_size=batch,
                       version_number=1)
    t0 = time.perf_counter()
    outcome = run_job(job.pk)
    seconds = time.perf_counter() - t0
    job = Job.objects.get(pk=job.pk)
    assert outcome == "succeeded", (outcome, job.failure_reason)
    return seconds, {"rows_per_second_in_loop": job.rows_per_second, "rows": job.rows_done}


def child(args) -> None:
    """One fresh worker process: set up, then transform one dataset; report peak RSS."""
    version, actor = setup_django(args.data_dir)
    from registry.jobs.lease import session_for

    session_for(version)  # loaded before the baseline, as in a warm worker
    ds = register(Path(args.dataset), actor)
    baseline = proc_kb("VmHWM")
    seconds, info = run_one(ds, actor, args.batch)
    print(json.dumps({"baseline_kb": baseline, "hwm_kb": proc_kb("VmHWM"), "seconds": seconds,
                      "dataset_bytes": Path(args.dataset).stat().st_size, **info}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--big-rows", type=int, default=11_000_000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--child", action="store_true")
    p.add_argument("--data-dir")
    p.add_argument("--dataset")
    args = p.parse_args()
    if args.child:
        return child(args)
    budget_mb = int(os.environ.get("MMC_BENCH_BUDGET_MB", "256"))
    work = Path(tempfile.mkdtemp(prefix="mmc-bench-batch-"))
    small, big = work / "small.npy", work / "big.npy"
    write_npy(small, args.rows)

    # 1. throughput, in this process
    version, actor = setup_django(str(work / "data"))
    from registry.jobs.lease import session_for

    runtime = session_for(version)
    ds = register(small, actor)
    x = np.load(small)
    raw, job, loop = [], [], []
    for _ in range(3):
        t0 = time.perf_counter()
        for i in range(0, len(x), args.batch):
            runtime.predict({"x": x[i:i + args.batch]})
        raw.append(len(x) / (time.perf_counter() - t0))
        seconds, info = run_one(ds, actor, args.batch)
        job.append(info["rows"] / seconds)
        loop.append(info["rows_per_second_in_loop"])
    del x

    # 2. peak RSS of fresh worker processes, dataset 1x and 10x
    write_npy(big, args.big_rows, seed=1)
    peaks = {}
    for name, path in (("small", small), ("big", big)):
        out = subprocess.run([sys.executable, __file__, "--child", "--data-dir",
                              str(work / f"data-{name}"), "--dataset", str(path), "--batch",
                              str(args.batch)], capture_output=True, text=True, cwd=REPO)
        if out.returncode:
            raise SystemExit(out.stderr[-3000:])
        peaks[name] = json.loads(out.stdout.strip().splitlines()[-1])
    import onnxruntime

    mb = 1024 * 1024
    print(f"\nBatch transform, MLP 64→256→256→10, float32 .npy, batch {args.batch}, "
          f"{os.cpu_count()} CPUs, onnxruntime {onnxruntime.__version__}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| measure | value |\n|---|---|")
    print(f"| raw onnxruntime, same session, {args.rows:,} rows in memory | "
          f"{max(raw):,.0f} rows/s |")
    print(f"| batch job end to end (claim → assembled .npy, audited) | {max(job):,.0f} rows/s |")
    print(f"| batch job, chunk loop only (job's own rows/s) | {max(loop):,.0f} rows/s |")
    print(f"| **ratio job / raw** (target ≥ 0.8) | **{max(job) / max(raw):.2f}** "
          f"(loop only {max(loop) / max(raw):.2f}) |")
    for name in ("small", "big"):
        r = peaks[name]
        print(f"| peak RSS (VmHWM), {r['rows']:,} rows = {r['dataset_bytes'] / mb:,.0f} MB "
              f"dataset | {r['hwm_kb'] / 1024:,.0f} MB (warm worker before the job "
              f"{r['baseline_kb'] / 1024:,.0f} MB; {r['rows'] / r['seconds']:,.0f} rows/s) |")
    b = peaks["big"]
    ok = b["hwm_kb"] * 1024 <= budget_mb * mb and b["dataset_bytes"] >= 10 * budget_mb * mb
    print(f"| budget {budget_mb} MB, dataset {b['dataset_bytes'] / (budget_mb * mb):.1f}× "
          f"the budget | {'within budget' if ok else 'OVER BUDGET'} |")
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
