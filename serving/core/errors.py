"""Typed data-plane errors, rendered once into the protocol's `{"error": "..."}` body.

Code below the HTTP layer raises these; the HTTP layer only reads `status`, `headers` and
`body()`, so every front (REST, /invocations, a future gRPC) answers the same way.
"""

from __future__ import annotations

import orjson


class ServingError(Exception):
    """Base of every error a client may see; `status` 500 unless a subclass says otherwise."""

    status: int = 500

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> bytes:
        """The protocol's error body: a JSON object whose only key names what went wrong."""
        return orjson.dumps({"error": self.message})


class InvalidInput(ServingError):
    """Malformed request: bad JSON, unknown or missing input, wrong datatype or shape."""

    status = 400


class Unauthorized(ServingError):
    """Missing or wrong credentials: a protected model's API key, a registry API token."""

    status = 401

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer", **(headers or {})})


class Forbidden(ServingError):
    """The caller is known but may not do this (e.g. repository load/unload without the role)."""

    status = 403


class ModelNotFound(ServingError):
    """Unknown model or version; the message names which."""

    status = 404


class Conflict(ServingError):
    """The target's current state forbids the operation (e.g. a load while a rollout runs)."""

    status = 409


class MethodNotAllowed(ServingError):
    """The path exists but not for this HTTP method; `Allow` names the one it takes."""

    status = 405


class PayloadTooLarge(ServingError):
    """A request body (or what it decompresses to) is over the server's limit."""

    status = 413


class RequestTimeout(ServingError):
    """The body stopped arriving (or arrives slower than the minimum rate); the connection
    closes after this answer, so the client's half-sent body is not read on."""

    status = 408

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Connection": "close"})


class BodyBudgetExhausted(ServingError):
    """Taking this body would push the process's buffered request bytes over its budget."""

    status = 503

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after),
                                           "Connection": "close"})


class ModelNotReady(ServingError):
    """The model exists but is not loaded (or is draining); clients may retry."""

    status = 503

    def __init__(
        self, message: str, *, retry_after: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        extra = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        super().__init__(message, headers={**extra, **(headers or {})})


class ReplicaStarting(ServingError):
    """The replica has not applied its first route table yet, so it cannot tell a model it is
    about to serve from one it never will: 503 with `Retry-After`, never a 404."""

    status = 503

    def __init__(self, replica: str, *, retry_after: int = 1) -> None:
        super().__init__(f"replica '{replica}' is starting: it has not loaded its model table "
                         "yet; retry shortly", headers={"Retry-After": str(retry_after)})


class QueueFull(ServingError):
    """The version's batcher queue is at its limit; `Retry-After` tells clients when to retry."""

    status = 503

    def __init__(
        self, message: str, *, retry_after: int = 1, headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after), **(headers or {})})
        self.retry_after = retry_after


class ServerFault(ServingError):
    """A genuine server-side failure (the runtime raised, a bug); never the client's fault."""

    status = 500


class ModelFailed(ServingError):
    """The model raised while running on inputs its signature accepts (an integer division by
    zero, a Reshape its own constants cannot satisfy): the version's fault, not the caller's, so
    a 500 counted against that version, never a 400."""

    status = 500


class NotSupported(ServingError):
    """The request is well formed but this deployment does not offer it."""

    status = 501
