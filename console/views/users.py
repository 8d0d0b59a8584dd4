"""Users & roles (admins): create a user, set the role, deactivate or reactivate, reset a
password. A generated password is shown once, in the answer that made it."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from registry import selectors
from registry.roles import role_of
from registry.services import users

from ..forms import RoleForm, UserCreateForm, error_text
from .access import requires, run_service


def _render(request: HttpRequest, form: UserCreateForm, *, secret: dict | None = None,
            status: int = 200) -> HttpResponse:
    rows = [{"user": u, "role": role_of(u) or "", "form": RoleForm(
        initial={"role": role_of(u) or "viewer"}, auto_id=f"role-{u.pk}-%s")}
            for u in selectors.user_list()]
    response = render(request, "console/users.html", {
        "form": form, "rows": rows, "secret": secret, "nav": "users"}, status=status)
    if secret:
        response["Cache-Control"] = "no-store"
    return response


@requires("admin", write="admin")
def user_page(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _render(request, UserCreateForm())
    form = UserCreateForm(request.POST)
    if not form.is_valid():
        return _render(request, form, status=400)
    result = run_service(request, users.user_create, **form.cleaned_data,
                         success=f"User {form.cleaned_data['username']} created.")
    if result is None:
        return _render(request, form, status=400)
    user, generated = result
    secret = {"username": user.get_username(), "password": generated} if generated else None
    return _render(request, UserCreateForm(), secret=secret)


@require_POST
@requires("admin", write="admin")
def user_role(request: HttpRequest, username: str) -> HttpResponse:
    form = RoleForm(request.POST)
    if form.is_valid():
        role = form.cleaned_data["role"]
        run_service(request, users.user_set_role, username=username, role=role,
                    success=f"{username} is now {role}.")
    else:
        messages.error(request, error_text(form))
    return redirect("console:users")


@require_POST
@requires("admin", write="admin")
def user_active(request: HttpRequest, username: str, active: bool) -> HttpResponse:
    run_service(request, users.user_set_active, username=username, active=active,
                success=f"{username} reactivated." if active else
                f"{username} deactivated: their sessions and API tokens stopped working.")
    return redirect("console:users")


@require_POST
@requires("admin", write="admin")
def user_password(request: HttpRequest, username: str) -> HttpResponse:
    password = run_service(request, users.user_reset_password, username=username,
                           success=f"New password set for {username}. Copy it now: it is not "
                                   "shown again.")
    if password is None:
        return redirect("console:users")
    return _render(request, UserCreateForm(), secret={"username": username, "password": password})
