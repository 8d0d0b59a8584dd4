"""The version page: signature, validation report, lineage, serving settings, load tests, the
serving-config search (its card's own views: views.config_search), try-it."""

from __future__ import annotations

from functools import partial

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from registry import selectors, services
from registry.errors import InvalidRequest, RegistryError
from registry.integrations.tensorrt import BUILDING, PRECISIONS, QUEUED
from registry.services import tensorrt as trt_services
from registry.services import versions as version_services
from registry.services.approvals import may_decide
from registry.services.conversion import version_convert
from registry.services.deletion import deletion_refusal, version_delete
from registry.services.loadtests import live_traffic_roles, loadtest_create
from registry.services.versions import SERVING_FIELDS

from .. import tryit
from ..forms import ApprovalForm, LoadTestForm, ReasonForm, error_text
from ..pipeline_drawing import draw
from ..serving_form import LABELS, ServingForm
from .access import requires, run_service
from .config_search import search_context
from .models import found


@require_GET
@requires("viewer")
def version_detail(request: HttpRequest, name: str, number: int) -> HttpResponse:
    return render_version(request, name, number)


def render_version(request: HttpRequest, name: str, number: int, *,
                   serving_form: ServingForm | None = None,
                   loadtest_form: LoadTestForm | None = None, status: int = 200) -> HttpResponse:
    version = found(selectors.version_get, name, number)
    signature = version.signature or {}
    inputs = tryit.example_inputs(signature)
    outputs = signature.get("outputs") or []
    base = request.build_absolute_uri("/")
    builds = (version.validation_report or {}).get("tensorrt") or {}
    endpoint = selectors.endpoint_get(version.model)
    context = {
        "model": version.model, "version": version, "signature": signature,
        "access": selectors.endpoint_access(endpoint),
        "roles": serving_roles(endpoint, version),
        "traffic_refusal": selectors.traffic_refusal(version),
        "aliases": sorted(a.name for a in version.aliases.all()),
        "inputs": inputs, "outputs": outputs,
        "report": version.validation_report or {},
        "engines": [{"precision": p, **builds.get(p, {})} for p in PRECISIONS],
        "precisions": PRECISIONS,
        "engines_pending": any((e or {}).get("status") in (QUEUED, BUILDING)
                               for e in builds.values()),
        "serving": [(f, getattr(version, f)) for f in SERVING_FIELDS],
        "cache": selectors.version_cache_counts(version),
        "decisions": version.approval_decisions.all(),
        "approval_refusal": may_decide(request.user, version),
        "approval_form": ApprovalForm(),
        "too_new": (version.validation_report or {}).get("runtime_too_new")
        if version.status == "failed" else None,
        "converted_to": list(version.model.versions.filter(
            metadata__converted_from=number).values_list("number", flat=True)),
        "serving_form": serving_form or ServingForm.for_version(version),
        "loadtest_form": loadtest_form or LoadTestForm(replicas=_replica_names()),
        "loadtest_runs": selectors.loadtest_runs(version),
        "loadtest_others": selectors.loadtest_latest_per_version(version.model, exclude=version),
        "live_roles": live_traffic_roles(version),
        "loadtest_limits": {"seconds": settings.LOADTEST_MAX_SECONDS,
                            "concurrency": settings.LOADTEST_MAX_CONCURRENCY},
        "infer_url": f"/v2/models/{name}/versions/{number}/infer",
        "curl": tryit.curl_snippet(base, name, number, inputs),
        "tritonclient": tryit.tritonclient_snippet(request.get_host(), name, number, inputs,
                                                   outputs),
        "pipeline": draw(version.pipeline, signature) if version.pipeline else None,
        "deletion_refusal": deletion_refusal(version.model, number),
        **search_context(request, version),
    }
    return render(request, "console/version_detail.html", context, status=status)


def _replica_names() -> list[str]:
    return [r.replica for r in selectors.replicas()]


