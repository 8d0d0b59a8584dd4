"""Who did it: the actor of a mutation, and the audit event written in the same transaction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from registry.models import AuditEvent

#: Called with every event written, inside its transaction (webhooks register here at start-up:
#: the audit log knows nothing of who listens).
_listeners: list[Callable[[AuditEvent], None]] = []


def listen(fn: Callable[[AuditEvent], None]) -> None:
    if fn not in _listeners:
        _listeners.append(fn)


@dataclass(frozen=True)
class Actor:
    user: Any | None
    name: str
    request_id: str = ""
    client_address: str = ""

    @classmethod
    def system(cls, name: str = "system") -> Actor:
        return cls(user=None, name=name)

    @classmethod
    def from_request(cls, request) -> Actor:
        user = getattr(request, "user", None)
        authenticated = bool(user and user.is_authenticated)
        return cls(
            user=user if authenticated else None,
            name=user.get_username() if authenticated else "anonymous",
            request_id=getattr(request, "request_id", ""),
            client_address=request.META.get("REMOTE_ADDR", "") or "",
        )


def record(
    actor: Actor, action: str, *, target_type: str, target: str, model_name: str = "",
    before: dict | None = None, after: dict | None = None, reason: str = "",
) -> AuditEvent:
    """Write one audit event. Must run inside the transaction of the change it records."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError(f"audit event {action!r} written outside a transaction")
    event = AuditEvent.objects.create(
        actor=actor.user, actor_name=actor.name, action=action, target_type=target_type,
        target=target, model_name=model_name, before=before, after=after, reason=reason,
        request_id=actor.request_id, client_address=actor.client_address,
    )
    for listener in _listeners:
        listener(event)
    return event
