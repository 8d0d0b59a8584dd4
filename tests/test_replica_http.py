"""Replicas that follow the control plane over HTTP (`mmc-serve --registry URL`) with a replica
credential and no database settings at all: they follow deploys, canaries, blue-green and
scale-to-zero; the credential is good for the replica API and refused by every other route; a
control plane that goes away leaves them serving, and saying why."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from registry import samples
from registry.audit import Actor
from registry.replica_api import CREDENTIAL_TTL_S
from registry.services.replicas import credential_create, credential_revoke
from tests.conftest import CLUSTERED
from tests.replicas import ControlPlane, following, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.25] * 64}]}


@pytest.fixture
def credential():
    _, raw = credential_create(name="fleet", actor=Actor.system("spec"))
    return raw


def infer(url: str, model: str, **headers) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", json=BODY, headers=headers, timeout=30)


def versions_answering(url: str, model: str, n: int = 40) -> set[str]:
    seen = set()
    for _ in range(n):
        r = infer(url, model)
        assert r.status_code == 200, r.text
        seen.add(r.json()["model_version"])
    return seen


def replica_row(engineer, name: str) -> dict:
    rows = engineer.get("/api/v1/replicas/").json()["replicas"]
    return next(r for r in rows if r["replica"] == name)


def no_database_in(pid: int) -> None:
    """The process was given no database settings and never loaded a database driver."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    names = {e.partition(b"=")[0].decode() for e in environ if e}
    assert not names & {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE",
                        "ARTIFACT_ROOT", "MMC_DATA_DIR"}, names
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "psycopg" not in maps and "libpq" not in maps and "_sqlite3" not in maps


def test_a_replica_without_database_settings_follows_deploys_canaries_blue_green_and_scale_to_zero(
        engineer, ready_model, credential, tmp_path):
    v1, v2 = samples.mlp(seed=1), samples.mlp(seed=2)
    ready_model("hx", v1)
    ready_model("hx", v2)
    with following(1, log_dir=tmp_path, token=credential) as (plane, (rep,)):
        no_database_in(rep.proc.pid)
        E = "/api/v1/models/hx/endpoint/"
        r = engineer.post(E + "deploy/?wait=20", {"version": 1}, format="json")
        assert r.status_code == 200 and r.json()["convergence"]["converged"], r.content
        assert versions_answering(rep.url, "hx", 5) == {"1"}
        x = np.full((1, 64), 0.25, np.float32)
        import onnxruntime as ort

        want = ort.InferenceSession(v1, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        got = infer(rep.url, "hx").json()["outputs"][0]["data"]
        np.testing.assert_allclose(got, want[0].ravel(), rtol=1e-5)

        r = engineer.post(E + "canary/?wait=20", {"version": 2, "weight": 50}, format="json")
        assert r.status_code == 200, r.content
        assert versions_answering(rep.url, "hx") == {"1", "2"}
        assert engineer.post(E + "promote/?wait=20", {}, format="json").status_code == 200
        wait_until(lambda: versions_answering(rep.url, "hx", 10) == {"2"}, timeout=20,
                   what="the promoted version alone")

        r = engineer.post(E + "blue-green/deploy/?wait=20", {"version": 1}, format="json")
        assert r.status_code == 200, r.content
        assert versions_answering(rep.url, "hx", 10) == {"2"}  # green is warm, not live
        assert engineer.post(E + "blue-green/switch/?wait=20", {},
                             format="json").status_code == 200
        wait_until(lambda: versions_answering(rep.url, "hx", 10) == {"1"}, timeout=20,
                   what="the switch to green")

        r = engineer.put(E + "scale-to-zero/?wait=20", {"after_seconds": 1}, format="json")
        assert r.status_code == 200, r.content
        wait_until(lambda: replica_row(engineer, "h1")["versions"].get("hx:1", {}).get(
            "state") == "SCALED_TO_ZERO", timeout=30, interval=0.3, what="hx to sleep")
        woke = infer(rep.url, "hx")  # a cold start, answered
        assert woke.status_code == 200 and woke.json()["model_version"] == "1", woke.text
        assert replica_row(engineer, "h1")["address"] == rep.url
        no_database_in(rep.proc.pid)


def api_paths() -> list[str]:
    """Every route of the REST API, its parameters filled with plausible values."""
    found = []

    def walk(patterns, prefix):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                found.append(prefix + str(p.pattern))

    walk(get_resolver().url_patterns, "/")
    paths = set()
    for raw in found:
        if not raw.startswith("/api/"):
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: "1" if "number" in m[1] or m[1] == "pk"
                      else "hx", raw)
        if "(" in path or "^" in path or "\\" in path:
            continue  # a regex route (format suffixes): its plain twin is listed
        paths.add(path)
    return sorted(paths)


