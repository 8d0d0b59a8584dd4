"""The job kernel: a worker holds a job by a lease (`worker`, `heartbeat_at`, renewed by a
thread). A worker that dies (kill -9) stops renewing; after MMC_JOB_LEASE_SECONDS the job is taken
over by whoever runs it next (a Celery redelivery, the recovery at worker start, the periodic
tick, run_jobs). Also what every kind of job shares: its version's session, batched prediction,
the stored request body."""

from __future__ import annotations

import logging
import math
import mmap
import os
import socket
import threading
from collections import OrderedDict
from datetime import datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.background import every
from registry.models import Job, JobKind, JobStatus, ModelVersion
from registry.store.artifacts import default_store
from serving.core.runtime import OnnxRuntime, select_providers

log = logging.getLogger(__name__)
HOST = socket.gethostname()
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class JobFailed(Exception):
    """The job cannot succeed; the message is the reason a person reads."""


class LeaseLost(Exception):
    """The job was cancelled or taken over by another worker: stop without writing a result."""


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
        self._beat = every(lease_seconds() / 3, self._renew)

    def __enter__(self) -> Lease:
        self._beat.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._beat.__exit__(None, None, None)

    def update(self, **fields) -> None:
        n = (Job.objects.filter(pk=self.job.pk, worker=self.job.worker, status=JobStatus.RUNNING)
             .update(heartbeat_at=timezone.now(), **fields))
        if not n:
            self.lost = True
        if self.lost:
            raise LeaseLost()

    def _renew(self) -> bool:
        """One heartbeat (registry.background.every); False once the job is no longer ours."""
        try:
            self.update()
        except LeaseLost:
            return False
        return True


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



_sessions: OrderedDict[tuple, object] = OrderedDict()
_sessions_lock = threading.Lock()
SESSION_CACHE = 2


def session_for(version: ModelVersion):
    """A loaded OnnxRuntime for the version, cached per worker process (LRU of two)."""
    key = (version.sha256, version.intra_op_threads, version.graph_optimization_level)
    with _sessions_lock:
        if key in _sessions:
            _sessions.move_to_end(key)
            return _sessions[key]
        store = default_store()
        if not store.verify(version.sha256):
            raise JobFailed(f"stored artifact of {version} does not match its sha256")
        runtime = OnnxRuntime(store.local_path(version.sha256),
                              providers=select_providers(settings.ORT_PROVIDERS or None),
                              intra_op_threads=version.intra_op_threads,
                              graph_optimization_level=version.graph_optimization_level,
                              trt_cache_dir=settings.TRT_CACHE_DIR).load()
        _sessions[key] = runtime
        while len(_sessions) > SESSION_CACHE:
            _sessions.popitem(last=False)[1].unload()
        return runtime



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



def chunk_count(rows: int, chunk_rows: int) -> int:
    return max(1, math.ceil(rows / chunk_rows))
