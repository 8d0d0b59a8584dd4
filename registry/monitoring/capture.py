"""Reads about data capture: an endpoint's settings with what its replicas captured and dropped
(from their heartbeats), the last captured requests of a version, and replay of one of them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from registry.models import Endpoint
from registry.monitoring import capture_store


@dataclass
class CaptureCounts:
    version: int
    captured: int = 0
    dropped: int = 0
    written: int = 0
    failed: int = 0


def capture_settings_of(endpoint: Endpoint) -> dict:
    """An endpoint's capture settings as the API, the card and the audit show them."""
    return {"percent": float(endpoint.capture_percent), "mode": endpoint.capture_mode,
            "max_bytes": endpoint.capture_max_bytes,
            "retention_days": endpoint.capture_retention_days}


def capture_counts(model_name: str) -> list[CaptureCounts]:
    """Per version, what the live replicas captured, dropped (queue full), wrote and lost since
    they started (their heartbeats' counters, summed), newest version first."""
    from registry.selectors import replicas

    prefix = f"{model_name}:"
    rows: dict[int, CaptureCounts] = {}
    for r in replicas():
        if r.lost:
            continue
        for key, state in (r.versions or {}).items():
            counts = state.get("capture") if isinstance(state, dict) else None
            if not key.startswith(prefix) or not key[len(prefix):].isdigit() \
                    or not isinstance(counts, dict):
                continue
            row = rows.setdefault(int(key[len(prefix):]), CaptureCounts(int(key[len(prefix):])))
            for what in ("captured", "dropped", "written", "failed"):
                value = counts.get(what)
                if isinstance(value, int):
                    setattr(row, what, getattr(row, what) + value)
    return [rows[v] for v in sorted(rows, reverse=True)]


def capture_status(endpoint: Endpoint | None, model_name: str) -> dict:
    """The settings (defaults for a model never deployed) and the counters, as API and card
    show them."""
    settings = capture_settings_of(endpoint or Endpoint())
    counts = capture_counts(model_name)
    return {**settings, "enabled": settings["percent"] > 0,
            "captured": sum(c.captured for c in counts),
            "dropped": sum(c.dropped for c in counts),
            "versions": [vars(c) for c in counts]}


#: How far back the version page looks for its last captured requests.
RECENT_WINDOW_S = 7 * 24 * 3600


def recent_records(model_name: str, version: int, *, limit: int = 20,
                   window_s: float = RECENT_WINDOW_S) -> list[dict]:
    """The last `limit` captured requests of one version, newest first."""
    now = time.time()
    return list(capture_store.iter_records(model_name, since=now - window_s, until=now,
                                           version=version, newest_first=True, limit=limit))


def prune_capture(*, now: float | None = None, store=None) -> int:
    """Retention, as the periodic GC enforces it: each model's captured files older than its
    endpoint's retention days (a model without an endpoint: the default), deleted."""
    default = Endpoint._meta.get_field("capture_retention_days").default
    days = dict(Endpoint.objects.values_list("model__name", "capture_retention_days"))
    return capture_store.prune(older_than_days=default, now=now, store=store, per_model=days)
