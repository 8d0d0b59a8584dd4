"""Model pages: the searchable list, create, the model page (versions, aliases, endpoint,
upload, diff) and the POSTs behind its buttons. Every change goes through a registry service."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from registry import selectors, services
from registry.errors import NotFound
from registry.evaluation import metric_columns, metric_diff, metric_rows
from registry.filtersets import ModelFilterSet, VersionFilterSet
from registry.models import VersionStatus
from registry.roles import TEAM_RANK, may, visible_models
from registry.services.deletion import model_delete, model_deletion_refusal

from ..forms import (
    AliasSetForm,
    ApprovalSettingForm,
    DeployForm,
    DiffForm,
    ModelCreateForm,
    ModelEditForm,
    ReasonForm,
    error_text,
)
from ..templatetags.console import filesize
from . import render_page_or_partial
from .access import requires, run_service

PAGE_SIZES = (25, 50, 100)
PENDING = (VersionStatus.UPLOADED, VersionStatus.VALIDATING)


def found(selector, *args):
    """A selector's result, or 404 when the registry says it does not exist."""
    try:
        return selector(*args)
    except NotFound as exc:
        raise Http404(exc.message) from None


def page_size(request: HttpRequest) -> int:
    try:
        size = int(request.GET.get("per_page", PAGE_SIZES[0]))
    except ValueError:
        return PAGE_SIZES[0]
    return size if size in PAGE_SIZES else PAGE_SIZES[0]


@require_GET
@requires("viewer")
def model_list(request: HttpRequest) -> HttpResponse:
    filterset = ModelFilterSet(request.GET, queryset=visible_models(selectors.model_list(),
                                                                    request.user))
    size = page_size(request)
    page = Paginator(filterset.qs, size).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"filter": filterset, "page": page, "query": query.urlencode(),
               "per_page": size, "page_sizes": PAGE_SIZES,
               "teams": selectors.my_teams(request.user)}
    return render_page_or_partial(request, "console/model_list.html",
                                  "console/partials/model_table.html", context)


@requires("engineer", write="engineer")
def model_create(request: HttpRequest) -> HttpResponse:
    teams = [t["team"] for t in selectors.my_teams(request.user)
             if TEAM_RANK[t["role"]] >= TEAM_RANK["engineer"]]
    form = ModelCreateForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        model = run_service(request, services.model_create, success="Model created.",
                            name=form.cleaned_data["name"],
                            description=form.cleaned_data["description"],
                            tags=form.cleaned_data["tags"],
                            team=form.cleaned_data.get("team") or None)
        if model is not None:
            return redirect("console:model-detail", name=model.name)
    return render(request, "console/model_form.html",
                  {"form": form, "title": "New model", "submit": "Create model",
                   "action": reverse("console:model-create"),
                   "cancel": reverse("console:model-list")},
                  status=400 if request.method == "POST" else 200)


@requires("engineer", write="engineer")
def model_edit(request: HttpRequest, name: str) -> HttpResponse:
    """Description and tags: the same service as PATCH /api/v1/models/{name}/."""
    model = found(selectors.model_get, name)
    initial = {"description": model.description, "tags": ", ".join(model.tags)}
    form = ModelEditForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        if run_service(request, services.model_update, name=name, success="Model saved.",
                       description=form.cleaned_data["description"],
                       tags=form.cleaned_data["tags"]) is not None:
            return redirect("console:model-detail", name=name)
    return render(request, "console/model_form.html",
                  {"form": form, "title": f"Edit {name}", "submit": "Save",
                   "action": reverse("console:model-edit", kwargs={"name": name}),
                   "cancel": reverse("console:model-detail", kwargs={"name": name})},
                  status=400 if request.method == "POST" else 200)


@require_POST
@requires(write="engineer")
def model_archive(request: HttpRequest, name: str, archived: bool) -> HttpResponse:
    """Archive (hide, refuse uploads; versions kept) or unarchive: the API's archive service."""
    form = ReasonForm(request.POST)
    if form.is_valid():
        run_service(request, services.model_archive, name=name, archived=archived,
                    reason=form.cleaned_data["reason"],
                    success="Model archived: it is hidden and takes no uploads; its versions "
                            "are kept." if archived else "Model unarchived.")
    else:
        messages.error(request, error_text(form))
    return redirect("console:model-detail", name=name)


