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


async def _too_large(send, declared: int) -> None:
    body = orjson.dumps({"error": f"request body of {declared} bytes is over the limit of "
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
    return await django_app(scope, receive, send)
