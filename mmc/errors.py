"""What the client raises: one `MmcError` carrying the server's own message, a subclass per kind
of refusal so a script catches what it can handle (`except mmc.Conflict`), and two that are not
the server's answer at all: `ConnectionFailed` (nothing answered) and `WaitTimeout` (a wait this
client ran out of time for)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class MmcError(Exception):
    """A refusal or failure. `status` is the HTTP status (None when no server answered),
    `message` the server's `{"error": ...}` text, `payload` the whole parsed answer."""

    def __init__(self, message: str, *, status: int | None = None, payload: Any = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.payload = payload
        self.retry_after = retry_after

    @property
    def field(self) -> str | None:
        """The request field the server named as wrong, when it named one."""
        return self.payload.get("field") if isinstance(self.payload, dict) else None

    def __str__(self) -> str:
        return f"{self.status}: {self.message}" if self.status is not None else self.message


class BadRequest(MmcError):
    """400: the request was malformed or a value was invalid (`field` names which)."""


class Unauthorized(MmcError):
    """401: no token, or one the server no longer accepts (expired, revoked)."""


class Forbidden(MmcError):
    """403: the token's role may not do this (or, for an approval, it is your own upload)."""


class NotFound(MmcError):
    """404: no such model, version, alias, job, dataset or webhook."""


class Conflict(MmcError):
    """409: refused in the current state, e.g. a rollout step the endpoint's state forbids, or a
    deletion while something still holds the version."""


class Gone(MmcError):
    """410: it existed, but not any more (an expired job result or dataset)."""


class PayloadTooLarge(MmcError):
    """413: the body is over the server's limit."""


class Unprocessable(MmcError):
    """422: understood but cannot be done, e.g. a model that cannot be converted."""


class RateLimited(MmcError):
    """429: too many requests (or logins); `retry_after` says how many seconds to wait."""


class ServerError(MmcError):
    """5xx: the server failed; the request may succeed later."""


class ServiceUnavailable(ServerError):
    """503: a dependency (the database, the artifact store) is down; see `retry_after`."""


class InsufficientStorage(ServerError):
    """507: the artifact store is full."""


class ConnectionFailed(MmcError):
    """The server could not be reached, or the connection broke before it answered."""


class WaitTimeout(MmcError, TimeoutError):
    """A client-side wait (validation, a job) ran out of time; `last` is what was seen last."""

    def __init__(self, message: str, *, last: Any = None):
        super().__init__(message)
        self.last = last


BY_STATUS: dict[int, type[MmcError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone,
    413: PayloadTooLarge, 422: Unprocessable, 429: RateLimited, 503: ServiceUnavailable,
    507: InsufficientStorage,
}


def _seconds(raw: str | None) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None  # an HTTP date: rare enough to leave to the caller (payload, headers)


def error_for(status: int, body: bytes, headers: Mapping[str, str]) -> MmcError:
    """The exception for an error answer: its class by status, its message the server's
    `error` text (the whole body when the answer is not our JSON)."""
    text = body.decode("utf-8", "replace")
    try:
        payload: Any = json.loads(text)
    except ValueError:
        payload = None
    message = payload["error"] if isinstance(payload, dict) and "error" in payload else text
    kind = BY_STATUS.get(status) or (ServerError if status >= 500 else MmcError)
    return kind(str(message), status=status, payload=payload if payload is not None else text,
                retry_after=_seconds(headers.get("Retry-After")))