def test_the_replica_credential_is_refused_by_every_api_route(client, engineer, ready_model,
                                                              credential):
    ready_model("hx", samples.mlp(seed=1))
    paths = api_paths()
    assert len(paths) > 40, paths
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {credential}"}
    refused = 0
    for path in paths:
        for method in ("get", "post", "put", "patch", "delete"):
            with_it = getattr(client, method)(path, **bearer).status_code
            anonymous = getattr(client, method)(path).status_code
            # refused (401/403), or answered as to anybody (a public route: sign-in, schema)
            assert with_it in (401, 403) or with_it == anonymous, (method, path, with_it)
            refused += with_it in (401, 403)
    assert refused > 4 * 40
    # ...and an API token, or no credential, is refused by the replica API
    token = engineer.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()["token"]
    from registry.replica_api import ReplicaApi

    async def calls():
        # the replica API's own ASGI app (console/asgi.py mounts it at /api/v1/replica/);
        # importing console.asgi here would start the embedded scheduler in this process
        transport = httpx.ASGITransport(app=ReplicaApi())
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as http:
            out = []
            for auth in (f"Bearer {token}", "", f"Bearer {credential}x"):
                r = await http.get("/api/v1/replica/desired-state",
                                   headers={"Authorization": auth} if auth else {})
                out.append((r.status_code, r.json()["error"]))
            return out

    for status, error in asyncio.run(calls()):
        assert status == 401 and "replica credential" in error


def row(name: str):
    from registry.models import ReplicaHeartbeat

    return ReplicaHeartbeat.objects.get(replica=name)


