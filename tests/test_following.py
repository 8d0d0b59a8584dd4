"""Serving follows the registry: deploys reach every replica, no request fails while the stable
changes, replicas report what they run, and an outage of Redis doesn't stop serving."""

import subprocess
import threading
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from registry import samples
from tests.conftest import CLUSTERED
from tests.replicas import free_port, replicas, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
N_REPLICAS = 2 if CLUSTERED else 1  # embedded mode is one process: console + serving


def deploy(client, model, version, wait=15):
    r = client.post(f"/api/v1/models/{model}/endpoint/deploy/?wait={wait}",
                    {"version": version}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def reference(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]


def test_deploy_reaches_every_replica_which_serves_the_right_answers(engineer, ready_model,
                                                                     tmp_path):
    v1 = samples.mlp(seed=1)
    ready_model("scorer", v1)
    with replicas(N_REPLICAS, embedded=not CLUSTERED, log_dir=tmp_path) as reps:
        body = deploy(engineer, "scorer", 1)
        assert body["convergence"]["converged"], body
        assert body["convergence"]["replicas"] == N_REPLICAS
        x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
        for rep in reps:
            client = triton.InferenceServerClient(rep.url.removeprefix("http://"))
            assert client.is_model_ready("scorer")
            inp = triton.InferInput("x", [3, 64], "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            result = client.infer("scorer", [inp])
            np.testing.assert_allclose(result.as_numpy("y"), reference(v1, x), rtol=1e-5)
            assert result.get_response()["model_version"] == "1"
        state = engineer.get("/api/v1/replicas/").json()
        assert state["converged"] == N_REPLICAS
        row = state["replicas"][0]
        assert row["versions"]["scorer:1"]["state"] == "READY", row


def test_new_stable_under_load_loses_no_request(engineer, ready_model, tmp_path):
    ready_model("live", samples.mlp(seed=1))
    ready_model("live", samples.mlp(seed=2))
    with replicas(N_REPLICAS, embedded=not CLUSTERED, log_dir=tmp_path) as reps:
        deploy(engineer, "live", 1)
        stop, seen, failures = threading.Event(), [], []
        body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                            "data": [0.5] * 64}]}

        def loop(url):
            with httpx.Client(base_url=url, timeout=10) as http:
                while not stop.is_set():
                    r = http.post("/v2/models/live/infer", json=body)
                    if r.status_code != 200:
                        failures.append((r.status_code, r.text))
                    else:
                        seen.append(r.headers["x-model-version"])

        threads = [threading.Thread(target=loop, args=(rep.url,)) for rep in reps for _ in
                   range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert deploy(engineer, "live", 2)["convergence"]["converged"]
        time.sleep(0.5)
        assert deploy(engineer, "live", 1)["convergence"]["converged"]
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
        assert failures == []
        assert {"1", "2"} <= set(seen) and seen[-1] == "1"
        assert len(seen) > 50


def test_unpinned_requests_need_a_key_once_the_endpoint_has_one(engineer, ready_model,
                                                                tmp_path):
    ready_model("secure", samples.mlp())
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path) as (rep,):
        deploy(engineer, "secure", 1)
        body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                            "data": [0] * 64}]}
        assert httpx.post(f"{rep.url}/v2/models/secure/infer", json=body).status_code == 200
        key = engineer.post("/api/v1/models/secure/endpoint/keys/", {"name": "app"},
                            format="json").json()["key"]
        wait_until(lambda: httpx.post(f"{rep.url}/v2/models/secure/infer",
                                      json=body).status_code == 401, what="key required")
        r = httpx.post(f"{rep.url}/v2/models/secure/infer", json=body,
                       headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
        assert httpx.post(f"{rep.url}/v2/models/secure/infer", json=body,
                          headers={"X-Api-Key": key}).status_code == 200
        r = httpx.post(f"{rep.url}/v2/models/secure/infer", json=body,
                       headers={"X-Api-Key": key + "x"})
        assert r.status_code == 401 and r.json()["error"]


def test_repository_unload_and_load_act_through_the_registry(engineer, admin, ready_model,
                                                            users, tmp_path):
    from registry.audit import Actor
    from registry.services import token_create

    ready_model("repo", samples.mlp())
    _, token = token_create(username="engineer", name="triton", actor=Actor.system("t"))
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path) as (rep,):
        client = triton.InferenceServerClient(rep.url.removeprefix("http://"),
                                              )
        with pytest.raises(Exception):  # noqa: B017 - no token: refused
            client.load_model("repo")
        client.load_model("repo", headers={"Authorization": f"Bearer {token}"})
        assert engineer.get("/api/v1/models/repo/endpoint/").json()["stable"] == 1
        wait_until(lambda: client.is_model_ready("repo"), what="repo ready")
        client.unload_model("repo", headers={"Authorization": f"Bearer {token}"})
        assert engineer.get("/api/v1/models/repo/endpoint/").json()["stable"] is None
        actions = [e["action"] for e in admin.get("/api/v1/audit/?model=repo").json()["results"]]
        assert actions[:2] == ["endpoint.undeploy", "endpoint.deploy"]


