"""Scale to zero, end to end: the idle timeout is set per endpoint (API and console; validated,
audited, shipped with the route table); a real replica unloads an idle model (its resident
memory drops, the console says "scaled to zero"), answers the first request after it and records
the cold start; and a canary started while a cold start is under way fails no request."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.test import Client

from registry import samples, services
from registry.audit import Actor
from registry.models import AuditEvent, Endpoint, ReplicaHeartbeat
from registry.serving_source import build_desired_state
from tests.conftest import CLUSTERED
from tests.replicas import replicas, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
SYSTEM = Actor.system("test")
OUT = 4096  # outputs per row: a 64 x 4096 x 4096 MLP, ~68 MB of weights to free
FREED = 32 * 1024 * 1024  # what must leave: under half the weights, over twice the ~16 MB
# that an embedded replica (the console in the same process) allocates meanwhile
ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
MB = 1024 * 1024


def big(seed: int = 0) -> bytes:
    return samples.mlp(hidden=(4096,), n_out=OUT, seed=seed)


def rss(pid: int) -> int:
    """The process's resident memory in bytes, as the kernel counts it."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def version_state(replica: str, key: str) -> dict:
    versions = ReplicaHeartbeat.objects.filter(replica=replica).values_list(
        "versions", flat=True).first() or {}
    return versions.get(key) or {}


def set_idle(client, model: str, seconds, **extra):
    return client.put(f"/api/v1/models/{model}/endpoint/scale-to-zero/?wait=30",
                      {"after_seconds": seconds, **extra}, format="json")


def test_the_idle_timeout_is_validated_audited_and_shipped_with_the_route_table(
        engineer, admin, client_for, ready_model):
    ready_model("scorer", samples.mlp())
    services.endpoint_deploy(model_name="scorer", version_number=1, actor=SYSTEM)
    revision = Endpoint.objects.get(model__name="scorer").revision
    for bad, words in [(-1, "0 (never) or 1 to 604800"), (604801, "0 (never) or 1 to 604800"),
                       ("soon", "valid integer"), (1.5, "valid integer"), (None, "null")]:
        r = set_idle(engineer, "scorer", bad)
        assert r.status_code == 400, (bad, r.content)
        assert words in r.content.decode(), (bad, r.content)
    assert Endpoint.objects.get(model__name="scorer").revision == revision  # nothing written
    assert set_idle(client_for("viewer"), "scorer", 60).status_code == 403
    r = set_idle(engineer, "scorer", 60, reason="nightly traffic only")
    assert r.status_code == 200, r.content
    assert r.json()["scale_to_zero"]["after_seconds"] == 60
    assert Endpoint.objects.get(model__name="scorer").revision > revision
    assert build_desired_state().routes["scorer"].scale_to_zero_after_s == 60
    event = AuditEvent.objects.get(action="endpoint.scale_to_zero")
    assert (event.before, event.after, event.reason) == (
        {"scale_to_zero_after_seconds": 0}, {"scale_to_zero_after_seconds": 60},
        "nightly traffic only")
    assert set_idle(engineer, "scorer", 60).status_code == 200  # unchanged: no second event
    assert AuditEvent.objects.filter(action="endpoint.scale_to_zero").count() == 1
    # the console's card calls the same service
    page = Client()
    page.force_login(_user("engineer"))
    r = page.post("/models/scorer/deployment/scale-to-zero/", {"after_seconds": "-5"})
    assert r.status_code == 400 and "0 (never) or 1 to 604800" in r.content.decode()
    r = page.post("/models/scorer/deployment/scale-to-zero/", {"after_seconds": "0"})
    assert r.status_code == 302
    assert Endpoint.objects.get(model__name="scorer").scale_to_zero_after_seconds == 0
    html = page.get("/models/scorer/deployment/").content.decode()
    assert "off: the versions stay loaded" in html
    assert 'id="stz-after"' in html and 'value="0"' in html


