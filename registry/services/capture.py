"""Data capture of an endpoint: which share of its requests replicas record, which tensors, the
byte cap of one record and how long records are kept. One service, validated, audited, shipped
with the route table (serving.core.capture does the recording)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction

from registry.audit import Actor, record
from registry.errors import InvalidRequest
from registry.models import Endpoint
from registry.monitoring.capture import capture_settings_of
from registry.notify import bump_revision
from registry.services.catalog import lock_model
from registry.services.deployments import endpoint_for_update

MODES = ("inputs", "outputs", "both")
#: The largest per-request byte cap: a record bigger than this is a dataset, not a sample.
MAX_RECORD_BYTES = 16 * 1024 * 1024
#: The longest retention accepted: ten years (anything longer is a typo).
MAX_RETENTION_DAYS = 3650
FIELDS = ("percent", "mode", "max_bytes", "retention_days")
_COLUMNS = {"percent": "capture_percent", "mode": "capture_mode",
            "max_bytes": "capture_max_bytes", "retention_days": "capture_retention_days"}


def _whole(value: Any, field: str, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value \
            or value != int(value) or not low <= value <= high:
        raise InvalidRequest(f"{field} must be a whole number from {low} to {high} ({what}), "
                             f"got {value!r}"[:300], field=field)
    return int(value)


def clean_capture(values: dict) -> dict:
    """The settings in `values` (any subset of FIELDS), checked; InvalidRequest names the first
    field out of range. Unknown keys are refused too, so a typo is not silently ignored."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown capture setting {unknown[0]!r} (known: "
                             f"{', '.join(FIELDS)})", field=unknown[0])
    cleaned: dict = {}
    if "percent" in values:
        raw = values["percent"]
        try:
            if isinstance(raw, bool) or not isinstance(raw, int | float | str | Decimal):
                raise InvalidOperation
            percent = Decimal(str(raw))
        except InvalidOperation:
            percent = None
        if percent is None or not percent.is_finite() or not 0 <= percent <= 100 \
                or percent != percent.quantize(Decimal("0.001")):
            raise InvalidRequest(f"percent must be a number from 0 to 100 (at most three "
                                 f"decimals; 0: capture off), got {raw!r}"[:300],
                                 field="percent")
        cleaned["percent"] = percent.quantize(Decimal("0.001"))
    if "mode" in values:
        if values["mode"] not in MODES:
            raise InvalidRequest(f"mode must be one of {', '.join(MODES)}, got "
                                 f"{values['mode']!r}"[:300], field="mode")
        cleaned["mode"] = values["mode"]
    if "max_bytes" in values:
        cleaned["max_bytes"] = _whole(values["max_bytes"], "max_bytes", 0, MAX_RECORD_BYTES,
                                      "tensor bytes one record keeps")
    if "retention_days" in values:
        cleaned["retention_days"] = _whole(values["retention_days"], "retention_days", 1,
                                           MAX_RETENTION_DAYS, "days records are kept")
    return cleaned


def capture_set(*, model_name: str, actor: Actor, values: dict, reason: str = "") -> Endpoint:
    """Change some or all of an endpoint's capture settings. Every value is checked before
    anything is written; an unchanged setting writes nothing (no audit, no revision)."""
    cleaned = clean_capture(values)
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name))
        before = capture_settings_of(endpoint)
        for key, value in cleaned.items():
            setattr(endpoint, _COLUMNS[key], value)
        after = capture_settings_of(endpoint)
        if after == before:
            return endpoint
        endpoint.revision = bump_revision()
        endpoint.save(update_fields=[*(_COLUMNS[k] for k in cleaned), "revision", "updated_at"])
        changed = [k for k in FIELDS if before[k] != after[k]]
        record(actor, "endpoint.capture", target_type="endpoint", target=model_name,
               model_name=model_name, before={k: before[k] for k in changed},
               after={k: after[k] for k in changed}, reason=reason)
    return endpoint
