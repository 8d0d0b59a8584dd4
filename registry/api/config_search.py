"""REST API for serving-config searches of a version (registry.services.config_search). Reads
need the viewer role, starting, applying and cancelling the engineer role.

    POST /api/v1/models/{m}/versions/{n}/config-search/        {"grid": {...}, ...} → 202
    GET  /api/v1/models/{m}/versions/{n}/config-search/        the version's searches
    GET  /api/v1/models/{m}/versions/{n}/config-search/{id}/
    POST /api/v1/models/{m}/versions/{n}/config-search/{id}/apply/[?wait=]  {"point": i}
    POST /api/v1/models/{m}/versions/{n}/config-search/{id}/cancel/
"""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors
from registry.api.parsers import JSONParser
from registry.api.schema import errors
from registry.api.serializers import VersionSerializer, username
from registry.api.views import WAIT, actor, valid, wait_seconds
from registry.convergence import wait_for_revision
from registry.models import ConfigSearch
from registry.notify import current_revision
from registry.services import config_search as svc


class GridSerializer(serializers.Serializer):
    """The values to try per setting; a setting left out keeps the version's value."""

    max_batch_size = serializers.ListField(child=serializers.IntegerField(), required=False)
    max_queue_delay_us = serializers.ListField(child=serializers.IntegerField(), required=False)
    instance_count = serializers.ListField(child=serializers.IntegerField(), required=False)
    intra_op_threads = serializers.ListField(child=serializers.IntegerField(), required=False)
    response_cache = serializers.ListField(child=serializers.BooleanField(), required=False)

    def to_internal_value(self, data):
        if isinstance(data, dict):  # DRF would drop an unknown setting without a word
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: [
                    f"cannot be searched; the settings that can: {', '.join(self.fields)}"]})
        return super().to_internal_value(data)


class ConfigSearchCreateSerializer(serializers.Serializer):
    grid = GridSerializer(help_text=(
        f"each setting's values to try, at most {svc.MAX_VALUES} per setting and "
        f"{svc.MAX_POINTS} points in the cross product"))
    concurrency = serializers.IntegerField(default=4, help_text=(
        "requests in flight while a point is measured (up to MMC_LOADTEST_MAX_CONCURRENCY)"))
    seconds = serializers.IntegerField(default=5, help_text=(
        f"measured per point (up to MMC_LOADTEST_MAX_SECONDS); points × seconds at most "
        f"{svc.MAX_SECONDS}"))
    p99_budget_ms = serializers.FloatField(default=100.0, help_text=(
        "the best point is the one with the most req/s whose p99 is within this, with no "
        "errors"))
    replica = serializers.CharField(required=False, allow_blank=True, default="", help_text=(
        "a live replica's name (default: the embedded server, else the first live replica "
        "running it)"))
    confirm = serializers.BooleanField(default=False, help_text=(
        "needed when the version takes real traffic: its users get every trial setting"))
    key = serializers.CharField(required=False, allow_blank=True, default="", write_only=True,
                                help_text="a predict key, when the endpoint is protected; "
                                          "never stored")


class PointSerializer(serializers.Serializer):
    settings = serializers.DictField(child=serializers.JSONField(), help_text=(
        "max_batch_size, max_queue_delay_us, instance_count, intra_op_threads, response_cache"))
    rps = serializers.FloatField(required=False, allow_null=True)
    p50_ms = serializers.FloatField(required=False, allow_null=True)
    p95_ms = serializers.FloatField(required=False, allow_null=True)
    p99_ms = serializers.FloatField(required=False, allow_null=True)
    requests = serializers.IntegerField(required=False)
    ok = serializers.IntegerField(required=False)
    errors = serializers.DictField(child=serializers.IntegerField(), required=False,
                                   help_text="failed requests by status")
    failure = serializers.CharField(required=False, help_text="why the point has no figures")


class ConfigSearchSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="version.model.name")
    version = serializers.IntegerField(source="version.number")
    points = PointSerializer(many=True)
    best_point = PointSerializer(allow_null=True, help_text=(
        "the most req/s with p99 within the budget and no errors; null when none was"))
    created_by = username("created_by")
    url = serializers.SerializerMethodField()

    class Meta:
        model = ConfigSearch
        fields = ["id", "url", "model", "version", "status", "grid", "concurrency", "seconds",
                  "p99_budget_ms", "replica", "live_roles", "original", "points_total",
                  "points", "progress", "best", "best_point", "applied_point", "restore_note",
                  "failure_reason", "created_by", "created_at", "started_at", "finished_at"]

    def get_url(self, obj) -> str:
        return reverse("api:config-search-detail",
                       args=[obj.version.model.name, obj.version.number, obj.pk])


class ApplySerializer(serializers.Serializer):
    point = serializers.IntegerField(required=False, allow_null=True, default=None,
                                     help_text="which point (default: the best)")


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="",
                                   max_length=1000)


def _body(search: ConfigSearch) -> dict:
    search = svc.config_search_get(model_name=search.version.model.name,
                                   number=search.version.number, search_id=search.pk)
    return ConfigSearchSerializer(search).data


class ConfigSearchListView(generics.ListAPIView):
    serializer_class = ConfigSearchSerializer
    parser_classes = [JSONParser]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular, building the schema
            return ConfigSearch.objects.none()
        return selectors.config_search_list(
            selectors.version_get(self.kwargs["name"], self.kwargs["number"]))

    @extend_schema(request=ConfigSearchCreateSerializer,
                   responses={202: ConfigSearchSerializer, **errors(409)})
    def post(self, request, name, number):
        """Search the version's serving settings: every point of the grid applied to the
        version in turn and measured with the load test's generator, its own settings put back
        after; a version taking real traffic needs confirm=true."""
        data = valid(ConfigSearchCreateSerializer, request.data)
        search = svc.config_search_create(model_name=name, number=number, actor=actor(request),
                                          **data)
        body = _body(search)
        return Response(body, status=status.HTTP_202_ACCEPTED, headers={"Location": body["url"]})


class ConfigSearchDetailView(APIView):
    @extend_schema(responses=ConfigSearchSerializer)
    def get(self, request, name, number, search_id):
        return Response(ConfigSearchSerializer(svc.config_search_get(
            model_name=name, number=number, search_id=search_id)).data)


class ConfigSearchApplyView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=ApplySerializer, responses=VersionSerializer, parameters=[WAIT])
    def post(self, request, name, number, search_id):
        """Make a measured point (default: the best) the version's serving settings, as PATCH
        of the version would (audited); with `?wait=`, once every live replica reloaded it."""
        seconds = wait_seconds(request)
        data = valid(ApplySerializer, request.data or {})
        svc.config_search_apply(model_name=name, number=number, search_id=search_id,
                                actor=actor(request), point=data["point"])
        body = VersionSerializer(selectors.version_get(name, number)).data
        if seconds is not None:
            body["convergence"] = wait_for_revision(current_revision(), seconds)
        return Response(body)


class ConfigSearchCancelView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=CancelSerializer, responses=ConfigSearchSerializer)
    def post(self, request, name, number, search_id):
        """Stop a queued or running search; a running one puts the version's settings back."""
        data = valid(CancelSerializer, request.data or {})
        search = svc.config_search_cancel(model_name=name, number=number, search_id=search_id,
                                          actor=actor(request), reason=data["reason"])
        return Response(_body(search))
