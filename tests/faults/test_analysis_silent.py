"""Celery beat killed under a running automated canary: the analysis tick stops, and the console
notices (health, 3 tick intervals later), drops the candidate's weight to 0 and audits it; the
analysis resumes only once beat runs again. A real cluster (tests/faults/cluster.py): its own
PostgreSQL, Redis, console, worker and beat.

Clustered pass only: the embedded pass has no beat to kill (its specs make the last-tick record
old instead: tests/test_analysis_watch.py)."""

from __future__ import annotations

import os

import pytest

from registry import samples
from tests.faults import cluster as faults
from tests.replicas import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.clustered, pytest.mark.timeout(240)]
if not os.environ.get("REDIS_URL"):
    pytestmark.append(pytest.mark.skip(reason="clustered pass only (needs Celery beat)"))
elif reason := faults.missing():
    pytestmark.append(pytest.mark.skip(reason=reason))

TICK = 1  # the rollout tick of this cluster (s): stale after 3 s
PLAN = {"steps": [20, 100], "bake_seconds": 600, "min_requests": 1_000_000}
ENDPOINT = "/api/v1/models/scorer/endpoint/"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = faults.Cluster(tmp_path_factory.mktemp("cluster"), MMC_ROLLOUT_TICK_SECONDS=TICK,
                       MMC_JOB_TICK_SECONDS=0, MMC_GC_SECONDS=0)
    try:
        yield c.up()
    finally:
        c.down()


def analysis_check(c) -> dict:
    r = c.get("/healthz", timeout=15)
    return r.json()["checks"].get("analysis", {}) if r.status_code == 200 else {}


def ready(c, number: int) -> bool:
    return c.get(f"/api/v1/models/scorer/versions/{number}/").json().get("status") == "ready"


def test_killing_beat_drops_the_running_candidate_to_zero_and_degrades_health(cluster):
    c = cluster
    assert c.post("/api/v1/models/", json={"name": "scorer"}).status_code == 201
    for number, seed in ((1, 1), (2, 2)):
        r = c.put("/api/v1/models/scorer/versions/upload/", content=samples.mlp(seed=seed))
        assert r.status_code == 201, r.text
        wait_until(lambda n=number: ready(c, n), 60, what=f"v{number} to be ready")
    assert c.post(f"{ENDPOINT}deploy/", json={"version": 1}).status_code == 200
    wait_until(lambda: analysis_check(c).get("state") == "ok", 30, what="beat's first tick")
    r = c.post(f"{ENDPOINT}canary/", json={"version": 2, "plan": PLAN})
    assert r.status_code == 200 and r.json()["candidate_weight"] == 20, r.text

    c.beat.kill9()
    wait_until(lambda: analysis_check(c).get("state") == "degraded", 30,
               what="health to say the analysis stopped")
    assert "canary analysis has not run for" in analysis_check(c)["detail"]
    ep = c.get(ENDPOINT).json()
    assert ep["candidate"] == 2 and ep["candidate_weight"] == 0, ep
    assert ep["rollout"]["analysis"]["paused"] is True
    assert c.pg.query("SELECT actor_name FROM registry_auditevent "
                      "WHERE action = 'endpoint.analysis.stale'") == "analysis-watch"
    r = c.post(f"{ENDPOINT}analysis/resume/", json={})
    assert r.status_code == 409 and "has not run for" in r.json()["error"], r.text

    c.beat = faults.Process("beat", c.beat.cmd, c.beat.env, c.root, c.repo).start()
    wait_until(lambda: analysis_check(c).get("state") == "ok", 30, what="beat to tick again")
    r = c.post(f"{ENDPOINT}analysis/resume/", json={})
    assert r.status_code == 200 and r.json()["candidate_weight"] == 20, r.text
