"""Rate limits and daily quotas of an endpoint or one of its predict keys: one service for both,
validated, audited, and shipped to replicas with the route table (a new revision)."""

from __future__ import annotations

import math
from typing import Any

from django.db import transaction

from registry.audit import Actor, record
from registry.errors import InvalidRequest, NotFound
from registry.models import Endpoint, EndpointApiKey
from registry.notify import bump_revision
from registry.services.catalog import lock_model
from registry.services.deployments import endpoint_for_update

#: The largest values accepted: well past any real deployment, small enough to be a typo's guard.
MAX_RPS = 1_000_000
MAX_BURST = 10_000_000
MAX_DAILY_QUOTA = 10**12
#: field -> (largest value, whether a fraction is allowed, what it means)
FIELDS = {
    "rps": (MAX_RPS, True, "requests per second on each replica"),
    "burst": (MAX_BURST, False, "requests a replica lets through at once"),
    "daily_quota": (MAX_DAILY_QUOTA, False, "requests per UTC day, all replicas together"),
}
_COLUMNS = {"rps": "rate_limit_rps", "burst": "rate_limit_burst", "daily_quota": "daily_quota"}


def clean_limit(name: str, value: Any) -> float | int:
    """One limit, checked: a number from 0 (no limit) to its maximum; whole except rps."""
    top, fraction, meaning = FIELDS[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{name} must be a number ({meaning}; 0: no limit)", field=name)
    if not math.isfinite(value) or value < 0:
        raise InvalidRequest(f"{name} must be 0 (no limit) or more, got {value}", field=name)
    if value > top:
        raise InvalidRequest(f"{name} must be at most {top}, got {value:g}", field=name)
    if not fraction:
        if value != int(value):
            raise InvalidRequest(f"{name} must be a whole number, got {value}", field=name)
        return int(value)
    return float(value)


def limits_of(row: Endpoint | EndpointApiKey) -> dict:
    return {"rps": row.rate_limit_rps, "burst": row.rate_limit_burst,
            "daily_quota": row.daily_quota}


def limits_set(*, model_name: str, actor: Actor, key_prefix: str | None = None,
               reason: str = "", **changes: Any) -> Endpoint | EndpointApiKey:
    """Set some of rps, burst and daily_quota of the endpoint, or of its active key
    `key_prefix`; the others keep their values. Every value is checked before anything is
    written."""
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown limit {unknown[0]!r}: use rps, burst or daily_quota",
                             field=unknown[0])
    if not changes:
        raise InvalidRequest("give at least one of rps, burst, daily_quota", field="rps")
    cleaned = {name: clean_limit(name, value) for name, value in changes.items()}
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name))
        if key_prefix is None:
            row, target_type, target = endpoint, "endpoint", model_name
        else:
            row = (EndpointApiKey.objects.select_for_update()
                   .filter(endpoint=endpoint, prefix=key_prefix, revoked_at__isnull=True).first())
            if row is None:
                raise NotFound(f"no active key {key_prefix!r} on {model_name!r}", field="key")
            target_type, target = "apikey", f"{model_name}/{key_prefix}"
        before = limits_of(row)
        for name, value in cleaned.items():
            setattr(row, _COLUMNS[name], value)
        after = limits_of(row)
        if after == before:
            return row
        row.save(update_fields=[_COLUMNS[n] for n in cleaned])
        endpoint.revision = bump_revision()
        endpoint.save(update_fields=["revision", "updated_at"])
        record(actor, "limits.set", target_type=target_type, target=target,
               model_name=model_name, before=before, after=after, reason=reason)
    return row
