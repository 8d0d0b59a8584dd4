"""Drift thresholds of an endpoint (checked, audited) and the record of each compared window:
points for charts, episodes opened and closed with one audit event each (registry.monitoring.
drift computes; this writes)."""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from registry.audit import Actor, record
from registry.errors import InvalidRequest
from registry.models import (
    DriftEpisode,
    DriftPoint,
    DriftSettings,
    Endpoint,
    ModelVersion,
    RegisteredModel,
)
from registry.monitoring import capture_store
from registry.monitoring.baselines import record_arrays
from registry.monitoring.drift import compare, deployed_versions
from registry.services.catalog import lock_model
from registry.services.deployments import endpoint_for_update

#: field -> (low, high, whole number?, what it is); the defaults are the model's.
RANGES: dict[str, tuple[float, float, bool, str]] = {
    "psi_threshold": (0.01, 10.0, False, "population stability index above which a feature "
                                         "may be drifted"),
    "p_value": (1e-9, 0.5, False, "two-sample test p-value (before the Bonferroni correction) "
                                  "below which a feature may be drifted"),
    "window_minutes": (1, 7 * 24 * 60, True, "minutes of recent capture compared"),
    "min_samples": (20, 10_000_000, True, "values a feature needs in the window to be compared"),
}
FIELDS = tuple(RANGES)
log = logging.getLogger(__name__)
DEFAULTS = {f: DriftSettings._meta.get_field(f).default for f in FIELDS}


def clean_drift_settings(values: dict) -> dict:
    """The thresholds in `values`, checked; InvalidRequest names the first field out of range
    (unknown keys too)."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown drift setting {unknown[0]!r} (known: "
                             f"{', '.join(FIELDS)})", field=unknown[0])
    cleaned: dict[str, Any] = {}
    for field, raw in values.items():
        low, high, whole, what = RANGES[field]
        ok = not isinstance(raw, bool) and isinstance(raw, int | float) and math.isfinite(raw) \
            and low <= raw <= high and (not whole or raw == int(raw))
        if not ok:
            kind = "a whole number" if whole else "a number"
            raise InvalidRequest(f"{field} must be {kind} from {low:g} to {high:g} ({what}), "
                                 f"got {raw!r}"[:300], field=field)
        cleaned[field] = int(raw) if whole else float(raw)
    return cleaned


def settings_of(endpoint: Endpoint) -> dict:
    row = DriftSettings.objects.filter(endpoint=endpoint).first()
    return {f: getattr(row, f) for f in FIELDS} if row else dict(DEFAULTS)


def drift_settings_set(*, model_name: str, actor: Actor, values: dict) -> dict:
    """Change some or all of an endpoint's drift thresholds; unchanged values write nothing."""
    cleaned = clean_drift_settings(values)
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name))
        row, _ = DriftSettings.objects.get_or_create(endpoint=endpoint)
        before = {f: getattr(row, f) for f in FIELDS}
        for key, value in cleaned.items():
            setattr(row, key, value)
        after = {f: getattr(row, f) for f in FIELDS}
        if after != before:
            row.save()
            changed = [k for k in FIELDS if before[k] != after[k]]
            record(actor, "endpoint.drift-settings", target_type="endpoint", target=model_name,
                   model_name=model_name, before={k: before[k] for k in changed},
                   after={k: after[k] for k in changed})
    return after


def record_window(*, model: RegisteredModel, version: int, window_end: datetime,
                  results: list[dict]) -> DriftEpisode | None:
    """Store one window's results; open an episode at its first drifted feature, close the open
    one when a compared window has none. Returns the episode opened or closed, if any."""
    actor = Actor.system("drift-monitor")
    drifted = [r for r in results if r["drifted"]]
    with transaction.atomic():
        DriftPoint.objects.bulk_create([
            DriftPoint(model=model, version=version, feature=r["feature"][:200], part=r["part"],
                       window_end=window_end, psi=r["psi"], statistic=r["statistic"],
                       p_value=r["p_value"], n=r["n"], drifted=r["drifted"]) for r in results])
        open_ = DriftEpisode.objects.select_for_update().filter(
            model=model, version=version, ended_at__isnull=True).first()
        figures = [{k: r[k] for k in ("feature", "psi", "p_value", "n")} for r in drifted]
        if drifted and open_ is None:
            episode = DriftEpisode.objects.create(model=model, version=version,
                                                  started_at=window_end,
                                                  features=[r["feature"] for r in drifted])
            record(actor, "monitor.drift", target_type="version",
                   target=f"{model.name}:{version}", model_name=model.name,
                   after={"version": version, "features": figures,
                          "window_end": window_end.isoformat()},
                   reason=f"drift in {', '.join(r['feature'] for r in drifted)[:200]}")
            return episode
        if results and not drifted and open_ is not None:
            open_.ended_at = window_end
            open_.save(update_fields=["ended_at"])
            record(actor, "monitor.drift.end", target_type="version",
                   target=f"{model.name}:{version}", model_name=model.name,
                   after={"version": version, "started_at": open_.started_at.isoformat(),
                          "window_end": window_end.isoformat()},
                   reason="no feature drifted in the window")
            return open_
    return None


def drift_tick(*, now: float | None = None, store=None) -> dict:
    """Periodic: every deployed version with a baseline compared over its endpoint's window;
    points stored, episodes opened and closed. Returns counts for the log."""
    now = time.time() if now is None else now
    done = {"versions": 0, "points": 0, "drifted": 0}
    endpoints = Endpoint.objects.select_related("model")
    for endpoint in endpoints:
        ids = deployed_versions(endpoint)
        if not ids:
            continue
        limits = settings_of(endpoint)
        for version in ModelVersion.objects.filter(pk__in=ids, baseline__isnull=False) \
                .select_related("baseline"):
            since = now - limits["window_minutes"] * 60
            records = capture_store.iter_tensors(endpoint.model.name, since=since, until=now,
                                                 version=version.number, store=store)
            try:
                arrays, _n = record_arrays(records)
                results = compare(version.baseline.features, arrays,
                                  psi_threshold=limits["psi_threshold"],
                                  p_value=limits["p_value"], min_samples=limits["min_samples"])
            except Exception:  # one version's unreadable capture must not stop the others
                log.exception("drift check of %s failed", version)
                done["failed"] = done.get("failed", 0) + 1
                continue
            record_window(model=endpoint.model, version=version.number,
                          window_end=datetime.fromtimestamp(now, UTC), results=results)
            done["versions"] += 1
            done["points"] += len(results)
            done["drifted"] += sum(r["drifted"] for r in results)
    return done