@require_POST
@requires("viewer", write="engineer")
def version_loadtest(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """Start a load test; the same service as POST .../loadtest/ in the API. Success opens the
    job's page (live progress), a refusal stays here with the reason."""
    form = LoadTestForm(request.POST, replicas=_replica_names())
    if not form.is_valid():
        messages.error(request, "Load test not started: " + error_text(form))
        return redirect(f"{request.path.rsplit('loadtest/', 1)[0]}#loadtest")
    job = run_service(request, loadtest_create, model_name=name, number=number,
                      **form.service_kwargs(),
                      worded=partial(loadtest_refusal, name=name, number=number),
                      success="Load test queued: its progress shows here, its result on the "
                              "version page.")
    if job is None:
        return redirect(f"{request.path.rsplit('loadtest/', 1)[0]}#loadtest")
    return redirect("console:job-detail", job_id=job.pk)


def loadtest_refusal(exc: RegistryError, *, name: str, number: int) -> str | None:
    """The service's refusals that name API parameters (confirm=true, `key`), in the form's
    terms; the API keeps its own words."""
    fields = LoadTestForm.base_fields
    details = exc.details or {}
    if details.get("rule") == "live-traffic":
        return (f"v{number} takes real traffic ({', '.join(details.get('roles') or [])} of "
                f"{name}): a load test would slow its users down. Tick “"
                f"{fields['confirm'].label}” to run it anyway.")
    if isinstance(exc, InvalidRequest) and exc.field == "key":
        return (f"{name}'s endpoint requires a predict key: fill in “{fields['key'].label}” "
                f"({fields['key'].help_text}).")
    return None


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return ", ".join(map(str, value)) or "none" if isinstance(value, list) else str(value)


@require_POST
@requires("viewer", write="engineer")
def version_serving(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """Change serving settings: the same service (and limits) as PATCH .../versions/{n}/."""
    version = found(selectors.version_get, name, number)
    form = ServingForm.for_version(version, request.POST)
    if not form.is_valid():
        messages.error(request, "Serving settings not saved: " + error_text(form))
        return render_version(request, name, number, serving_form=form, status=400)
    changes = form.changes(version)
    if not changes:
        messages.info(request, "Nothing changed.")
    else:
        said = "; ".join(f"{LABELS[k]} {_shown(getattr(version, k))} → {_shown(v)}"
                         for k, v in changes.items())
        if run_service(request, version_services.version_configure, model_name=name,
                       number=number, **changes,
                       success=f"Serving settings saved: {said}. Replicas serving v{number} "
                               f"reload it with the new settings.") is None:
            return render_version(request, name, number, serving_form=form, status=400)
    return redirect(f"{request.path.rsplit('serving/', 1)[0]}#serving")


def serving_roles(endpoint, version) -> list[str]:
    """What this version is to the model's endpoint: stable, candidate, blue/green, shadow."""
    if endpoint is None:
        return []
    slots = (("stable", endpoint.stable_id), ("candidate", endpoint.candidate_id),
             ("blue", endpoint.blue_id), ("green", endpoint.green_id),
             ("shadow", endpoint.shadow_id))
    roles = [name for name, pk in slots if pk == version.pk]
    if endpoint.live_color in roles:
        roles[roles.index(endpoint.live_color)] += " (live)"
    return roles


class TensorRTForm(forms.Form):
    precision = forms.ChoiceField(choices=[(p, p.upper()) for p in PRECISIONS],
                                  label="Precision")


@require_POST
@requires("viewer", write="engineer")
def version_tensorrt(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """Ask for a TensorRT engine build; the same service as POST .../tensorrt/ in the API."""
    form = TensorRTForm(request.POST)
    if not form.is_valid():
        messages.error(request, error_text(form))
    else:
        precision = form.cleaned_data["precision"]
        run_service(request, trt_services.tensorrt_build, model_name=name, number=number,
                    precision=precision,
                    success=f"{precision.upper()} TensorRT engine build queued: its status "
                            f"shows below.")
    return redirect(f"{request.path.rsplit('tensorrt/', 1)[0]}#tensorrt")


@require_POST
@requires("viewer", write="engineer")
def version_decide(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """Approve or reject the version; the same services as POST .../approve/ and .../reject/."""
    form = ApprovalForm(request.POST)
    if not form.is_valid():
        messages.error(request, error_text(form))
    else:
        approve = form.cleaned_data["decision"] == "approve"
        run_service(request, services.version_approve if approve else services.version_reject,
                    model_name=name, number=number, comment=form.cleaned_data["comment"],
                    success=f"Version {number} {'approved' if approve else 'rejected'}.")
    return redirect(f"{request.path.rsplit('approval/', 1)[0]}#approval")


@require_POST
@requires("viewer", write="engineer")
def version_convert_view(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """Convert a too-new version; the same service as POST .../convert/ in the API. Success
    opens the new version's page, a refusal stays here with the reason."""
    result = run_service(request, version_convert, model_name=name, number=number)
    if result is None:
        return redirect(f"{request.path.rsplit('convert/', 1)[0]}#convert")
    version, created = result
    conversion = (version.metadata or {}).get("conversion") or {}
    if created:
        messages.success(request, f"Converted v{number} to v{version.number} (IR "
                                  f"{conversion['to']['ir_version']}, opset "
                                  f"{conversion['to']['opset']}): outputs match within rtol "
                                  f"{conversion['tolerance']['rtol']:g}, atol "
                                  f"{conversion['tolerance']['atol']:g} (max abs diff "
                                  f"{conversion['max_abs_diff']:.3g}); it is being validated.")
    else:
        messages.info(request, f"v{number} was already converted: v{version.number}.")
    return redirect("console:version-detail", name, version.number)


@require_POST
@requires("viewer", write="engineer")
def version_delete_view(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """Delete the version; the same service as DELETE .../versions/{n}/ in the API. Success
    opens the model page, a refusal stays here with what holds it."""
    form = ReasonForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    if run_service(request, version_delete, model_name=name, number=number, reason=reason,
                   success=f"Version {number} deleted; its artifact goes with the next garbage "
                           f"collection unless another version shares it.") is None:
        return redirect(f"{request.path.rsplit('delete/', 1)[0]}#delete")
    return redirect("console:model-detail", name=name)
