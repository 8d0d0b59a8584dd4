#!/usr/bin/env python3
"""The fan-out of the control plane over HTTP: N simulated replicas following one console through
its replica API (registry/replica_api.py), as `mmc-serve --registry https://console …` does
(serving/sources/control_plane.py), against E endpoints.

    .venv/bin/python bench/fanout.py [--replicas 1000] [--endpoints 200] [--duration 60]
        [--heartbeat 2.0] [--deploy-every 10] [--clients 20] [--redis-db 9]
        [--admin-url postgres://postgres@127.0.0.1:5432/postgres]

It creates its own database (mmc_fanout_<pid>) on the server --admin-url names, migrates it, seeds
E models each with one ready version and an endpoint serving it (every tenth also a second version,
every twentieth at a 10 % canary), a viewer and an API token for the latency probe, and drops the
database at the end, whatever happens. It flushes Redis database --redis-db at the start and the
end, and starts the console as it runs in clustered mode:

    uvicorn console.asgi:application --port P --lifespan on --no-access-log --log-level warning
    (DATABASE_URL=<that database>, REDIS_URL=redis://…/<redis-db>, MMC_EMBED_SERVING=0,
     MMC_REPLICA_TOKEN=<a secret>)

Phases:
1. Baseline (--baseline s, 20): a probe process asks GET /api/v1/models/ with the API token at
   --probe-rate (5/s), with no replica connected.
2. Cold start: every replica's first GET of the desired state, all at once.
3. The fleet, --duration s: each replica is asyncio tasks in this one process (httpx.AsyncClient,
   the replicas spread over --clients clients per kind): one long poll held open continually
   (`GET desired-state?wait=25`, If-None-Match its ETag, gzip), and a heartbeat
   (`PUT heartbeats/<replica>`: one entry per loaded version with a VersionStats snapshot, as
   `Reconciler.observed` builds it) --heartbeat s after the previous one ended, first ones
   staggered over one interval, plus one at once after each new table (as `Reconciler.reconcile`
   does); one replica's heartbeats never overlap (its one source thread). Heartbeats time out
   after 10 s, as the replica's client does. Every --deploy-every s a real deploy
   (`endpoint_deploy`, audited, published on Redis) moves the revision; each replica's receipt
   of the new ETag (the whole body read) is timed from the deploy's commit. The probe runs again
   throughout.

Reported: deploy → received on all N (p50/p99/max per replica, time until the last); heartbeats/s
achieved vs asked, their latency and outcome, gaps per replica and the registry's own count of
lost replicas (no heartbeat for MMC_REPLICA_STALE_SECONDS, 10 s), sampled every 2 s; the probe's
p50/p95 before and during the fleet; CPU seconds of the console process, of PostgreSQL (every
backend on the server: other databases' load included, so the baseline's rate is given too), of
this simulator (and its event loop's lag, so a client-bound run reads as one), and of the whole
machine; pg_stat_database for the bench's database. Markdown to stdout and
bench/results/fanout-latest.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gzip
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "fanout-latest.md"
STATE = "/api/v1/replica/desired-state"
WAIT_S = 25.0  # serving.sources.control_plane.WAIT_SECONDS
TIMEOUT_S = 10.0  # HttpRegistrySource's timeout_seconds
STALE_S = 10.0  # MMC_REPLICA_STALE_SECONDS
TICK = os.sysconf("SC_CLK_TCK")

from serving.core.state_wire import FULL_HEARTBEAT_EVERY_S  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=1000)
    p.add_argument("--endpoints", type=int, default=200)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of the fleet")
    p.add_argument("--heartbeat", type=float, default=2.0,
                   help="MMC_HEARTBEAT_SECONDS (default 2.0); 0: no heartbeats at all (the "
                        "long polls alone)")
    p.add_argument("--full-heartbeats", action="store_true",
                   help="every heartbeat carries the whole state (as before heartbeats carried "
                        "only what changed)")
    p.add_argument("--deploy-every", type=float, default=10.0)
    p.add_argument("--baseline", type=float, default=20.0, help="probe seconds before the fleet")
    p.add_argument("--probe-rate", type=float, default=5.0, help="probe requests/s")
    p.add_argument("--clients", type=int, default=20,
                   help="httpx.AsyncClients per kind (long polls, heartbeats); replicas spread "
                        "over them")
    p.add_argument("--redis-db", type=int, default=9)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    p.add_argument("--admin-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--console-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the console (repeatable)")
    p.add_argument("--output", default=str(RESULTS))
    p.add_argument("--label", default="", help="a line under the title (what this run is)")
    # the probe process (internal)
    p.add_argument("--probe", metavar="BASE_URL", help=argparse.SUPPRESS)
    p.add_argument("--probe-seconds", type=float, help=argparse.SUPPRESS)
    p.add_argument("--probe-out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def quantile(values, q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- CPU accounting from /proc -------------------------------------------------------------------

def proc_cpu(pid: int, children: bool = False) -> float:
    """utime + stime of `pid` (its threads included), with its reaped children's if asked."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def postgres_cpu(postmaster: int) -> float:
    """The whole server's CPU: the postmaster, its live children (backends, walwriter, ...) and
    the children it reaped (CONN_MAX_AGE=0: a backend per connection; they count when gone)."""
    total = proc_cpu(postmaster, children=True)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine since boot, all cores."""
    parts = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    total = sum(parts[:8])
    return (total - idle) / TICK, total / TICK


class Meter:
    """CPU seconds of the console, PostgreSQL, this process and the machine between two marks."""

    def __init__(self, console_pid: int, postmaster: int | None) -> None:
        self.console_pid, self.postmaster = console_pid, postmaster

    def mark(self) -> dict[str, float]:
        busy, total = machine_cpu()
        me = os.times()
        return {"t": time.monotonic(), "console": proc_cpu(self.console_pid),
                "postgres": postgres_cpu(self.postmaster) if self.postmaster else float("nan"),
                "simulator": me.user + me.system, "machine": busy, "machine_total": total}

    @staticmethod
    def delta(a: dict, b: dict) -> dict[str, float]:
        d = {k: b[k] - a[k] for k in a}
        d["seconds"] = d.pop("t")
        return d


# -- the database, Django, the console -----------------------------------------------------------

class Database:
    """Our own database on the server: created at start, dropped at the end."""

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.psycopg, self.admin_url = psycopg, admin_url
        self.name = f"mmc_fanout_{os.getpid()}"
        base = admin_url.rsplit("/", 1)[0]
        self.url = f"{base}/{self.name}"

    def __enter__(self) -> Database:
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *exc) -> None:
        if "django" in sys.modules:
            from django.db import connections

            connections.close_all()
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def postmaster(self) -> int | None:
        """The server's postmaster pid, if it runs on this machine (our backend's parent)."""
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            try:  # read while the backend lives
                fields = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()
                return int(fields[1])
            except OSError:
                return None

    def stats(self) -> dict[str, float]:
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit, xact_rollback, sessions, tup_inserted, tup_updated, "
                "tup_fetched, blks_hit + blks_read FROM pg_stat_database WHERE datname = %s",
                (self.name,)).fetchone()
        keys = ("commits", "rollbacks", "sessions", "inserted", "updated", "fetched", "blocks")
        return dict(zip(keys, (float(v) for v in row), strict=True))


def console_env(db: Database, redis_url: str, data_dir: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MMC_", "REDIS_URL", "DJANGO_", "DATABASE_URL"))}
    env.update({"DATABASE_URL": db.url, "REDIS_URL": redis_url, "MMC_EMBED_SERVING": "0",
                "SECRET_KEY": "x", "DJANGO_SETTINGS_MODULE": "console.settings",
                "MMC_DATA_DIR": data_dir, "MMC_REPLICA_TOKEN": token})
    return env


def setup_django(env: dict[str, str]) -> None:
    """This process's Django on the same database and Redis (the deploys publish there)."""
    for key in [k for k in os.environ if k.startswith(("MMC_", "REDIS_URL", "DJANGO_"))]:
        del os.environ[key]
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY",
                                           "DJANGO_SETTINGS_MODULE", "MMC_DATA_DIR")})
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)  # = manage.py migrate with the console's environment
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # Django's config logs every request


