"""The front door (deploy/haproxy.cfg, Debian's haproxy on loopback) in front of two real replicas:
traffic through it follows the registry's canary weight on both replicas, and a replica killed
with SIGKILL under load costs at most the requests it held, none once the proxy has marked it down.
Replicas: `mmc-serve --registry` (clustered) or the embedded console+serving process, on the test
database."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter

import httpx
import pytest

from registry import samples
from tests import frontdoor
from tests.conftest import CLUSTERED
from tests.replicas import replicas, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults,
              pytest.mark.skipif(bool(frontdoor.missing()), reason=frontdoor.missing())]
QUIET = {"MMC_ROLLOUT_TICK_SECONDS": "0"}
BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def post(client, model: str, path: str, body: dict) -> None:
    r = client.post(f"/api/v1/models/{model}/endpoint/{path}/?wait=20", body, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["convergence"]["converged"], r.json()


class Traffic:
    """`threads` keep-alive clients posting infer through the front door; each answer or failure
    is kept as (start, end, status or error, X-Served-By, X-Model-Version)."""

    def __init__(self, url: str, model: str, *, threads: int = 4, total: int | None = None):
        self.url, self.model, self.total = url, model, total
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.seen: list[tuple[float, float, str, str, str]] = []
        self.sent = 0
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def join(self) -> None:
        for t in self.threads:
            t.join()

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.stop.is_set():
                with self.lock:
                    if self.total is not None and self.sent >= self.total:
                        return
                    self.sent += 1
                t0 = time.monotonic()
                try:
                    r = http.post(f"/v2/models/{self.model}/infer", json=BODY)
                    what = str(r.status_code) if r.status_code != 200 or "outputs" in r.json() \
                        else "200 without outputs"
                    row = (t0, time.monotonic(), what, r.headers.get("x-served-by", ""),
                           r.headers.get("x-model-version", ""))
                except httpx.HTTPError as exc:
                    row = (t0, time.monotonic(), f"{type(exc).__name__}: {exc}", "", "")
                with self.lock:
                    self.seen.append(row)

    def failures(self) -> list[tuple[float, float, str, str, str]]:
        with self.lock:
            return [row for row in self.seen if row[2] != "200"]


def test_both_replicas_behind_the_front_door_follow_the_canary_weight(
        engineer, ready_model, tmp_path):
    ready_model("split", samples.mlp(seed=1))
    ready_model("split", samples.mlp(seed=2))
    with replicas(2, embedded=not CLUSTERED, log_dir=tmp_path, **QUIET) as (r1, r2):
        door = frontdoor.FrontDoor(tmp_path, {"r1": r1.url[7:], "r2": r2.url[7:]}).start()
        try:
            post(engineer, "split", "deploy", {"version": 1})
            post(engineer, "split", "canary", {"version": 2, "weight": 20})
            with Traffic(door.url, "split", total=5000) as traffic:
                traffic.join()
        finally:
            door.stop()
    assert traffic.failures() == []
    assert len(traffic.seen) == 5000
    by_replica = {name: Counter(row[4] for row in traffic.seen if row[3] == name)
                  for name in ("r1", "r2")}
    for versions in by_replica.values():
        served = sum(versions.values())
        assert served >= 1000, by_replica  # both replicas take a share of the load
        assert set(versions) == {"1", "2"}, by_replica
        assert abs(versions["2"] / served - 0.20) <= 0.03, by_replica
    assert abs(sum(v["2"] for v in by_replica.values()) / 5000 - 0.20) <= 0.03, by_replica


def test_a_replica_killed_under_load_costs_no_request_once_marked_down(
        engineer, ready_model, tmp_path):
    ready_model("steady", samples.mlp(seed=1))
    with replicas(2, embedded=not CLUSTERED, log_dir=tmp_path, **QUIET) as (r1, r2):
        door = frontdoor.FrontDoor(tmp_path, {"r1": r1.url[7:], "r2": r2.url[7:]}).start()
        try:
            post(engineer, "steady", "deploy", {"version": 1})
            with Traffic(door.url, "steady", threads=4) as traffic:
                wait_until(lambda: {r[3] for r in traffic.seen} >= {"r1", "r2"}
                           and len(traffic.seen) >= 200, 60, what="both replicas answering")
                r2.stop(sig_kill=True)
                killed = time.monotonic()
                wait_until(lambda: door.states()["r2"].startswith("DOWN"), 30, interval=0.02,
                           what="haproxy to mark r2 down")
                down = time.monotonic()
                wait_until(lambda: sum(1 for r in traffic.seen if r[0] > down) >= 300, 60,
                           what="300 answers after r2 was marked down")
            states = door.states()
        finally:
            door.stop()
    failures = traffic.failures()
    in_window = [f for f in failures if f[0] <= down]
    after = [f for f in failures if f[0] > down]
    # A request r2 held when it died is retried on r1 (retry-on empty-response) unless r2 had
    # already sent part of its answer: at most what it held then (about half of 4 clients).
    assert len(in_window) <= 2, (in_window, down - killed)
    assert after == [], after
    assert states == {"r1": "UP", "r2": "DOWN"}
    assert {r[3] for r in traffic.seen if r[0] > down} == {"r1"}


def test_compose_publishes_inference_only_through_the_front_door_it_configures():
    import yaml

    compose = yaml.safe_load((frontdoor.REPO / "docker-compose.yml").read_text())["services"]
    assert "ports" not in compose["serving"]  # replicas scale without host-port clashes
    assert compose["frontdoor"]["ports"] == ["8080:8080", "9001:9001"]  # HTTP, gRPC
    mount = "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"
    assert mount in compose["frontdoor"]["volumes"]
    r = subprocess.run(["haproxy", "-c", "-f", str(frontdoor.CONFIG)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    servers = [line.split() for line in frontdoor.CONFIG.read_text().splitlines()
               if line.strip().startswith("server-template")]
    assert [s[3] for s in servers] == ["serving:8001", "serving:9001"]  # HTTP, gRPC
    assert all("resolvers" in s for s in servers)


def test_grpc_through_the_front_door_reaches_both_replicas_and_streams(engineer, ready_model,
                                                                       tmp_path):
    """The gRPC listener (HTTP/2 end to end): tritonclient.grpc unchanged, unary calls spread
    over both replicas (their health read on the HTTP port), a stream answered in full."""
    import numpy as np
    import tritonclient.grpc as tgrpc

    ready_model("fast", samples.mlp(seed=1))
    with replicas(2, embedded=not CLUSTERED, log_dir=tmp_path, grpc=True, **QUIET) as (r1, r2):
        door = frontdoor.FrontDoor(tmp_path, {"r1": r1.url[7:], "r2": r2.url[7:]},
                                   grpc={"r1": r1.grpc_address, "r2": r2.grpc_address}).start()
        try:
            post(engineer, "fast", "deploy", {"version": 1})
            wait_until(lambda: all(row["status"] == "UP" for row in door.grpc_rows().values()),
                       30, interval=0.1, what="both gRPC servers up behind haproxy")
            client = tgrpc.InferenceServerClient(door.grpc_address)
            assert client.is_server_ready() and client.is_model_ready("fast")
            x = np.full((1, 64), 0.5, dtype=np.float32)
            inputs = [tgrpc.InferInput("x", [1, 64], "FP32")]
            inputs[0].set_data_from_numpy(x)
            answers = [client.infer("fast", inputs).as_numpy("y") for _ in range(40)]
            assert all(np.array_equal(a, answers[0]) for a in answers)
            got = []
            client.start_stream(callback=lambda result, error: got.append(error or result))
            for i in range(20):
                client.async_stream_infer("fast", inputs, request_id=str(i))
            client.stop_stream()  # waits for every answer
            client.close()
            served = {name: stats for name, stats in door.grpc_sessions().items()}
        finally:
            door.stop()
    assert len(got) == 20 and all(not isinstance(g, Exception) for g in got), got[:3]
    assert all(n > 0 for n in served.values()), served  # leastconn used both replicas
