"""Job housekeeping, run by the periodic jobs tick: re-queue jobs a dead worker left behind,
delete expired results and datasets."""

from __future__ import annotations

import logging
import shutil
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.audit import Actor, record
from registry.background import enqueue
from registry.jobs.lease import lease_seconds
from registry.models import Dataset, Job, JobStatus
from registry.store.files import dataset_path, job_dir

log = logging.getLogger(__name__)


def enqueue_job(job_id, *, key: str | None = None) -> None:
    """Run the job after the current transaction commits, on the jobs lane (its own, so a long
    batch never delays validations). `key` (a load test's predict key) travels only in the
    task's arguments: a re-queued job has none and says so."""
    if key:
        enqueue("registry.run_job", job_id=str(job_id), key=key)
    else:
        enqueue("registry.run_job", job_id=str(job_id))


def stale_jobs(*, queued: bool = True):
    """Jobs a worker should pick up: running under a lease nobody renews, and (`queued`) queued
    ones, whose message may have been lost."""
    cutoff = timezone.now() - timedelta(seconds=lease_seconds())
    lapsed = Q(status=JobStatus.RUNNING, heartbeat_at__lt=cutoff)
    return (Job.objects.filter(lapsed | Q(status=JobStatus.QUEUED) if queued else lapsed)
            .order_by("created_at"))


def recover_jobs(*, queued: bool = True) -> list[str]:
    """Re-queue jobs a dead worker left behind, and (`queued`) queued ones whose message was
    lost. The recovery tick (every few seconds) passes queued=False: a job waiting behind a long
    one is not sent again every tick; the jobs tick and worker start send those."""
    ids = [str(pk) for pk in stale_jobs(queued=queued).values_list("pk", flat=True)]
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
