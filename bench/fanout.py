#!/usr/bin/env python3
"""The route table's fan-out on PostgreSQL: N simulated replicas in one process doing what each
replica's reconciler does to the database, at its intervals, against E endpoints.

    .venv/bin/python bench/fanout.py [--replicas 100] [--endpoints 1000] [--duration 30]
        [--workers 16] [--deploy-every 10] [--admin-url postgres://postgres@127.0.0.1:5432/postgres]

It creates its own database (mmc_fanout_<pid>) on the server --admin-url names, migrates it, seeds
E models each with one ready version and an endpoint serving it (every tenth also a second version,
every twentieth at a 10 % canary), and drops the database at the end, whatever happens. Each
replica is a real `registry.serving_source.RegistrySource` (the code path `mmc-serve --registry`
runs, with the product's settings, CONN_MAX_AGE included): after a cold start (every replica's
first fetch at once, timed apart), every --poll s `revision()`, and `fetch()` when the
revision moved; every --heartbeat s `report()` of what it runs (one entry per loaded version with
its stats snapshot, as `Reconciler.observed` builds it). Like the reconciler, a replica's next
poll or heartbeat is due its interval after the previous one ended, and one replica's calls never
overlap. Every --deploy-every s a real deploy (`endpoint_deploy`, audited) moves the revision and,
as Redis pub/sub would, wakes every replica to poll at once: the fan-out.

The replicas share --workers threads (each its own Django connection), not one connection each:
100 connections would exhaust a default PostgreSQL (max_connections 100) shared with others.

Reported per call kind: calls, calls/s (and what the intervals ask for), SQL statements per call
and per second, p50/p99 of a call and of a statement (first for one replica alone, then for the
fleet); the database's own counts (commits, new sessions, rows written) from pg_stat_database;
heartbeat gaps per replica (the registry calls a replica lost after MMC_REPLICA_STALE_SECONDS,
10 s) and how many replicas each deploy reached, how fast; the simulator's CPU, so a
client-bound run reads as one. Markdown to stdout and bench/results/fanout-latest.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import os
import random
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "fanout-latest.md"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=100)
    p.add_argument("--endpoints", type=int, default=1000)
    p.add_argument("--duration", type=float, default=30.0, help="seconds simulated")
    p.add_argument("--workers", type=int, default=16, help="threads (database connections)")
    p.add_argument("--poll", type=float, default=1.0, help="MMC_POLL_SECONDS (default 1.0)")
    p.add_argument("--heartbeat", type=float, default=2.0,
                   help="MMC_HEARTBEAT_SECONDS (default 2.0)")
    p.add_argument("--deploy-every", type=float, default=10.0)
    p.add_argument("--no-stats", action="store_true",
                   help="heartbeats without per-version stats (as for versions still loading): "
                        "the route fan-out alone, without the metric samples a heartbeat writes")
    p.add_argument("--calibrate", type=int, default=3,
                   help="calls of each kind by one replica alone, before the fleet starts")
    p.add_argument("--admin-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--output", default=str(RESULTS))
    return p.parse_args(argv)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
        from django.db import connections

        connections.close_all()
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def stats(self) -> dict[str, float]:
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit, xact_rollback, sessions, tup_inserted, tup_updated, "
                "tup_fetched, blks_hit + blks_read FROM pg_stat_database WHERE datname = %s",
                (self.name,)).fetchone()
            conn.execute("SELECT pg_stat_clear_snapshot()")
        keys = ("commits", "rollbacks", "sessions", "inserted", "updated", "fetched", "blocks")
        return dict(zip(keys, (float(v) for v in row), strict=True))


def setup_django(db: Database, data_dir: str) -> None:
    for key in [k for k in os.environ if k.startswith(("MMC_", "REDIS_URL", "DJANGO_"))]:
        del os.environ[key]
    os.environ.update({"DATABASE_URL": db.url, "DJANGO_SETTINGS_MODULE": "console.settings",
                       "SECRET_KEY": "fanout-bench-only", "MMC_DATA_DIR": data_dir})
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def seed(endpoints: int) -> list[str]:
    """E models, one ready version each (every tenth a second one at a 10 % canary), an endpoint
    serving each; returns the models a deploy can move (two versions, no canary)."""
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


class Recorder:
    """Per call kind: call wall times; per statement: its time, by the call kind running it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, list[float]] = defaultdict(list)
        self.statements: dict[str, list[float]] = defaultdict(list)
        self.local = threading.local()

    def statement(self, execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            kind = getattr(self.local, "kind", "other")
            with self.lock:
                self.statements[kind].append(time.perf_counter() - t0)

    def call(self, kind: str, fn, *args):
        self.local.kind = kind
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.local.kind = "other"
            with self.lock:
                self.calls[kind].append(time.perf_counter() - t0)


class SimulatedReplica:
    """What one replica's reconciler asks of the registry, through the real RegistrySource."""

    def __init__(self, index: int, recorder: Recorder, *, stats: bool = True) -> None:
        from registry.serving_source import RegistrySource

        self.name = f"sim-{index:03d}"
        self.source = RegistrySource(address=f"10.1.{index // 200}.{index % 200 + 1}:8001")
        self.recorder, self.with_stats = recorder, stats
        self.lock = threading.Lock()  # a replica's source calls run on one thread, in order
        self.seen: int | None = None
        self.revision = 0
        self.stats: dict = {}
        self.beats: list[float] = []
        self.applied: dict[int, float] = {}  # revision -> when its table was in

    def poll(self) -> None:
        from serving.core.stats import VersionStats

        revision = self.recorder.call("revision poll", self.source.revision)
        if revision == self.seen:
            return
        desired = self.recorder.call("route fetch", self.source.fetch)
        self.stats = {key: self.stats.get(key) or VersionStats(*key) for key in desired.versions}
        self.seen, self.revision = revision, desired.revision
        self.applied[desired.revision] = time.monotonic()
        self.heartbeat()  # the reconciler reports at once after a new table

    def first_fetch(self) -> None:
        """A replica's start: the whole table, before the timed window (no heartbeat yet)."""
        from serving.core.stats import VersionStats

        self.seen = self.recorder.call("revision poll", self.source.revision)
        desired = self.recorder.call("route fetch", self.source.fetch)
        self.stats = {key: VersionStats(*key) for key in desired.versions}
        self.revision = desired.revision

    def heartbeat(self) -> None:
        from serving.core.desired_state import ObservedState

        versions = {f"{m}:{v}": {"state": "READY", "reason": None,
                                 "providers": ["CPUExecutionProvider"], "queue_depth": 0,
                                 **({"stats": s.snapshot()} if self.with_stats else {})}
                    for (m, v), s in self.stats.items()}
        observed = ObservedState(replica=self.name, revision=self.revision, versions=versions,
                                 degraded=None)
        kind = "heartbeat + samples" if self.with_stats else "heartbeat"
        self.recorder.call(kind, self.source.report, observed)
        self.beats.append(time.monotonic())


class Schedule:
    """A heap of (due, seq, replica, kind) shared by the worker threads; a call's next one is due
    its interval after it ended (the reconciler's loops sleep after their work)."""

    def __init__(self, replicas, args, until: float) -> None:
        self.args, self.until = args, until
        self.cond = threading.Condition()
        self.heap: list = []
        self.seq = 0
        now = time.monotonic()
        for r in replicas:  # replicas start at random moments, as a fleet does
            self.push(now + random.uniform(0, args.poll), r, "poll")
            self.push(now + random.uniform(0, args.heartbeat), r, "heartbeat")

    def push(self, due: float, replica, kind: str) -> None:
        with self.cond:
            self.seq += 1
            heapq.heappush(self.heap, (due, self.seq, replica, kind))
            self.cond.notify()

    def wake_all(self, replicas) -> None:
        now = time.monotonic()
        for r in replicas:
            self.push(now, r, "wake")

    def next(self):
        with self.cond:
            while True:
                now = time.monotonic()
                if now >= self.until:
                    return None
                if self.heap and self.heap[0][0] <= now:
                    return heapq.heappop(self.heap)
                wait = (self.heap[0][0] - now) if self.heap else 0.1
                self.cond.wait(min(wait, self.until - now, 0.1))

    def worker(self, recorder: Recorder) -> None:
        from django.db import connection

        with connection.execute_wrapper(recorder.statement):
            while (item := self.next()) is not None:
                _, _, replica, kind = item
                with replica.lock:
                    try:
                        replica.heartbeat() if kind == "heartbeat" else replica.poll()
                    except Exception as exc:  # noqa: BLE001 - a replica stays degraded, not dead
                        print(f"{replica.name} {kind}: {type(exc).__name__}: {exc}", flush=True)
                if kind != "wake":
                    interval = self.args.heartbeat if kind == "heartbeat" else self.args.poll
                    self.push(time.monotonic() + interval, replica, kind)
        connection.close()


def deployer(schedule: Schedule, replicas, movable: list[str], every: float,
             deploys: list[tuple[int, float]]) -> None:
    """Real deploys (audited service calls) on a timer; each wakes every replica, as pub/sub."""
    from django.db import connection

    from registry.audit import Actor
    from registry.models import Endpoint
    from registry.services import endpoint_deploy

    stable = dict.fromkeys(movable, 1)
    while time.monotonic() + every < schedule.until:
        time.sleep(every)
        name = movable[len(deploys) % len(movable)]
        stable[name] = 2 if stable[name] == 1 else 1
        endpoint_deploy(model_name=name, version_number=stable[name],
                        actor=Actor.system("fanout"), reason="fan-out bench")
        revision = Endpoint.objects.values_list("revision", flat=True).get(model__name=name)
        deploys.append((revision, time.monotonic()))
        schedule.wake_all(replicas)
    connection.close()


def main() -> int:
    args = parse_args(sys.argv[1:])
    random.seed(0)
    cpu0, wall0 = os.times(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mmc-fanout-") as tmp, Database(args.admin_url) as db:
        setup_django(db, tmp)
        movable = seed(args.endpoints)
        from registry.models import ModelVersion

        total_versions = ModelVersion.objects.count()
        print(f"[fanout] {db.name}: {args.endpoints} endpoints, {total_versions} versions; "
              f"{args.replicas} replicas on {args.workers} workers for {args.duration:g} s",
              flush=True)
        solo = calibrate(args.calibrate)
        start = Recorder()
        replicas = [SimulatedReplica(i, start, stats=not args.no_stats)
                    for i in range(args.replicas)]
        cold = cold_start(replicas, args.workers)
        print(f"[fanout] cold start: every replica's first fetch in {cold:.1f} s", flush=True)
        recorder = Recorder()
        for r in replicas:
            r.recorder = recorder
        before = db.stats()
        t0, c0 = time.monotonic(), os.times()
        schedule = Schedule(replicas, args, t0 + args.duration)
        deploys: list[tuple[int, float]] = []
        threads = [threading.Thread(target=schedule.worker, args=(recorder,))
                   for _ in range(args.workers)]
        threads.append(threading.Thread(target=deployer, args=(
            schedule, replicas, movable, args.deploy_every, deploys)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed, c1 = time.monotonic() - t0, os.times()
        after = db.stats()
        text = report(args, db, total_versions, solo, (cold, start), recorder, replicas,
                      deploys, before, after, elapsed,
                      (c1.user + c1.system) - (c0.user + c0.system))
    print(text)
    Path(args.output).write_text(text)
    cpu1 = os.times()
    print(f"[fanout] done in {time.monotonic() - wall0:.0f} s "
          f"({cpu1.user + cpu1.system - cpu0.user - cpu0.system:.0f} s CPU); "
          f"database {db.name} dropped")
    return 0


def calibrate(n: int) -> Recorder:
    """Each call kind `n` times by one replica alone, one after another: its cost without the
    fleet's contention (still on a shared machine)."""
    from django.db import connection

    solo = Recorder()
    replica = SimulatedReplica(999, solo, stats=False)
    with connection.execute_wrapper(solo.statement):
        for _ in range(n):
            replica.seen = None  # as if the revision had moved: fetch, then heartbeat
            replica.poll()
        replica.with_stats = True
        for _ in range(n):
            replica.heartbeat()
    return solo


def cold_start(replicas, workers: int) -> float:
    """Every replica's first fetch at once on `workers` threads, as after a fleet restart."""
    from django.db import connection

    def fetch(chunk) -> None:
        for r in chunk:
            r.first_fetch()
        connection.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=fetch, args=(replicas[i::workers],))
               for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def report(args, db, total_versions, solo, cold, recorder, replicas, deploys, before, after,
           elapsed, cpu) -> str:
    per_replica_versions = max((len(r.stats) for r in replicas), default=0)
    asked = {"revision poll": args.replicas / args.poll,
             "heartbeat": args.replicas / args.heartbeat,
             "heartbeat + samples": args.replicas / args.heartbeat}
    lines = [
        f"# Route-table fan-out on PostgreSQL ({dt.date.today()})", "",
        f"One replica alone, {args.calibrate} calls of each kind, one after another:", "",
        "| call | statements/call | call p50 ms | call max ms | statement p50 ms |",
        "|---|---|---|---|---|",
    ]
    for kind in ("revision poll", "route fetch", "heartbeat", "heartbeat + samples"):
        calls, stmts = solo.calls.get(kind, []), solo.statements.get(kind, [])
        per = len(stmts) / len(calls) if calls else 0
        lines.append(f"| {kind} | {per:,.1f} | {quantile(calls, 0.5) * 1e3:,.1f} | "
                     f"{max(calls, default=float('nan')) * 1e3:,.1f} | "
                     f"{quantile(stmts, 0.5) * 1e3:,.2f} |")
    fetches = cold[1].calls.get("route fetch", [])
    lines += [
        "", f"Cold start: all {args.replicas} replicas' first fetch at once on {args.workers} "
        f"connections took {cold[0]:.1f} s (a fetch p50 {quantile(fetches, 0.5) * 1e3:,.0f} ms, "
        f"p99 {quantile(fetches, 0.99) * 1e3:,.0f} ms). Then the fleet, timed from there:", "",
        f"{args.replicas} simulated replicas × {args.endpoints} endpoints ({total_versions} "
        f"versions; each replica loads {per_replica_versions}"
        f"{', heartbeats without stats' if args.no_stats else ''}), poll {args.poll:g} s, "
        f"heartbeat {args.heartbeat:g} s, a deploy every {args.deploy_every:g} s waking every "
        f"replica; {args.workers} worker threads (connections), {elapsed:.1f} s. The simulator "
        f"used {cpu:.1f} s of CPU in {elapsed:.1f} s ({cpu / elapsed:.0%} of one core; load "
        f"average at end {' '.join(Path('/proc/loadavg').read_text().split()[:3])}).", "",
        "| call | calls | calls/s | intervals ask | statements/call | statements/s | "
        "call p50 ms | call p99 ms | statement p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    total_statements = 0
    for kind in ("revision poll", "route fetch", "heartbeat", "heartbeat + samples"):
        if kind not in recorder.calls:
            continue
        calls, stmts = recorder.calls.get(kind, []), recorder.statements.get(kind, [])
        total_statements += len(stmts)
        want = f"{asked[kind]:,.0f}" if kind in asked else "on a new revision"
        per = len(stmts) / len(calls) if calls else 0
        lines.append(
            f"| {kind} | {len(calls):,} | {len(calls) / elapsed:,.1f} | {want} | {per:,.1f} | "
            f"{len(stmts) / elapsed:,.0f} | {quantile(calls, 0.5) * 1e3:,.1f} | "
            f"{quantile(calls, 0.99) * 1e3:,.1f} | {quantile(stmts, 0.99) * 1e3:,.2f} |")
    d = {k: (after[k] - before[k]) / elapsed for k in after}
    gaps = [b - a for r in replicas for a, b in zip(r.beats, r.beats[1:], strict=False)]
    silent = sum(1 for r in replicas if not r.beats)
    reach = []
    for revision, at in deploys:
        done = [r.applied[revision] - at for r in replicas if revision in r.applied]
        reach.append(f"{len(done)}/{len(replicas)} replicas"
                     + (f", the last after {max(done):.1f} s" if done else ""))
    lines += [
        "",
        f"All statements: {total_statements / elapsed:,.0f}/s. PostgreSQL's own counts "
        f"(pg_stat_database): {d['commits']:,.0f} commits/s, {d['sessions']:,.1f} new sessions/s, "
        f"{d['inserted']:,.0f} rows inserted/s, {d['updated']:,.0f} updated/s, "
        f"{d['fetched']:,.0f} fetched/s.",
        "",
        f"Heartbeat gap per replica (asked {args.heartbeat:g} s): p50 "
        f"{quantile(gaps, 0.5):.1f} s, p99 {quantile(gaps, 0.99):.1f} s, max "
        f"{max(gaps, default=float('nan')):.1f} s; {silent} replicas never reported. Each "
        f"deploy (commit, then every replica woken) had reached, by the end: "
        f"{'; '.join(reach) or 'none made'}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
