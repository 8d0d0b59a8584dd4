"""`mmc-serve --workers N`: several serving processes on one port (serving/process/supervisor.py),
each
with the drain, restarted when one dies, answering statistics for all of them
(serving/process/siblings.py). Real processes on a real model repository."""

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
from serving.core.stats import VersionStats
from serving.process import supervisor
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


def _listening(pids: set[int], port: int) -> set[int]:
    """Which of `pids` hold a socket listening on `port` (/proc/net/tcp*, /proc/PID/fd)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    found = set()
    for pid in pids:
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            found.add(pid)
    return found


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
    # At once, while the new worker loads its models: it does not listen yet, so the kernel
    # gives every new connection to the other; none is told "starting".
    _infer_on_new_connections(two_workers, 16)
    assert two_workers.proc.poll() is None
    # ... and once it has loaded them it listens beside the other: two workers take the port
    workers = _children(two_workers.proc.pid)
    _wait(lambda: _listening(workers, two_workers.port) == workers, 60, "both to listen")


class _Loading:
    """An app whose models load until `loaded` is set: what a restarted worker serves."""

    def __init__(self) -> None:
        self.loaded = False
        self.dataplane = self  # DrainingServer asks app.dataplane.ready()

    def ready(self) -> tuple[bool, str]:
        return self.loaded, "loading"

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def test_a_restarted_worker_listens_only_once_its_models_are_loaded():
    """Held (a worker started again while the others serve), it opens its SO_REUSEPORT socket
    once ready: until then the kernel gives new connections to the workers listening, and no
    client is told "starting"."""
    import asyncio

    import uvicorn

    from serving.http.server import DrainingServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = _Loading()
    server = DrainingServer(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="warning"), app=app, held=True)

    async def scenario() -> None:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        with pytest.raises(ConnectionRefusedError):  # not listening at all while it loads
            await asyncio.open_connection("127.0.0.1", port)
        app.loaded = True
        deadline = time.monotonic() + 5
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "never listened once ready"
                await asyncio.sleep(0.05)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 200")
        writer.close()
        server.should_exit = True
        await serving

    asyncio.run(scenario())


def test_a_worker_knows_when_its_supervisor_is_gone(monkeypatch):
    monkeypatch.setenv(supervisor.ENV_WORKER_INDEX, "0")
    monkeypatch.setenv(supervisor.ENV_SUPERVISOR_PID, str(os.getppid()))
    assert not supervisor.supervisor_gone()
    monkeypatch.setenv(supervisor.ENV_SUPERVISOR_PID, str(os.getpid()))  # not its parent
    assert supervisor.supervisor_gone()
    monkeypatch.delenv(supervisor.ENV_WORKER_INDEX)  # a lone process has no supervisor
    assert not supervisor.supervisor_gone()


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
    monkeypatch.setattr("serving.core.gpu.gpu_available", lambda: False)
    assert supervisor.resolve_workers("auto") == supervisor.AUTO_MAX_WORKERS
    monkeypatch.setattr(supervisor, "usable_cpus", lambda: 2)
    assert supervisor.resolve_workers("auto") == 2
    monkeypatch.setattr("serving.core.gpu.gpu_available", lambda: True)
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
