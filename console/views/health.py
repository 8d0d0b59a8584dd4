"""The health bar as a partial: every page polls it, so a degraded part shows without a reload."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from ..templatetags.console import health_bar
from .access import requires


@require_GET
@requires("viewer")
def health_partial(request: HttpRequest) -> HttpResponse:
    return render(request, "console/partials/health_bar.html", health_bar())
