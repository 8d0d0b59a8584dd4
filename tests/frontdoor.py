"""The front door (deploy/haproxy.cfg) as the specs and bench/frontdoor.py run it: Debian's haproxy
binary on loopback, in front of replicas on free ports. The config is the real file with only its
marked lines rewritten: the two binds (free loopback ports) and the DNS `server-template` (one
`server` line per replica, as there is no compose DNS here). Every other line (health checks,
retries, connection reuse, timeouts) is what compose runs."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from pathlib import Path

import httpx

from tests.replicas import free_port, wait_until

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "deploy" / "haproxy.cfg"
#: Which replica answered, for the specs only (the compose file does not tell clients).
SERVED_BY = "    http-response set-header X-Served-By %s"


def missing() -> str:
    """Why the front door cannot run here ('' when it can)."""
    if shutil.which("haproxy") is None:
        return "haproxy not installed (Debian: apt-get install -y haproxy)"
    return ""


def render(servers: dict[str, str], *, port: int, stats_port: int, grpc_port: int = 0,
           grpc: dict[str, str] | None = None, source: Path = CONFIG) -> str:
    """deploy/haproxy.cfg for loopback: `servers` maps a name to its `host:port`, `grpc` the
    same names to their gRPC `host:port` (health still read on the HTTP port)."""
    out = []
    for line in source.read_text().splitlines():
        marker = line.partition("# frontdoor: ")[2].strip()
        indent = line[: len(line) - len(line.lstrip())]
        if marker == "bind":
            out.append(f"{indent}bind 127.0.0.1:{port}")
        elif marker == "stats":
            out.append(f"{indent}bind 127.0.0.1:{stats_port}")
        elif marker == "servers":
            out += [f"{indent}server {name} {address}" for name, address in servers.items()]
            out.append(SERVED_BY)
        elif marker == "grpc-bind":
            out.append(f"{indent}bind 127.0.0.1:{grpc_port or free_port()} proto h2")
        elif marker == "grpc-servers":
            out += [f"{indent}server {name} {address} proto h2 check-proto h1 check port "
                    f"{servers[name].rpartition(':')[2]}"
                    for name, address in (grpc or {}).items()]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


class FrontDoor:
    """One haproxy process (foreground, `-db`) with its rendered config and log in `root`."""

    def __init__(self, root: Path, servers: dict[str, str],
                 grpc: dict[str, str] | None = None) -> None:
        self.root, self.servers = root, servers
        self.port, self.stats_port, self.grpc_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_address = f"127.0.0.1:{self.grpc_port}"
        self.config = root / "haproxy.cfg"
        self.config.write_text(render(servers, port=self.port, stats_port=self.stats_port,
                                      grpc_port=self.grpc_port, grpc=grpc))
        self.log = root / "haproxy.log"
        self.proc: subprocess.Popen | None = None

    def check(self) -> None:
        """haproxy's own validation of the rendered file (`-c`)."""
        r = subprocess.run(["haproxy", "-c", "-f", str(self.config)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise RuntimeError(f"haproxy -c: {r.stdout}{r.stderr}")

    def start(self, *, up: int | None = None, timeout: float = 30) -> FrontDoor:
        """Start it and wait until `up` servers (default: all) pass their health checks."""
        self.check()
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.config)],
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        want = len(self.servers) if up is None else up
        wait_until(lambda: self.proc.poll() is not None or len(self.up()) >= want, timeout,
                   interval=0.1, what=f"{want} servers up behind haproxy")
        if self.proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {self.log.read_text()[-3000:]}")
        return self

    def states(self) -> dict[str, str]:
        """Each server's status as haproxy's stats say it (UP, DOWN, `UP 1/2`, ...)."""
        r = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5)
        rows = csv.DictReader(io.StringIO(r.text.lstrip("# ")))
        return {row["svname"]: row["status"] for row in rows
                if row["pxname"] == "serving" and row["svname"] in self.servers}

    def grpc_rows(self) -> dict[str, dict]:
        """haproxy's stats row of each gRPC server line, by name."""
        r = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5)
        rows = csv.DictReader(io.StringIO(r.text.lstrip("# ")))
        return {row["svname"]: row for row in rows
                if row["pxname"] == "serving-grpc" and row["svname"] not in ("FRONTEND",
                                                                            "BACKEND")}

    def grpc_sessions(self) -> dict[str, int]:
        """Calls each gRPC server line took (its sessions, `stot`)."""
        return {name: int(row["stot"] or 0) for name, row in self.grpc_rows().items()}

    def up(self) -> set[str]:
        try:
            return {name for name, status in self.states().items() if status == "UP"}
        except httpx.HTTPError:
            return set()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
