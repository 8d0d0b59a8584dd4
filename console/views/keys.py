"""Predict keys of one endpoint, on its deployment page: create (shown once) and revoke, through
the same services as the API's /endpoint/keys/; and the rate limits and daily quotas of the
endpoint and of each key (the API's /endpoint/limits/ and /endpoint/keys/<prefix>/limits/); and
when the endpoint scales to zero (the API's /endpoint/scale-to-zero/); and whether it is
protected (the API's /endpoint/protect/ and /endpoint/open/)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from registry.services import access
from registry.services.limits import limits_set
from registry.services.scaling import scale_to_zero_set

from ..forms import LimitsForm, PredictKeyForm, ScaleToZeroForm
from .access import requires, run_service
from .deployment import render_deployment


@require_POST
@requires(write="engineer")
def key_create(request: HttpRequest, name: str) -> HttpResponse:
    form = PredictKeyForm(request.POST, auto_id="key-%s")
    if not form.is_valid():
        return render_deployment(request, name, key_form=form, status=400)
    result = run_service(request, access.api_key_create, model_name=name,
                         name=form.cleaned_data["name"],
                         success="Predict key created. Copy it now: it is not shown again.")
    if result is None:
        return render_deployment(request, name, key_form=form, status=400)
    key, raw = result
    return render_deployment(request, name, new_key={"key": key, "raw": raw})


@require_POST
@requires(write="engineer")
def key_revoke(request: HttpRequest, name: str, prefix: str) -> HttpResponse:
    revoked = run_service(request, access.api_key_revoke, model_name=name, prefix=prefix)
    if revoked is not None:
        (messages.warning if revoked.refusing_all else messages.success)(
            request, f"{revoked.detail[0].upper()}{revoked.detail[1:]}. Replicas apply it with "
                     "the next route revision.")
    return redirect(reverse("console:deployment", kwargs={"name": name}) + "#keys")


@require_POST
@requires(write="engineer")
def endpoint_protect(request: HttpRequest, name: str) -> HttpResponse:
    """Every call needs a predict key from now on (with none yet, every call is refused)."""
    run_service(request, access.endpoint_protect, model_name=name,
                success=f"{name} is protected: every call needs one of its predict keys.")
    return redirect(reverse("console:deployment", kwargs={"name": name}) + "#keys")


@require_POST
@requires(write="engineer")
def endpoint_open(request: HttpRequest, name: str) -> HttpResponse:
    """Anyone who can reach /v2 may call the endpoint without a key (audited)."""
    run_service(request, access.endpoint_open, model_name=name,
                success=f"{name} is open: calls need no predict key.")
    return redirect(reverse("console:deployment", kwargs={"name": name}) + "#keys")


@require_POST
@requires(write="engineer")
def limits_update(request: HttpRequest, name: str, prefix: str | None = None) -> HttpResponse:
    """Set the endpoint's limits (no prefix) or one key's; a refusal re-renders the page (400)
    with what was wrong."""
    form = LimitsForm(request.POST)
    whose = f"predict key {prefix}…" if prefix else "the endpoint"
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"Limits of {whose}: {form.fields[field].label}: "
                                    f"{' '.join(errors)}")
        return render_deployment(request, name, status=400)
    done = run_service(request, limits_set, model_name=name, key_prefix=prefix,
                       success=f"Limits of {whose} saved: replicas apply them with the next "
                               "route revision.", **form.cleaned_data)
    if done is None:
        return render_deployment(request, name, status=400)
    anchor = f"#key-{prefix}" if prefix else "#limits"
    return redirect(reverse("console:deployment", kwargs={"name": name}) + anchor)


@require_POST
@requires(write="engineer")
def scale_to_zero_update(request: HttpRequest, name: str) -> HttpResponse:
    """Set the endpoint's idle timeout (scale to zero); a refusal re-renders the page (400)."""
    form = ScaleToZeroForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"Scale to zero: {form.fields[field].label}: "
                                    f"{' '.join(errors)}")
        return render_deployment(request, name, status=400)
    seconds = form.cleaned_data["after_seconds"]
    done = run_service(request, scale_to_zero_set, model_name=name, seconds=seconds,
                       success=(f"Replicas unload {name} after {seconds} s without a request, "
                                "from the next route revision." if seconds else
                                f"{name} no longer scales to zero: replicas load it again."))
    if done is None:
        return render_deployment(request, name, status=400)
    return redirect(reverse("console:deployment", kwargs={"name": name}) + "#scale-to-zero")
