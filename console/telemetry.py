"""The console's traces: when the OTEL_* variables name an exporter (serving.core.tracing's rule,
the same as the replicas'), each request is a trace through OpenTelemetry's Django
instrumentation, each Celery task joins the trace of the request that queued it (the Celery
instrumentation, clustered mode), and an outbound webhook or job callback carries its
`traceparent` (registry.integrations.outbound). Off otherwise: nothing is imported."""

from __future__ import annotations

import importlib.util
import os
import socket

from serving.core.tracing import MissingTracePackages, exporter_from_env, install_provider

#: module -> the distribution that ships it; Django's instrumentation makes spans of ASGI
#: requests (the console's) only with the ASGI one installed
INSTRUMENTATIONS = {
    "opentelemetry.instrumentation.django": "opentelemetry-instrumentation-django",
    "opentelemetry.instrumentation.asgi": "opentelemetry-instrumentation-asgi",
    "opentelemetry.instrumentation.celery": "opentelemetry-instrumentation-celery",
}


def start_tracing(*, clustered: bool) -> bool:
    """Instrument Django (and Celery when `clustered`) if tracing is on; whether it is.
    MissingTracePackages names what to install when it is on without them."""
    exporter = exporter_from_env(os.environ)
    if exporter is None:
        return False
    wanted = list(INSTRUMENTATIONS)[: 3 if clustered else 2]
    missing = [INSTRUMENTATIONS[m] for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingTracePackages(f"tracing is on ({exporter.why})", missing)
    install_provider(exporter, service="mmc-console", instance=socket.gethostname())
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    instrumentor = DjangoInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
    if clustered:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        celery = CeleryInstrumentor()
        if not celery.is_instrumented_by_opentelemetry:
            celery.instrument()
    return True
