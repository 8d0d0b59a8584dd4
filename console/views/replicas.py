"""The Replicas page (admin): every serving replica the control plane hears from, and the replica
credentials they follow it with (make one, shown once; revoke one). A replica credential is good
for the replica API only (registry/replica_api.py): `mmc-serve --registry <this console's URL>`."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from registry import selectors
from registry.notify import current_revision
from registry.services.replicas import credential_create, credential_revoke

from ..forms import ReplicaCredentialForm
from .access import requires, run_service
from .tokens import console_url


def _render(request: HttpRequest, form: ReplicaCredentialForm, *, created=None,
            status: int = 200) -> HttpResponse:
    context = {"form": form, "created": created, "nav": "replicas",
               "console_url": console_url(request), "revision": current_revision(),
               "replicas": selectors.replicas(include_lost=True),
               "credentials": selectors.replica_credentials(),
               "environment_credential": bool(settings.REPLICA_TOKEN)}
    response = render(request, "console/replicas.html", context, status=status)
    if created:
        response["Cache-Control"] = "no-store"  # the raw credential must not sit in a cache
    return response


@requires("admin", write="admin")
def replicas_page(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _render(request, ReplicaCredentialForm())
    form = ReplicaCredentialForm(request.POST)
    if not form.is_valid():
        return _render(request, form, status=400)
    result = run_service(request, credential_create, name=form.cleaned_data["name"],
                         success="Replica credential created. Copy it now: it is not shown "
                                 "again.")
    if result is None:
        return _render(request, form, status=400)
    credential, raw = result
    return _render(request, ReplicaCredentialForm(),
                   created={"credential": credential, "raw": raw})


@require_POST
@requires("admin", write="admin")
def credential_revoke_view(request: HttpRequest, prefix: str) -> HttpResponse:
    run_service(request, credential_revoke, prefix=prefix,
                success="Replica credential revoked: replicas showing it are refused from "
                        "their next call and keep serving what they run.")
    return redirect("console:replicas")
