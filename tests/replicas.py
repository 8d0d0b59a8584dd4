"""Serving processes for integration specs: real `mmc-serve --registry` replicas (clustered) or the
single embedded console+serving process, on free loopback ports, against the test database."""

from __future__ import annotations

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


class Replica:
    def __init__(self, name: str, *, embedded: bool, log_dir: Path, port: int | None = None,
                 grpc: bool = False, **env):
        """`port`: a given one (a restart on the same address), else a free one. `grpc`: also
        the gRPC front, on a free port of its own (`grpc_address`)."""
        self.name, self.port = name, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if grpc:
            self.grpc_address = f"127.0.0.1:{free_port()}"
            env.setdefault("MMC_GRPC_PORT", self.grpc_address.rpartition(":")[2])
        if embedded:
            cmd = [sys.executable, "-m", "uvicorn", "console.asgi:application", "--port",
                   str(self.port), "--lifespan", "on", "--no-access-log", "--log-level", "warning",
                   "--http", "serving.protocol:GuardedHttpToolsProtocol"]  # as `manage.py start`
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
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v2/health/live", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not live: {self.log.read_text()[-3000:]}")

    def stop(self, sig_kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if sig_kill else self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@contextmanager
def replicas(n: int, *, embedded: bool, log_dir: Path, grpc: bool = False, **env):
    started = [Replica(f"r{i + 1}", embedded=embedded, log_dir=log_dir, grpc=grpc, **env)
               for i in range(n)]
    try:
        for r in started:
            r.wait_live()
        # ?wait counts the replicas that have reported: one live but not yet heard from would
        # let a deploy call itself converged before that replica loaded anything.
        from registry.models import ReplicaHeartbeat

        names = {r.name for r in started}
        wait_until(lambda: set(ReplicaHeartbeat.objects.filter(replica__in=names)
                               .values_list("replica", flat=True)) == names,
                   timeout=30, what=f"replicas {sorted(names)} to report")
        yield started
    finally:
        for r in started:
            r.stop()


def wait_until(predicate, timeout: float = 20, interval: float = 0.05, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