def test_desired_state_long_poll_snapshot_artifacts_and_heartbeat_refusals(
        engineer, ready_model, credential):
    """In process (ASGI): one snapshot for many replicas; a long poll answers at the next
    revision, else 304; artifacts only those the state references; a bad heartbeat is 400."""
    body = ready_model("hx", samples.mlp(seed=1))
    assert engineer.post("/api/v1/models/hx/endpoint/deploy/", {"version": 1},
                         format="json").status_code == 200
    from registry.replica_api import ReplicaApi

    auth = {"Authorization": f"Bearer {credential}"}
    replica_api = ReplicaApi()  # as console/asgi.py mounts it, without the rest of the console

    async def scenario():
        transport = httpx.ASGITransport(app=replica_api)
        async with httpx.AsyncClient(transport=transport, base_url="http://cp",
                                     headers=auth, timeout=60) as http:
            builds = replica_api.builds
            answers = await asyncio.gather(*[http.get("/api/v1/replica/desired-state")
                                             for _ in range(20)])
            assert {a.status_code for a in answers} == {200}
            assert replica_api.builds - builds <= 1  # 20 replicas, one snapshot
            etag = answers[0].headers["etag"]
            doc = answers[0].json()
            assert doc["routes"]["hx"]["stable"] == "1"
            sha = doc["versions"][0]["sha256"]
            assert sha == body["sha256"] and "artifact_path" not in doc["versions"][0]

            t0 = time.monotonic()
            same = await http.get("/api/v1/replica/desired-state?wait=0.5",
                                  headers={"If-None-Match": etag})
            assert same.status_code == 304 and time.monotonic() - t0 >= 0.4

            async def deploy_soon():
                await asyncio.sleep(0.5)
                await asyncio.to_thread(lambda: engineer.post(
                    "/api/v1/models/hx/endpoint/deploy/", {"version": None}, format="json"))

            waiting = asyncio.ensure_future(http.get(
                "/api/v1/replica/desired-state?wait=25", headers={"If-None-Match": etag}))
            await deploy_soon()
            moved = await asyncio.wait_for(waiting, 20)  # not the whole 25 s
            assert moved.status_code == 200 and moved.headers["etag"] != etag
            assert "hx" not in moved.json()["routes"]

            gone = await http.get(f"/api/v1/replica/artifacts/{sha}")
            assert gone.status_code == 404 and "not referenced" in gone.json()["error"]
            await asyncio.to_thread(lambda: engineer.post(
                "/api/v1/models/hx/endpoint/deploy/", {"version": 1}, format="json"))
            await asyncio.sleep(1.5)  # the watcher's next read (MMC_POLL_SECONDS)
            blob = await http.get(f"/api/v1/replica/artifacts/{sha}")
            assert blob.status_code == 200 and hashlib.sha256(blob.content).hexdigest() == sha

            bad = await http.put("/api/v1/replica/heartbeats/h9", content=b"{not json")
            assert bad.status_code == 400 and "not a heartbeat" in bad.json()["error"]
            bad = await http.put("/api/v1/replica/heartbeats/h9",
                                 json={"revision": 1, "versions": {"hx": {}},
                                       "address": "", "started_at": 1.0})
            assert bad.status_code == 400 and "model:number" in bad.json()["error"]
            big = await http.put("/api/v1/replica/heartbeats/h9",
                                 headers={"Content-Length": str(64 * 1024 * 1024)},
                                 content=b"")
            assert big.status_code == 413
            same = {"revision": 2, "same": True, "degraded": None, "address": "x",
                    "started_at": time.time()}
            unknown = await http.put("/api/v1/replica/heartbeats/h9", json=same)
            assert unknown.status_code == 409 and "send all" in unknown.json()["error"]
            full = {"revision": 1, "address": "x", "started_at": time.time(),
                    "versions": {"hx:1": {"state": "READY", "stats": {
                        "count": 3, "errors": 0, "latency_buckets": [3]}}}}
            ok = await http.put("/api/v1/replica/heartbeats/h9", json=full)
            assert ok.status_code == 204
            before = await asyncio.to_thread(row, "h9")
            await asyncio.sleep(0.05)
            ok = await http.put("/api/v1/replica/heartbeats/h9", json=same)  # as last reported
            assert ok.status_code == 204
            after = await asyncio.to_thread(row, "h9")
            assert after.versions == before.versions and after.revision == 2
            assert after.last_seen > before.last_seen
            changed = {"revision": 3, "address": "x", "started_at": time.time(),
                       "changed": {"hx:2": {"state": "LOADING"}}, "removed": ["hx:1"]}
            ok = await http.put("/api/v1/replica/heartbeats/h9", json=changed)
            assert ok.status_code == 204
            merged = await asyncio.to_thread(row, "h9")
            assert merged.versions == {"hx:2": {"state": "LOADING"}} and merged.revision == 3
            import registry.replica_api as api

            queue, api.HEARTBEAT_QUEUE = api.HEARTBEAT_QUEUE, 0  # a storm: shed the large ones
            try:
                big_state = {**full, "versions": {f"hx:{n}": {"state": "READY"}
                                                  for n in range(1, 400)}}
                shed = await http.put("/api/v1/replica/heartbeats/h9", json=big_state)
                assert shed.status_code == 503 and 2 <= int(shed.headers["retry-after"]) <= 10
                ok = await http.put("/api/v1/replica/heartbeats/h9", json=same)  # small: served
                assert ok.status_code == 204
            finally:
                api.HEARTBEAT_QUEUE = queue
            assert (await http.delete("/api/v1/replica/heartbeats/h9")).status_code == 204
            gone = await http.put("/api/v1/replica/heartbeats/h9", json=same)
            assert gone.status_code == 409  # left: the next heartbeat must carry everything

    asyncio.run(scenario())


