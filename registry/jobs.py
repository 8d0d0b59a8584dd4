"""Runs jobs (async inference, batch transforms) on a worker: Celery in clustered mode, a job
thread in the embedded process, or `manage.py run_jobs` anywhere.

A worker holds a job by a lease (`worker`, `heartbeat_at`, renewed by a thread). A worker that
dies (kill -9) stops renewing; after MMC_JOB_LEASE_SECONDS the job is taken over by whoever runs
it next (a Celery redelivery, the recovery at worker start, the periodic tick, run_jobs). A batch
transform writes each chunk's output to its own part file, renamed into place, so the next worker
skips finished chunks and redoes at most the one in flight: no row lost, none duplicated.
Inference uses the serving code itself: decode, validate against the signature, onnxruntime,
encode.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import shutil
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import close_old_connections, connections, transaction
from django.utils import timezone

from .audit import Actor, record
from .jobfiles import dataset_path, job_dir
from .models import Dataset, Job, JobKind, JobStatus, ModelVersion

log = logging.getLogger(__name__)
HOST = socket.gethostname()
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class JobFailed(Exception):
    """The job cannot succeed; the message is the reason a person reads."""


class LeaseLost(Exception):
    """The job was cancelled or taken over by another worker: stop without writing a result."""


# --------------------------------------------------------------------------- dispatch

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def enqueue_job(job_id) -> None:
    """Run the job after the current transaction commits: on Celery when clustered, else on the
    embedded process's job thread (its own, so a long batch never delays validations)."""
    global _executor
    from .tasks import run_job_task

    def send() -> None:
        if settings.CLUSTERED:
            run_job_task.apply_async(kwargs={"job_id": str(job_id)})
            return
        from .worker import _run_in_process

        global _executor
        with _executor_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmc-jobs")
        _executor.submit(_run_in_process, run_job, {"job_id": str(job_id)})

    transaction.on_commit(send)


# --------------------------------------------------------------------------- sessions

_sessions: OrderedDict[tuple, object] = OrderedDict()
_sessions_lock = threading.Lock()
SESSION_CACHE = 2


def session_for(version: ModelVersion):
    """A loaded OnnxRuntime for the version, cached per worker process (LRU of two)."""
    from serving.runtime import OnnxRuntime, select_providers

    from .artifacts import default_store

    key = (version.sha256, version.intra_op_threads, version.graph_optimization_level)
    with _sessions_lock:
        if key in _sessions:
            _sessions.move_to_end(key)
            return _sessions[key]
        store = default_store()
        if not store.verify(version.sha256):
            raise JobFailed(f"stored artifact of {version} does not match its sha256")
        runtime = OnnxRuntime(store.path_for(version.sha256),
                              providers=select_providers(settings.ORT_PROVIDERS or None),
                              intra_op_threads=version.intra_op_threads,
                              graph_optimization_level=version.graph_optimization_level,
                              trt_cache_dir=settings.TRT_CACHE_DIR).load()
        _sessions[key] = runtime
        while len(_sessions) > SESSION_CACHE:
            _sessions.popitem(last=False)[1].unload()
        return runtime


# --------------------------------------------------------------------------- lease


def worker_name() -> str:
    return f"{HOST}:{os.getpid()}:{threading.get_ident()}"


def lease_seconds() -> float:
    return float(settings.JOB_LEASE_SECONDS)


def claim(job_id) -> Job | None:
    """Take the job if nobody live holds it; None when finished or held. Counts attempts."""
    now = timezone.now()
    with transaction.atomic():
        job = (Job.objects.select_for_update(of=("self",))
               .select_related("version__model", "dataset").filter(pk=job_id).first())
        if job is None or job.status in FINISHED:
            return None
        if (job.status == JobStatus.RUNNING and job.heartbeat_at is not None
                and job.heartbeat_at > now - timedelta(seconds=lease_seconds())):
            return None  # a live worker has it
        job.attempts += 1
        if job.attempts > settings.JOB_MAX_ATTEMPTS:
            _set_finished(job, JobStatus.FAILED, now,
                          failure_reason=f"the job was interrupted {job.attempts - 1} times "
                                         f"(worker killed or out of memory); giving up")
            return None
        job.status, job.worker, job.heartbeat_at = JobStatus.RUNNING, worker_name(), now
        job.started_at = job.started_at or now
        job.save(update_fields=["status", "worker", "heartbeat_at", "attempts", "started_at"])
    return job


