"""Serving processes for integration specs: real `mmc-serve --registry` replicas (clustered) or the
single embedded console+serving process, on free loopback ports, against the test database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.conftest import REPO, child_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: What a replica that follows the control plane over HTTP is started with: nothing of the
#: control plane's (no database, Redis, Django settings or artifact folder).
REPLICA_ENV_KEYS = ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV")


def replica_env(token: str, cache_dir: Path, **extra) -> dict:
    env = {k: os.environ[k] for k in REPLICA_ENV_KEYS if k in os.environ}
    env.update({"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "MMC_REPLICA_TOKEN": token,
                "MMC_REPLICA_CACHE_DIR": str(cache_dir), "MMC_HEARTBEAT_SECONDS": "0.5"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Replica:
    def __init__(self, name: str, *, embedded: bool, log_dir: Path, port: int | None = None,
                 grpc: bool = False, follow: str | None = None, token: str = "", **env):
        """`port`: a given one (a restart on the same address), else a free one. `grpc`: also
        the gRPC front, on a free port of its own (`grpc_address`). `follow`: the control
        plane's URL: the replica follows it over HTTP with `token`, and is given no database
        settings at all."""
        self.name, self.port = name, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if grpc:
            self.grpc_address = f"127.0.0.1:{free_port()}"
            env.setdefault("MMC_GRPC_PORT", self.grpc_address.rpartition(":")[2])
        if follow:
            cmd = [sys.executable, "-m", "serving.cli", "--registry", follow, "--port",
                   str(self.port), "--replica", name, "--workers", "1"]
            self.log = log_dir / f"{name}.log"
            env = replica_env(token, log_dir / f"{name}-cache", MMC_REPLICA_ADDRESS=self.url,
                              **env)
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log.open("wb"),
                                         stderr=subprocess.STDOUT)
            return
        if embedded:
            cmd = [sys.executable, "-m", "uvicorn", "console.asgi:application", "--port",
                   str(self.port), "--lifespan", "on", "--no-access-log", "--log-level", "warning",
                   "--http", "serving.http.protocol:GuardedHttpToolsProtocol"]  # as manage.py start
            env.setdefault("MMC_EMBED_SERVING", "1")
            env.setdefault("MMC_REPLICA", name)
        else:
            cmd = [sys.executable, "-m", "serving.cli", "--registry", "--port", str(self.port),
                   "--replica", name]
        env.setdefault("MMC_REPLICA_ADDRESS", self.url)  # where a load test reaches it
        self.log = log_dir / f"{name}.log"
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(**env),
                                     stdout=self.log.open("wb"), stderr=subprocess.STDOUT)

    def wait_live(self, timeout: float = 60) -> None:
        wait_answering(self.proc, f"{self.url}/v2/health/live", self.log, timeout=timeout,
                       what=f"{self.name} live")

    def stop(self, sig_kill: bool = False) -> None:
        stop_process(self.proc, kill=sig_kill)


@contextmanager
def replicas(n: int, *, embedded: bool, log_dir: Path, grpc: bool = False, **env):
    started = [Replica(f"r{i + 1}", embedded=embedded, log_dir=log_dir, grpc=grpc, **env)
               for i in range(n)]
    try:
        reported_in(started)
        yield started
    finally:
        for r in started:
            r.stop()


def reported_in(started: list[Replica]) -> None:
    """Each replica live and heard from: ?wait counts the replicas that have reported, so one
    live but not yet heard from would let a deploy call itself converged before that replica
    loaded anything."""
    for r in started:
        r.wait_live()
    from registry.models import ReplicaHeartbeat

    names = {r.name for r in started}
    wait_until(lambda: set(ReplicaHeartbeat.objects.filter(replica__in=names)
                           .values_list("replica", flat=True)) == names,
               timeout=30, what=f"replicas {sorted(names)} to report")


def wait_answering(proc: subprocess.Popen, url: str, log: Path, *, timeout: float = 60,
                   ok=lambda status: status == 200, what: str = "the process") -> None:
    """Until `url` answers a status `ok` accepts; the process exiting first, or the time
    running out, raises with the end of its log."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: exited: {log.read_text()[-3000:]}")
        try:
            if ok(httpx.get(url, timeout=1).status_code):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not up after {timeout:g} s: {log.read_text()[-3000:]}")


def stop_process(proc: subprocess.Popen, *, kill: bool = False) -> None:
    """SIGTERM (or SIGKILL), then SIGKILL if it is still there 10 s later."""
    if proc.poll() is None:
        proc.kill() if kill else proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


class ControlPlane:
    """The console as a process of its own (uvicorn on console.asgi, as `manage.py start` runs
    it) on the test database, without its own serving: what HTTP-following replicas talk to."""

    def __init__(self, log_dir: Path, port: int | None = None, **env):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / "control-plane.log"
        env.setdefault("MMC_EMBED_SERVING", "0")
        env.setdefault("MMC_POLL_SECONDS", "0.5")
        cmd = [sys.executable, "-m", "uvicorn", "console.asgi:application", "--port",
               str(self.port), "--lifespan", "on", "--no-access-log", "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(**env),
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        wait_answering(self.proc, f"{self.url}/healthz", self.log, ok=lambda s: s < 500,
                       what="control plane")

    def stop(self) -> None:
        stop_process(self.proc)


@contextmanager
def following(n: int, *, log_dir: Path, token: str, control_plane: ControlPlane | None = None,
              **env):
    """A control plane and `n` replicas that follow it over HTTP, each reported in."""
    plane = control_plane or ControlPlane(log_dir)
    started = []
    try:
        started = [Replica(f"h{i + 1}", embedded=False, log_dir=log_dir, follow=plane.url,
                           token=token, **env) for i in range(n)]
        reported_in(started)
        yield plane, started
    finally:
        for r in started:
            r.stop()
        if control_plane is None:
            plane.stop()


def wait_until(predicate, timeout: float = 20, interval: float = 0.05, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