def test_control_plane_down_the_replica_serves_and_says_why_then_follows_again(
        engineer, ready_model, credential, tmp_path):
    ready_model("hx", samples.mlp(seed=1))
    ready_model("hx", samples.mlp(seed=2))
    plane = ControlPlane(tmp_path)
    try:
        with following(1, log_dir=tmp_path, token=credential, control_plane=plane) as (_, reps):
            rep = reps[0]
            r = engineer.post("/api/v1/models/hx/endpoint/deploy/?wait=20", {"version": 1},
                              format="json")
            assert r.json()["convergence"]["converged"], r.content
            plane.stop()
            degraded = wait_until(lambda: httpx.get(f"{rep.url}/v2/health/ready",
                                                    timeout=5).json().get("degraded"),
                                  timeout=30, interval=0.3, what="the replica to say why")
            assert "did not answer" in degraded, degraded
            assert infer(rep.url, "hx").status_code == 200  # its last table, still served
            metrics = httpx.get(f"{rep.url}/metrics", timeout=5).text
            assert re.search(r'mmc_serving_degraded\{[^}]*\} 1\.0', metrics), metrics[-2000:]
            # the control plane comes back on its address: the replica follows again
            engineer.post("/api/v1/models/hx/endpoint/deploy/", {"version": 2}, format="json")
            plane = ControlPlane(tmp_path, port=plane.port)
            wait_until(lambda: infer(rep.url, "hx").json()["model_version"] == "2",
                       timeout=40, interval=0.3, what="the deploy made while it was away")
            wait_until(lambda: not httpx.get(f"{rep.url}/v2/health/ready",
                                             timeout=5).json().get("degraded"),
                       timeout=20, interval=0.3, what="the replica to say it follows again")
            # a revoked credential: refused from the next call; the replica says so and serves
            credential_revoke(prefix=credential.split("_")[1], actor=Actor.system("spec"))
            time.sleep(CREDENTIAL_TTL_S + 1)  # what the control plane believed is forgotten
            engineer.post("/api/v1/models/hx/endpoint/deploy/", {"version": 1}, format="json")
            why = wait_until(lambda: httpx.get(f"{rep.url}/v2/health/ready",
                                               timeout=5).json().get("degraded"),
                             timeout=40, interval=0.3, what="the refusal to show")
            assert "401" in why, why
            assert infer(rep.url, "hx").json()["model_version"] == "2"
    finally:
        plane.stop()


@pytest.mark.skipif(not CLUSTERED, reason="clustered: the control plane's notice over Redis")
def test_clustered_notice_reaches_http_replicas_at_once(engineer, ready_model, credential,
                                                        tmp_path):
    ready_model("hx", samples.mlp(seed=1))
    with following(2, log_dir=tmp_path, token=credential,
                   control_plane=None) as (_, reps):
        r = engineer.post("/api/v1/models/hx/endpoint/deploy/?wait=20", {"version": 1},
                          format="json")
        body = r.json()
        assert body["convergence"]["converged"] and body["convergence"]["replicas"] >= 2, body
        for rep in reps:
            assert infer(rep.url, "hx").status_code == 200


@pytest.mark.skipif(not CLUSTERED, reason="clustered: daily quotas counted in a shared Redis")
def test_http_replicas_count_one_daily_quota_in_the_quota_store_alone(engineer, ready_model,
                                                                     credential, tmp_path):
    import os

    ready_model("hx", samples.mlp(seed=1))
    quota_store = os.environ["REDIS_URL"]  # the tests' Redis; compose gives a database of its own
    with following(2, log_dir=tmp_path, token=credential, MMC_QUOTA_REDIS_URL=quota_store,
                   MMC_QUOTA_SYNC_SECONDS="0.2") as (_, (one, two)):
        assert engineer.post("/api/v1/models/hx/endpoint/deploy/?wait=20", {"version": 1},
                             format="json").status_code == 200
        r = engineer.put("/api/v1/models/hx/endpoint/limits/?wait=20", {"daily_quota": 4},
                         format="json")
        assert r.status_code == 200, r.content
        first = [infer(one.url, "hx").status_code for _ in range(3)]
        time.sleep(3)  # both replicas have synced the store many times (every 0.2 s)
        second = [infer(two.url, "hx").status_code for _ in range(3)]
        time.sleep(3)  # the last count reaches the store
        limits = engineer.get("/api/v1/models/hx/endpoint/").json()["limits"]
    assert first == [200, 200, 200] and second == [200, 429, 429], (first, second)
    assert limits["daily_quota"] == 4 and limits["used_today"] == 4, limits  # the console reads it