class Lease:
    """Renews the job's heartbeat on a thread; `update()` also writes progress. Either one
    finding the job no longer ours (cancelled, taken over) sets `lost`."""

    def __init__(self, job: Job):
        self.job = job
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"mmc-lease-{job.pk}")

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def update(self, **fields) -> None:
        n = (Job.objects.filter(pk=self.job.pk, worker=self.job.worker, status=JobStatus.RUNNING)
             .update(heartbeat_at=timezone.now(), **fields))
        if not n:
            self.lost = True
        if self.lost:
            raise LeaseLost()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(lease_seconds() / 3):
                try:
                    self.update()
                except LeaseLost:
                    return
                except Exception:  # a database hiccup: try again on the next beat
                    log.exception("lease renewal of job %s failed", self.job.pk)
        finally:
            connections.close_all()  # this thread's own connection; it ends with the job


def _set_finished(job: Job, status: str, now: datetime, **fields) -> None:
    ttl = settings.ASYNC_RESULT_TTL if job.kind == JobKind.ASYNC else settings.BATCH_RESULT_TTL
    job.status, job.finished_at = status, now
    job.expires_at = now + timedelta(seconds=ttl) if status == JobStatus.SUCCEEDED else now
    for key, value in fields.items():
        setattr(job, key, value)
    job.save()
    record(Actor.system("jobs"), f"job.{status}", target_type="job", target=str(job.pk),
           model_name=job.version.model.name,
           after={"kind": job.kind, "version": job.version.number, "status": status,
                  "reason": job.failure_reason[:500], "rows": job.rows_done,
                  "attempts": job.attempts})


def finish(job: Job, status: str, **fields) -> bool:
    """Record the outcome if the job is still ours (a cancel in between wins)."""
    with transaction.atomic():
        current = (Job.objects.select_for_update(of=("self",)).select_related("version__model")
                   .get(pk=job.pk))
        if current.status != JobStatus.RUNNING or current.worker != job.worker:
            return False
        _set_finished(current, status, timezone.now(), **fields)
    return True


# --------------------------------------------------------------------------- running


def run_job(job_id) -> str:
    """Run one job to an outcome; safe to call twice or concurrently (the lease decides)."""
    job = claim(job_id)
    if job is None:
        return "skipped"
    try:
        with Lease(job) as lease:
            if job.kind == JobKind.ASYNC:
                from .async_infer import run_async

                fields = run_async(job, lease)
            else:
                from .batch import run_batch

                fields = run_batch(job, lease)
        status, reason = JobStatus.SUCCEEDED, ""
    except LeaseLost:
        _cleanup_if_cancelled(job)
        return "lost"
    except JobFailed as exc:
        status, reason, fields = JobStatus.FAILED, str(exc), {}
    except Exception as exc:
        from serving.errors import ServingError

        if not isinstance(exc, ServingError):
            log.exception("job %s crashed", job.pk)
        reason = getattr(exc, "message", None) or f"{exc.__class__.__name__}: {exc}"
        status, fields = JobStatus.FAILED, {}
    if not finish(job, status, failure_reason=reason[:4000], **fields):
        _cleanup_if_cancelled(job)
        return "lost"
    if status == JobStatus.SUCCEEDED:
        shutil.rmtree(job_dir(job.pk) / "parts", ignore_errors=True)
    if job.callback_url:
        from .callbacks import deliver

        deliver(Job.objects.select_related("version__model").get(pk=job.pk))
    return status


def _cleanup_if_cancelled(job: Job) -> None:
    if Job.objects.filter(pk=job.pk, status=JobStatus.CANCELLED).exists():
        shutil.rmtree(job_dir(job.pk), ignore_errors=True)


def predict_rows(runtime, feeds: dict[str, np.ndarray], rows: int, batch_size: int,
                 names: list[str] | None = None, lease: Lease | None = None
                 ) -> dict[str, np.ndarray]:
    """Run `rows` rows in batches of `batch_size`; outputs concatenated in row order."""
    if rows <= batch_size:
        return runtime.predict(feeds, names)
    parts: dict[str, list] = {}
    for start in range(0, rows, batch_size):
        if lease is not None and lease.lost:
            raise LeaseLost()
        out = runtime.predict({k: v[start:start + batch_size] for k, v in feeds.items()}, names)
        for k, v in out.items():
            parts.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in parts.items()}


