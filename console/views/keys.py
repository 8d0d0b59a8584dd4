"""Predict keys of one endpoint, on its deployment page: create (shown once) and revoke, through
the same services as the API's /endpoint/keys/."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from registry.services import access

from ..forms import PredictKeyForm
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
    run_service(request, access.api_key_revoke, model_name=name, prefix=prefix,
                success=f"Predict key {prefix}… revoked: replicas refuse it once they apply "
                        "the change.")
    return redirect(reverse("console:deployment", kwargs={"name": name}) + "#keys")
