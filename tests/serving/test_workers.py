"""`mmc-serve --workers N`: several serving processes on one port (serving/supervisor.py), each
with the drain, restarted when one dies, answering statistics for all of them
(serving/siblings.py). Real processes on a real model repository."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from registry import samples
from serving import supervisor
from serving.stats import VersionStats
from tests.serving.test_app import Server, write_model

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                    "data": [1.0, 2.0, 3.0, 4.0]}]}


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return {int(p) for p in out.split()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead to us
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "mlp", "1", samples.mlp(4, (8,), 2),
                {"max_batch_size": 8, "max_queue_delay_us": 0})
    return root


def wait_both_ready(server: Server) -> None:
    server.wait_ready()
    _wait(lambda: len(_children(server.proc.pid)) == 2, 30, "two workers")
    # wait_ready saw one worker ready; the other may still be loading (a busy host): 16 new
    # connections in a row ready (each lands on either worker) say both are
    _wait(lambda: all(httpx.get(f"{server.url}/v2/health/ready", timeout=5).status_code
                      == 200 for _ in range(16)), 60, "both workers ready")


@pytest.fixture
def two_workers(repository: Path):
    server = Server(repository, MMC_SERVE_WORKERS="2", MMC_DRAIN_SECONDS="2")
    try:
        wait_both_ready(server)
        yield server
    finally:
        server.stop()


def _infer_on_new_connections(server: Server, n: int) -> None:
    for _ in range(n):  # a new connection each: the kernel hands them to either worker
        with httpx.Client(base_url=server.url, timeout=10) as client:
            r = client.post("/v2/models/mlp/infer", json=BODY)
            assert r.status_code == 200, r.text


def test_statistics_count_every_workers_requests_whichever_worker_answers(two_workers):
    _infer_on_new_connections(two_workers, 30)
    for _ in range(6):  # each on a new connection: either worker answers for both
        stats = httpx.get(f"{two_workers.url}/v2/models/mlp/stats", timeout=10).json()
        (entry,) = stats["model_stats"]
        assert entry["inference_stats"]["success"]["count"] == 30
        assert entry["inference_count"] == 30
    metrics = httpx.get(f"{two_workers.url}/metrics", timeout=10).text
    series = {line.split("replica=\"")[1].split("\"")[0]: int(line.rsplit(" ", 1)[1])
              for line in metrics.splitlines()
              if line.startswith("nv_inference_request_success{")}
    assert set(series) == {"test-r1-w0", "test-r1-w1"}  # one series per worker process
    assert sum(series.values()) == 30


def test_a_worker_that_dies_is_started_again_and_the_port_keeps_answering(two_workers):
    before = _children(two_workers.proc.pid)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    _wait(lambda: len(_children(two_workers.proc.pid) - before) == 1, 30, "a new worker")
    assert victim not in _children(two_workers.proc.pid)
    # At once, while the new worker loads its models: the connections the kernel gives it
    # wait (their clients retry) until it can answer; none is told "starting".
    _infer_on_new_connections(two_workers, 16)
    assert two_workers.proc.poll() is None


def test_a_restarted_workers_socket_completes_no_connection_until_it_is_admitted():
    """A restarted worker listens refusing from its first moment: a connection completed
    before the refusal would wait in its queue and then be told "starting"."""
    listener = supervisor.reuse_port_listener("127.0.0.1", 0, refuse=True)
    port = listener.getsockname()[1]
    try:
        with pytest.raises(TimeoutError):  # the SYN is dropped: no handshake
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        with pytest.raises(BlockingIOError):  # and nothing waits in the accept queue
            listener.accept()
        assert supervisor.admit_new_connections(listener)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            listener.settimeout(5)
            accepted, _ = listener.accept()
            accepted.close()
    finally:
        listener.close()


def test_sigterm_drains_every_worker_then_the_server_exits_0(two_workers):
    workers = _children(two_workers.proc.pid)
    client = httpx.Client(base_url=two_workers.url, timeout=10)  # one keep-alive connection
    assert client.post("/v2/models/mlp/infer", json=BODY).status_code == 200
    two_workers.proc.send_signal(signal.SIGTERM)
    # The workers drain: readiness refused (on new connections, so either worker says so) ...
    _wait(lambda: httpx.get(f"{two_workers.url}/v2/health/ready", timeout=5).status_code == 503,
          10, "readiness to be refused")
    # ... while the worker holding a connection still answers on it, and says it closes it.
    r = client.post("/v2/models/mlp/infer", json=BODY)
    assert r.status_code == 200 and r.headers.get("connection") == "close"
    client.close()
    assert two_workers.proc.wait(30) == 0
    assert not any(_alive(pid) for pid in workers)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{two_workers.url}/v2/health/live", timeout=2)


def test_a_stop_sent_to_the_whole_process_group_still_drains(repository: Path):
    """systemd, a terminal's Ctrl-C or `kill -- -PGID` signal the workers and the supervisor,
    which passes the signal on: each worker takes that for one stop, not a second (forcing)."""
    server = Server(repository, own_session=True, MMC_SERVE_WORKERS="2", MMC_DRAIN_SECONDS="2")
    try:
        wait_both_ready(server)
        client = httpx.Client(base_url=server.url, timeout=10)
        assert client.post("/v2/models/mlp/infer", json=BODY).status_code == 200
        os.killpg(server.proc.pid, signal.SIGTERM)
        _wait(lambda: httpx.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 503,
              10, "readiness to be refused")
        time.sleep(0.5)  # past the supervisor passing the signal on (it looks every 0.1 s)
        r = client.post("/v2/models/mlp/infer", json=BODY)
        assert r.status_code == 200 and r.headers.get("connection") == "close"
        client.close()
        assert server.proc.wait(30) == 0
    finally:
        server.stop()


def test_workers_are_not_left_behind_when_the_supervisor_is_killed(two_workers):
    workers = _children(two_workers.proc.pid)
    two_workers.proc.kill()
    two_workers.proc.wait()
    _wait(lambda: not any(_alive(pid) for pid in workers), 20, "the workers to exit")


def test_workers_that_cannot_start_stop_the_server_with_an_error(repository: Path):
    with socket.socket() as taken:  # the gRPC port, held without SO_REUSEPORT
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(repository, MMC_SERVE_WORKERS="2", MMC_GRPC_PORT=str(port))
        try:
            code = server.proc.wait(90)
        finally:
            server.stop()
    assert code != 0
    log = server.log.read_text()
    assert "times within" in log and "stopping" in log


def test_workers_flag_takes_a_count_or_auto(monkeypatch):
    assert supervisor.resolve_workers("3") == 3
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match="--workers"):
            supervisor.resolve_workers(bad)
    monkeypatch.setattr(supervisor, "usable_cpus", lambda: 16)
    monkeypatch.setattr("serving.runtime.gpu_available", lambda: False)
    assert supervisor.resolve_workers("auto") == supervisor.AUTO_MAX_WORKERS
    monkeypatch.setattr(supervisor, "usable_cpus", lambda: 2)
    assert supervisor.resolve_workers("auto") == 2
    monkeypatch.setattr("serving.runtime.gpu_available", lambda: True)
    assert supervisor.resolve_workers("auto") == 1


def test_usable_cpus_follow_the_affinity_mask():
    assert supervisor.usable_cpus() <= len(os.sched_getaffinity(0))
    assert supervisor.usable_cpus() >= 1


def test_version_statistics_add_up_across_workers():
    a, b = VersionStats("m", "1"), VersionStats("m", "1")
    a.record_execution(2, 2, 10, 100, 10)
    a.record_success(1_000_000)
    a.record_success(2_000_000)
    b.record_execution(1, 1, 5, 50, 5)
    b.record_success(3_000_000)
    b.record_failure(7)
    b.record_cold_start(0.25)
    total = VersionStats.merged([a, VersionStats.from_state(b.to_state())])
    t = total.to_triton()
    assert t["inference_stats"]["success"] == {"count": 3, "ns": 6_000_000}
    assert t["inference_stats"]["fail"] == {"count": 1, "ns": 7}
    assert t["execution_count"] == 2 and t["inference_count"] == 3
    assert {s["batch_size"]: s["compute_infer"]["count"] for s in t["batch_stats"]} == {1: 1, 2: 1}
    assert sum(total.latency_counts) == 3
    assert total.cold_starts == 1 and total.cold_start_last_s == 0.25
    assert total.since == min(a.since, b.since)


def test_a_daily_quota_counts_the_requests_of_every_worker(tmp_path: Path):
    root = tmp_path / "models"
    write_model(root, "mlp", "1", samples.mlp(4, (8,), 2),
                {"max_batch_size": 8, "limits": {"daily_quota": 6}})
    server = Server(root, MMC_SERVE_WORKERS="2", MMC_QUOTA_SYNC_SECONDS="0.05")
    try:
        wait_both_ready(server)
        codes = []
        for _ in range(14):  # new connections, slower than the sync: each worker knows the total
            with httpx.Client(base_url=server.url, timeout=10) as client:
                codes.append(client.post("/v2/models/mlp/infer", json=BODY).status_code)
            time.sleep(0.25)
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.stop()
    assert codes.count(200) == 6 and codes.count(429) == 8
    assert codes[:6] == [200] * 6

    def per_worker(name: str) -> dict[str, float]:
        found: dict[str, float] = {}
        for line in metrics.splitlines():
            if line.startswith(name + "{"):
                replica = line.split("replica=\"")[1].split("\"")[0]
                found[replica] = found.get(replica, 0) + float(line.rsplit(" ", 1)[1])
        return found

    admitted = per_worker("mmc_predict_requests_total")
    refused = per_worker("mmc_predict_rejected_total")
    assert sum(admitted.values()) == 6 and sum(refused.values()) == 8
    # Both workers took requests (14 connections all on one: 1 in 8,000), so each counted
    # against the one shared total: on its own count either would have let in 6.
    handled = {r: admitted.get(r, 0) + refused.get(r, 0) for r in {*admitted, *refused}}
    assert set(handled) == {"test-r1-w0", "test-r1-w1"}