def open_body(path):
    """The stored request body: mapped (binary tensors become views, no copy) when non-empty."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


# --------------------------------------------------------------------------- housekeeping


def stale_jobs():
    """Jobs a worker should pick up: queued, or running under a lease nobody renews."""
    cutoff = timezone.now() - timedelta(seconds=lease_seconds())
    from django.db.models import Q

    return (Job.objects.filter(Q(status=JobStatus.QUEUED)
                               | Q(status=JobStatus.RUNNING, heartbeat_at__lt=cutoff))
            .order_by("created_at"))


def recover_jobs() -> list[str]:
    """Re-queue jobs a dead worker left behind (and queued ones whose message was lost)."""
    ids = [str(pk) for pk in stale_jobs().values_list("pk", flat=True)]
    with transaction.atomic():
        for pk in ids:
            enqueue_job(pk)
    if ids:
        log.warning("re-queued %d job(s): %s", len(ids), ids)
    return ids


def expire_results(now: datetime | None = None) -> list[str]:
    """Delete the files of jobs past their expiry (results, bodies, parts) and mark them."""
    now = now or timezone.now()
    due = list(Job.objects.filter(expired=False, expires_at__lte=now)
               .exclude(status__in=[JobStatus.QUEUED, JobStatus.RUNNING])
               .values_list("pk", flat=True))
    for pk in due:
        shutil.rmtree(job_dir(pk), ignore_errors=True)
    if due:
        with transaction.atomic():
            Job.objects.filter(pk__in=due).update(expired=True)
            record(Actor.system("jobs"), "jobs.expire", target_type="jobs",
                   target=f"{len(due)} job(s)", after={"jobs": [str(pk) for pk in due]})
    return [str(pk) for pk in due]


def expire_datasets(now: datetime | None = None) -> list[str]:
    """Delete the files of datasets unused for DATASET_TTL (none a queued or running job reads)
    and mark them expired; the rows stay, for the jobs that name them."""
    now = now or timezone.now()
    with transaction.atomic():
        due = list(Dataset.objects.select_for_update(skip_locked=True)
                   .filter(expired=False, expires_at__lte=now)
                   .exclude(jobs__status__in=[JobStatus.QUEUED, JobStatus.RUNNING])
                   .order_by())
        if not due:
            return []
        Dataset.objects.filter(pk__in=[d.pk for d in due]).update(expired=True)
        record(Actor.system("jobs"), "datasets.expire", target_type="datasets",
               target=f"{len(due)} dataset(s)",
               after={"datasets": [str(d.pk) for d in due],
                      "bytes": sum(d.size_bytes for d in due)})
    for d in due:  # after commit: a refused batch_create never points at a missing file
        dataset_path(d).unlink(missing_ok=True)
    return [str(d.pk) for d in due]


def tick(now: datetime | None = None) -> dict:
    return {"expired": expire_results(now), "datasets_expired": expire_datasets(now),
            "requeued": recover_jobs()}


_scheduler: threading.Thread | None = None


def start_scheduler(interval: float | None = None) -> threading.Thread | None:
    """Embedded mode: recover interrupted jobs now, then tick every interval on a daemon thread."""
    global _scheduler
    interval = settings.JOB_TICK_SECONDS if interval is None else interval
    if interval <= 0 or _scheduler is not None:
        return _scheduler

    def loop() -> None:
        while True:
            close_old_connections()
            try:
                tick()
            except Exception:
                log.exception("jobs tick failed")
            finally:
                close_old_connections()
            time.sleep(interval)

    _scheduler = threading.Thread(target=loop, name="mmc-jobs-tick", daemon=True)
    _scheduler.start()
    return _scheduler


def progress(job: Job) -> dict:
    """Rows done/total, fraction, rows/s and ETA as the API shows them."""
    total, done, rate = job.rows_total, job.rows_done, job.rows_per_second
    eta = None
    if job.status == JobStatus.RUNNING and total and rate:
        eta = round(max(total - done, 0) / rate, 1)
    return {"rows_done": done, "rows_total": total,
            "fraction": round(done / total, 4) if total else None,
            "rows_per_second": round(rate, 1) if rate else None, "eta_seconds": eta,
            "chunks_done": job.chunks_done, "chunks_total": job.chunks_total,
            "chunks_resumed": job.chunks_resumed,
            "elapsed_seconds": round(((job.finished_at or timezone.now()) - job.started_at)
                                     .total_seconds(), 2) if job.started_at else None}


def result_url(job: Job) -> str | None:
    """Where the result downloads from, while there is one to download."""
    if job.status != JobStatus.SUCCEEDED or job.expired:
        return None
    return f"/api/v1/jobs/{job.pk}/result/"


def chunk_count(rows: int, chunk_rows: int) -> int:
    return max(1, math.ceil(rows / chunk_rows))
