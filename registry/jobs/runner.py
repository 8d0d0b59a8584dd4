"""Runs one job (async inference, a batch transform or a load test) to an outcome on whatever
worker picked it: Celery in clustered mode, the embedded process's job lane, or
`manage.py run_jobs`."""

from __future__ import annotations

import logging
import shutil

from django.db import transaction

from registry.integrations.callbacks import deliver
from registry.jobs.async_infer import run_async
from registry.jobs.batch import run_batch
from registry.jobs.lease import JobFailed, Lease, LeaseLost, claim, finish
from registry.jobs.loadtest import run_loadtest
from registry.models import Job, JobKind, JobStatus
from registry.notify import bump_revision
from registry.store.files import job_dir
from serving.core.errors import ServingError

log = logging.getLogger(__name__)


def run_job(job_id, *, key: str | None = None) -> str:
    """Run one job to an outcome; safe to call twice or concurrently (the lease decides).
    `key`: a load test's predict key, passed only in the task's arguments, never stored."""
    job = claim(job_id)
    if job is None:
        return "skipped"
    try:
        with Lease(job) as lease:
            if job.kind == JobKind.LOADTEST:
                fields = run_loadtest(job, lease, key=key)
            else:
                fields = (run_async if job.kind == JobKind.ASYNC else run_batch)(job, lease)
        status, reason = JobStatus.SUCCEEDED, ""
    except LeaseLost:
        _cleanup_if_cancelled(job)
        return "lost"
    except JobFailed as exc:
        status, reason, fields = JobStatus.FAILED, str(exc), {}
    except Exception as exc:
        if not isinstance(exc, ServingError):
            log.exception("job %s crashed", job.pk)
        reason = getattr(exc, "message", None) or f"{exc.__class__.__name__}: {exc}"
        status, fields = JobStatus.FAILED, {}
    finished = finish(job, status, failure_reason=reason[:4000], **fields)
    if job.kind == JobKind.LOADTEST and (job.params or {}).get("load_first"):
        with transaction.atomic():  # the replicas unload the version it had them load
            bump_revision()
    if not finished:
        _cleanup_if_cancelled(job)
        return "lost"
    if status == JobStatus.SUCCEEDED:
        shutil.rmtree(job_dir(job.pk) / "parts", ignore_errors=True)
    if job.callback_url:
        deliver(Job.objects.select_related("version__model").get(pk=job.pk))
    return status


def _cleanup_if_cancelled(job: Job) -> None:
    if Job.objects.filter(pk=job.pk, status=JobStatus.CANCELLED).exists():
        shutil.rmtree(job_dir(job.pk), ignore_errors=True)
