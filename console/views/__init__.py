"""Console pages, one module per concept: models, versions, audit (access holds the role check)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def render_page_or_partial(request: HttpRequest, page: str, partial: str, context: dict, *,
                           status: int = 200, partial_status: int | None = None) -> HttpResponse:
    """The whole page, or only the partial an htmx request re-renders (a filter, sort, page or
    poll): one place decides. `partial_status` (default: `status`) lets a partial answer 200 where
    htmx must swap it in anyway, e.g. to show a filter's errors (htmx drops 4xx bodies)."""
    if request.htmx:
        return render(request, partial, context,
                      status=status if partial_status is None else partial_status)
    return render(request, page, context, status=status)
