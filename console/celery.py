"""The Celery app for the clustered mode: `celery -A console worker` runs the tasks declared in
registry/tasks.py; `celery -A console beat` runs settings.PERIODIC_TASKS."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
app = Celery("mmc")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
