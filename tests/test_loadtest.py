"""Load tests of a version: refused beyond the bounds, against a version taking real traffic
without confirm=true, or on a protected endpoint without a key; a real run against a live
embedded server stores req/s, percentiles and errors on the job and shows them on the version
page."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from registry import samples
from registry.models import AuditEvent, ReplicaHeartbeat
from tests.replicas import replicas, wait_until
from tests.test_jobs import wait_job

MLP = samples.mlp()


@pytest.fixture
def two_versions(ready_model, engineer):
    """mlp v1 deployed as stable (takes real traffic) and v2 ready, idle."""
    v1 = ready_model("mlp", MLP)
    v2 = ready_model("mlp", samples.mlp(seed=2))
    r = engineer.post("/api/v1/models/mlp/endpoint/deploy/", {"version": 1}, format="json")
    assert r.status_code == 200, r.content
    return v1, v2


def start(client, number: int, **body):
    return client.post(f"/api/v1/models/mlp/versions/{number}/loadtest/", body, format="json")


@pytest.mark.parametrize("body, field", [
    ({"requests": 0}, "requests"),
    ({"requests": 100_001}, "requests"),
    ({"seconds": 61}, "seconds"),
    ({"requests": 10, "concurrency": 33}, "concurrency"),
    ({"requests": 10, "seconds": 5}, "requests"),
    ({}, "requests"),
])
def test_a_load_test_beyond_the_bounds_is_refused_with_400(two_versions, engineer, body, field):
    r = start(engineer, 2, **body)
    assert r.status_code == 400, r.content
    assert field in r.json()["error"]


def test_a_version_taking_real_traffic_needs_confirm_and_the_refusal_names_the_rule(
        two_versions, engineer):
    r = start(engineer, 1, requests=10)
    assert r.status_code == 409
    assert "takes real traffic (stable of mlp)" in r.json()["error"]
    assert "confirm=true" in r.json()["error"]


def test_without_a_live_replica_running_the_version_the_load_test_is_refused(two_versions,
                                                                          engineer):
    r = start(engineer, 2, requests=10)
    assert r.status_code == 409 and "no replica is live" in r.json()["error"]


def test_a_protected_endpoint_needs_a_key_in_the_request(two_versions, engineer):
    assert engineer.post("/api/v1/models/mlp/endpoint/keys/", {"name": "app"},
                         format="json").status_code == 201
    r = start(engineer, 1, requests=10, confirm=True)
    assert r.status_code == 400 and "requires a predict key" in r.json()["error"]


def test_viewers_cannot_start_load_tests(two_versions, client_for):
    assert start(client_for("viewer"), 2, requests=10).status_code == 403


def test_a_load_test_against_a_live_embedded_server_stores_and_shows_its_result(
        two_versions, engineer, users, tmp_path):
    from django.test import Client

    browser = Client()
    browser.force_login(users["engineer"])
    with replicas(1, embedded=True, log_dir=tmp_path) as (rep,):
        wait_until(lambda: (ReplicaHeartbeat.objects.get(replica=rep.name).versions
                            .get("mlp:1", {}).get("state") == "READY"), timeout=30,
                   what="v1 loaded")
        assert ReplicaHeartbeat.objects.get(replica=rep.name).address == rep.url
        r = start(engineer, 1, requests=200, concurrency=4, confirm=True)
        assert r.status_code == 202, r.content
        job = r.json()
        assert job["kind"] == "loadtest" and job["params"]["replica"] == rep.name
        assert r["Location"] == f"/api/v1/jobs/{job['id']}/"
        done = wait_job(engineer, job["id"], timeout=60)
    assert done["status"] == "succeeded", done
    s = done["summary"]
    assert s["requests"] == 200 and s["ok"] == 200 and s["errors"] == {}
    assert s["rps"] > 0 and 0 < s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"]
    assert done["progress"]["rows_done"] == 200 and done["result_url"] is None
    event = AuditEvent.objects.get(action="job.create", target=job["id"])
    assert event.after["kind"] == "loadtest" and event.after["live_roles"] == ["stable"]

    page = browser.get("/models/mlp/versions/1/").content.decode()
    assert f'data-job="{job["id"]}" data-status="succeeded"' in page
    assert f">{s['rps']}<" in page
    other = browser.get("/models/mlp/versions/2/").content.decode()
    assert 'id="loadtest-compare"' in other and 'data-version="1"' in other
    detail = browser.get(f"/jobs/{job['id']}/").content.decode()
    assert f"{s['rps']} req/s" in detail


def test_the_key_is_passed_to_the_worker_but_never_stored(two_versions, engineer,
                                                          django_capture_on_commit_callbacks,
                                                          monkeypatch):
    from registry import background
    from registry.models import Job

    sent = []
    monkeypatch.setattr(background, "_send", lambda declared, delay, kwargs, *a: sent.append(
        (declared.name, kwargs)))
    assert engineer.post("/api/v1/models/mlp/endpoint/keys/", {"name": "app"},
                         format="json").status_code == 201
    ReplicaHeartbeat.objects.create(
        replica="r9", address="http://127.0.0.1:9", versions={"mlp:1": {"state": "READY"}},
        started_at=timezone.now(), last_seen=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        r = start(engineer, 1, requests=10, confirm=True, key="sekrit-key-123")
    assert r.status_code == 202, r.content
    assert sent == [("registry.run_job", {"job_id": r.json()["id"], "key": "sekrit-key-123"})]
    job = Job.objects.get(pk=r.json()["id"])
    stored = json.dumps(job.params) + json.dumps(
        list(AuditEvent.objects.values_list("after", flat=True)))
    assert "sekrit" not in stored and "sekrit" not in r.content.decode()


def test_an_idle_version_no_slot_references_is_loaded_for_its_test_and_unloaded_after(
        two_versions, engineer, tmp_path):
    """v2 is ready but neither stable, candidate, blue/green, shadow nor warm: the replica does
    not run it. The load test has it loaded (pinned only: unpinned traffic still goes to v1),
    runs, and the replica lets it go once the test is over."""
    from registry.serving_source import build_desired_state

    with replicas(1, embedded=True, log_dir=tmp_path) as (rep,):
        def state(key: str):
            return (ReplicaHeartbeat.objects.get(replica=rep.name).versions.get(key) or {}
                    ).get("state")

        wait_until(lambda: state("mlp:1") == "READY", timeout=30, what="v1 loaded")
        assert state("mlp:2") is None
        r = start(engineer, 2, requests=100, concurrency=2)
        assert r.status_code == 202, r.content
        job = r.json()
        assert job["params"]["load_first"] is True and job["params"]["replica"] == rep.name
        done = wait_job(engineer, job["id"], timeout=90)
        assert done["status"] == "succeeded", done
        assert done["summary"]["ok"] == 100
        route = build_desired_state().routes["mlp"]
        assert route.stable == "1" and "2" not in route.warm  # gone from the desired state
        wait_until(lambda: state("mlp:2") is None, timeout=30, what="v2 unloaded")


def test_while_its_test_runs_an_idle_version_is_desired_as_warm_never_weighted(two_versions,
                                                                               engineer):
    from registry.models import Job
    from registry.serving_source import build_desired_state

    ReplicaHeartbeat.objects.create(
        replica="r9", address="http://127.0.0.1:9", versions={"mlp:1": {"state": "READY"}},
        started_at=timezone.now(), last_seen=timezone.now())
    r = start(engineer, 2, requests=10)
    assert r.status_code == 202, r.content
    route = build_desired_state().routes["mlp"]
    assert route.warm == ("2",) and route.stable == "1" and route.candidate_weight == 0
    Job.objects.filter(pk=r.json()["id"]).update(status="cancelled")
    assert build_desired_state().routes["mlp"].warm == ()