def _user(username: str):
    from django.contrib.auth.models import User

    return User.objects.get(username=username)


def test_an_idle_replica_unloads_the_model_then_answers_the_first_request(
        engineer, ready_model, tmp_path):
    ready_model("big", big())
    services.endpoint_deploy(model_name="big", version_number=1, actor=SYSTEM)
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path) as (rep,):
        wait_until(lambda: version_state(rep.name, "big:1").get("state") == "READY",
                   timeout=60, what="big:1 loaded")
        with httpx.Client(base_url=rep.url, timeout=60) as http:
            assert http.post("/v2/models/big/infer", json=ROW).status_code == 200
            loaded = rss(rep.proc.pid)
            assert set_idle(engineer, "big", 1).status_code == 200
            wait_until(lambda: version_state(rep.name, "big:1").get("state") == "SCALED_TO_ZERO",
                       timeout=30, what="big:1 scaled to zero")
            # the weights leave the process: far more than anything else it allocates
            wait_until(lambda: rss(rep.proc.pid) < loaded - FREED, timeout=120,
                       what=f"RSS below {(loaded - FREED) // MB} MB (was {loaded // MB} MB)")
            assert http.get("/v2/health/ready").status_code == 200  # idle, not unready
            page = Client()
            page.force_login(_user("engineer"))
            html = page.get("/models/big/deployment/").content.decode()
            assert '<span class="badge badge-scaled_to_zero">scaled to zero</span>' in html
            r = http.post("/v2/models/big/infer", json=ROW)
            assert r.status_code == 200, r.text
            assert len(r.json()["outputs"][0]["data"]) == OUT
        # reported: the cold start, and the request counted with the one before the sleep
        stats = wait_until(lambda: ((s := version_state(rep.name, "big:1").get("stats") or {})
                                    .get("count") == 2 and s), timeout=30, what="2 requests")
        assert stats["cold_starts"] == 1 and stats["cold_start_last_s"] > 0
        body = engineer.get("/api/v1/models/big/endpoint/").json()["scale_to_zero"]
        assert body["after_seconds"] == 1
        assert [(c["version"], c["count"]) for c in body["cold_starts"]] == [(1, 1)]
        html = page.get("/models/big/deployment/").content.decode()
        assert 'class="cold-count">1</td>' in html
        assert f'{stats["cold_start_last_s"]:.2f} s' in html


def test_a_canary_started_during_a_cold_start_fails_no_request(engineer, ready_model,
                                                               tmp_path):
    ready_model("race", big())
    ready_model("race", samples.mlp(hidden=(16,), n_out=OUT, seed=2))  # same signature
    services.endpoint_deploy(model_name="race", version_number=1, actor=SYSTEM)
    services.scale_to_zero_set(model_name="race", seconds=1, actor=SYSTEM)
    # polling often, the replica picks the canary up while version 1 is still loading
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path, MMC_POLL_SECONDS="0.1") as (rep,):
        wait_until(lambda: version_state(rep.name, "race:1").get("state") == "SCALED_TO_ZERO",
                   timeout=60, what="race:1 scaled to zero")

        def infer(_):
            with httpx.Client(base_url=rep.url, timeout=60) as http:
                r = http.post("/v2/models/race/infer", json=ROW)
                return r.status_code, r.headers.get("x-model-version"), r.text[:200]

        with ThreadPoolExecutor(16) as pool:
            first = [pool.submit(infer, i) for i in range(8)]  # these wake version 1
            r = engineer.post("/api/v1/models/race/endpoint/canary/?wait=30",
                              {"version": 2, "weight": 50}, format="json")
            assert r.status_code == 200, r.content
            then = [pool.submit(infer, i) for i in range(8)]
            answers = [f.result() for f in first + then]
        assert [a[0] for a in answers] == [200] * 16, answers
        assert {a[1] for a in answers} <= {"1", "2"}
