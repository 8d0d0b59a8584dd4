"""How a job's progress and result read to a person or a client."""

from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from registry.models import Job, JobKind, JobStatus


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


def status_url(job: Job) -> str:
    """Where a client polls the job."""
    return reverse("api:job-detail", args=[job.pk])


def result_url(job: Job) -> str | None:
    """Where the result downloads from, while there is one to download."""
    if job.status != JobStatus.SUCCEEDED or job.expired or job.kind == JobKind.LOADTEST:
        return None  # a load test's result is its summary, on the job itself
    return reverse("api:job-result", args=[job.pk])
