"""The health bar: what the console depends on, each state said in words."""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from registry import selectors
from registry.notify import current_revision, redis_client

_worker_cache: tuple[float, Check] | None = None
WORKER_CACHE_SECONDS = 15.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    @property
    def state(self) -> str:
        return "ok" if self.ok else "degraded"


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
    try:
        revision = current_revision()
        live = selectors.replicas()
    except Exception as exc:
        return Check("Serving", False, f"unknown: {exc.__class__.__name__}")
    if not live:
        return Check("Serving", False, "no replicas reporting")
    converged = sum(r.revision >= revision for r in live)
    degraded = [r for r in live if r.degraded]
    detail = f"{converged}/{len(live)} replicas at revision {revision}"
    if degraded:
        detail += f"; {len(degraded)} degraded ({degraded[0].degraded})"
    return Check("Serving", converged == len(live) and not degraded, detail)


def checks() -> list[Check]:
    return [c for c in (database(), redis(), workers(), serving()) if c is not None]
