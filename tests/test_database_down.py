"""What a client sees while the database is unreachable, in both modes: 503 + Retry-After, JSON
under /api/, a plain page in the console, the health bar and /healthz naming the database, and one
log line instead of a traceback. The real outage (a stopped PostgreSQL) is in
tests/faults/test_control_plane.py; here the database error is raised where the ORM would."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import OperationalError
from django.test import Client

from console import health
from registry import background, selectors
from registry.errors import NotFound

DOWN = OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection '
                        'refused\n\tIs the server running on that host?')


@pytest.fixture
def database_down(monkeypatch):
    def refuse(*args, **kwargs):
        raise DOWN

    monkeypatch.setattr(selectors, "model_list", refuse)
    monkeypatch.setattr(health, "database",
                        lambda: health.Check("Database", False, "unreachable: OperationalError"))


@pytest.fixture
def engineer_session(users) -> Client:
    """A signed-in console session whose client answers errors as a browser sees them."""
    client = Client(raise_request_exception=False)
    client.force_login(users["engineer"])
    return client


def test_api_answers_503_json_with_retry_after(engineer_session, database_down, caplog):
    client = engineer_session
    with caplog.at_level(logging.WARNING, logger="django.request"):
        r = client.get("/api/v1/models/")
    assert r.status_code == 503 and r["Content-Type"] == "application/json"
    assert r["Retry-After"] == "5"
    assert r.json()["error"].startswith("database unavailable (connection to server at")
    assert "Is the server running" not in r.json()["error"]  # its first line only
    records = [rec for rec in caplog.records if rec.name == "django.request"]
    assert len(records) == 1 and records[0].exc_info is None  # no traceback
    assert records[0].levelname == "WARNING"
    assert "database unavailable: OperationalError" in records[0].getMessage()


def test_console_page_answers_a_plain_503_page(engineer_session, database_down):
    r = engineer_session.get("/models/")
    assert r.status_code == 503 and r["Retry-After"] == "5"
    assert b"Database unavailable" in r.content and b"<!doctype html>" in r.content


def test_health_bar_and_healthz_name_the_database_without_a_session(database_down):
    bar = Client().get("/health/")  # no session to read while the database is down
    assert bar.status_code == 200
    assert b"Database" in bar.content and b"unreachable: OperationalError" in bar.content
    r = Client().get("/healthz")
    assert r.status_code == 503 and r["Retry-After"] == "5"
    assert r.json() == {"status": "unavailable", "checks": {"database": {
        "state": "degraded", "detail": "unreachable: OperationalError"}}}


def test_other_errors_stay_500(engineer_session, monkeypatch):
    def boom():
        raise RuntimeError("a bug")

    monkeypatch.setattr(selectors, "model_list", boom)
    r = engineer_session.get("/api/v1/models/")
    assert r.status_code == 500 and "Retry-After" not in r


@pytest.mark.django_db
def test_healthz_lists_every_check_when_the_database_answers():
    r = Client().get("/healthz")
    body = r.json()
    assert r.status_code == 200
    assert body["checks"]["database"]["state"] == "ok"
    assert {"database", "workers", "serving"} <= set(body["checks"])
    assert body["status"] in ("ok", "degraded")


def test_a_hung_probe_costs_one_thread_and_callers_wait_at_most_the_bound(monkeypatch):
    monkeypatch.setattr(health, "PROBE_WAIT", 0.2)
    release, runs = threading.Event(), []

    def hung() -> health.Check:
        runs.append(threading.current_thread().name)
        release.wait(30)
        return health.Check("Broker", True, "reachable")

    probe = health.Probe("Broker", hung, ttl=60)
    answers: list[health.Check] = []
    callers = [threading.Thread(target=lambda: answers.append(probe())) for _ in range(20)]
    t0 = time.monotonic()
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    waited = time.monotonic() - t0
    assert len(runs) == 1  # one probe in flight, whatever the number of callers
    assert len(answers) == 20 and not any(a.ok for a in answers)
    assert waited < 10  # a hung dependency never holds a caller for good
    release.set()
    deadline = time.monotonic() + 10
    while probe().ok is False and time.monotonic() < deadline:
        time.sleep(0.05)
    assert probe() == health.Check("Broker", True, "reachable") and len(runs) == 1


def test_a_broker_refusing_a_task_never_fails_the_caller(settings, monkeypatch):
    settings.CLUSTERED = True
    declared = background._tasks["registry.validate_version"]

    def refuse(**kwargs):
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(declared.celery, "apply_async", refuse)
    with background.unsent_tasks() as unsent:
        background._send(declared, 0.0, {"version_id": 1})
    assert unsent == [("registry.validate_version",
                       "ConnectionError: Error 111 connecting to 127.0.0.1:6379. "
                       "Connection refused.")]
    with background.unsent_tasks() as later:  # a later request starts with nothing
        pass
    assert later == []


def test_not_found_is_not_mistaken_for_an_outage(engineer_session, monkeypatch):
    def missing():
        raise NotFound("no such model", field="model")

    monkeypatch.setattr(selectors, "model_list", missing)
    assert engineer_session.get("/api/v1/models/").status_code == 404


@pytest.mark.django_db
def test_a_value_the_database_cannot_store_is_a_400_not_a_500(engineer_session, monkeypatch):
    from django.db import DataError

    def refuse():
        raise DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")

    monkeypatch.setattr(selectors, "model_list", refuse)
    r = engineer_session.get("/api/v1/models/")
    assert r.status_code == 400
    assert r.json()["error"] == ("a value cannot be stored: PostgreSQL text fields cannot "
                                 "contain NUL (0x00) bytes")
