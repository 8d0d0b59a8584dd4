"""`manage.py run_jobs`: a job worker without Celery. Polls for queued jobs and jobs whose worker
died (lease expired), runs them one at a time, expires old results. `--once` exits when nothing
is left to run. Safe beside Celery workers and other run_jobs processes: the lease decides."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from registry.jobs.housekeeping import expire_results, stale_jobs
from registry.jobs.runner import run_job


class Command(BaseCommand):
    help = "Run async-inference and batch-transform jobs (poll the database)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true",
                            help="exit when no job is left to run")
        parser.add_argument("--poll", type=float, default=1.0, help="seconds between polls")

    def handle(self, *args, once, poll, **options):
        while True:
            close_old_connections()
            expire_results()
            ids = list(stale_jobs().values_list("pk", flat=True))
            ran = [(pk, run_job(pk)) for pk in ids]
            for pk, outcome in ran:
                self.stdout.write(f"job {pk}: {outcome}")
            if once and not any(outcome != "skipped" for _, outcome in ran):
                return
            time.sleep(0 if ran and any(o != "skipped" for _, o in ran) else poll)
