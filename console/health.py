"""The health bar: what the console depends on, each state said in words."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from registry import selectors
from registry.convergence import silent_since
from registry.notify import current_revision, redis_client
from registry.store.space import GIB, free_space

_worker_cache: tuple[float, Check] | None = None
WORKER_CACHE_SECONDS = 15.0


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
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return Check("Database", True, f"{connection.vendor} reachable")
    except Exception as exc:  # shown, never raised: the bar must render while degraded
        return Check("Database", False, f"unreachable: {exc.__class__.__name__}")


def redis() -> Check | None:
    client = redis_client()
    if client is None:
        return None
    try:
        client.ping()
        return Check("Redis", True, "reachable")
    except Exception as exc:
        return Check("Redis", False, f"unreachable: {exc.__class__.__name__}")


def workers() -> Check:
    """Embedded mode runs jobs in-process; clustered mode asks Celery (cached: a ping is slow)."""
    global _worker_cache
    if not settings.CLUSTERED:
        return Check("Workers", True, "in-process")
    now = time.monotonic()
    if _worker_cache and now - _worker_cache[0] < WORKER_CACHE_SECONDS:
        return _worker_cache[1]
    try:
        from console.celery import app

        replies = app.control.ping(timeout=0.5) or []
        check = (Check("Workers", True, f"{len(replies)} online") if replies
                 else Check("Workers", False, "none online: uploads stay validating"))
    except Exception as exc:
        check = Check("Workers", False, f"unknown: {exc.__class__.__name__}")
    _worker_cache = (now, check)
    return check


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
    """The artifact store's free space: uploads and job files fail when it runs out."""
    try:
        space = free_space()
    except OSError as exc:
        return Check("Store", False, f"unknown: {exc.__class__.__name__}")
    detail = f"{space.free / GIB:.1f} GiB free of {space.total / GIB:.1f} GiB"
    if space.free < settings.STORE_MIN_FREE_BYTES:
        return Check("Store", False, f"{detail}; below {settings.STORE_MIN_FREE_BYTES / GIB:.1f}"
                                     " GiB (MMC_STORE_MIN_FREE_BYTES)")
    return Check("Store", True, detail)


def checks() -> list[Check]:
    return [c for c in (database(), redis(), workers(), serving(), store()) if c is not None]


def overall(checks: list[Check]) -> str:
    """The bar's headline state: degraded if any check is, else converging if any is, else ok."""
    states = {c.state for c in checks}
    return next(s for s in ("degraded", "converging", "ok") if s in states or s == "ok")
