"""How far the data plane is from the desired state: which replicas have applied a revision, and
which cannot say (lost: no heartbeat within REPLICA_STALE_SECONDS)."""

from __future__ import annotations

import time

from django.db import close_old_connections
from django.utils import timezone

from registry import selectors
from registry.models import ReplicaHeartbeat


def silent_since(replica: ReplicaHeartbeat) -> str:
    """The last heartbeat as the health bar and ?wait say it: HH:MM:SS and the time zone."""
    return timezone.localtime(replica.last_seen).strftime("%H:%M:%S %Z")


def laggards(revision: int) -> list[dict]:
    """Every replica not known to run `revision`: live ones behind it, and every lost one (it may
    be dead or cut off; either way no one can tell what it serves)."""
    behind = []
    for r in selectors.replicas(include_lost=True):
        if r.lost:
            behind.append({"replica": r.replica, "revision": r.revision, "state": "lost",
                           "reason": f"lost: no heartbeat since {silent_since(r)}"})
        elif r.revision < revision:
            behind.append({"replica": r.replica, "revision": r.revision, "state": "live",
                           "reason": f"applying: at revision {r.revision}"})
    return behind


def wait_for_revision(revision: int, timeout: float) -> dict:
    """Block until every live replica reports `revision` applied, or the timeout passes. Lost
    replicas are not waited for (they may never come back) but keep the answer unconverged."""
    deadline = time.monotonic() + max(0.0, min(timeout, 120.0))
    while True:
        behind = laggards(revision)
        waiting = [b for b in behind if b["state"] == "live"]
        if not waiting or time.monotonic() >= deadline:
            return {"revision": revision, "converged": not behind, "laggards": behind,
                    "replicas": len(selectors.replicas()),
                    "lost": sum(b["state"] == "lost" for b in behind)}
        time.sleep(0.05)
        close_old_connections()
