"""The health bar: what the console depends on, each state said in words."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from registry import selectors
from registry.convergence import silent_since
from registry.notify import current_revision, redis_client
from registry.services import analysis_watch
from registry.store.artifacts import default_store
from registry.store.space import GIB, free_space
from registry.ticks import tick_age

#: Seconds a probe's answer is reused, and the longest a request waits for a fresh one.
REDIS_TTL, WORKERS_TTL, PROBE_WAIT = 2.0, 15.0, 1.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    # Not ok, but on its way there without anyone acting (a replica applying a new revision).
    converging: bool = False

    @property
    def state(self) -> str:
        return "ok" if self.ok else "converging" if self.converging else "degraded"


def database() -> Check:
    """In the request's own thread (its connection is the one that matters), bounded by the
    connect timeout of the settings."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return Check("Database", True, f"{connection.vendor} reachable")
    except Exception as exc:  # shown, never raised: the bar must render while degraded
        connection.close()  # a broken connection must not stick once the database is back
        return Check("Database", False, f"unreachable: {exc.__class__.__name__}")


class Probe:
    """A slow check run off the request thread, at most one in flight per process: a request
    waits at most PROBE_WAIT seconds for a fresh answer, else gets the last one, or "not
    answering" once the probe has been stuck longer than that. A hung dependency therefore
    costs one thread, not one per request (which once wedged the console for good)."""

    def __init__(self, name: str, run: Callable[[], Check], ttl: float):
        self.name, self.run, self.ttl = name, run, ttl
        self._lock = threading.Lock()
        self._result: tuple[float, Check] | None = None
        self._running: tuple[float, threading.Thread] | None = None

    def __call__(self) -> Check:
        now = time.monotonic()
        with self._lock:
            if self._result and now - self._result[0] < self.ttl:
                return self._result[1]
            if self._running is None:
                thread = threading.Thread(target=self._probe, name=f"mmc-probe-{self.name}",
                                          daemon=True)
                self._running = (now, thread)
                thread.start()
            started, thread = self._running
        thread.join(PROBE_WAIT)
        with self._lock:
            if self._result and self._result[0] >= started:
                return self._result[1]
            stuck = time.monotonic() - started
            if stuck >= PROBE_WAIT:
                return Check(self.name, False, f"not answering for {stuck:.0f} s")
            return self._result[1] if self._result else Check(self.name, False, "checking")

    def _probe(self) -> None:
        try:
            check = self.run()
        except Exception as exc:  # a probe never raises into its thread
            check = Check(self.name, False, f"unknown: {exc.__class__.__name__}")
        with self._lock:
            self._result, self._running = (time.monotonic(), check), None


def _ping_redis() -> Check:
    try:
        redis_client().ping()  # socket timeouts: registry.notify.redis_client
        return Check("Redis", True, "reachable")
    except Exception as exc:
        return Check("Redis", False, f"unreachable: {exc.__class__.__name__}")


def _ping_workers() -> Check:
    from console.celery import app

    try:
        replies = app.control.ping(timeout=0.5) or []
    except Exception as exc:
        return Check("Workers", False, f"unknown: {exc.__class__.__name__}")
    return (Check("Workers", True, f"{len(replies)} online") if replies
            else Check("Workers", False, "none online: uploads stay validating"))


_redis_probe = Probe("Redis", _ping_redis, REDIS_TTL)
_workers_probe = Probe("Workers", _ping_workers, WORKERS_TTL)


def redis() -> Check | None:
    return _redis_probe() if redis_client() is not None else None


def workers() -> Check:
    """Embedded mode runs jobs in-process; clustered mode asks Celery (a broadcast ping)."""
    if not settings.CLUSTERED:
        return Check("Workers", True, "in-process")
    return _workers_probe()


