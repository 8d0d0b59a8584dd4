"""ASGI entry point. Embedded mode: one process serves the console (Django) and the data plane
(serving.http.app, mounted at /v2, /ping, /invocations, /metrics, with no Django on its request
path).
Clustered mode: the console process serves Django only; `mmc-serve --registry` replicas serve."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_app = get_asgi_application()

from asgiref.sync import sync_to_async  # noqa: E402
from django.db import close_old_connections  # noqa: E402
from django.http import HttpResponse, JsonResponse  # noqa: E402
from django.urls import Resolver404  # noqa: E402

from registry.api.authentication import (  # noqa: E402
    headers_only_request,
    presents_credentials,
    view_admission,
)
from registry.api.errors import server_error  # noqa: E402
from registry.api.uploads import (  # noqa: E402
    RAW_UPLOAD_PATH,
    RECEIVED_BODY,
    UploadSlots,
    ensure_room,
    receive_into_store,
)
from registry.errors import (  # noqa: E402
    CredentialsRequired,
    PayloadTooLarge,
    RegistryError,
    RequestTimeout,
    TooManyAttempts,
)
from registry.logfilters import database_unavailable  # noqa: E402
from registry.replica_api import PREFIX as REPLICA_API  # noqa: E402
from registry.replica_api import replica_api  # noqa: E402
from registry.store.artifacts import default_store  # noqa: E402
from serving.edge_limits import EdgeLimits  # noqa: E402

log = logging.getLogger(__name__)
SERVING_PREFIXES = ("/v2", "/ping", "/invocations", "/metrics")
UPLOAD_SLACK = 1024 * 1024
#: The most request body a caller who presents no valid token or session may send: the login
#: form and small form posts fit; anything larger is refused (401) before a byte is read.
ANONYMOUS_BODY_BYTES = 1024 * 1024
#: The edge limits of every listener: a raw upload's body has the data plane's idle timeout and
#: minimum rate (MMC_BODY_IDLE_TIMEOUT_S, MMC_BODY_MIN_RATE).
BODY_LIMITS = EdgeLimits.from_env()
UPLOADS = UploadSlots()


def _build_serving():
    from registry.serving_source import RegistrySource
    from serving.http.app import create_app

    return create_app(RegistrySource(address=os.environ.get("MMC_REPLICA_ADDRESS", "embedded")),
                      replica=os.environ.get("MMC_REPLICA", "embedded"))


serving_app = _build_serving() if settings.EMBED_SERVING else None
if not settings.CLUSTERED:  # embedded: periodic tasks run here (clustered: Celery beat)
    from registry.background import start_scheduler

    start_scheduler()  # the jobs tick recovers interrupted jobs at once, then runs periodically


class _Refused(Exception):
    """A request answered from its headers alone: `response` says why."""

    def __init__(self, response: HttpResponse):
        super().__init__(response.status_code)
        self.response = response


def _refusal(exc: RegistryError, *, close: bool = False) -> HttpResponse:
    """`exc` as the API renders it ({"error": ...}, Retry-After); `close`: the connection ends
    with the answer (a client that stalls mid-body is not waited for)."""
    response = JsonResponse({"error": exc.message}, status=exc.status)
    if exc.status == 401:
        response["WWW-Authenticate"] = "Bearer"
    if getattr(exc, "retry_after", None):
        response["Retry-After"] = str(exc.retry_after)
    if close:
        response["Connection"] = "close"
    return response


async def _send_response(send, response: HttpResponse) -> None:
    """A rendered Django response, as it stands (no middleware ran)."""
    body = response.content
    headers = [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in response.items()
               if k.lower() != "content-length"]
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _too_large(send, declared: int | None) -> None:
    size = f"request body of {declared} bytes" if declared is not None else "request body"
    await _send_response(send, _refusal(PayloadTooLarge(
        f"{size} is over the limit of {settings.MAX_UPLOAD_BYTES} bytes")))


def _declared_length(scope) -> int | None:
    """The body's Content-Length; None when it has none but is chunked (of unknown size)."""
    chunked = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value or 0)
        if name == b"transfer-encoding":
            chunked = True
    return None if chunked else 0


