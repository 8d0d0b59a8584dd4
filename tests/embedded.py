"""`manage.py start` as a user starts it (embedded mode), in a data folder of its own, for the
specs that need the one-process server itself: the README's lines, the load test's default
address, the attack suite on the embedded listeners."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.replicas import free_port


@dataclass
class Embedded:
    proc: subprocess.Popen
    url: str
    log: Path

    @property
    def password(self) -> str:
        """The first admin's password, as the server printed it once."""
        return re.search(r"Created user 'admin' with password (\S+)", self.log.read_text())[1]


@contextmanager
def embedded_start(tmp_path: Path, env: dict, *args: str,
                   ready_path: str = "/v2/health/ready", timeout: float = 120):
    """`manage.py start --port <free> *args` with `env` (plus MMC_DATA_DIR under `tmp_path`),
    up once `ready_path` answers 200; stopped (SIGTERM, then kill) on leaving."""
    port = free_port()
    log = tmp_path / "start.log"
    env = {"MMC_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1", **env}
    proc = subprocess.Popen([sys.executable, "manage.py", "start", "--port", str(port), *args],
                            cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"manage.py start did not come up:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}{ready_path}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield Embedded(proc, url, log)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
