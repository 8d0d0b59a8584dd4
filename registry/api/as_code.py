"""REST API for deployments as code: plan and apply an mmc.yaml (engineer; a file with a webhooks
section needs admin, as the webhook API does), export today's state as one (YAML), and the file's
JSON Schema for editors (anonymous: an editor sends no token). Thin: parse, call one service."""

from __future__ import annotations

import codecs
import json

from django.conf import settings
from django.http import HttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import parsers, serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.api.parsers import JSONParser
from registry.api.permissions import RolePermission
from registry.api.views import actor, valid
from registry.errors import InvalidRequest, PayloadTooLarge
from registry.roles import has_role
from registry.services import as_code

YAML = "application/yaml"


class YAMLTextParser(parsers.BaseParser):
    """The file itself as the body (`curl --data-binary @mmc.yaml -H 'Content-Type:
    application/yaml'`), bounded as a JSON body is; prune and source then come as query
    parameters."""

    media_type = YAML

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if limit is not None else stream.read()
        if limit is not None and len(raw) > limit:
            raise PayloadTooLarge(f"a file is at most {limit} bytes")
        try:
            return {"file": codecs.decode(raw, "utf-8")}
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"the file is not valid UTF-8: {exc}", field="file") from None


class ConfigFileSerializer(serializers.Serializer):
    file = serializers.JSONField(help_text=(
        "mmc.yaml: its text (YAML or JSON), or its document as a JSON object (its sha256 is then "
        "that of the object as compact JSON with sorted keys)"))
    prune = serializers.BooleanField(default=False, help_text=(
        "also remove the aliases and webhooks the file's sections no longer name (never models, "
        "versions or an endpoint's routing)"))
    secrets = serializers.DictField(
        child=serializers.CharField(max_length=200, trim_whitespace=False), required=False,
        default=dict, help_text="the values of the environment variables the file's webhooks "
                                "name in secret_env (never stored in the file)")


class ConfigApplySerializer(ConfigFileSerializer):
    source = serializers.CharField(max_length=200, required=False, allow_blank=True, default="",
                                   help_text="where the file comes from, e.g. a git commit; kept "
                                             "in the audit event")


class ConfigChangeSerializer(serializers.Serializer):
    resource = serializers.CharField(help_text='e.g. "endpoint fraud", "alias fraud@production"')
    action = serializers.ChoiceField(choices=["create", "update", "delete"])
    before = serializers.JSONField(allow_null=True, help_text="the keys that change, as now")
    after = serializers.JSONField(allow_null=True, help_text="... and as the file makes them")
    steps = serializers.ListField(child=serializers.CharField(),
                                  help_text="what an apply does, in order")


class ConfigSummarySerializer(serializers.Serializer):
    create = serializers.IntegerField()
    update = serializers.IntegerField()
    delete = serializers.IntegerField()


class ConfigOutcomeSerializer(serializers.Serializer):
    changes = ConfigChangeSerializer(many=True)
    summary = ConfigSummarySerializer()
    detail = serializers.CharField(help_text="the outcome in words")
    sha256 = serializers.CharField(help_text="the file's")
    prune = serializers.BooleanField()
    not_pruned = serializers.ListField(child=serializers.CharField(), help_text=(
        "resources the file's sections no longer name, kept because prune was not asked for"))
    applied = serializers.BooleanField(help_text="whether anything was changed")
    source = serializers.CharField(allow_blank=True)
    audit_event = serializers.IntegerField(allow_null=True, help_text="the apply's audit event")


QUERY = [OpenApiParameter("prune", bool, description="with a raw YAML body: as `prune`")]
REQUEST = {"application/json": ConfigFileSerializer, YAML: OpenApiTypes.OBJECT}


def _request(request, serializer) -> tuple[str, dict]:
    """The file's text and the other fields, from a JSON body or a raw YAML one (then from the
    query string)."""
    body = request.data if isinstance(request.data, dict) else {"file": request.data}
    query = {k: request.query_params[k] for k in ("prune", "source") if k in request.query_params}
    data = valid(serializer, {**query, **body})
    file = data.pop("file")
    if isinstance(file, dict):
        file = json.dumps(file, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    elif not isinstance(file, str):
        raise InvalidRequest("file must be the file's text, or its document as a JSON object",
                             field="file")
    return file, data


class PlanPermission(RolePermission):
    """A plan changes nothing (what it tries is rolled back): it needs the engineer role, and
    a read-only token may plan, so a pull request's job can hold a token that cannot apply."""

    def has_permission(self, request, view) -> bool:
        if not has_role(request.user, "engineer"):
            self.message = "this needs the engineer role"
            return False
        return True


class PlanView(APIView):
    parser_classes = [JSONParser, YAMLTextParser]
    permission_classes = [PlanPermission]

    @extend_schema(operation_id="config_plan", request=REQUEST,
                   responses=ConfigOutcomeSerializer, parameters=QUERY)
    def post(self, request):
        """What applying the file would change, resource by resource (as `terraform plan`);
        refused where the apply would be, with the same message. Changes nothing."""
        text, data = _request(request, ConfigFileSerializer)
        outcome = as_code.config_plan(text=text, actor=actor(request), **data)
        return Response(ConfigOutcomeSerializer(outcome.as_dict()).data)


class ApplyView(APIView):
    parser_classes = [JSONParser, YAMLTextParser]

    @extend_schema(operation_id="config_apply",
                   request={"application/json": ConfigApplySerializer, YAML: OpenApiTypes.OBJECT},
                   responses=ConfigOutcomeSerializer, parameters=[
                       *QUERY, OpenApiParameter("source", str, description=(
                           "with a raw YAML body: as `source`"))])
    def post(self, request):
        """Make the registry what the file says, through the same audited services as the
        console, all or nothing: models and settings, aliases, then routing. A second apply
        of the same file changes nothing and says so."""
        text, data = _request(request, ConfigApplySerializer)
        outcome = as_code.config_apply(text=text, actor=actor(request), **data)
        return Response(ConfigOutcomeSerializer(outcome.as_dict()).data)


class ExportView(APIView):
    @extend_schema(operation_id="config_export", responses={(200, YAML): OpenApiResponse(
        OpenApiTypes.OBJECT, description="an mmc.yaml document")})
    def get(self, request):
        """Today's state as an mmc.yaml (every model that is not archived, of the teams you are
        in; the webhooks, without secrets, for an admin): planning it shows no change."""
        text = as_code.export_text(include_webhooks=has_role(request.user, "admin"),
                                   user=request.user,
                                   schema_url=request.build_absolute_uri(
                                       reverse("api:config-schema")))
        return HttpResponse(text, content_type=f"{YAML}; charset=utf-8")


class SchemaView(APIView):
    authentication_classes: list = []  # an editor fetches it with no token
    permission_classes = [AllowAny]

    @extend_schema(operation_id="config_schema", responses={200: OpenApiResponse(
        OpenApiTypes.OBJECT, description="the JSON Schema (draft 2020-12) of mmc.yaml")})
    def get(self, request):
        """The JSON Schema editors validate mmc.yaml with (`# yaml-language-server:
        $schema=<this URL>`)."""
        return Response(as_code.schema())