@require_POST
@requires(write="engineer")
def model_delete_view(request: HttpRequest, name: str) -> HttpResponse:
    """Delete the model with its versions: the API's DELETE /api/v1/models/{m}/."""
    form = ReasonForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    if run_service(request, model_delete, name=name, reason=reason,
                   success=f"Model {name} and its versions deleted.") is None:
        return redirect("console:model-detail", name=name)
    return redirect("console:model-list")


def version_rows_context(request: HttpRequest, model) -> dict:
    """The versions table and the metrics table above it, both narrowed by the version filter
    (the API's VersionFilterSet); the pickers keep every version."""
    everything = list(selectors.version_list(model))
    filterset = VersionFilterSet(request.GET, queryset=selectors.version_list(model))
    active = [k for k in filterset.filters if request.GET.get(k, "").strip()]
    if active and filterset.is_valid():
        versions = list(filterset.qs)
    else:
        versions = everything
    columns = metric_columns(versions)
    endpoint = selectors.endpoint_get(model)
    # the one gate's rule (selectors.traffic_refusal): only these are offered "Deploy as stable"
    routable = {v.number for v in selectors.traffic_versions(model)}
    for v in versions:
        v.may_take_traffic = v.number in routable
    return {
        "model": model, "versions": versions, "endpoint": endpoint,
        "numbers": [v.number for v in everything],
        "alias_choices": alias_choices(everything, routable),
        "pending": any(v.status in PENDING for v in everything),
        "can_write": may(request.user, model.team_id, "engineer"),
        "filter": filterset, "filtered": bool(active) and filterset.is_valid(),
        "filter_query": urlencode([(k, v) for k in active for v in request.GET.getlist(k)]),
        "metric_columns": columns,
        "metric_rows": [r for r in metric_rows(versions, columns) if r["version"].metrics],
    }


def alias_choices(versions, routable: set[int]) -> list[tuple[int, str]]:
    """The alias picker: ready versions (registry.services.catalog.alias_set), those that may
    not take traffic said so, as the production alias refuses them."""
    def label(v) -> str:
        if v.number in routable:
            return f"v{v.number}"
        why = selectors.traffic_refusal(v).why  # "is rejected", or a pipeline's "runs step …"
        said = why.removeprefix("is ") if why.startswith("is ") else "a step may not serve"
        return f"v{v.number} ({said}: not for production)"

    return [(v.number, label(v)) for v in versions if v.status == VersionStatus.READY]


@require_GET
@requires("viewer")
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    model = found(selectors.model_get, name)
    context = version_rows_context(request, model)
    context.update(
        aliases=selectors.alias_list(model),
        access=selectors.endpoint_access(context["endpoint"]),
        # PUT of the raw body: the multipart POST endpoint fails under session auth (CSRF reads
        # the body before the view sets its upload handler); same service, same progress events.
        upload_url=reverse("api:version-upload-raw", kwargs={"name": model.name}),
        deletion_refusal=model_deletion_refusal(model),
    )
    return render(request, "console/model_detail.html", context)


@require_GET
@requires("viewer")
def version_rows(request: HttpRequest, name: str) -> HttpResponse:
    """The versions table alone: polled by htmx while a version is still validating."""
    model = found(selectors.model_get, name)
    context = version_rows_context(request, model)
    context["oob"] = True  # also refresh the version pickers (alias, compare)
    return render(request, "console/partials/version_rows.html", context)


