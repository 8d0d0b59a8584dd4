"""Completion callbacks: a small JSON notice POSTed to the job's callback URL, signed with
HMAC-SHA256 over the raw body (`X-MMC-Signature: sha256=<hex>`), retried with backoff.

The receiver verifies with `hmac.compare_digest(sig, "sha256=" + hmac.new(secret, body,
sha256).hexdigest())`. The secret is the job's own, else MMC_CALLBACK_SECRET; with neither the
notice goes unsigned. The result itself is not sent: the notice says where to fetch it.
"""

from __future__ import annotations

import logging
import time

import orjson
from django.conf import settings
from django.urls import reverse

from registry.integrations.outbound import backoff, post_signed
from registry.models import Job, JobStatus

log = logging.getLogger(__name__)
ATTEMPTS = 4
BACKOFF_S = 0.5
TIMEOUT_S = 10.0


def notice(job: Job) -> bytes:
    return orjson.dumps({
        "id": str(job.pk), "kind": job.kind, "status": job.status,
        "model": job.version.model.name, "version": job.version.number,
        "failure_reason": job.failure_reason or None, "rows": job.rows_done,
        "status_path": reverse("api:job-detail", args=[job.pk]),  # as jobs.progress.status_url
        "result_path": (reverse("api:job-result", args=[job.pk])
                        if job.status == JobStatus.SUCCEEDED else None),
        "result_bytes": job.result_bytes,
        "expires_at": job.expires_at.isoformat() if job.expires_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    })


def deliver(job: Job, *, attempts: int = ATTEMPTS) -> str:
    """POST the notice; retry connection errors, 408, 429 and 5xx. Records the outcome on the
    job (`callback_status`, which the engineer sees: the class of failure, never what answered)
    and returns it; never raises."""
    body = notice(job)
    headers = {"Content-Type": "application/json", "X-MMC-Job": str(job.pk),
               "X-MMC-Event": f"job.{job.status}"}
    secret = job.callback_secret or settings.JOB_CALLBACK_SECRET
    outcome = ""
    for attempt in range(1, attempts + 1):
        sent = post_signed(job.callback_url, body, headers, secret=secret, timeout=TIMEOUT_S)
        if sent.ok:
            outcome = f"delivered: HTTP {sent.status_code} on attempt {attempt}"
            break
        outcome = f"failed after {attempt} attempt(s): {sent.error}"
        if not sent.retryable:
            break
        if attempt < attempts:
            time.sleep(backoff(attempt, base=BACKOFF_S, cap=BACKOFF_S * 2 ** attempts))
    Job.objects.filter(pk=job.pk).update(callback_status=outcome[:300])
    if not outcome.startswith("delivered"):
        log.warning("callback for job %s: %s", job.pk, outcome)
    return outcome
