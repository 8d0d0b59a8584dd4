"""The Celery app for the clustered mode: `celery -A console worker`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
app = Celery("mmc")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(related_name="analysis")  # registry.analysis: the rollout tick
# `celery -A console beat`: automated canary analysis and rollout housekeeping.
app.conf.beat_schedule = {
    "rollout-tick": {"task": "registry.rollout_tick",
                     "schedule": float(os.environ.get("MMC_ROLLOUT_TICK_SECONDS", "5") or 5)},
    "jobs-tick": {"task": "registry.jobs_tick",
                  "schedule": float(os.environ.get("MMC_JOB_TICK_SECONDS", "30") or 30)},
}