@require_GET
@requires("viewer")
def version_status(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """The upload form's status line for one version: htmx polls it until the version is ready
    or failed, then it says which (with the failure reason) and stops."""
    version = found(selectors.version_get, name, number)
    return render(request, "console/partials/upload_status.html",
                  {"model": version.model, "version": version,
                   "pending": version.status in PENDING})


def _tensor_rows(a: dict, b: dict, key: str) -> list[dict]:
    def by_name(sig):
        return {t["name"]: t for t in (sig or {}).get(key) or []}

    left, right = by_name(a), by_name(b)
    rows = []
    for name in list(left) + [n for n in right if n not in left]:
        la, rb = left.get(name), right.get(name)
        rows.append({"name": name, "a": la, "b": rb,
                     "change": _change(la, rb)})
    return rows


def _change(a, b) -> str:
    if a is None:
        return "only in B"
    if b is None:
        return "only in A"
    return "same" if a == b else "changed"


def _pairs(a: dict, b: dict) -> list[dict]:
    keys = list(a) + [k for k in b if k not in a]
    return [{"key": k, "a": a.get(k), "b": b.get(k),
             "change": _change(a[k] if k in a else None, b[k] if k in b else None)}
            for k in keys]


def _size_change(delta: int) -> str:
    return "same" if not delta else ("+" if delta > 0 else "−") + filesize(abs(delta))


def _weights_change(a, b) -> str:
    if not a.weights_sha256 or not b.weights_sha256:
        return "unknown"  # not validated yet, failed, or external weights
    return "same weights" if a.weights_sha256 == b.weights_sha256 else "weights changed"


@require_GET
@requires("viewer")
def model_diff(request: HttpRequest, name: str) -> HttpResponse:
    model = found(selectors.model_get, name)
    form = DiffForm(request.GET)
    context: dict = {"model": model, "form": form}
    if form.is_valid():
        va = found(selectors.version_get, name, form.cleaned_data["a"])
        vb = found(selectors.version_get, name, form.cleaned_data["b"])
        sa, sb = va.signature or {}, vb.signature or {}
        context.update(
            a=va, b=vb,
            inputs=_tensor_rows(sa, sb, "inputs"), outputs=_tensor_rows(sa, sb, "outputs"),
            graph=_pairs({k: v for k, v in sa.items() if k not in ("inputs", "outputs")},
                         {k: v for k, v in sb.items() if k not in ("inputs", "outputs")}),
            metadata=_pairs(va.metadata or {}, vb.metadata or {}),
            metrics=metric_diff(va.metrics or {}, vb.metrics or {}),
            lineage=_pairs(va.lineage or {}, vb.lineage or {}),
            weights=_weights_change(va, vb),
            size_change=_size_change(vb.size_bytes - va.size_bytes),
        )
    return render_page_or_partial(request, "console/model_diff.html", "console/partials/diff.html",
                                  context, status=200 if form.is_valid() else 400)


@require_POST
@requires(write="engineer")
def approval_setting(request: HttpRequest, name: str) -> HttpResponse:
    """Turn the approval gate on or off; the same service as PATCH /api/v1/models/{name}/."""
    form = ApprovalSettingForm(request.POST)
    if form.is_valid():
        on = form.cleaned_data["requires_approval"]
        run_service(request, services.model_update, name=name, requires_approval=on,
                    success="Promotion now needs an approved version." if on else
                    "Promotion no longer needs approval.")
    else:
        messages.error(request, error_text(form))
    return redirect(reverse("console:model-detail", kwargs={"name": name}))


@require_POST
@requires(write="engineer")
def alias_set(request: HttpRequest, name: str) -> HttpResponse:
    form = AliasSetForm(request.POST)
    if form.is_valid():
        run_service(request, services.alias_set, model_name=name,
                    alias=form.cleaned_data["alias"],
                    version_number=form.cleaned_data["version"],
                    success=f"Alias {form.cleaned_data['alias']!r} now points at version "
                            f"{form.cleaned_data['version']}.")
    else:
        messages.error(request, error_text(form))
    return redirect(reverse("console:model-detail", kwargs={"name": name}) + "#aliases")


@require_POST
@requires(write="engineer")
def alias_remove(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    run_service(request, services.alias_remove, model_name=name, alias=alias,
                success=f"Alias {alias!r} removed.")
    return redirect(reverse("console:model-detail", kwargs={"name": name}) + "#aliases")


@require_POST
@requires(write="engineer")
def endpoint_deploy(request: HttpRequest, name: str) -> HttpResponse:
    form = DeployForm(request.POST)
    if form.is_valid():
        number = form.cleaned_data["version"]
        run_service(request, services.endpoint_deploy, model_name=name, version_number=number,
                    reason=form.cleaned_data["reason"],
                    success=f"Version {number} is now stable; replicas are loading it.")
    else:
        messages.error(request, error_text(form))
    return redirect(reverse("console:model-detail", kwargs={"name": name}) + "#endpoint")
