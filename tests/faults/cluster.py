"""A whole clustered product the fault specs may break: its own PostgreSQL and Redis on free
loopback ports (never the machine's shared ones), a console process, a Celery worker and beat.
Faults are injected into the real processes: SIGSTOP/SIGCONT (hung), kill -9, a stopped server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.replicas import free_port, wait_until

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), None)


def missing() -> str:
    """Why this machine cannot run the cluster ('' when it can)."""
    if PG_BIN is None or not (PG_BIN / "initdb").exists():
        return "PostgreSQL server binaries (initdb) not installed"
    if shutil.which("redis-server") is None:
        return "redis-server not installed"
    return ""


def _as_postgres(cmd: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


#: One MLP request (registry.samples.mlp: 64 inputs), as the load below posts it.
INFER = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


class Redis:
    def __init__(self, root: Path):
        self.port, self.root = free_port(), root
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.root)],
            stdout=(self.root / "redis.log").open("ab"), stderr=subprocess.STDOUT)
        wait_until(self.answers, 10, what="redis to start")

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.resume()
            self.kill()


class Postgres:
    def __init__(self):
        # Its own folder straight under /tmp: the postgres user cannot pass pytest's 0700 ones.
        root = Path(tempfile.mkdtemp(prefix="mmc-pg-"))
        root.chmod(0o755)
        self.root, self.port, self.data = root, free_port(), root / "pgdata"
        self.socket_dir = root / "pgsock"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/mmc"
        self.log = root / "postgres.log"

    def init(self) -> None:
        for path in (self.data, self.socket_dir):
            path.mkdir(parents=True)
            shutil.chown(path, "postgres") if os.geteuid() == 0 else None
        self.log.touch()
        shutil.chown(self.log, "postgres") if os.geteuid() == 0 else None
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust",
                                     "-U", "postgres", "--no-sync"]),
                       check=True, capture_output=True)
        self.start()
        subprocess.run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                        "-U", "postgres", "mmc"], check=True, capture_output=True)

    def start(self) -> None:
        subprocess.run(_as_postgres([
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "start",
            "-o", f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c max_connections=200"]), check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m",
                                     "immediate", "-w", "stop"]), capture_output=True)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def query_ok(self) -> bool:
        return subprocess.run([str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p",
                               str(self.port)], capture_output=True).returncode == 0

    def query(self, sql: str) -> str:
        return subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                               "-d", "mmc", "-tAc", sql],
                              check=True, capture_output=True, text=True).stdout.strip()

    def connections(self) -> int:
        """Client backends connected to the product's database (not this psql itself)."""
        return int(self.query("SELECT count(*) FROM pg_stat_activity WHERE datname = 'mmc' "
                              "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"))


class Process:
    """A product process (console, worker, beat) with its log; Popen in its own session so a
    kill -9 of the group takes its children with it."""

    def __init__(self, name: str, cmd: list[str], env: dict, log_dir: Path, cwd: Path = REPO):
        self.name, self.cmd, self.env, self.cwd = name, cmd, env, cwd
        self.log = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Process:
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()

    def threads(self) -> int:
        return int(next(line.split()[1] for line in
                        Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
                        if line.startswith("Threads:")))

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]


