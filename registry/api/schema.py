"""The OpenAPI schema is the contract CI clients generate code from (tests/test_api_contract.py
keeps it true): drf-spectacular's AutoSchema, plus the JSON error answers an operation can give,
documented once here instead of on every view."""

from __future__ import annotations

from http import HTTPStatus

from drf_spectacular import openapi
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse

from registry.api.serializers import ErrorSerializer

WRITES = {"POST", "PUT", "PATCH", "DELETE"}


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Our knox subclass (it records "last used") reads as what it is: a bearer token."""

    target_class = "registry.api.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "An API token: `Authorization: Bearer <token>` (tokens page, "
                               "`mmc login` or POST /api/v1/tokens/)."}


def error_statuses(method: str, operation: dict) -> list[int]:
    """Every operation needs a token (401) and a role (403); parameters and bodies can be
    invalid (400); a path, a page or a body can name what does not exist (404); a write can meet
    a state that forbids it (409); a body can be too large (413) or of a type the operation does
    not read (415). A throttled operation adds 429 (AutoSchema below); anything else an operation
    can answer it declares itself with `errors()`."""
    parameters = operation.get("parameters", [])
    body = "requestBody" in operation
    codes = [401, 403]
    if body or any(p["in"] in ("query", "header") for p in parameters):
        codes.append(400)
    if body or any(p["in"] == "path" or p["name"] == "page" for p in parameters):
        codes.append(404)
    if method in WRITES:
        codes.append(409)
    if body:
        codes += [413, 415]
    return sorted(codes)


def errors(*codes: int) -> dict:
    """extend_schema(responses={200: ..., **errors(409, 410)}): error answers beyond the rule."""
    return {code: OpenApiResponse(ErrorSerializer, description=HTTPStatus(code).phrase)
            for code in codes}


class AutoSchema(openapi.AutoSchema):
    def get_operation(self, *args, **kwargs):
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        error = self.resolve_serializer(ErrorSerializer, "response").ref
        responses = operation["responses"]
        codes = error_statuses(self.method, operation)
        if self.view.get_throttles():
            codes.append(429)
        for code in codes:
            responses.setdefault(str(code), {
                "description": HTTPStatus(code).phrase,
                "content": {"application/json": {"schema": error}},
            })
        operation["responses"] = dict(sorted(responses.items()))
        return operation
