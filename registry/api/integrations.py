"""REST API for integrations with the world outside: Triton model-repository and KServe export,
webhook subscriptions and their delivery log (admin), TensorRT engine builds (engineer)."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors
from registry.api.parsers import JSONParser
from registry.api.schema import errors
from registry.api.serializers import VersionSerializer, username
from registry.api.views import actor, valid
from registry.errors import InvalidRequest, NotFound
from registry.integrations.export import FORMATS, parse_versions, stream_tar_gz, triton_export
from registry.integrations.kserve import RUNTIMES, kserve_export, stream_kserve
from registry.integrations.tensorrt import PRECISIONS
from registry.integrations.webhooks import EVENTS
from registry.models import WebhookDelivery, WebhookSubscription
from registry.services import tensorrt as trt_services
from registry.services import webhooks as hooks

# -- Triton export ----------------------------------------------------------------------------


class IgnoreFormatParameter(DefaultContentNegotiation):
    """`?format=` names the archive's (triton) or a dataset's format (npy), not a DRF renderer;
    without this, DRF answers an unknown renderer format with a 404."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class ModelExportView(APIView):
    content_negotiation_class = IgnoreFormatParameter

    @extend_schema(
        parameters=[
            OpenApiParameter("format", str, enum=list(FORMATS), required=True),
            OpenApiParameter("versions", str, description=(
                "triton: 'all' (default: every ready version), 'stable', or numbers like 1,2")),
            OpenApiParameter("kind", str, enum=["auto", "cpu", "gpu"], description=(
                "triton: instance_group kind; auto: GPU when validation ran on a GPU provider")),
            OpenApiParameter("runtime", str, enum=list(RUNTIMES), description=(
                "kserve: the ServingRuntime, mmc-serve (default) or Triton")),
            OpenApiParameter("storage_uri", str, description=(
                "kserve: the artifact store as KServe reaches it (default "
                "MMC_KSERVE_STORAGE_URI, pvc://mmc-artifacts)")),
            OpenApiParameter("name", str, description=(
                "kserve: the InferenceService's name (default: the model's, as a DNS label)")),
        ],
        responses={(200, "application/gzip"): bytes, **errors(409)})
    def get(self, request, name):
        """triton: a Triton model repository (.tar.gz): <model>/config.pbtxt and
        <model>/<n>/model.onnx. kserve: a ServingRuntime and an InferenceService mirroring the
        endpoint (canaryTrafficPercent = the candidate's weight), as <model>-kserve/*.yaml."""
        q = request.query_params
        fmt = q.get("format", "")
        if fmt not in FORMATS:
            raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}", field="format")
        if fmt == "kserve":
            if "versions" in q:
                raise InvalidRequest("a KServe export is what the endpoint routes (stable and "
                                     "candidate): versions does not apply", field="versions")
            export = kserve_export(model_name=name, runtime=q.get("runtime", "mmc"),
                                   storage=q.get("storage_uri"), name=q.get("name"))
            stream = stream_kserve(export)
        else:
            export = triton_export(model_name=name, versions=parse_versions(q.get("versions")),
                                   kind=q.get("kind", "auto"))
            stream = stream_tar_gz(export)
        response = StreamingHttpResponse(stream, content_type="application/gzip")
        response["Content-Disposition"] = f'attachment; filename="{export.filename}"'
        response["X-Exported-Versions"] = ",".join(str(v.number) for v in export.versions)
        return response


# -- TensorRT ---------------------------------------------------------------------------------


class TensorRTBuildSerializer(serializers.Serializer):
    precision = serializers.ChoiceField(choices=PRECISIONS, default="fp16")


class TensorRTStatusSerializer(serializers.Serializer):
    model = serializers.CharField()
    version = serializers.IntegerField()
    tensorrt = serializers.DictField(child=serializers.JSONField(),
                                     help_text="per precision: status, build time, engine")


class VersionTensorRTView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses=TensorRTStatusSerializer)
    def get(self, request, name, number):
        """Engine build status per precision (also in the version detail's validation_report)."""
        version = selectors.version_get(name, number)
        return Response({"model": name, "version": number, "tensorrt": (
            version.validation_report or {}).get("tensorrt") or {}})

    @extend_schema(request=TensorRTBuildSerializer, responses={202: VersionSerializer})
    def post(self, request, name, number):
        """Build a TensorRT engine for the version on a GPU worker (status in the detail)."""
        data = valid(TensorRTBuildSerializer, request.data)
        version = trt_services.tensorrt_build(model_name=name, number=number,
                                              precision=data["precision"], actor=actor(request))
        return Response(VersionSerializer(version).data, status=status.HTTP_202_ACCEPTED)


