"""Every API error is JSON: {"error": "<what was wrong>", "field": ..., "fields": {...}}."""

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from registry.errors import RegistryError


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
    if isinstance(exc, RegistryError):
        body = {"error": exc.message}
        if exc.field:
            body["field"] = exc.field
        if exc.details is not None:
            body["details"] = exc.details
        return Response(body, status=exc.status)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or "permission denied")
    response = drf_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = {"error": "; ".join(_flatten(exc.detail)), "fields": exc.detail}
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = {"error": str(detail)}
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        response.status_code = status.HTTP_401_UNAUTHORIZED
    return response
