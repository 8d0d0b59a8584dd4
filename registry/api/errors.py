"""Every API error is JSON: {"error": "<what was wrong>", "field": ..., "fields": {...}}.

DRF views answer through `exception_handler`; what Django answers itself under /api/ (no such
route, a request it refuses before any view, an unexpected exception) goes through the
`handler400/403/404/500` views at the bottom, which keep the console's HTML pages elsewhere."""

from __future__ import annotations

import sys

from django.core.exceptions import (
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.db import DataError
from django.http import Http404, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler
from rest_framework.views import set_rollback

from registry.errors import InvalidRequest, PayloadTooLarge, RegistryError
from registry.logfilters import database_unavailable

API_PREFIX = "/api/"


def _flatten(detail, prefix="") -> list[str]:
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            out += _flatten(value, f"{prefix}{name}" if not prefix else f"{prefix}.{name}")
        return out
    if isinstance(detail, list):
        return [m for item in detail for m in _flatten(item, prefix)]
    return [f"{prefix}: {detail}" if prefix else str(detail)]


def exception_handler(exc, context):
    # Django's own refusals of a request body, raised while DRF parses it.
    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge(f"request body too large: {exc}")
    elif isinstance(exc, TooManyFieldsSent | TooManyFilesSent | SuspiciousOperation):
        exc = InvalidRequest(f"request refused: {exc}")
    elif isinstance(exc, DataError):  # e.g. a NUL byte in text PostgreSQL cannot store
        set_rollback()  # the failed statement aborted the transaction it ran in
        exc = InvalidRequest(f"a value cannot be stored: {_first_line(exc)}")
    if isinstance(exc, RegistryError):
        body = {"error": exc.message}
        if exc.field:
            body["field"] = exc.field
        if exc.details is not None:
            body["details"] = exc.details
        response = Response(body, status=exc.status)
        if getattr(exc, "retry_after", None):
            response["Retry-After"] = str(exc.retry_after)
        return _as_json(response, context)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or "permission denied")
    response = drf_handler(exc, context)
    if response is None:
        return None  # unexpected: Django logs it and answers through handler500
    if isinstance(exc, exceptions.ValidationError):
        response.data = {"error": "; ".join(_flatten(exc.detail)), "fields": exc.detail}
        if isinstance(exc.detail, dict) and exc.detail:
            first = next(iter(exc.detail))
            if first != "non_field_errors":
                response.data["field"] = first
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = {"error": str(detail)}
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        response.status_code = status.HTTP_401_UNAUTHORIZED
    return _as_json(response, context)


def _as_json(response: Response, context) -> Response:
    """An error renders as JSON whatever the client accepts (HTML, YAML for the schema...)."""
    request = context.get("request")
    if request is not None:
        request.accepted_renderer = JSONRenderer()
        request.accepted_media_type = JSONRenderer.media_type
    return response


# -- Django's error views: JSON under /api/, the console's pages elsewhere ---------------------


def _api(request) -> bool:
    return request.path.startswith(API_PREFIX)


def _json(message: str, status_code: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status_code)


def bad_request(request, exception, *args, **kwargs):
    if _api(request):
        if isinstance(exception, RequestDataTooBig):
            return _json(f"request body too large: {exception}", 413)
        return _json(f"bad request: {exception}" if str(exception) else "bad request", 400)
    return defaults.bad_request(request, exception, *args, **kwargs)


def permission_denied(request, exception, *args, **kwargs):
    if _api(request):
        return _json(str(exception) or "permission denied", 403)
    return defaults.permission_denied(request, exception, *args, **kwargs)


def page_not_found(request, exception, *args, **kwargs):
    if _api(request):
        return _json(f"no API route {request.method} {request.path}", 404)
    return defaults.page_not_found(request, exception, *args, **kwargs)


#: What a client is told to wait before it tries again while the database is unreachable.
DATABASE_RETRY_AFTER = 5


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


def _database_down(request, exc: BaseException) -> HttpResponse:
    reason = _first_line(exc)
    if _api(request):
        response = JsonResponse({"error": f"database unavailable ({reason}); try again shortly",
                                 "retry_after": DATABASE_RETRY_AFTER}, status=503)
    else:  # no template: base.html would ask the database for the user again
        response = HttpResponse(
            "<!doctype html><title>Database unavailable</title>"
            "<h1>Database unavailable</h1><p>The console cannot reach its database. Nothing was "
            "changed; this page answers again by itself once the database is back.</p>",
            status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(DATABASE_RETRY_AFTER)
    return response


def server_error(request, *args, **kwargs):
    exc = sys.exc_info()[1]
    if database_unavailable(exc):
        return _database_down(request, exc)
    if isinstance(exc, DataError):  # a form value the database refuses: the client's to fix
        message = f"a value cannot be stored: {_first_line(exc)}"
        return (_json(message, 400) if _api(request)
                else HttpResponse(message, status=400, content_type="text/plain; charset=utf-8"))
    if _api(request):
        rid = getattr(request, "request_id", "")
        return _json("internal server error; it is logged" + (
            f" with request id {rid}" if rid else ""), 500)
    return defaults.server_error(request, *args, **kwargs)
