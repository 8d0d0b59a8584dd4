"""API tokens (knox) as the API authenticates them: knox checks the digest, the expiry and that
the user is active on every request; we also note when a token was last used.

Also the caller of a request judged from its headers alone, before a byte of its body is read
(console.asgi: no body reaches disk before its caller is known): the same token lookup, the
same session lookup, and for an API view its own authentication and permission classes."""

from __future__ import annotations

import io
from importlib import import_module

from django.conf import settings
from django.contrib.auth import get_user
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse
from django.urls import resolve
from django.utils.functional import SimpleLazyObject
from knox.auth import TokenAuthentication
from rest_framework.exceptions import APIException, AuthenticationFailed

from registry.services.access import token_touch


class ApiTokenAuthentication(TokenAuthentication):
    def validate_user(self, auth_token):
        user, token = super().validate_user(auth_token)  # refuses an inactive user (401)
        token_touch(token)
        return user, token


def headers_only_request(scope: dict) -> HttpRequest:
    """A Django request for an ASGI `scope` whose body reads as empty (none of it was received),
    with the session and the lazy user SessionMiddleware and AuthenticationMiddleware give it."""
    request = ASGIRequest(scope, io.BytesIO())
    engine = import_module(settings.SESSION_ENGINE)
    request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    request.user = SimpleLazyObject(lambda: get_user(request))
    return request


def presents_credentials(request: HttpRequest) -> bool:
    """Whether `request` carries a valid API token or the session cookie of an active user
    signed in (its CSRF check, which may need the body, is left to the view)."""
    try:
        if ApiTokenAuthentication().authenticate(request) is not None:
            return True
    except AuthenticationFailed:
        return False
    return bool(request.user.is_authenticated and request.user.is_active)


def view_admission(request: HttpRequest) -> tuple[object | None, HttpResponse | None]:
    """Run the authentication and permission checks of the API view `request` routes to, as that
    view runs them (its classes, its exception handler): (the user, None) when they pass, else
    (None, the view's refusal, rendered). Raises Resolver404 for a path no view serves."""
    match = resolve(request.path_info)
    view = match.func.view_class(**match.func.view_initkwargs)
    view.setup(request, *match.args, **match.kwargs)
    drf_request = view.initialize_request(request, *match.args, **match.kwargs)
    view.request, view.format_kwarg = drf_request, None
    view.headers = view.default_response_headers
    try:
        view.perform_authentication(drf_request)
        view.check_permissions(drf_request)
    except APIException as exc:
        response = view.finalize_response(drf_request, view.handle_exception(exc))
        return None, response.render()
    return drf_request.user, None
