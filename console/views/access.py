"""Who may see and do what in the console: the same roles the API checks (registry.roles),
applied once by a decorator, and service errors turned into messages the user reads."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from registry.audit import Actor
from registry.errors import Forbidden, NotFound, RegistryError
from registry.roles import has_role, require_model

WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def requires(read: str = "viewer", write: str = "engineer") -> Callable:
    """Reads need `read`, writes need `write` (on a model's pages, in the team owning it; a
    model of another team is a 404); anonymous users are sent to the login page."""

    def decorate(view):
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            needed = write if request.method in WRITE_METHODS else read
            name = kwargs.get("name") if has_role(request.user, "viewer") else None
            try:
                if name is not None and require_model(request.user, name, needed):
                    return view(request, *args, **kwargs)
            except NotFound as exc:
                raise Http404(exc.message) from None
            except Forbidden as exc:
                raise PermissionDenied(exc.message) from None
            if not has_role(request.user, needed):
                raise PermissionDenied(f"this needs the {needed} role")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def run_service(request: HttpRequest, service: Callable, *, success: str = "",
                worded: Callable[[RegistryError], str | None] | None = None, **kwargs):
    """Call one registry service as the request's user; a RegistryError becomes an error
    message (and None is returned) so the page shows what went wrong: in the API's words, or
    in the console's where `worded` has them (a box to tick, not a parameter to send)."""
    try:
        result = service(actor=Actor.from_request(request), **kwargs)
    except RegistryError as exc:
        messages.error(request, (worded(exc) if worded else None) or exc.message)
        return None
    if success:
        messages.success(request, success)
    return result
