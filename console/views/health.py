"""The health bar as a partial (every page polls it, so a degraded part shows without a reload),
`/healthz`, the same checks as JSON for load balancers and probes, and `/healthz/metrics`, the
replicas' and endpoints' states as Prometheus metrics for the alert rules."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from registry.api.errors import DATABASE_RETRY_AFTER

from .. import health, prometheus
from ..templatetags.console import health_bar
from .access import requires


@require_GET
def health_partial(request: HttpRequest) -> HttpResponse:
    database = health.database()
    if not database.ok:  # no session to read: say what is down, and only that
        return render(request, "console/partials/health_bar.html",
                      {"checks": [database], "all_ok": False})
    return _health_partial(request, database)


@requires("viewer")
def _health_partial(request: HttpRequest, database: health.Check) -> HttpResponse:
    return render(request, "console/partials/health_bar.html", health_bar(database))


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """No sign-in (it names dependencies and states, nothing else). 200 while the console can
    work (its database answers), 503 with Retry-After when it cannot."""
    database = health.database()
    checks = health.checks(database) if database.ok else [database]
    body = {"status": "ok" if all(c.ok for c in checks) else "degraded" if database.ok
            else "unavailable",
            "checks": {c.name.lower(): {"state": c.state, "detail": c.detail} for c in checks}}
    response = JsonResponse(body, status=200 if database.ok else 503)
    if not database.ok:
        response["Retry-After"] = str(DATABASE_RETRY_AFTER)
    return response


@never_cache
@require_GET
def healthz_metrics(request: HttpRequest) -> HttpResponse:
    """No sign-in, as `/healthz` and a replica's /metrics: replica and model names, revisions
    and traffic shares, nothing else. A database that does not answer fails the scrape (503)."""
    body, content_type = prometheus.render()
    return HttpResponse(body, content_type=content_type)
