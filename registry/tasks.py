"""Background jobs. Celery runs them in clustered mode; registry.worker runs the same functions on
an in-process thread in embedded mode."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from celery.signals import worker_ready

from .tensorrt import build_tensorrt_task  # noqa: F401  (registers the Celery task)
from .validation import stale_validations, validate_version
from .webhooks import deliver_webhook_task  # noqa: F401  (registers the Celery task)
from .worker import enqueue

log = logging.getLogger(__name__)


@shared_task(name="registry.validate_version", acks_late=True, reject_on_worker_lost=True)
def validate_version_task(version_id: int) -> str:
    return validate_version(version_id)


def recover_validations(older_than: timedelta | None = None) -> list[int]:
    """Re-queue validations a dead worker left behind. Runs at worker/process start."""
    from django.db import transaction

    ids = list(stale_validations(older_than).values_list("pk", flat=True))
    with transaction.atomic():
        for pk in ids:
            enqueue(validate_version_task, version_id=pk)
    if ids:
        log.warning("re-queued %d interrupted validation(s): %s", len(ids), ids)
    return ids


@worker_ready.connect
def _recover_on_worker_start(**_kwargs) -> None:
    recover_validations()


@shared_task(name="registry.run_job", acks_late=True, reject_on_worker_lost=True)
def run_job_task(job_id: str) -> str:
    from .jobs import run_job

    return run_job(job_id)


@shared_task(name="registry.jobs_tick", ignore_result=True)
def jobs_tick_task() -> dict:
    """Celery beat: expire job results, re-queue jobs whose worker died."""
    from .jobs import tick

    return tick()


@worker_ready.connect
def _recover_jobs_on_worker_start(**_kwargs) -> None:
    from .jobs import recover_jobs

    recover_jobs()