class Cluster:
    """PostgreSQL + Redis + console + Celery worker + beat, all this object's own."""

    def __init__(self, root: Path, *, repo: Path = REPO, **settings):
        self.root, self.repo = root, repo  # repo: the checkout whose product runs (a bench's
        # --before runs an older one)
        self.redis, self.pg = Redis(root), Postgres()
        self.console_port = free_port()
        self.url = f"http://127.0.0.1:{self.console_port}"
        self.settings = settings
        self.token = ""
        self.console = self.worker = self.beat = None

    def env(self, **extra) -> dict:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("MMC_", "DATABASE_URL", "REDIS_URL", "DJANGO_"))}
        env = {**base, "DATABASE_URL": self.pg.url, "REDIS_URL": self.redis.url,
               "SECRET_KEY": "fault-specs-only", "SECURE_COOKIES": "0",
               "MMC_DATA_DIR": str(self.root / "data"), "MMC_EMBED_SERVING": "0",
               "DJANGO_SETTINGS_MODULE": "console.settings", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": str(self.repo), "MMC_OUTBOUND_ALLOW": "127.0.0.1/32"}
        env.update({k: str(v) for k, v in {**self.settings, **extra}.items()})
        return env

    def manage(self, *args: str, code: str | None = None) -> str:
        cmd = ([sys.executable, "-c", code] if code
               else [sys.executable, "manage.py", *args])
        return subprocess.run(cmd, cwd=self.repo, env=self.env(), check=True,
                              capture_output=True, text=True, timeout=120).stdout

    def up(self) -> Cluster:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.pg.init()
        self.redis.start()
        self.manage("start", "--no-serve", "--no-demo")
        self.token = self.manage(code=(
            "import django; django.setup()\n"
            "from django.contrib.auth.models import Group, User\n"
            "from registry.models import ApiToken\n"
            "u = User.objects.create_user('eng', password='x' * 12)\n"
            "u.groups.add(Group.objects.get(name='engineer'))\n"
            "print(ApiToken.objects.create(user=u)[1])\n")).strip()
        self.console = Process("console", [
            sys.executable, "-m", "uvicorn", "console.asgi:application", "--port",
            str(self.console_port), "--no-access-log", "--log-level", "warning"],
            self.env(), self.root, self.repo).start()
        self.worker = self.start_worker()
        self.beat = Process("beat", [sys.executable, "-m", "celery", "-A", "console", "beat",
                                     "--loglevel=INFO", "-s", str(self.root / "beat-schedule")],
                            self.env(), self.root, self.repo).start()
        wait_until(lambda: self.get("/api/v1/models/").status_code == 200, 60,
                   what="console to start")
        return self

    def start_worker(self, name: str = "worker") -> Process:
        worker = Process(name, [sys.executable, "-m", "celery", "-A", "console", "worker",
                                "--concurrency=2", "--loglevel=INFO", "--without-gossip",
                                "--without-mingle", "-n", f"{name}@%h"],
                         self.env(), self.root, self.repo).start()
        wait_until(lambda: b"ready." in worker.log.read_bytes() or worker.proc.poll() is not None,
                   60, what=f"{name} to start")
        if worker.proc.poll() is not None:
            raise RuntimeError(worker.tail())
        return worker

    def start_replica(self, name: str, port: int | None = None, **env) -> Process:
        """An `mmc-serve --registry` replica of this cluster's product (its own session, its log
        in root/<name>.log, appended to on a restart): `.port` and `.url` say where it listens.
        The caller stops it (`stop()`: SIGTERM, `kill9()`)."""
        port = port or free_port()
        replica = Process(name, [sys.executable, "-m", "serving.cli", "--registry", "--port",
                                 str(port), "--replica", name],
                          self.env(**env), self.root, self.repo).start()
        replica.port, replica.url = port, f"http://127.0.0.1:{port}"
        return replica

    def restart_console(self, timeout: float = 60) -> Process:
        """A new console process on the same port (after a kill9 or stop of the old one)."""
        old = self.console
        self.console = Process("console", old.cmd, old.env, self.root, self.repo).start()
        wait_until(lambda: self.get("/api/v1/models/", timeout=5).status_code == 200, timeout,
                   what="console to start again")
        return self.console

    def down(self) -> None:
        for proc in (self.beat, self.worker, self.console):
            if proc:
                proc.stop()
        self.redis.stop()
        self.pg.remove()

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path: str, timeout: float = 30, **kw) -> httpx.Response:
        return self.request("GET", path, timeout, **kw)

    def post(self, path: str, timeout: float = 30, **kw) -> httpx.Response:
        return self.request("POST", path, timeout, **kw)

    def put(self, path: str, timeout: float = 30, **kw) -> httpx.Response:
        return self.request("PUT", path, timeout, **kw)

    def request(self, method: str, path: str, timeout: float = 30, **kw) -> httpx.Response:
        """The answer, or a 599 standing for the transport error (time-out, refused)."""
        try:
            return httpx.request(method, self.url + path, headers=self.headers(),
                                 timeout=timeout, **kw)
        except httpx.TransportError as exc:
            return httpx.Response(599, text=f"{exc.__class__.__name__}: {exc}")


class Load:
    """`threads` clients, each with its own keep-alive pool, posting `model`'s infer in a loop.
    A refused connect (nothing sent) or a 503 with Retry-After is retried, not a drop; anything
    else that is not a 200 (a reset, a 404, a 5xx without Retry-After) is a drop."""

    def __init__(self, url: str, threads: int = 4, model: str = "scorer") -> None:
        self.url, self.model = url, model
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok: list[float] = []  # when each 200 came back
        self.retried: Counter = Counter()  # what a client may retry: not drops
        self.drops: list[tuple[float, str]] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)

    def oks_since(self, moment: float) -> int:
        with self.lock:
            return sum(1 for t in self.ok if t > moment)

    def first_ok_after(self, moment: float) -> float | None:
        with self.lock:
            return next((t for t in self.ok if t > moment), None)

    def drop_kinds(self) -> Counter:
        with self.lock:
            return Counter(what.split(":")[0] for _, what in self.drops)

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self.stop.is_set():
                try:
                    r = http.post(f"/v2/models/{self.model}/infer", json=INFER)
                except httpx.ConnectError:  # nothing was sent: retry
                    self._note_retry("ConnectError")
                    continue
                except httpx.HTTPError as exc:  # sent, and lost
                    self._drop(f"{type(exc).__name__}: {exc}")
                    continue
                if r.status_code == 200:
                    with self.lock:
                        self.ok.append(time.monotonic())
                elif r.status_code == 503 and "retry-after" in r.headers:
                    self._note_retry("503 with Retry-After")
                else:
                    self._drop(f"{r.status_code} {r.text[:200]}")

    def _note_retry(self, what: str) -> None:
        with self.lock:
            self.retried[what] += 1
        time.sleep(0.005)

    def _drop(self, what: str) -> None:
        with self.lock:
            self.drops.append((time.monotonic(), what))
