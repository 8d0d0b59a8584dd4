"""The validation lease and the recovery tick, in both modes: a version whose worker stopped
renewing its lease (killed) or whose task never reached the broker is queued again by the tick,
once, attempts counted; one a live worker holds is left alone. The real kill -9 of a whole
Celery worker is in tests/faults/test_control_plane.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from registry import samples
from registry.models import ModelVersion, VersionStatus
from registry.validation import recover_validations, validate_version
from tests.conftest import upload, wait_validated

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ready(engineer):
    engineer.post("/api/v1/models/", {"name": "m"}, format="json")
    upload(engineer, "m", samples.mlp())
    wait_validated(engineer, "m", 1)
    return ModelVersion.objects.get(model__name="m", number=1)


def interrupted(version: ModelVersion, *, silent_for: timedelta, started: bool = True) -> None:
    """What a worker leaves when it dies mid-validation (or a lost message, not started)."""
    ModelVersion.objects.filter(pk=version.pk).update(
        status=VersionStatus.VALIDATING, signature={}, validation_attempts=1 if started else 0,
        validation_started_at=timezone.now() - silent_for if started else None,
        validation_heartbeat_at=timezone.now() - silent_for)


def test_a_lapsed_lease_is_queued_again_once_and_validated(engineer, ready, settings):
    interrupted(ready, silent_for=timedelta(seconds=settings.VALIDATION_LEASE_SECONDS + 1))
    assert recover_validations() == [ready.pk]
    assert recover_validations() == []  # marked queued: the next tick does not send it twice
    done = wait_validated(engineer, "m", 1)
    assert done["status"] == "ready" and done["validation_attempts"] == 2


def test_a_live_lease_is_left_alone(ready, settings):
    interrupted(ready, silent_for=timedelta(seconds=settings.VALIDATION_LEASE_SECONDS / 3))
    assert recover_validations() == []
    # a duplicate message meets the live worker's lease: it does nothing
    assert validate_version(ready.pk) == VersionStatus.VALIDATING
    assert ModelVersion.objects.get(pk=ready.pk).validation_attempts == 1


def test_a_message_that_never_arrived_is_sent_after_a_lease(engineer, ready, settings):
    interrupted(ready, started=False,
                silent_for=timedelta(seconds=settings.VALIDATION_LEASE_SECONDS + 1))
    assert recover_validations() == [ready.pk]
    assert wait_validated(engineer, "m", 1)["validation_attempts"] == 1


def test_the_recovery_tick_is_a_periodic_task(settings):
    from registry.background import _tasks

    assert settings.PERIODIC_TASKS["registry.recovery_tick"] == settings.RECOVERY_TICK_SECONDS
    assert settings.CELERY_BEAT_SCHEDULE["registry.recovery_tick"]["schedule"] == 5.0
    assert "registry.recovery_tick" in _tasks


def test_the_upload_answer_says_when_validation_could_not_be_queued(engineer, settings,
                                                                    monkeypatch):
    from registry import background

    settings.CLUSTERED = True
    declared = background._tasks["registry.validate_version"]

    def refuse(**kwargs):
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(declared.celery, "apply_async", refuse)
    engineer.post("/api/v1/models/", {"name": "q"}, format="json")
    r = upload(engineer, "q", samples.mlp(seed=2))
    assert r.status_code == 201
    body = r.json()
    assert body["status"] == "validating" and body["created"] is True
    assert body["detail"].startswith("stored as version 1, but its validation could not be "
                                     "queued now (ConnectionError: Error 111")
    assert "queued again automatically within 20 s" in body["detail"]
    settings.CLUSTERED = False  # let the in-process lane (or the suite's worker) finish it
    monkeypatch.undo()
    assert recover_validations(timedelta(0)) == [ModelVersion.objects.get(model__name="q").pk]