@pytest.mark.skipif(not CLUSTERED, reason="Redis exists in the clustered mode only")
def test_replicas_keep_serving_while_redis_is_down_and_catch_up_after(engineer, ready_model,
                                                                      tmp_path):
    ready_model("steady", samples.mlp(seed=1))
    ready_model("steady", samples.mlp(seed=2))
    port = free_port()
    redis_cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no"]
    private = subprocess.Popen(redis_cmd, stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        with replicas(2, embedded=False, log_dir=tmp_path,
                      REDIS_URL=f"redis://127.0.0.1:{port}/0") as reps:
            deploy(engineer, "steady", 1)
            private.kill()
            private.wait()
            body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                                "data": [1] * 64}]}
            for rep in reps:
                for _ in range(20):
                    r = httpx.post(f"{rep.url}/v2/models/steady/infer", json=body)
                    assert r.status_code == 200 and r.headers["x-model-version"] == "1"
            # the registry database still answers: polling converges without pub/sub
            assert deploy(engineer, "steady", 2)["convergence"]["converged"]
            for rep in reps:
                r = httpx.post(f"{rep.url}/v2/models/steady/infer", json=body)
                assert r.headers["x-model-version"] == "2"
            private = subprocess.Popen(redis_cmd, stdout=subprocess.DEVNULL)
            time.sleep(0.5)
            assert deploy(engineer, "steady", 1)["convergence"]["converged"]
    finally:
        private.kill()


def test_upload_then_validation_then_serving_via_the_cli(users, tmp_path):
    """The CI flow: mmc upload --wait, mmc deploy --wait, then infer."""
    from registry.audit import Actor
    from registry.services import token_create

    _, token = token_create(username="engineer", name="cli", actor=Actor.system("t"))
    model_file = tmp_path / "m.onnx"
    model_file.write_bytes(samples.mlp(seed=4))
    with replicas(1, embedded=True, log_dir=tmp_path) as (console,):
        env = {"MMC_URL": console.url, "MMC_TOKEN": token}

        def mmc(*args):
            import os
            import sys

            return subprocess.run([sys.executable, "-m", "registry.cli.main", *args],
                                  env={**os.environ, **env}, capture_output=True, text=True)

        assert mmc("create-model", "cli-model", "--tag", "ci").returncode == 0
        r = mmc("upload", "cli-model", str(model_file), "--metadata", '{"commit": "c0ffee"}',
                "--wait", "60")
        assert r.returncode == 0, r.stderr
        assert '"status": "ready"' in r.stdout
        again = mmc("upload", "cli-model", str(model_file))
        assert "already version 1" in again.stderr
        assert mmc("alias", "cli-model", "production", "1").returncode == 0
        r = mmc("deploy", "cli-model", "1", "--wait", "15")
        assert r.returncode == 0, r.stdout + r.stderr
        bad = mmc("deploy", "cli-model", "7")
        assert bad.returncode == 1 and "no version 7" in bad.stderr
        assert "production" in mmc("versions", "cli-model").stdout


def test_replica_metrics_reach_the_registry_as_per_version_windows(engineer, ready_model,
                                                                   tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from registry.metrics import version_series, version_window

    ready_model("metered", samples.mlp())
    since = timezone.now() - timedelta(seconds=1)
    with replicas(N_REPLICAS, embedded=not CLUSTERED, log_dir=tmp_path) as reps:
        deploy(engineer, "metered", 1)
        body = {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32",
                            "data": [0.25] * 128}]}
        for rep in reps:
            for _ in range(15):
                assert httpx.post(f"{rep.url}/v2/models/metered/infer",
                                  json=body).status_code == 200
        expected = 15 * len(reps)
        window = wait_until(
            lambda: (w := version_window("metered", 1, since))["count"] == expected and w,
            what=f"{expected} requests in the metrics window")
        assert window["errors"] == 0 and window["error_rate"] == 0
        assert 0 < window["p50_ms"] <= window["p99_ms"] < 5000
        assert window["rps"] > 0
        points = version_series("metered", 1, seconds=120)
        assert sum(p["count"] for p in points) >= 1