def flush_redis(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


def seed(endpoints: int) -> list[str]:
    """E models, one ready version each (every tenth a second one, every twentieth at a 10 %
    canary), an endpoint serving each; returns the models a deploy can move (two versions, no
    canary)."""
    from django.db import transaction

    from registry import samples
    from registry.models import Endpoint, ModelVersion, RegisteredModel, VersionStatus
    from registry.notify import bump_revision
    from registry.signatures import read_signature

    signature = read_signature(samples.mlp())
    with transaction.atomic():
        models = RegisteredModel.objects.bulk_create(
            RegisteredModel(name=f"model-{i:05d}") for i in range(endpoints))
        versions = []
        for i, m in enumerate(models):
            for number in (1, 2) if i % 10 == 0 else (1,):
                versions.append(ModelVersion(
                    model=m, number=number, sha256=f"{i:032x}{number:032x}", size_bytes=18_000,
                    signature=signature, status=VersionStatus.READY, max_batch_size=32))
        ModelVersion.objects.bulk_create(versions)
        by_model = defaultdict(dict)
        for v in ModelVersion.objects.all():
            by_model[v.model_id][v.number] = v
        rows, movable = [], []
        for i, m in enumerate(models):
            mine = by_model[m.pk]
            canary = i % 20 == 10
            rows.append(Endpoint(model=m, stable=mine[1],
                                 candidate=mine.get(2) if canary else None,
                                 candidate_weight=10 if canary else 0))
            if 2 in mine and not canary:
                movable.append(m.name)
        Endpoint.objects.bulk_create(rows)
        bump_revision()
    return movable


def api_token() -> str:
    """A viewer and its API token, made through the services as an admin would."""
    from registry.audit import Actor
    from registry.services import ensure_roles, token_create
    from registry.services.users import user_create

    actor = Actor.system("fanout")
    ensure_roles()
    user_create(username="fanout-probe", role="viewer", actor=actor)
    return token_create(username="fanout-probe", name="fanout probe", actor=actor)[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Console:
    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "console.asgi:application", "--port",
             str(self.port), "--lifespan", "on", "--no-access-log", "--log-level", "warning"],
            cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_up(self, token: str) -> None:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                r = httpx.get(self.base + "/api/v1/models/", timeout=2,
                              headers={"Authorization": f"Bearer {token}"})
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the console did not come up:\n{self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# -- the probe (its own process: the simulator's loop must not time it) ------------------------

def probe_main(args) -> int:
    import httpx

    token = os.environ["FANOUT_PROBE_TOKEN"]
    out, errors = [], 0
    period = 1.0 / args.probe_rate
    with httpx.Client(base_url=args.probe, timeout=30.0,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        start = time.monotonic()
        due = start
        while due < start + args.probe_seconds:
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            t0 = time.perf_counter()
            try:
                ok = client.get("/api/v1/models/").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                out.append(time.perf_counter() - t0)
            else:
                errors += 1
            due = max(due + period, time.monotonic() - period)  # behind: no catch-up burst
    Path(args.probe_out).write_text(json.dumps({"latencies": out, "errors": errors}))
    return 0


def start_probe(base: str, token: str, seconds: float, rate: float, out: Path):
    env = {**os.environ, "FANOUT_PROBE_TOKEN": token}
    return subprocess.Popen([sys.executable, __file__, "--probe", base, "--probe-seconds",
                             str(seconds), "--probe-rate", str(rate), "--probe-out", str(out)],
                            env=env)


def probe_result(proc, out: Path) -> dict:
    proc.wait()
    doc = json.loads(out.read_text())
    lat = doc["latencies"]
    return {"n": len(lat), "errors": doc["errors"], "p50": quantile(lat, 0.5),
            "p95": quantile(lat, 0.95), "max": max(lat, default=float("nan"))}


# -- the simulated fleet -------------------------------------------------------------------------

class Bodies:
    """Heartbeat bodies: the versions part (one entry per loaded version with a VersionStats
    snapshot) is encoded once per revision and second and shared by every replica, so the
    simulator's CPU goes to HTTP, not to 1,000 copies of the same JSON."""

    def __init__(self) -> None:
        from serving.core.stats import VersionStats

        self.VersionStats = VersionStats
        self.keys: dict[int, list[tuple[str, str]]] = {}  # revision -> loaded (model, version)
        self.stats: dict[tuple[str, str], object] = {}
        self.cache: dict[tuple[int, int], bytes] = {}
        self.snapshot_bytes: dict[int, tuple[int, int]] = {}  # revision -> (gzip'd, raw)

    def learn(self, revision: int, gzipped: bytes) -> None:
        if revision in self.keys:
            return
        raw = gzip.decompress(gzipped)
        doc = json.loads(raw)
        self.keys[revision] = [(v["model"], v["version"]) for v in doc["versions"]]
        self.snapshot_bytes[revision] = (len(gzipped), len(raw))

    def versions(self, revision: int) -> bytes:
        import orjson

        second = int(time.time())
        cached = self.cache.get((revision, second))
        if cached is None:
            if len(self.cache) > 16:
                self.cache.clear()
            versions = {}
            for key in self.keys[revision]:
                stats = self.stats.get(key)
                if stats is None:
                    stats = self.stats[key] = self.VersionStats(*key)
                versions[f"{key[0]}:{key[1]}"] = {
                    "state": "READY", "reason": None, "providers": ["CPUExecutionProvider"],
                    "queue_depth": 0, "stats": stats.snapshot()}
            cached = self.cache[(revision, second)] = orjson.dumps(versions)
        return cached

    def body(self, replica: Replica, *, since: int | None = None) -> bytes:
        """The whole observed state, or (`since`: the revision of the last acknowledged one)
        what changed since, as serving.sources.control_plane sends: `"same": true` within a
        revision (an idle version's counters do not move), else the versions the new revision
        added and the keys it dropped."""
        head = (f'{{"replica":"{replica.name}","revision":{replica.revision},'
                f'"degraded":null,"address":"{replica.address}",'
                f'"started_at":{replica.started_at},').encode()
        if since is None:
            return head + b'"versions":' + self.versions(replica.revision) + b"}"
        if since == replica.revision:
            return head + b'"same":true}'
        import orjson

        now, then = self.keys[replica.revision], set(self.keys.get(since, ()))
        changed = {}
        for key in now:
            if key not in then:
                stats = self.stats.get(key)
                if stats is None:
                    stats = self.stats[key] = self.VersionStats(*key)
                changed[f"{key[0]}:{key[1]}"] = {
                    "state": "READY", "reason": None, "providers": ["CPUExecutionProvider"],
                    "queue_depth": 0, "stats": stats.snapshot()}
        removed = [f"{m}:{v}" for m, v in then - set(now)]
        return head + b'"changed":' + orjson.dumps(changed) + b',"removed":' + \
            orjson.dumps(removed) + b"}"


class Replica:
    def __init__(self, index: int, poll_client, beat_client) -> None:
        self.name = f"sim-{index:04d}"
        self.address = f"http://10.1.{index // 250}.{index % 250 + 1}:8001"
        self.started_at = int(time.time())
        self.poll_client, self.beat_client = poll_client, beat_client
        self.etag = ""
        self.revision = 0
        self.received: dict[int, float] = {}  # revision -> when its body was in
        self.beats: list[float] = []  # when each heartbeat's 204 came
        self.beat_lock = asyncio.Lock()
        # the revision and moment of its last acknowledged full heartbeat: until the revision
        # moves (its versions change) or FULL_HEARTBEAT_EVERY_S pass, it says "same"
        self.reported_revision: int | None = None
        self.reported_at = 0.0
        self.quiet_until = 0.0  # a 503's Retry-After


class Fleet:
    def __init__(self, args, base: str, token: str) -> None:
        import httpx

        self.args, self.httpx = args, httpx
        self.bodies = Bodies()
        headers = {"Authorization": f"Bearer {token}", "User-Agent": "mmc-serve-sim"}
        per = -(-args.replicas // args.clients)
        # The replica's own client settings (HttpRegistrySource): 10 s timeouts, the read of a
        # long poll 10 s more than its wait, httpx's default keep-alive expiry (5 s).
        limits = httpx.Limits(max_connections=per + 2, max_keepalive_connections=per + 2)
        self.poll_clients = [httpx.AsyncClient(
            base_url=base, headers=headers, limits=limits,
            timeout=httpx.Timeout(TIMEOUT_S, read=WAIT_S + TIMEOUT_S, pool=None))
            for _ in range(args.clients)]
        self.beat_clients = [httpx.AsyncClient(
            base_url=base, headers={**headers, "Content-Type": "application/json"},
            limits=limits, timeout=httpx.Timeout(TIMEOUT_S, pool=None))
            for _ in range(args.clients)]
        self.replicas = [Replica(i, self.poll_clients[i % args.clients],
                                 self.beat_clients[i % args.clients])
                         for i in range(args.replicas)]
        self.beat_latency: list[float] = []
        self.beat_outcomes: dict[str, int] = defaultdict(int)
        self.beat_kinds: dict[str, int] = defaultdict(int)  # "full" / "same", acknowledged or not
        self.poll_outcomes: dict[str, int] = defaultdict(int)
        self.poll_errors: list[str] = []
        self.beat_errors: list[str] = []
        self.cold_latency: list[float] = []
        self.lag: list[float] = []
        self.window: tuple[float, float] | None = None
        self.deploys: list[tuple[int, float, float]] = []  # (revision, committed at, call s)
        self.lost_samples: list[tuple[float, int, int]] = []  # (t, lost, rows)
        self.stop = asyncio.Event()

    async def close(self) -> None:
        for c in self.poll_clients + self.beat_clients:
            await c.aclose()

    def counting(self) -> bool:
        return self.window is not None and self.window[0] <= time.monotonic() <= self.window[1]

    # -- one replica ------------------------------------------------------------------

    async def get_state(self, r: Replica, wait: float) -> bool:
        """One GET of the desired state; True when it brought a new revision."""
        params = {"wait": f"{wait:g}"} if wait else None
        headers = {"Accept-Encoding": "gzip"}
        if r.etag:
            headers["If-None-Match"] = r.etag
        async with r.poll_client.stream("GET", STATE, params=params, headers=headers) as resp:
            raw = b"".join([chunk async for chunk in resp.aiter_raw()])
            now = time.monotonic()
            if resp.status_code == 304:
                self.poll_outcomes["304"] += 1
                return False
            if resp.status_code != 200:
                self.poll_outcomes[str(resp.status_code)] += 1
                raise RuntimeError(f"desired state: {resp.status_code} {raw[:200]!r}")
            self.poll_outcomes["200"] += 1
            etag = resp.headers.get("etag", "")
            revision = int(etag.strip('"').lstrip("r"))
            if resp.headers.get("content-encoding") != "gzip":
                raw = gzip.compress(raw)
            self.bodies.learn(revision, raw)
            if revision > r.revision:
                r.etag, r.revision = etag, revision
                r.received.setdefault(revision, now)
                return True
            return False

    async def follow(self, r: Replica) -> None:
        """The long poll, held open continually (HttpRegistrySource._follow)."""
        delay = 0.2
        while not self.stop.is_set():
            try:
                changed = await self.get_state(r, WAIT_S)
            except Exception as exc:  # noqa: BLE001 - a replica keeps following
                if self.counting():
                    self.poll_outcomes[type(exc).__name__] += 1
                    self.poll_errors.append(f"{type(exc).__name__}: {exc}"[:200])
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2
            if changed and self.args.heartbeat > 0:  # the reconciler reports after a new table
                asyncio.get_running_loop().create_task(self.heartbeat(r))

    async def heartbeat(self, r: Replica) -> None:
        async with r.beat_lock:  # one source thread: a replica's calls never overlap
            if self.stop.is_set():
                return
            t0 = time.monotonic()
            if t0 < r.quiet_until:
                return
            whole = (self.args.full_heartbeats or r.reported_revision is None
                     or t0 - r.reported_at >= FULL_HEARTBEAT_EVERY_S)
            since = None if whole else r.reported_revision
            same = since == r.revision
            revision = r.revision
            try:
                resp = await r.beat_client.put(f"/api/v1/replica/heartbeats/{r.name}",
                                               content=self.bodies.body(r, since=since))
                if resp.status_code == 409 and not whole:  # none held: the whole state
                    whole, same = True, False
                    resp = await r.beat_client.put(f"/api/v1/replica/heartbeats/{r.name}",
                                                   content=self.bodies.body(r))
                outcome = str(resp.status_code)
                if outcome == "503":  # shed: the replica waits Retry-After before the next
                    retry = resp.headers.get("retry-after", "")
                    r.quiet_until = t0 + (float(retry) if retry.isdigit() else 5.0)
                if outcome == "204":
                    r.reported_revision = revision
                    if whole:
                        r.reported_at = t0
                if self.counting():
                    self.beat_kinds["full" if whole else "same" if same else "changes"] += 1
            except self.httpx.HTTPError as exc:
                outcome = type(exc).__name__
                if self.counting():
                    self.beat_errors.append(f"{outcome}: {exc}"[:200])
            t1 = time.monotonic()
            if self.counting():
                self.beat_outcomes[outcome] += 1
                if outcome == "204":
                    self.beat_latency.append(t1 - t0)
            if outcome == "204":
                r.beats.append(t1)

    async def beat_loop(self, r: Replica) -> None:
        await asyncio.sleep(random.uniform(0, self.args.heartbeat))
        while not self.stop.is_set():
            await self.heartbeat(r)
            await asyncio.sleep(self.args.heartbeat)

    # -- the run ------------------------------------------------------------------------

    async def cold_start(self) -> float:
        async def first(r: Replica) -> None:
            t0 = time.monotonic()
            for attempt in range(5):
                try:
                    await self.get_state(r, 0)
                    break
                except Exception as exc:  # noqa: BLE001
                    self.poll_errors.append(f"cold start {type(exc).__name__}: {exc}"[:200])
                    await asyncio.sleep(0.2 * 2 ** attempt)
            self.cold_latency.append(time.monotonic() - t0)

        t0 = time.monotonic()
        await asyncio.gather(*(first(r) for r in self.replicas))
        return time.monotonic() - t0

    async def lag_monitor(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.05)
            self.lag.append(time.monotonic() - t0 - 0.05)

    async def deployer(self, movable: list[str]) -> None:
        from registry.audit import Actor
        from registry.notify import current_revision
        from registry.services import endpoint_deploy

        stable = dict.fromkeys(movable, 1)

        def deploy(name: str, number: int) -> tuple[int, float, float]:
            t0 = time.monotonic()
            endpoint_deploy(model_name=name, version_number=number,
                            actor=Actor.system("fanout"), reason="fan-out bench")
            committed = time.monotonic()  # committed and published on Redis
            return current_revision(), committed, committed - t0

        start, end = self.window
        k = 1
        while start + k * self.args.deploy_every < end - 1.0:
            await asyncio.sleep(max(0.0, start + k * self.args.deploy_every - time.monotonic()))
            name = movable[(k - 1) % len(movable)]
            stable[name] = 2 if stable[name] == 1 else 1
            self.deploys.append(await asyncio.to_thread(deploy, name, stable[name]))
            k += 1

    async def lost_sampler(self) -> None:
        """The registry's own view: heartbeat rows older than the stale limit, every 2 s."""
        from datetime import timedelta

        from django.db import close_old_connections
        from django.utils import timezone

        from registry.models import ReplicaHeartbeat

        def count() -> tuple[int, int]:
            try:
                cutoff = timezone.now() - timedelta(seconds=STALE_S)
                rows = ReplicaHeartbeat.objects.count()
                return ReplicaHeartbeat.objects.filter(last_seen__lt=cutoff).count(), rows
            finally:
                close_old_connections()

        while not self.stop.is_set():
            await asyncio.sleep(2.0)
            lost, rows = await asyncio.to_thread(count)
            self.lost_samples.append((time.monotonic(), lost, rows))

    async def run(self, movable: list[str]) -> None:
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        self.window = (start, start + self.args.duration)
        tasks = [loop.create_task(self.lag_monitor()), loop.create_task(self.lost_sampler())]
        for r in self.replicas:
            tasks.append(loop.create_task(self.follow(r)))
            if self.args.heartbeat > 0:
                tasks.append(loop.create_task(self.beat_loop(r)))
        deployer = loop.create_task(self.deployer(movable))
        await asyncio.sleep(max(0.0, self.window[1] - time.monotonic()))
        self.stop.set()
        await deployer
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- main ----------------------------------------------------------------------------------------

def main() -> int:
    args = parse_args(sys.argv[1:])
    if args.probe:
        return probe_main(args)
    random.seed(0)
    wall0 = time.monotonic()
    redis_url = f"{args.redis_url.rstrip('/')}/{args.redis_db}"
    replica_token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="mmc-fanout-") as tmp, Database(args.admin_url) as db:
        env = console_env(db, redis_url, tmp, replica_token)
        for item in args.console_env:
            key, _, value = item.partition("=")
            env[key] = value
        flush_redis(redis_url)
        setup_django(env)
        movable = seed(args.endpoints)
        token = api_token()
        from registry.models import ModelVersion

        total_versions = ModelVersion.objects.count()
        console = Console(env, Path(tmp) / "console.log")
        try:
            console.wait_up(token)
            meter = Meter(console.proc.pid, db.postmaster())
            print(f"[fanout] {db.name}: {args.endpoints} endpoints, {total_versions} versions; "
                  f"console pid {console.proc.pid} at {console.base}; baseline "
                  f"{args.baseline:g} s", flush=True)
            out = Path(tmp) / "probe-baseline.json"
            m0 = meter.mark()
            baseline = probe_result(start_probe(console.base, token, args.baseline,
                                                args.probe_rate, out), out)
            m1 = meter.mark()
            result = asyncio.run(run_fleet(args, console, token, replica_token, movable, meter,
                                           db, tmp))
            fleet, cold, probe, marks, pg = result
            text = report(args, db, total_versions, console, baseline,
                          Meter.delta(m0, m1), fleet, cold, probe, marks, pg)
        except BaseException:
            print(console.tail(), file=sys.stderr)
            raise
        finally:
            console.stop()
            flush_redis(redis_url)
    print(text)
    Path(args.output).write_text(text)
    print(f"[fanout] done in {time.monotonic() - wall0:.0f} s; database {db.name} dropped, "
          f"Redis db {args.redis_db} flushed")
    return 0


async def run_fleet(args, console, token, replica_token, movable, meter, db, tmp):
    fleet = Fleet(args, console.base, replica_token)
    try:
        m0 = meter.mark()
        cold = await fleet.cold_start()
        m1 = meter.mark()
        revisions = {r.revision for r in fleet.replicas}
        print(f"[fanout] cold start: {args.replicas} first fetches in {cold:.1f} s "
              f"(revisions {sorted(revisions)}); fleet for {args.duration:g} s", flush=True)
        out = Path(tmp) / "probe-fleet.json"
        probe_proc = start_probe(console.base, token, args.duration, args.probe_rate, out)
        pg0 = await asyncio.to_thread(db.stats)
        m2 = meter.mark()
        await fleet.run(movable)
        m3 = meter.mark()
        pg1 = await asyncio.to_thread(db.stats)
        probe = await asyncio.to_thread(probe_result, probe_proc, out)
        if console.proc.poll() is not None:
            raise RuntimeError("the console exited during the run")
        return fleet, cold, probe, (Meter.delta(m0, m1), Meter.delta(m2, m3)), (pg0, pg1)
    finally:
        await fleet.close()


def ms(x: float) -> str:
    return f"{x * 1e3:,.0f}" if x == x else "–"


def report(args, db, total_versions, console, baseline, base_cpu, fleet, cold, probe, marks,
           pg) -> str:
    cold_cpu, cpu = marks
    elapsed = cpu["seconds"]
    n = args.replicas
    loaded = max((len(k) for k in fleet.bodies.keys.values()), default=0)
    sizes = fleet.bodies.snapshot_bytes
    last = max(sizes) if sizes else None
    beat_bytes = len(fleet.bodies.body(fleet.replicas[0])) if fleet.bodies.keys else 0
    lines = [f"# Control-plane fan-out over HTTP ({dt.date.today()})", ""]
    if args.label:
        lines += [args.label, ""]
    lines += [
        f"{n:,} simulated replicas following one console (uvicorn, one process) through the "
        f"replica API; {args.endpoints} endpoints ({total_versions} versions; each replica "
        f"loads {loaded}); "
        + (f"heartbeat every {args.heartbeat:g} s (+ one after each new table); "
           if args.heartbeat > 0 else "no heartbeats; ")
        + f"a deploy every {args.deploy_every:g} s; {args.duration:g} s. Snapshot of the last "
        f"revision: {sizes[last][0] / 1024:,.0f} KiB gzip'd ({sizes[last][1] / 1024:,.0f} KiB "
        f"JSON); a heartbeat body {beat_bytes / 1024:,.0f} KiB. Machine: {os.cpu_count()} CPUs, "
        f"shared; load average at end "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}."
        if last is not None else "(no snapshot received)", "",
        f"Cold start: {n:,} first GETs of the desired state at once took {cold:.1f} s "
        f"(p50 {ms(quantile(fleet.cold_latency, 0.5))} ms, p99 "
        f"{ms(quantile(fleet.cold_latency, 0.99))} ms; console CPU {cold_cpu['console']:.1f} s).",
        "", "## Deploy → received on every replica", "",
        "| deploy | revision | deploy call ms | replicas reached | p50 ms | p99 ms | max ms "
        "(the last) |", "|---|---|---|---|---|---|---|",
    ]
    all_delays, within = [], 0
    for i, (revision, at, call) in enumerate(fleet.deploys, 1):
        delays = []
        for r in fleet.replicas:
            got = [t for rev, t in r.received.items() if rev >= revision]
            if got:
                delays.append(min(got) - at)
        all_delays += delays
        full = len(delays) == n
        within += full and max(delays) <= 5.0
        lines.append(f"| {i} | {revision} | {call * 1e3:,.0f} | {len(delays):,}/{n:,} | "
                     f"{ms(quantile(delays, 0.5))} | {ms(quantile(delays, 0.99))} | "
                     f"{ms(max(delays, default=float('nan')))}{'' if full else ' (not all)'} |")
    lines += [
        "", f"All deploys: per-replica delay p50 {ms(quantile(all_delays, 0.5))} ms, p99 "
        f"{ms(quantile(all_delays, 0.99))} ms, max {ms(max(all_delays, default=float('nan')))} "
        f"ms; {within} of {len(fleet.deploys)} deploys on all {n:,} within 5 s. Long polls: "
        + ", ".join(f"{k}: {v:,}" for k, v in sorted(fleet.poll_outcomes.items())) + ".",
    ]
    if args.heartbeat > 0:
        asked = n / args.heartbeat
        asked_total = asked + n * len(fleet.deploys) / elapsed
        ok = fleet.beat_outcomes.get("204", 0)
        gaps, worst = [], []
        start, end = fleet.window
        for r in fleet.replicas:
            times = [start] + [t for t in r.beats if start <= t <= end] + [end]
            g = [b - a for a, b in zip(times, times[1:], strict=False)]
            gaps += g[1:-1] if len(g) > 2 else g
            worst.append(max(g))
        lost_client = sum(1 for w in worst if w > STALE_S)
        lost_registry = [lost for _, lost, _ in fleet.lost_samples]
        rows = fleet.lost_samples[-1][2] if fleet.lost_samples else 0
        lines += [
            "", "## Heartbeats", "",
            f"Asked: {asked:,.0f}/s ({n:,} every {args.heartbeat:g} s), {asked_total:,.0f}/s with "
            f"the one after each new table. Achieved: {ok / elapsed:,.1f}/s answered 204 "
            f"({ok / elapsed / asked_total:.0%} of asked); outcomes "
            + ", ".join(f"{k}: {v:,}" for k, v in sorted(fleet.beat_outcomes.items()))
            + "; sent " + ", ".join(f"{k}: {v:,}" for k, v in sorted(fleet.beat_kinds.items()))
            + f". A heartbeat's latency (204s): p50 {ms(quantile(fleet.beat_latency, 0.5))} ms, "
            f"p99 {ms(quantile(fleet.beat_latency, 0.99))} ms.", "",
            f"Gap between a replica's heartbeats (asked {args.heartbeat:g} s): p50 "
            f"{quantile(gaps, 0.5):.1f} s, p99 {quantile(gaps, 0.99):.1f} s, max "
            f"{max(gaps, default=float('nan')):.1f} s; {lost_client:,} of {n:,} replicas had a gap "
            f"over {STALE_S:g} s (window edges counted). The registry's own count of lost replicas "
            f"(rows with last_seen over {STALE_S:g} s old, every 2 s): max "
            f"{max(lost_registry, default=0):,}, at the end "
            f"{lost_registry[-1] if lost_registry else 0:,} of {rows:,} rows.",
        ]
    else:
        lines += ["", "No heartbeats (--heartbeat 0): the long polls alone."]
    lines += [
        "", "## The console's API while replicas follow it", "",
        f"GET /api/v1/models/ with an API token, {args.probe_rate:g}/s from a process of its own:",
        "", "| | requests | errors | p50 ms | p95 ms | max ms |", "|---|---|---|---|---|---|",
        f"| baseline, no replicas ({args.baseline:g} s) | {baseline['n']} | {baseline['errors']} "
        f"| {ms(baseline['p50'])} | {ms(baseline['p95'])} | {ms(baseline['max'])} |",
        f"| during the fleet ({args.duration:g} s) | {probe['n']} | {probe['errors']} | "
        f"{ms(probe['p50'])} | {ms(probe['p95'])} | {ms(probe['max'])} |",
        f"| ratio | | | {probe['p50'] / baseline['p50']:.1f}× | "
        f"{probe['p95'] / baseline['p95']:.1f}× | |",
    ]
    d = {k: (pg[1][k] - pg[0][k]) / elapsed for k in pg[1]}
    per_min = cpu["console"] / n / (elapsed / 60)
    cores = cpu["machine_total"] / elapsed
    lines += [
        "", "## CPU", "",
        "| CPU seconds per second (cores) | baseline (probe only) | fleet |", "|---|---|---|",
        f"| console (uvicorn process) | {base_cpu['console'] / base_cpu['seconds']:.2f} | "
        f"{cpu['console'] / elapsed:.2f} |",
        f"| PostgreSQL, every backend on the server | "
        f"{base_cpu['postgres'] / base_cpu['seconds']:.2f} | {cpu['postgres'] / elapsed:.2f} |",
        f"| this simulator (one process) | {base_cpu['simulator'] / base_cpu['seconds']:.2f} | "
        f"{cpu['simulator'] / elapsed:.2f} |",
        f"| the whole machine ({cores:.0f} cores) | "
        f"{base_cpu['machine'] / base_cpu['seconds']:.2f} | {cpu['machine'] / elapsed:.2f} |",
        "", f"Console CPU per replica per minute: {per_min * 1e3:,.1f} ms. The simulator's event "
        f"loop lag (a 50 ms sleep's overshoot): p50 {ms(quantile(fleet.lag, 0.5))} ms, p99 "
        f"{ms(quantile(fleet.lag, 0.99))} ms, max {ms(max(fleet.lag, default=float('nan')))} ms.",
        "", f"PostgreSQL, the bench's database (pg_stat_database, per second): "
        f"{d['commits']:,.0f} commits, {d['sessions']:,.1f} new sessions, {d['inserted']:,.0f} "
        f"rows inserted, {d['updated']:,.0f} updated, {d['fetched']:,.0f} fetched: about "
        f"{(d['inserted'] + d['updated']) / max(loaded + 1, 1):,.1f} heartbeats stored/s (a "
        f"heartbeat writes a sample row per loaded version and its own row; those a replica "
        f"gave up on are stored too).",
    ]
    errors = fleet.beat_errors[:3] + fleet.poll_errors[:3]
    if errors:
        lines += ["", "First errors: " + "; ".join(f"`{e}`" for e in errors)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
