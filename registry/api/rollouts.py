"""REST API for rollouts: thin views over registry.services.rollouts. Every POST accepts
?wait=<seconds> (block until every live replica applied the change), answers with the endpoint,
its state and, with ?wait, the convergence; a refused transition is a 409 naming the state."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors, services
from registry.api.parsers import JSONParser
from registry.api.serializers import EndpointSerializer
from registry.api.views import WAIT, actor, endpoint_response, valid
from registry.choices import RollbackOrder
from registry.metrics import latest_shadow


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class CanarySerializer(ReasonSerializer):
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1)
    weight = serializers.IntegerField(min_value=0, max_value=100, default=0)
    plan = serializers.JSONField(required=False, allow_null=True, default=None, help_text=(
        "automated analysis: steps, bake time, guards (null: weights by hand)"))
    override = serializers.BooleanField(default=False, help_text=(
        "admin only: start despite signature differences (needs a reason)"))


class WeightSerializer(ReasonSerializer):
    weight = serializers.IntegerField(min_value=0, max_value=100)


class VersionReasonSerializer(ReasonSerializer):
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1)


class RollbackSerializer(VersionReasonSerializer):
    order = serializers.ChoiceField(choices=RollbackOrder.values,
                                    default=RollbackOrder.LOAD_FIRST.value,
                                    help_text=RollbackOrder.help_lines())


def rollout_response(name: str, request, ep):
    return endpoint_response(name, request, ep.revision)


class _Op(APIView):
    """POST runs `service` with the validated body; subclasses name both."""

    parser_classes = [JSONParser]
    serializer_class = ReasonSerializer
    service = None
    fields: dict[str, str] = {}

    def post(self, request, name):
        data = valid(self.serializer_class, request.data)
        kwargs = {self.fields.get(k, k): v for k, v in data.items()}
        ep = type(self).service(model_name=name, actor=actor(request), **kwargs)
        return rollout_response(name, request, ep)


def op(service, serializer=ReasonSerializer, doc: str = "", **fields) -> type[_Op]:
    def post(self, request, name):
        return _Op.post(self, request, name)

    # A post of its own: extend_schema annotates the function it is given, and one shared
    # _Op.post would leave every operation documented with the last one's body.
    post = extend_schema(request=serializer, responses=EndpointSerializer, parameters=[WAIT],
                         description=doc or service.__doc__ or "")(post)
    return type(f"{service.__name__.title().replace('_', '')}View", (_Op,), {
        "serializer_class": serializer, "service": staticmethod(service), "fields": fields,
        "post": post})


CanaryView = op(services.canary_start, CanarySerializer, version="version_number")
WeightView = op(services.canary_weight, WeightSerializer)
PromoteView = op(services.canary_promote)
AbortView = op(services.canary_abort)
PauseView = op(services.analysis_pause, doc="Pause the automated analysis (weights by hand).")
ResumeView = op(services.analysis_resume)
RollbackView = op(services.rollback, RollbackSerializer, version="version_number")
BlueGreenDeployView = op(services.bluegreen_deploy, VersionReasonSerializer,
                         version="version_number")
SwitchView = op(services.bluegreen_switch)
SwitchBackView = op(services.bluegreen_switch_back,
                    doc="Send all traffic back to the colour the last switch left.")
BlueGreenFinishView = op(services.bluegreen_finish)
# Whether /infer needs a predict key: not a rollout, but the same shape (reason in, endpoint out).
ProtectView = op(services.endpoint_protect)
OpenView = op(services.endpoint_open)


class ShadowSerializer(serializers.Serializer):
    model = serializers.CharField()
    shadow = serializers.IntegerField(allow_null=True, help_text="the shadow version, if any")
    comparison = serializers.JSONField(allow_null=True, help_text=(
        "the newest shadow-vs-live comparison a replica reported"))


class ShadowView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses=ShadowSerializer)
    def get(self, request, name):
        """The shadow version and the newest comparison a replica reported for it."""
        ep = selectors.endpoint_get(selectors.model_get(name))
        shadow = ep.shadow.number if ep and ep.shadow else None
        return Response({"model": name, "shadow": shadow, "comparison": latest_shadow(name)})

    @extend_schema(request=VersionReasonSerializer, responses=EndpointSerializer,
                   parameters=[WAIT])
    def post(self, request, name):
        """Mirror live traffic to a version; answers recorded, never returned."""
        data = valid(VersionReasonSerializer, request.data)
        ep = services.shadow_start(model_name=name, version_number=data["version"],
                                   reason=data["reason"], actor=actor(request))
        return rollout_response(name, request, ep)

    @extend_schema(responses={200: EndpointSerializer}, parameters=[
        WAIT, OpenApiParameter("reason", str, description="why, for the audit log")])
    def delete(self, request, name):
        """Stop mirroring; answers the endpoint like every other rollout operation (200), so
        `?wait` can report the convergence."""
        ep = services.shadow_stop(model_name=name, actor=actor(request),
                                  reason=request.query_params.get("reason", ""))
        return rollout_response(name, request, ep)
