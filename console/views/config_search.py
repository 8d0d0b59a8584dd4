"""The version page's serving-config search card: start a search, follow it (an htmx partial
polled while it runs), apply a point, cancel. The same services as the API's config-search
routes; the version page itself is rendered by views.versions."""

from __future__ import annotations

from functools import partial

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from registry import selectors
from registry.errors import InvalidRequest, RegistryError
from registry.models import ConfigSearch, ModelVersion
from registry.services import config_search as svc
from registry.services.config_search import settings_of
from serving.core.tensor_signature import batch_dimension

from ..charts import scatter_chart
from ..forms import ConfigSearchForm, error_text
from ..serving_form import LABELS
from .access import requires, run_service
from .models import found

#: Column heads of the points table, in DIMENSIONS order.
HEADS = ("Max batch", "Queue delay µs", "Instances", "Threads", "Cache")
PHASES = {"applying": "applying its settings", "reloading": "waiting for the replica to reload",
          "warming up": "warming up", "measuring": "measuring"}


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def panel(search: ConfigSearch | None) -> dict:
    """What the results partial shows of a search: its points as table rows, the chart."""
    if search is None:
        return {"search": None}
    rows = []
    for i, p in enumerate(search.points):
        rows.append({"n": i, "p": p, "best": i == search.best,
                     "applied": i == search.applied_point,
                     "values": [_shown(p["settings"].get(d)) for d in svc.DIMENSIONS],
                     "measured": not p.get("failure") and p.get("rps") is not None
                     and p.get("p99_ms") is not None,
                     "errors": sum((p.get("errors") or {}).values())})
    progress = search.progress or {}
    best = rows[search.best] if search.best is not None else None
    return {"search": search, "rows": rows,
            "heads": [(head, d in search.grid) for head, d in zip(HEADS, svc.DIMENSIONS,
                                                                   strict=True)],
            "chart": scatter_chart(search.points, budget=search.p99_budget_ms, best=search.best),
            "best": best,
            "best_settings": ", ".join(f"{head.lower()} {value}" for head, d, value in zip(
                HEADS, svc.DIMENSIONS, best["values"], strict=True) if d in search.grid)
            if best else "",
            "phase": PHASES.get(progress.get("phase"), progress.get("phase") or "queued"),
            "at_point": (progress.get("point") or 0) + 1}


def search_context(request: HttpRequest, version: ModelVersion) -> dict:
    """The card's part of the version page's context: the form, the search shown (the one
    asked for with ?search=, else the newest) and the earlier ones."""
    searches = list(selectors.config_search_list(version)[:8])
    wanted = request.GET.get("search", "")
    shown = next((s for s in searches if str(s.pk) == wanted), searches[0] if searches else None)
    replicas = [r.replica for r in selectors.replicas()]
    return {
        "search_form": ConfigSearchForm.for_version(
            version, replicas=replicas,
            batchable=bool(batch_dimension(version.signature or {}))),
        "searches": searches, **panel(shown),
        "search_limits": {"points": svc.MAX_POINTS, "seconds": svc.MAX_SECONDS,
                          "values": svc.MAX_VALUES,
                          "per_point": settings.LOADTEST_MAX_SECONDS},
    }


def _back(name: str, number: int, search_id: int | None = None) -> HttpResponse:
    url = reverse("console:version-detail", args=[name, number])
    return redirect(f"{url}?search={search_id}#config-search" if search_id else
                    f"{url}#config-search")


def refusal(exc: RegistryError, *, name: str, number: int) -> str | None:
    """The service's refusals that name API parameters (confirm=true, `key`), in the form's
    terms; the API keeps its own words."""
    fields = ConfigSearchForm.base_fields
    details = exc.details or {}
    if details.get("rule") == "live-traffic":
        return (f"v{number} takes real traffic ({', '.join(details.get('roles') or [])} of "
                f"{name}): a search changes its settings point by point. Tick "
                f"“{fields['confirm'].label}” to run it anyway.")
    if isinstance(exc, InvalidRequest) and exc.field == "key":
        return f"{name}'s endpoint requires a predict key: fill in “{fields['key'].label}”."
    return None


@require_POST
@requires("viewer", write="engineer")
def config_search_start(request: HttpRequest, name: str, number: int) -> HttpResponse:
    form = ConfigSearchForm(request.POST, replicas=[r.replica for r in selectors.replicas()])
    if not form.is_valid():
        messages.error(request, "Search not started: " + error_text(form))
        return _back(name, number)
    search = run_service(request, svc.config_search_create, model_name=name, number=number,
                         **form.service_kwargs(),
                         worded=partial(refusal, name=name, number=number),
                         success="Serving-config search queued: its points show below as "
                                 "they are measured.")
    return _back(name, number, search.pk if search else None)


@require_GET
@requires("viewer")
def config_search_panel(request: HttpRequest, name: str, number: int,
                        search_id: int) -> HttpResponse:
    """The results partial (htmx polls it while the search runs); a plain visit goes to the
    version page showing that search."""
    search = found(partial(svc.config_search_get, model_name=name, number=number,
                           search_id=search_id))
    if not request.htmx:
        return _back(name, number, search.pk)
    return render(request, "console/partials/config_search_run.html",
                  {"model": search.version.model, "version": search.version, **panel(search)})


@require_POST
@requires("viewer", write="engineer")
def config_search_apply(request: HttpRequest, name: str, number: int,
                        search_id: int) -> HttpResponse:
    raw = request.POST.get("point", "")
    point = int(raw) if raw.isdigit() else None
    before = settings_of(found(selectors.version_get, name, number))
    version = run_service(request, svc.config_search_apply, model_name=name, number=number,
                          search_id=search_id, point=point)
    if version is not None:
        after = settings_of(version)
        said = "; ".join(f"{LABELS[d]} {_shown(before[d])} → {_shown(after[d])}"
                         for d in svc.DIMENSIONS if before[d] != after[d])
        messages.success(request, (
            f"Applied point #{point if point is not None else 'best'} of search {search_id} "
            f"to v{number}: " + (f"{said}. Replicas serving v{number} reload it with these "
                                 f"settings." if said else "it already had these settings.")))
    return _back(name, number, search_id)


@require_POST
@requires("viewer", write="engineer")
def config_search_cancel(request: HttpRequest, name: str, number: int,
                         search_id: int) -> HttpResponse:
    run_service(request, svc.config_search_cancel, model_name=name, number=number,
                search_id=search_id, reason=request.POST.get("reason", "")[:1000],
                success="Search cancelled: the version's own settings are put back within a "
                        "second or two.")
    return _back(name, number, search_id)
