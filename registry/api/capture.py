"""REST API for an endpoint's data capture: GET its settings and counters, PUT new settings
(registry.services.capture checks them: a value out of range is a 400 naming the field)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors
from registry.api.parsers import JSONParser
from registry.api.views import actor
from registry.errors import InvalidRequest
from registry.monitoring.capture import capture_status
from registry.services.capture import MAX_RECORD_BYTES, MAX_RETENTION_DAYS, MODES, capture_set


class CaptureVersionSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    captured = serializers.IntegerField(help_text="sampled into the live replicas' queues")
    dropped = serializers.IntegerField(help_text="sampled but dropped: a queue was full")
    written = serializers.IntegerField(help_text="stored in the artifact store")
    failed = serializers.IntegerField(help_text="lost: the store did not take them")


class CaptureSerializer(serializers.Serializer):
    """An endpoint's capture settings and what its live replicas captured since they started."""

    percent = serializers.FloatField(help_text="share of requests recorded, 0-100; 0: off")
    mode = serializers.ChoiceField(choices=MODES, help_text="which tensors a record keeps")
    max_bytes = serializers.IntegerField(help_text="tensor bytes one record keeps at most")
    retention_days = serializers.IntegerField(help_text="days records are kept (the GC)")
    enabled = serializers.BooleanField()
    captured = serializers.IntegerField()
    dropped = serializers.IntegerField()
    versions = CaptureVersionSerializer(many=True)


class CaptureSetSerializer(serializers.Serializer):
    """Any subset of the settings; those left out keep their values."""

    percent = serializers.FloatField(required=False, help_text=(
        "0 to 100, at most three decimals (0.5: one request in 200); 0 turns capture off"))
    mode = serializers.ChoiceField(choices=MODES, required=False)
    max_bytes = serializers.IntegerField(required=False, help_text=(
        f"0 to {MAX_RECORD_BYTES}; tensors past it are left out and the record says truncated"))
    retention_days = serializers.IntegerField(required=False, help_text=(
        f"1 to {MAX_RETENTION_DAYS}"))
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500)


class EndpointCaptureView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses=CaptureSerializer)
    def get(self, request, name):
        """The endpoint's capture settings, and per version what the live replicas captured
        and dropped (their heartbeats)."""
        model = selectors.model_get(name)
        return Response(CaptureSerializer(
            capture_status(selectors.endpoint_get(model), name)).data)

    @extend_schema(request=CaptureSetSerializer, responses=CaptureSerializer)
    def put(self, request, name):
        """Change the capture settings (audited; replicas follow at the next revision)."""
        data = request.data
        if not isinstance(data, dict):
            raise InvalidRequest("the body must be a JSON object of capture settings")
        values = {k: v for k, v in data.items() if k != "reason"}
        reason = data.get("reason", "")
        if not isinstance(reason, str) or len(reason) > 500:
            raise InvalidRequest("reason must be text of at most 500 characters",
                                 field="reason")
        selectors.model_get(name)
        ep = capture_set(model_name=name, actor=actor(request), values=values, reason=reason)
        return Response(CaptureSerializer(capture_status(ep, name)).data)
