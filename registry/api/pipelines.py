"""REST API for pipelines: create a pipeline version from a JSON spec. Everything else (deploy,
canary, rollback, aliases, export) is the same API as for any version."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.views import APIView

from registry.api.parsers import JSONParser
from registry.api.serializers import METRICS_HELP, VersionUploadSerializer
from registry.api.views import _upload_response, actor
from registry.errors import InvalidRequest
from registry.services.pipelines import EXTRA_KEYS, pipeline_create


class PipelineStepSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="the step's name in edges (letters, digits, - or _)")
    model = serializers.CharField(help_text="a registered model")
    version = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1,
                                       help_text="a ready version of it (or give alias)")
    alias = serializers.CharField(required=False, help_text=(
        "an alias of it, resolved now and pinned: the pipeline version never changes"))


# "from" is a Python keyword: the edge serializer is declared with its fields as a mapping.
PipelineEdgeSerializer = type("PipelineEdgeSerializer", (serializers.Serializer,), {
    "__doc__": "`step.tensor`, or a bare name: the pipeline's input (from) or output (to).",
    "from": serializers.CharField(help_text="a pipeline input name, or step.output"),
    "to": serializers.CharField(help_text="step.input, or a pipeline output name"),
})


class PipelineCreateSerializer(serializers.Serializer):
    steps = PipelineStepSerializer(many=True)
    edges = PipelineEdgeSerializer(many=True)
    metadata = serializers.JSONField(required=False, help_text="free-form JSON object")
    metrics = serializers.JSONField(required=False, help_text=METRICS_HELP)
    lineage = serializers.JSONField(required=False,
                                    help_text="JSON object: run_url, git_commit, dataset")


class PipelineCreateView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=PipelineCreateSerializer,
                   responses={201: VersionUploadSerializer, 200: VersionUploadSerializer})
    def post(self, request, name):
        """Create a pipeline version: steps (model versions, or aliases pinned now) and edges
        from the pipeline's inputs through the steps to its outputs. Checked at once (every
        step ready, every step input fed exactly once, datatypes equal, shapes compatible, no
        cycle): a 400 names the bad step or edge, and nothing is written. The same spec again
        answers the existing version (200)."""
        if not isinstance(request.data, dict):
            raise InvalidRequest("the body must be a JSON object with steps and edges")
        spec = {k: v for k, v in request.data.items() if k not in EXTRA_KEYS}
        extra = {k: request.data[k] for k in EXTRA_KEYS if k in request.data}
        version, created = pipeline_create(model_name=name, spec=spec, actor=actor(request),
                                           **extra)
        return _upload_response(version, created, [])