def serving() -> Check:
    """Live replicas behind the current revision are converging; degraded once one stays behind
    longer than REPLICA_CONVERGE_SECONDS, reports itself degraded, or replicas are lost."""
    try:
        revision = current_revision()
        every = selectors.replicas(include_lost=True)
    except Exception as exc:
        return Check("Serving", False, f"unknown: {exc.__class__.__name__}")
    live = [r for r in every if not r.lost]
    lost = [r for r in every if r.lost]
    if not live and not lost:
        return Check("Serving", False, "no replicas reporting")
    converged = sum(r.revision >= revision for r in live)
    now = timezone.now()
    bound = timedelta(seconds=settings.REPLICA_CONVERGE_SECONDS)
    stuck = [r for r in live
             if r.revision < revision and r.behind_since and now - r.behind_since > bound]
    degraded = [r for r in live if r.degraded]
    parts = [f"{converged}/{len(live)} replicas at revision {revision}"]
    if lost:
        parts.append(f"{len(lost)} lost: " + ", ".join(
            f"{r.replica}, silent since {silent_since(r)}" for r in lost))
    if stuck:
        parts.append(f"{len(stuck)} behind for more than {bound.total_seconds():.0f} s: "
                     + ", ".join(r.replica for r in stuck))
    if degraded:
        parts.append(f"{len(degraded)} degraded ({degraded[0].degraded})")
    if lost or stuck or degraded or not live:
        return Check("Serving", False, "; ".join(parts))
    if converged < len(live):
        return Check("Serving", False, "converging: " + parts[0], converging=True)
    return Check("Serving", True, parts[0])


def store() -> Check:
    """The artifact store: free space of its folder (uploads and job files fail when it runs
    out); with an object store, whether the bucket answers (an object store has no free-space
    figure) and the free space left locally for the upload spool, job files and blob cache."""
    local = _local_space()
    if default_store().on_local_disk:
        return local
    remote = _object_store_probe()
    if not remote.ok:
        return remote
    return Check("Store", local.ok, f"{remote.detail}; spool and cache: {local.detail}")


def _local_space() -> Check:
    try:
        space = free_space()
    except OSError as exc:
        return Check("Store", False, f"unknown: {exc.__class__.__name__}")
    detail = f"{space.free / GIB:.1f} GiB free of {space.total / GIB:.1f} GiB"
    if space.free < settings.STORE_MIN_FREE_BYTES:
        return Check("Store", False, f"{detail}; below {settings.STORE_MIN_FREE_BYTES / GIB:.1f}"
                                     " GiB (MMC_STORE_MIN_FREE_BYTES)")
    return Check("Store", True, detail)


def _ping_object_store() -> Check:
    artifacts = default_store()
    try:
        artifacts.ping()
        return Check("Store", True, f"object store {artifacts.location} reachable")
    except Exception as exc:
        return Check("Store", False,
                     f"object store {artifacts.location} unreachable: {exc.__class__.__name__}")


_object_store_probe = Probe("Store", _ping_object_store, REDIS_TTL)


def analysis() -> Check:
    """The automated canary analysis' tick (Celery beat clustered, the scheduler embedded):
    degraded once it has not run for ANALYSIS_STALE_SECONDS. Noticing it here also drops any
    running analysis's candidate to 0 % (registry.services.analysis_watch)."""
    try:
        found = tick_age()
        analysis_watch.drop_stale(found=found)
    except Exception as exc:  # shown, never raised
        return Check("Analysis", False, f"unknown: {exc.__class__.__name__}")
    return Check("Analysis", not found.stale, found.text)


def checks(db: Check | None = None) -> list[Check]:
    """Every check; `db`: the database check when the caller already made it."""
    return [c for c in (db or database(), redis(), workers(), serving(), store(), analysis())
            if c is not None]


def overall(checks: list[Check]) -> str:
    """The bar's headline state: degraded if any check is, else converging if any is, else ok."""
    states = {c.state for c in checks}
    return next(s for s in ("degraded", "converging", "ok") if s in states or s == "ok")
