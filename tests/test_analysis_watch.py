"""Automated canary analysis cannot go silent: its tick records each pass; once it has not run
for 3 tick intervals, health is degraded naming it, a canary with a plan may not start or
resume (409), and a running analysis drops its candidate to 0 % by itself, audited, in whichever
process notices first (the console's health and pages, the scheduler's watch task, a replica
following the registry). Clocks are fed, or the last-tick record made old: nothing waits."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from registry import samples, services
from registry.audit import Actor
from registry.models import AuditEvent, Endpoint, TickRecord
from registry.services import analysis, analysis_watch
from registry.serving_source import RegistrySource, build_desired_state
from registry.tasks import analysis_watch_task
from registry.ticks import TICK, tick_age, tick_recorded

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = Actor.system("test")
PLAN = {"steps": [20, 100], "bake_seconds": 600, "min_requests": 10**6}


def silent_for(seconds: float) -> None:
    """The analysis tick last ran `seconds` ago (beat killed, Redis down, scheduler hung)."""
    TickRecord.objects.update_or_create(
        name=TICK, defaults={"last_run_at": timezone.now() - timedelta(seconds=seconds)})


@pytest.fixture
def analysing(ready_model):
    """scorer: v1 stable, v2 candidate at 20 % driven by a plan, while the tick runs."""
    ready_model("scorer", samples.mlp(seed=1))
    ready_model("scorer", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="scorer", version_number=1, actor=SYSTEM)
    tick_recorded()
    services.canary_start(model_name="scorer", version_number=2, plan=PLAN, actor=SYSTEM)
    assert Endpoint.objects.get(model__name="scorer").candidate_weight == 20
    return "scorer"


def endpoint() -> Endpoint:
    return Endpoint.objects.get(model__name="scorer")


def stale_events() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action="endpoint.analysis.stale"))


def test_a_silent_tick_drops_the_candidate_to_zero_audits_it_and_degrades_health(analysing):
    body = Client().get("/healthz").json()
    assert body["checks"]["analysis"]["state"] == "ok", body
    silent_for(95)
    body = Client().get("/healthz").json()
    assert body["status"] == "degraded"
    check = body["checks"]["analysis"]
    assert check["state"] == "degraded"
    assert check["detail"].startswith("canary analysis has not run for 95 s"), check
    ep = endpoint()
    assert ep.candidate_weight == 0 and ep.candidate.number == 2
    assert ep.rollout.analysis.paused and ep.rollout.analysis.step == 0
    assert build_desired_state().routes["scorer"].candidate_weight == 0
    (event,) = stale_events()
    assert event.actor_name == "analysis-watch"
    assert (event.before["candidate_weight"], event.after["candidate_weight"]) == (20, 0)
    assert "has not run for 95 s" in event.reason
    Client().get("/healthz")  # noticed again: nothing more to drop, nothing audited twice
    assert len(stale_events()) == 1


def test_a_fed_clock_finds_the_tick_stale_past_three_intervals_and_at_least_30_s(analysing):
    now = timezone.now()
    bound = settings.ANALYSIS_STALE_SECONDS
    assert bound == max(30.0, 3 * settings.ROLLOUT_TICK_SECONDS)
    assert not tick_age(now=now + timedelta(seconds=bound - 1)).stale
    assert analysis_watch.drop_stale(now=now + timedelta(seconds=bound - 1)) == []
    assert endpoint().candidate_weight == 20
    later = now + timedelta(seconds=bound + 80)
    assert tick_age(now=later).stale
    assert analysis_watch.drop_stale(now=later) == ["scorer"]
    assert endpoint().candidate_weight == 0 and len(stale_events()) == 1


def test_an_analysed_canary_is_refused_while_no_tick_runs(ready_model, engineer):
    ready_model("scorer", samples.mlp(seed=1))
    ready_model("scorer", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="scorer", version_number=1, actor=SYSTEM)
    url = "/api/v1/models/scorer/endpoint/canary/"
    r = engineer.post(url, {"version": 2, "plan": PLAN}, format="json")
    assert r.status_code == 409 and "Canary analysis has never run" in r.json()["error"]
    silent_for(95)
    r = engineer.post(url, {"version": 2, "plan": PLAN}, format="json")
    assert r.status_code == 409, r.content
    assert "has not run for 95 s" in r.json()["error"] and "by hand" in r.json()["error"]
    assert AuditEvent.objects.filter(action="endpoint.canary.refused").count() == 2
    r = engineer.post(url, {"version": 2, "weight": 10}, format="json")  # by hand: no tick
    assert r.status_code == 200 and r.json()["candidate_weight"] == 10


def test_a_dropped_analysis_resumes_only_once_the_tick_runs_again(analysing, engineer):
    silent_for(95)
    assert analysis_watch.drop_stale() == ["scorer"]
    r = engineer.post("/api/v1/models/scorer/endpoint/analysis/resume/", {}, format="json")
    assert r.status_code == 409 and "has not run for 95 s" in r.json()["error"]
    analysis.tick(metrics=lambda *a: {"count": 0, "errors": 0, "error_rate": None,
                                      "p99_ms": None})
    r = engineer.post("/api/v1/models/scorer/endpoint/analysis/resume/", {}, format="json")
    assert r.status_code == 200 and r.json()["candidate_weight"] == 20, r.content


def test_the_deployment_page_shows_the_tick_age_and_drops_a_stale_analysis(
        analysing, page_client):
    client = page_client("viewer")
    html = client.get("/models/scorer/deployment/").content.decode()
    # seconds counted from a record made a moment ago: a loaded machine may add one or two
    assert re.search(r"<strong>Analysis checks:</strong> ran \d s ago \(every 5 s\)", html)
    silent_for(95)
    html = client.get("/models/scorer/deployment/live/").content.decode()
    assert re.search(r"canary analysis has not run for 9[5-9] s", html)
    assert "endpoint.analysis.stale" in html  # the decisions list
    assert endpoint().candidate_weight == 0


@pytest.fixture
def page_client(users):
    def make(role: str) -> Client:
        client = Client()
        client.force_login(users[role])
        return client

    return make


def test_a_replica_following_the_registry_drops_a_stale_analysis(analysing, monkeypatch):
    monkeypatch.setattr(analysis_watch, "_last_watch", float("-inf"))
    silent_for(95)
    RegistrySource(address="test").revision()
    assert endpoint().candidate_weight == 0 and len(stale_events()) == 1


def test_the_scheduler_runs_the_watch_every_tick_interval(analysing):
    assert settings.PERIODIC_TASKS["registry.analysis_watch"] == settings.ROLLOUT_TICK_SECONDS
    assert analysis_watch_task() == 0  # the tick runs: nothing to do
    silent_for(95)
    assert analysis_watch_task() == 1 and endpoint().candidate_weight == 0
