"""Every background task of the registry, each a thin interface over a service or a job runner.
Declared with `registry.background.task` (Celery in clustered mode, an in-process lane in
embedded mode) and started with `registry.background.enqueue(name, ...)`."""

from __future__ import annotations

from datetime import timedelta

from celery.signals import worker_ready
from django.conf import settings

from registry.background import task
from registry.integrations import tensorrt, webhooks
from registry.jobs import housekeeping, runner
from registry.metrics_retention import compact
from registry.services import analysis, analysis_watch, config_sweep
from registry.store.gc import collect_garbage
from registry.validation import (
    backfill_weights_hashes,
    recover_validations,
    validate_version,
)


@task("registry.validate_version", acks_late=True, reject_on_worker_lost=True)
def validate_version_task(version_id: int) -> str:
    return validate_version(version_id)


@task("registry.run_job", lane="jobs", acks_late=True, reject_on_worker_lost=True)
def run_job_task(job_id: str, key: str | None = None) -> str:
    return runner.run_job(job_id, key=key)


@task("registry.run_config_search", lane="jobs", acks_late=True, reject_on_worker_lost=True)
def run_config_search_task(search_id: int, key: str | None = None) -> str:
    """On the jobs lane, as load tests: embedded, one measurement at a time."""
    return config_sweep.config_search_run(search_id, key=key)


@task("registry.build_tensorrt_engine", acks_late=True)
def build_tensorrt_task(version_id: int, precision: str) -> str:
    return tensorrt.build_engine(version_id, precision)["status"]


@task("registry.deliver_webhook", lane="webhooks", acks_late=True)
def deliver_webhook_task(delivery_id: int) -> str:
    return webhooks.attempt_delivery(delivery_id)


@task("registry.rollout_tick", ignore_result=True)
def rollout_tick_task() -> int:
    """Periodic: automated canary analysis decisions, then rollout housekeeping."""
    return len(analysis.tick())


@task("registry.analysis_watch", ignore_result=True)
def analysis_watch_task() -> int:
    """Periodic: a rollout tick that stopped or keeps failing must not leave a canary unjudged
    at its share (the console and replicas notice too: beat itself may be what stopped)."""
    return len(analysis_watch.drop_stale())


@task("registry.jobs_tick", ignore_result=True)
def jobs_tick_task() -> dict:
    """Periodic: expire job results and datasets (and re-queue jobs whose worker died, and
    config searches whose message was lost)."""
    return {**housekeeping.tick(),
            "config_searches": config_sweep.recover_config_searches(queued=True)}


@task("registry.recovery_tick", ignore_result=True)
def recovery_tick_task() -> dict:
    """Periodic: queue again the validations and jobs whose worker's lease lapsed (killed), or
    whose message never reached the broker; put back the settings a killed config search left."""
    return {"validations": recover_validations(),
            "jobs": housekeeping.recover_jobs(queued=False),
            "config_searches": config_sweep.recover_config_searches()}


@task("registry.gc_artifacts", ignore_result=True)
def gc_artifacts_task() -> int:
    """Periodic: remove artifact blobs no version references, once past the grace period, and
    captured requests older than their endpoint's retention."""
    from registry.monitoring.capture import prune_capture

    grace = timedelta(seconds=settings.GC_GRACE_SECONDS)
    removed = len(collect_garbage(grace=grace)["blobs"])
    prune_capture()
    return removed


@task("registry.metrics_compact", ignore_result=True)
def metrics_compact_task() -> dict:
    """Periodic: mark each minute's and 10 minutes' last metric sample, delete what aged out."""
    return compact()


@task("registry.weights_backfill", ignore_result=True)
def weights_backfill_task() -> int:
    """Periodic: give versions validated before the weights hash existed their hash, a few
    per run (each read is a whole artifact)."""
    return len(backfill_weights_hashes(limit=settings.WEIGHTS_BACKFILL_BATCH))


@worker_ready.connect
def _recover_on_worker_start(**_kwargs) -> None:
    recover_validations()
    housekeeping.recover_jobs()


@task("registry.drift_tick", ignore_result=True)
def drift_tick_task() -> dict:
    """Periodic: compare each deployed version's recent capture with its baseline."""
    from registry.services.drift import drift_tick

    return drift_tick()


@task("registry.quality_tick", ignore_result=True)
def quality_tick_task() -> dict:
    """Periodic: join feedback with captured predictions, compute each version's quality."""
    from registry.monitoring import quality

    return quality.run()