# -- Webhooks ---------------------------------------------------------------------------------


class WebhookSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.name", default=None, read_only=True,
                                  allow_null=True, help_text="null: every model")
    created_by = username("created_by")

    class Meta:
        model = WebhookSubscription
        fields = ["id", "name", "url", "model", "events", "active", "created_by", "created_at",
                  "updated_at"]


class WebhookWriteSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True)
    url = serializers.CharField(max_length=500, required=False)
    model = serializers.CharField(required=False, allow_null=True, allow_blank=True,
                                  help_text="a model's name; null or omitted: every model")
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENTS),
                                   required=False, help_text="empty: every event")
    active = serializers.BooleanField(required=False)
    secret = serializers.CharField(required=False, min_length=16, max_length=200,
                                   help_text="HMAC key; generated when omitted on create")


class WebhookCreateSerializer(WebhookWriteSerializer):
    url = serializers.CharField(max_length=500, help_text="where the signed events go")


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(read_only=True, help_text="the signing secret, shown once")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]


class WebhookAttemptSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    status_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    duration_ms = serializers.FloatField()
    at = serializers.DateTimeField()


class WebhookDeliverySerializer(serializers.ModelSerializer):
    webhook = serializers.IntegerField(source="subscription_id")
    attempt_log = WebhookAttemptSerializer(many=True)

    class Meta:
        model = WebhookDelivery
        fields = ["id", "webhook", "event", "audit_event", "status", "attempts", "max_attempts",
                  "last_status_code", "last_error", "created_at", "finished_at", "body",
                  "attempt_log"]


class _AdminOnly:
    read_role = write_role = "admin"


class WebhookListView(_AdminOnly, generics.ListAPIView):
    serializer_class = WebhookSerializer
    parser_classes = [JSONParser]

    def get_queryset(self):
        return WebhookSubscription.objects.select_related("model", "created_by")

    @extend_schema(request=WebhookCreateSerializer, responses={201: WebhookCreatedSerializer})
    def post(self, request):
        """Subscribe a URL; the answer shows the signing secret, once."""
        data = valid(WebhookCreateSerializer, request.data)
        sub = hooks.webhook_create(actor=actor(request), **data)
        return Response(WebhookCreatedSerializer(sub).data, status=status.HTTP_201_CREATED)


def _webhook(pk: int) -> WebhookSubscription:
    sub = WebhookSubscription.objects.select_related("model", "created_by").filter(pk=pk).first()
    if sub is None:
        raise NotFound(f"no webhook {pk}", field="webhook")
    return sub


class WebhookDetailView(_AdminOnly, APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses=WebhookSerializer)
    def get(self, request, pk):
        return Response(WebhookSerializer(_webhook(pk)).data)

    @extend_schema(request=WebhookWriteSerializer, responses=WebhookSerializer)
    def patch(self, request, pk):
        data = valid(WebhookWriteSerializer, request.data)
        sub = hooks.webhook_update(webhook_id=pk, actor=actor(request), **data)
        return Response(WebhookSerializer(sub).data)

    @extend_schema(responses={204: None})
    def delete(self, request, pk):
        hooks.webhook_delete(webhook_id=pk, actor=actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookTestView(_AdminOnly, APIView):
    @extend_schema(request=None, responses=WebhookDeliverySerializer)
    def post(self, request, pk):
        """Send a `ping` event now (one attempt) and answer with the delivery and its result."""
        delivery = hooks.webhook_test(webhook_id=pk, actor=actor(request))
        return Response(WebhookDeliverySerializer(delivery).data)


class WebhookDeliveryListView(_AdminOnly, generics.ListAPIView):
    """The delivery log of one webhook, newest first, each with its attempts."""

    serializer_class = WebhookDeliverySerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular, building the schema
            return WebhookDelivery.objects.none()
        sub = _webhook(self.kwargs["pk"])
        qs = sub.deliveries.prefetch_related("attempt_log")
        for key in ("status", "event"):
            if self.request.query_params.get(key):
                qs = qs.filter(**{key: self.request.query_params[key]})
        return qs
