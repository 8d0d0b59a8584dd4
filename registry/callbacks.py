"""Completion callbacks: a small JSON notice POSTed to the job's callback URL, signed with
HMAC-SHA256 over the raw body (`X-MMC-Signature: sha256=<hex>`), retried with backoff.

The receiver verifies with `hmac.compare_digest(sig, "sha256=" + hmac.new(secret, body,
sha256).hexdigest())`. The secret is the job's own, else MMC_CALLBACK_SECRET; with neither the
notice goes unsigned. The result itself is not sent: the notice says where to fetch it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time

import httpx
import orjson
from django.conf import settings

from .models import Job

log = logging.getLogger(__name__)
ATTEMPTS = 4
BACKOFF_S = 0.5
TIMEOUT_S = 10.0


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def notice(job: Job) -> bytes:
    return orjson.dumps({
        "id": str(job.pk), "kind": job.kind, "status": job.status,
        "model": job.version.model.name, "version": job.version.number,
        "failure_reason": job.failure_reason or None, "rows": job.rows_done,
        "status_path": f"/api/v1/jobs/{job.pk}/",
        "result_path": f"/api/v1/jobs/{job.pk}/result/" if job.status == "succeeded" else None,
        "result_bytes": job.result_bytes,
        "expires_at": job.expires_at.isoformat() if job.expires_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    })


def deliver(job: Job, *, attempts: int = ATTEMPTS) -> str:
    """POST the notice; retry connection errors, 408, 429 and 5xx. Records the outcome on the
    job (`callback_status`) and returns it; never raises."""
    body = notice(job)
    headers = {"Content-Type": "application/json", "X-MMC-Job": str(job.pk),
               "X-MMC-Event": f"job.{job.status}"}
    secret = job.callback_secret or settings.JOB_CALLBACK_SECRET
    if secret:
        headers["X-MMC-Signature"] = sign(secret, body)
    outcome = ""
    for attempt in range(1, attempts + 1):
        try:
            r = httpx.post(job.callback_url, content=body, headers=headers, timeout=TIMEOUT_S)
        except httpx.HTTPError as exc:
            outcome = f"failed after {attempt} attempt(s): {exc.__class__.__name__}: {exc}"
        else:
            if r.status_code < 300:
                outcome = f"delivered: HTTP {r.status_code} on attempt {attempt}"
                break
            outcome = f"failed after {attempt} attempt(s): HTTP {r.status_code}"
            if r.status_code < 500 and r.status_code not in (408, 429):
                break
        if attempt < attempts:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
    Job.objects.filter(pk=job.pk).update(callback_status=outcome[:300])
    if not outcome.startswith("delivered"):
        log.warning("callback for job %s: %s", job.pk, outcome)
    return outcome
