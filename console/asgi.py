"""ASGI entry point. Embedded mode: one process serves the console (Django) and the data plane
(serving.app, mounted at /v2, /ping, /invocations, /metrics, with no Django on its request path).
Clustered mode: the console process serves Django only; `mmc-serve --registry` replicas serve."""

from __future__ import annotations

import os

import orjson

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_app = get_asgi_application()

from registry.api.uploads import RAW_UPLOAD_PATH, RECEIVED_BODY, receive_into_store  # noqa: E402
from registry.errors import PayloadTooLarge  # noqa: E402

SERVING_PREFIXES = ("/v2", "/ping", "/invocations", "/metrics")
UPLOAD_SLACK = 1024 * 1024


def _build_serving():
    from registry.serving_source import RegistrySource
    from serving.app import create_app

    return create_app(RegistrySource(address=os.environ.get("MMC_REPLICA_ADDRESS", "embedded")),
                      replica=os.environ.get("MMC_REPLICA", "embedded"))


serving_app = _build_serving() if settings.EMBED_SERVING else None
if not settings.CLUSTERED:  # embedded: periodic tasks run here (clustered: Celery beat)
    from registry.background import start_scheduler

    start_scheduler()  # the jobs tick recovers interrupted jobs at once, then runs periodically


async def _too_large(send, declared: int | None) -> None:
    size = f"request body of {declared} bytes" if declared is not None else "request body"
    body = orjson.dumps({"error": f"{size} is over the limit of "
                                  f"{settings.MAX_UPLOAD_BYTES} bytes"})
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


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
    if scope["type"] == "http":
        # Django's ASGI handler spools the whole body before any view runs: refuse a declared
        # oversized body here, before a byte of it is read.
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                declared = int(value or 0)
                if declared > settings.MAX_UPLOAD_BYTES + UPLOAD_SLACK:
                    return await _too_large(send, declared)
                break
        if scope.get("method") == "PUT" and RAW_UPLOAD_PATH.match(path):
            return await _raw_upload(scope, receive, send)
    return await django_app(scope, receive, send)


async def _raw_upload(scope, receive, send) -> None:
    """A raw version upload: its body goes into the store while it arrives (once, hashed on the
    way), then Django runs the view with an empty body and the filled writer in the scope; a
    body the view does not take (refused, failed) is removed."""
    try:
        writer = await receive_into_store(receive)
    except PayloadTooLarge:
        return await _too_large(send, None)
    if writer is None:  # the client went away
        return
    sent = False

    async def rest():
        nonlocal sent
        if not sent:  # the body, already read; then whatever the connection says (disconnect)
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return await receive()

    async def answer(message):
        if message["type"] == "http.response.start":  # the view is done: before the client
            writer.abort()  # hears a refusal, what it sent is gone (no-op once stored)
        await send(message)

    try:
        await django_app({**scope, RECEIVED_BODY: writer}, rest, answer)
    finally:
        writer.abort()