def _in_thread(gate):
    """`gate(scope, ...)` on Django's thread for synchronous code (the ORM), its connections
    closed after, as at the end of a request. What it refuses (a RegistryError) and a database
    that does not answer (503, as the API answers it) come back as _Refused."""
    def call(scope, *args):
        try:
            return gate(scope, *args)
        except RegistryError as exc:
            raise _Refused(_refusal(exc)) from None
        except Exception as exc:
            if not database_unavailable(exc):
                raise
            log.warning("%s %s refused before its body: database unavailable: %s",
                        scope.get("method"), scope.get("path"), type(exc).__name__)
            raise _Refused(server_error(headers_only_request(scope))) from None
        finally:
            close_old_connections()
    return sync_to_async(call)


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        if serving_app is not None:
            return await serving_app(scope, receive, send)
        message = await receive()  # Django has no lifespan: acknowledge and wait for shutdown
        while message["type"] != "lifespan.shutdown":
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope.get("path", "")
    if serving_app is not None and path.startswith(SERVING_PREFIXES):
        return await serving_app(scope, receive, send)
    if scope["type"] == "http" and path.startswith(REPLICA_API):
        return await replica_api(scope, receive, send)  # replicas: long polls, no Django
    if scope["type"] == "http":
        # Django's ASGI handler spools the whole body before any view runs: whatever is refused
        # for its headers (size, caller, role, free space) is refused before a byte is read.
        declared = _declared_length(scope)
        if declared is not None and declared > settings.MAX_UPLOAD_BYTES + UPLOAD_SLACK:
            return await _too_large(send, declared)
        if scope.get("method") == "PUT" and RAW_UPLOAD_PATH.match(path):
            return await _raw_upload(scope, receive, send, declared)
        if declared is None or declared > ANONYMOUS_BODY_BYTES:
            try:
                await _in_thread(_admit_large_body)(scope, declared)
            except _Refused as refused:
                return await _send_response(send, refused.response)
    return await django_app(scope, receive, send)


def _admit_large_body(scope, declared: int | None) -> None:
    """A body over ANONYMOUS_BODY_BYTES (or of unknown size) is read only from a caller who
    presents a valid token or session (401), and only if the disk it is spooled to has room
    for it (507)."""
    if not presents_credentials(headers_only_request(scope)):
        size = f"of {declared} bytes" if declared is not None else "of undeclared size"
        raise CredentialsRequired(
            f"a request body {size} needs an API token (Authorization: Bearer …) or a "
            f"signed-in session; none was presented, and none of the body was read")
    if declared:
        ensure_room(declared)  # the artifact disk's floor, whatever the store


def _admit_upload(scope, declared: int | None):
    """Who sends this raw upload, judged from its headers as the upload view judges it (its own
    authentication and permission classes: no rule restated here), when it may send it; raises
    InsufficientStorage when a local store has no room for its declared size."""
    user, refusal = view_admission(headers_only_request(scope))
    if refusal is not None:
        raise _Refused(refusal)
    if declared and default_store().on_local_disk:
        ensure_room(declared)
    return user


async def _raw_upload(scope, receive, send, declared: int | None) -> None:
    """A raw version upload. Admitted from its headers alone (401/403 as the view would answer,
    429 past MMC_MAX_UPLOADS_PER_USER in progress, 507 without room for it), its body goes
    into the store while it arrives (once, hashed on the way; 408 when it stalls or trickles),
    then Django runs the view with an empty body and the filled writer in the scope; a body the
    view does not take (refused, failed) is removed."""
    try:
        user = await _in_thread(_admit_upload)(scope, declared)
        UPLOADS.take(user.pk, settings.MAX_UPLOADS_PER_USER)
    except Resolver404:  # no view serves this path: Django answers it (404), body unread
        return await django_app(scope, _empty_body(receive), send)
    except _Refused as refused:  # 401, 403, 507 (or 503: no database)
        return await _send_response(send, refused.response)
    except TooManyAttempts as exc:
        return await _send_response(send, _refusal(exc))
    try:
        await _receive_and_register(scope, receive, send)
    finally:
        UPLOADS.release(user.pk)


async def _receive_and_register(scope, receive, send) -> None:
    try:
        writer = await receive_into_store(receive, idle_timeout_s=BODY_LIMITS.body_idle_timeout_s,
                                          min_rate=BODY_LIMITS.body_min_rate)
    except PayloadTooLarge:
        return await _too_large(send, None)
    except RequestTimeout as exc:  # stalled or trickling: not waited for any longer
        return await _send_response(send, _refusal(exc, close=True))
    except RegistryError as exc:  # the disk got down to the free space it keeps (507)
        return await _send_response(send, _refusal(exc))
    if writer is None:  # the client went away
        return
    rest = _empty_body(receive)

    async def answer(message):
        if message["type"] == "http.response.start":  # the view is done: before the client
            writer.abort()  # hears a refusal, what it sent is gone (no-op once stored)
        await send(message)

    try:
        await django_app({**scope, RECEIVED_BODY: writer}, rest, answer)
    finally:
        writer.abort()


def _empty_body(receive):
    """A receive that gives Django an empty body, then whatever the connection says next
    (its disconnect): the body was read already, or is not to be read."""
    sent = False

    async def rest():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return await receive()

    return rest
