"""The tokens page: every signed-in user creates, lists and revokes their own API tokens (an
admin sees and revokes everyone's). A new token is shown once, in the answer that made it."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from registry import selectors
from registry.api.throttles import TokenCreateThrottle
from registry.roles import has_role
from registry.services import access

from ..forms import TokenCreateForm
from .access import requires, run_service


def console_url(request: HttpRequest) -> str:
    """This console's address as the browser reached it: what the CLI's MMC_URL needs."""
    return request.build_absolute_uri("/").rstrip("/")


def _render(request: HttpRequest, form: TokenCreateForm, *, created=None,
            status: int = 200) -> HttpResponse:
    is_admin = has_role(request.user, "admin")
    context = {"form": form, "created": created, "is_admin": is_admin, "nav": "tokens",
               "console_url": console_url(request),
               "tokens": selectors.token_list(user=None if is_admin else request.user)}
    response = render(request, "console/tokens.html", context, status=status)
    if created:
        response["Cache-Control"] = "no-store"  # the raw token must not sit in a cache
    return response


@requires("viewer", write="viewer")
def token_page(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _render(request, TokenCreateForm())
    form = TokenCreateForm(request.POST)
    if not form.is_valid():
        return _render(request, form, status=400)
    if not TokenCreateThrottle().allow_request(request, None):  # the API's limit, same count
        messages.error(request, "Too many tokens created recently: try again later.")
        return _render(request, form, status=429)
    result = run_service(request, access.token_create, username=request.user.get_username(),
                         name=form.cleaned_data["name"],
                         expires_in_days=form.cleaned_data["expires_in_days"],
                         read_only=form.cleaned_data["read_only"],
                         success="Token created. Copy it now: it is not shown again.")
    if result is None:
        return _render(request, form, status=400)
    token, raw = result
    return _render(request, TokenCreateForm(), created={"token": token, "raw": raw})


@require_POST
@requires("viewer", write="viewer")
def token_revoke(request: HttpRequest, token_key: str) -> HttpResponse:
    owner = None if has_role(request.user, "admin") else request.user
    run_service(request, access.token_revoke, token_key=token_key, owner=owner,
                success=f"Token {token_key} revoked: it no longer works.")
    return redirect("console:tokens")
