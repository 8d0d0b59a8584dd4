"""How far the data plane is from the desired state: which live replicas have applied a revision."""

from __future__ import annotations

import time

from django.db import close_old_connections

from registry import selectors


def laggards(revision: int) -> list[dict]:
    return [{"replica": r.replica, "revision": r.revision}
            for r in selectors.replicas() if r.revision < revision]


def wait_for_revision(revision: int, timeout: float) -> dict:
    """Block until every live replica reports `revision` applied, or the timeout passes."""
    deadline = time.monotonic() + max(0.0, min(timeout, 120.0))
    while True:
        behind = laggards(revision)
        if not behind or time.monotonic() >= deadline:
            return {"revision": revision, "converged": not behind, "laggards": behind,
                    "replicas": len(selectors.replicas())}
        time.sleep(0.05)
        close_old_connections()
