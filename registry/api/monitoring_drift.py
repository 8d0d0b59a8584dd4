"""REST API for baselines and drift.

    GET  /api/v1/models/{m}/versions/{n}/baseline/    the version's baseline (404: none)
    POST /api/v1/models/{m}/versions/{n}/baseline/    {"dataset": id} or {"since", "until"} → 201
    GET  /api/v1/models/{m}/endpoint/drift/           thresholds, episodes, latest points
    PUT  /api/v1/models/{m}/endpoint/drift/           any subset of the thresholds
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors
from registry.api.parsers import JSONParser
from registry.api.views import actor
from registry.errors import InvalidRequest, NotFound
from registry.models import Baseline
from registry.monitoring.drift import latest_points, recent_episodes
from registry.services.baselines import baseline_from_capture, baseline_from_dataset
from registry.services.drift import DEFAULTS, RANGES, drift_settings_set, settings_of


class BaselineSerializer(serializers.ModelSerializer):
    version = serializers.IntegerField(source="version.number")
    features = serializers.JSONField(help_text=(
        '{"inputs": {feature: summary}, "outputs": {...}}; a numeric summary has count, mean, '
        "std, min, max, quantiles, histogram edges and counts and a sample; a categorical one "
        "top (value -> count), other and distinct"))

    class Meta:
        model = Baseline
        fields = ["version", "source", "dataset", "window_start", "window_end", "rows",
                  "features", "created_at"]


class BaselineCreateSerializer(serializers.Serializer):
    """Either a dataset (an uploaded .npy/.npz) or a capture window (default: the last hour)."""

    dataset = serializers.UUIDField(required=False)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)


class VersionBaselineView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses=BaselineSerializer)
    def get(self, request, name, number):
        """The version's baseline: statistics of each input feature and output."""
        version = selectors.version_get(name, number)
        baseline = Baseline.objects.filter(version=version).first()
        if baseline is None:
            raise NotFound(f"version {number} of {name!r} has no baseline", field="baseline")
        return Response(BaselineSerializer(baseline).data)

    @extend_schema(request=BaselineCreateSerializer, responses={201: BaselineSerializer})
    def post(self, request, name, number):
        """Compute the version's baseline (replacing any) from a dataset or captured traffic;
        a dataset that does not fit the signature is a 400 naming the tensor, dtype or shape."""
        selectors.version_get(name, number)
        body = BaselineCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if "dataset" in data and ("since" in data or "until" in data):
            raise InvalidRequest("give a dataset or a capture window (since/until), not both",
                                 field="since" if "since" in data else "until")
        if "dataset" in data:
            baseline = baseline_from_dataset(model_name=name, version_number=number,
                                             dataset_id=data["dataset"], actor=actor(request))
        else:
            until = data.get("until") or timezone.now()
            since = data.get("since") or until - timedelta(hours=1)
            baseline = baseline_from_capture(model_name=name, version_number=number,
                                             since=since.timestamp(), until=until.timestamp(),
                                             actor=actor(request))
        return Response(BaselineSerializer(baseline).data, status=status.HTTP_201_CREATED)


class DriftPointSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    feature = serializers.CharField()
    part = serializers.CharField()
    window_end = serializers.DateTimeField()
    psi = serializers.FloatField()
    statistic = serializers.FloatField()
    p_value = serializers.FloatField()
    n = serializers.IntegerField()
    drifted = serializers.BooleanField()


class DriftEpisodeSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)
    features = serializers.ListField(child=serializers.CharField())


class DriftSettingsSerializer(serializers.Serializer):
    psi_threshold = serializers.FloatField(help_text=(
        f"{RANGES['psi_threshold'][0]:g} to {RANGES['psi_threshold'][1]:g}; default "
        f"{DEFAULTS['psi_threshold']}"))
    p_value = serializers.FloatField(help_text=(
        f"{RANGES['p_value'][0]:g} to {RANGES['p_value'][1]:g} (Bonferroni-corrected for the "
        f"number of features); default {DEFAULTS['p_value']}"))
    window_minutes = serializers.IntegerField(help_text=f"default {DEFAULTS['window_minutes']}")
    min_samples = serializers.IntegerField(help_text=f"default {DEFAULTS['min_samples']}")


class DriftSerializer(DriftSettingsSerializer):
    episodes = DriftEpisodeSerializer(many=True)
    points = DriftPointSerializer(many=True, help_text="each feature's latest window")


class EndpointDriftView(APIView):
    parser_classes = [JSONParser]

    def _body(self, model) -> dict:
        endpoint = selectors.endpoint_get(model)
        limits = settings_of(endpoint) if endpoint else dict(DEFAULTS)
        return DriftSerializer({**limits, "episodes": recent_episodes(model),
                                "points": latest_points(model)}).data

    @extend_schema(responses=DriftSerializer)
    def get(self, request, name):
        """The endpoint's drift thresholds, its recent drift episodes and each deployed
        version's latest comparison per feature."""
        return Response(self._body(selectors.model_get(name)))

    @extend_schema(request=DriftSettingsSerializer(partial=True), responses=DriftSerializer)
    def put(self, request, name):
        """Change some of the thresholds (audited); a value out of range is a 400 naming it."""
        if not isinstance(request.data, dict):
            raise InvalidRequest("the body must be a JSON object of drift settings")
        model = selectors.model_get(name)
        drift_settings_set(model_name=name, actor=actor(request), values=dict(request.data))
        return Response(self._body(model))
