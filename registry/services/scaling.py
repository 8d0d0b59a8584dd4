"""Scale to zero of an endpoint: the idle time after which replicas unload its versions (the next
request loads them again). One service, validated, audited, shipped with the route table."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from registry.audit import Actor, record
from registry.errors import InvalidRequest
from registry.models import Endpoint
from registry.notify import bump_revision
from registry.services.catalog import lock_model
from registry.services.deployments import endpoint_for_update

#: The longest idle timeout accepted: a week (longer is the same as off, and likely a typo).
MAX_IDLE_SECONDS = 7 * 24 * 3600


def clean_idle_seconds(value: Any) -> int:
    """The idle timeout, checked: whole seconds from 1 to a week, or 0 (never scale to zero)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest("scale_to_zero_after_seconds must be a whole number of seconds "
                             "(0: never scale to zero)", field="scale_to_zero_after_seconds")
    if value != value or value < 0 or value > MAX_IDLE_SECONDS:
        raise InvalidRequest(f"scale_to_zero_after_seconds must be 0 (never) or 1 to "
                             f"{MAX_IDLE_SECONDS} (a week), got {value}",
                             field="scale_to_zero_after_seconds")
    if value != int(value):
        raise InvalidRequest(f"scale_to_zero_after_seconds must be a whole number of seconds, "
                             f"got {value}", field="scale_to_zero_after_seconds")
    return int(value)


def scale_to_zero_set(*, model_name: str, actor: Actor, seconds: Any,
                      reason: str = "") -> Endpoint:
    """Set after how many idle seconds replicas unload the endpoint's versions (0: never). The
    value is checked before anything is written; an unchanged value writes nothing."""
    cleaned = clean_idle_seconds(seconds)
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name))
        before = endpoint.scale_to_zero_after_seconds
        if before == cleaned:
            return endpoint
        endpoint.scale_to_zero_after_seconds = cleaned
        endpoint.revision = bump_revision()
        endpoint.save(update_fields=["scale_to_zero_after_seconds", "revision", "updated_at"])
        record(actor, "endpoint.scale_to_zero", target_type="endpoint", target=model_name,
               model_name=model_name, before={"scale_to_zero_after_seconds": before},
               after={"scale_to_zero_after_seconds": cleaned}, reason=reason)
    return endpoint
