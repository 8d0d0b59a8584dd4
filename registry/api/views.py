"""REST API for CI. Thin: parse, call one service or selector, serialise."""

from __future__ import annotations

import math

from django.conf import settings
from django.db import transaction
from django.http import FileResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.parsers import FileUploadParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import background, selectors, services
from registry.api.parsers import JSONParser, loads
from registry.api.permissions import RolePermission
from registry.api.schema import errors
from registry.api.serializers import (
    AliasSerializer,
    AliasSetSerializer,
    ApiKeyCreatedSerializer,
    ApiKeyRevokedSerializer,
    ApiKeySerializer,
    ApprovalCommentSerializer,
    ArchiveSerializer,
    AuditEventSerializer,
    DeploySerializer,
    EndpointSerializer,
    LimitsSetSerializer,
    MeSerializer,
    ModelCreateSerializer,
    ModelSerializer,
    ModelUpdateSerializer,
    NameSerializer,
    ReplicaListSerializer,
    ScaleToZeroSetSerializer,
    UploadSerializer,
    VersionConfigSerializer,
    VersionSerializer,
    VersionUploadSerializer,
)
from registry.api.uploads import (
    StoreUploadHandler,
    discard_refused_blobs,
    received_writer,
    remember_blob,
)
from registry.audit import Actor
from registry.convergence import wait_for_revision
from registry.errors import InvalidRequest, LifecycleError, PayloadTooLarge
from registry.filtersets import AuditFilterSet, ModelFilterSet, VersionFilterSet
from registry.models import ApiToken, Endpoint, ModelVersion
from registry.notify import current_revision
from registry.roles import role_of, visible_models
from registry.selectors import my_teams
from registry.services.conversion import version_convert
from registry.services.replicas import replica_remove
from registry.services.versions import DESCRIPTIVE_FIELDS
from registry.store.artifacts import default_store


def actor(request) -> Actor:
    return Actor.from_request(request)


def valid(serializer_class, data, **kwargs) -> dict:
    ser = serializer_class(data=data, **kwargs)
    ser.is_valid(raise_exception=True)
    return ser.validated_data


WAIT = OpenApiParameter("wait", float, description=(
    "seconds (at most 120) to wait until every live replica applied the change"))


def wait_seconds(request) -> float | None:
    raw = request.query_params.get("wait")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise InvalidRequest("wait must be a number of seconds", field="wait")
    return seconds


REASON = OpenApiParameter("reason", str, description="why, kept in the audit log")


class MeView(APIView):
    @extend_schema(responses=MeSerializer)
    def get(self, request):
        token = request.auth if isinstance(request.auth, ApiToken) else None
        return Response(MeSerializer({"username": request.user.get_username(),
                                      "role": role_of(request.user), "token": token,
                                      "teams": my_teams(request.user)}).data)


class ModelListView(generics.ListAPIView):
    serializer_class = ModelSerializer
    filterset_class = ModelFilterSet

    def get_queryset(self):
        return visible_models(selectors.model_list(), self.request.user)

    @extend_schema(request=ModelCreateSerializer, responses={201: ModelSerializer})
    def post(self, request):
        data = valid(ModelCreateSerializer, request.data)
        model = services.model_create(actor=actor(request), **data)
        return Response(ModelSerializer(selectors.model_get(model.name)).data,
                        status=status.HTTP_201_CREATED)


class ModelDetailView(APIView):
    @extend_schema(responses=ModelSerializer)
    def get(self, request, name):
        return Response(ModelSerializer(selectors.model_get(name)).data)

    @extend_schema(request=ModelUpdateSerializer, responses=ModelSerializer)
    def patch(self, request, name):
        data = valid(ModelUpdateSerializer, request.data)
        services.model_update(name=name, actor=actor(request), **data)
        return Response(ModelSerializer(selectors.model_get(name)).data)

    @extend_schema(parameters=[REASON], responses={204: None})
    def delete(self, request, name):
        """Delete the model with its versions, aliases and endpoint (engineer+); 409 naming
        what holds a version (a role on its endpoint, another model's pipeline, a job)."""
        services.model_delete(name=name, actor=actor(request),
                              reason=request.query_params.get("reason", ""))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelArchiveView(APIView):
    @extend_schema(request=ArchiveSerializer, responses=ModelSerializer)
    def post(self, request, name):
        data = valid(ArchiveSerializer, request.data)
        services.model_archive(name=name, actor=actor(request), **data)
        return Response(ModelSerializer(selectors.model_get(name)).data)


def _check_uploadable(request, name: str) -> None:
    """Refuse before reading the body: unknown/archived model, declared size over the limit."""
    model = selectors.model_get(name)
    if model.archived:
        raise LifecycleError(f"model {name!r} is archived; unarchive it first")
    declared = int(request.META.get("CONTENT_LENGTH") or 0)
    limit = default_store().max_bytes
    if declared > limit + 1024 * 1024:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the artifact limit of "
                              f"{limit} bytes", field="file")


def _json_object(raw, field: str = "metadata") -> dict | None:
    """An upload's JSON-object field (metadata, metrics, lineage), from a form field, a query
    parameter or a header; None when absent."""
    if raw in (None, ""):
        return None
    value = loads(raw, what=field, field=field)  # bounded: depth, never recursion
    if not isinstance(value, dict):
        raise InvalidRequest(f"{field} must be a JSON object", field=field)
    return value


def _descriptive(get) -> dict:
    """metadata, metrics and lineage of an upload, each read by `get(field)`."""
    return {field: _json_object(get(field), field) for field in ("metadata", "metrics", "lineage")}


def _upload_response(version, created: bool, unsent: list[tuple[str, str]]) -> Response:
    body = VersionSerializer(version).data
    body["created"] = created
    if not created:
        body["detail"] = (f"identical artifact (sha256 {version.sha256[:12]}…) is already "
                          f"version {version.number}; nothing was created")
    elif unsent := [reason for name, reason in unsent if name == "registry.validate_version"]:
        within = settings.VALIDATION_LEASE_SECONDS + settings.RECOVERY_TICK_SECONDS
        body["detail"] = (f"stored as version {version.number}, but its validation could not be "
                          f"queued now ({unsent[0]}); it is queued again automatically within "
                          f"{within:.0f} s of the task queue answering")
    return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class DiscardsRefusedUpload:
    """For upload views: the artifact is in the store before the view decides, so once the answer
    is known (refused, failed, or a second file field) nothing stays that no version uses."""

    def dispatch(self, request, *args, **kwargs):
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            discard_refused_blobs(request)


class VersionListView(DiscardsRefusedUpload, generics.ListAPIView):
    """Versions, newest first; `?metric=auc>0.9` and `?metadata=team:ml` filter (repeatable)."""

    serializer_class = VersionSerializer
    filterset_class = VersionFilterSet
    parser_classes = [MultiPartParser]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular, building the schema
            return ModelVersion.objects.none()
        return selectors.version_list(selectors.model_get(self.kwargs["name"]))

    def initial(self, request, *args, **kwargs):
        # Install the streaming handler before authentication: with a browser session, the CSRF
        # check reads request.POST, which parses the multipart body there and then.
        if request.method == "POST":
            handler = StoreUploadHandler(default_store(), request._request)
            request._request.upload_handlers = [handler]
        super().initial(request, *args, **kwargs)

    @extend_schema(request={"multipart/form-data": UploadSerializer},
                   responses={201: VersionUploadSerializer, 200: VersionUploadSerializer})
    def post(self, request, name):
        """Upload a version (multipart field `file`; optional `metadata`, `metrics` and `lineage`,
        each a JSON object)."""
        _check_uploadable(request, name)
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidRequest("multipart field 'file' is missing", field="file")
        with background.unsent_tasks() as unsent:
            version, created = services.version_upload(
                model_name=name, blob=upload.blob, actor=actor(request), filename=upload.name,
                **_descriptive(request.data.get),
            )
        return _upload_response(version, created, unsent)


class VersionRawUploadView(DiscardsRefusedUpload, APIView):
    parser_classes = [FileUploadParser]

    @extend_schema(
        request={"application/octet-stream": bytes},
        parameters=[OpenApiParameter("filename", str),
                    *(OpenApiParameter(f, str, description=f"JSON object (or header X-Model-"
                                       f"{f.title()})") for f in ("metadata", "metrics",
                                                                   "lineage"))],
        responses={201: VersionUploadSerializer, 200: VersionUploadSerializer},
    )
    def put(self, request, name, filename: str | None = None):
        """Upload a version as the raw request body (curl --upload-file). `curl -T model.onnx
        …/versions/upload/` appends the file's name to the URL: that name is the filename.
        `metadata`, `metrics`, `lineage`: query parameters, or headers X-Model-Metadata,
        X-Model-Metrics, X-Model-Lineage."""
        _check_uploadable(request, name)
        writer = received_writer(request._request) or \
            default_store().writer().read_from(request._request.read)
        blob = writer.finish()
        remember_blob(request._request, blob)
        with background.unsent_tasks() as unsent:
            version, created = services.version_upload(
                model_name=name, blob=blob, actor=actor(request),
                filename=filename or request.query_params.get("filename", ""),
                **_descriptive(lambda f: request.query_params.get(f)
                               or request.headers.get(f"X-Model-{f.title()}")),
            )
        return _upload_response(version, created, unsent)


class VersionDetailView(APIView):
    @extend_schema(responses=VersionSerializer)
    def get(self, request, name, number):
        return Response(VersionSerializer(selectors.version_get(name, number)).data)

    @extend_schema(request=VersionConfigSerializer, responses=VersionSerializer,
                   parameters=[WAIT])
    def patch(self, request, name, number):
        """Change serving settings (batching, instances, threads) and the descriptive metrics
        and lineage (merged: null removes a key); every other field is immutable. With
        `?wait=`, a change of serving settings answers once every live replica reloaded it."""
        seconds = wait_seconds(request)  # a bad ?wait= is refused before anything changes
        if not isinstance(request.data, dict):
            raise InvalidRequest("the body must be a JSON object of serving settings, metrics "
                                 "or lineage")
        allowed = set(VersionConfigSerializer().fields)
        immutable = set(request.data) - allowed
        if immutable:
            raise InvalidRequest(f"{', '.join(sorted(immutable))}: a version is immutable; only "
                                 f"serving settings, metrics and lineage "
                                 f"({', '.join(sorted(allowed))}) can change",
                                 field=sorted(immutable)[0])
        data = valid(VersionConfigSerializer, request.data)
        described = {k: data.pop(k) for k in DESCRIPTIVE_FIELDS if k in data}
        with transaction.atomic():  # both changes, or neither
            if described:
                services.version_describe(model_name=name, number=number, actor=actor(request),
                                          **described)
            if data or not described:
                services.version_configure(model_name=name, number=number,
                                           actor=actor(request), **data)
        body = VersionSerializer(selectors.version_get(name, number)).data
        if seconds is not None and (data or not described):
            body["convergence"] = wait_for_revision(current_revision(), seconds)
        return Response(body)

    @extend_schema(parameters=[REASON], responses={204: None})
    def delete(self, request, name, number):
        """Delete a version nothing holds (engineer+); 409 naming what holds it: a role on its
        endpoint, a pipeline step, an alias, a job, a validation. Its blob goes with the next
        garbage collection unless another version shares it."""
        services.version_delete(model_name=name, number=number, actor=actor(request),
                                reason=request.query_params.get("reason", ""))
        return Response(status=status.HTTP_204_NO_CONTENT)


class VersionApproveView(APIView):
    @extend_schema(request=ApprovalCommentSerializer, responses=VersionSerializer)
    def post(self, request, name, number):
        """Approve a version for promotion (an engineer or admin other than its uploader)."""
        data = valid(ApprovalCommentSerializer, request.data)
        services.version_approve(model_name=name, number=number, actor=actor(request), **data)
        return Response(VersionSerializer(selectors.version_get(name, number)).data)


class VersionRejectView(APIView):
    @extend_schema(request=ApprovalCommentSerializer, responses=VersionSerializer)
    def post(self, request, name, number):
        """Reject a version (a comment saying why is required; not its uploader)."""
        data = valid(ApprovalCommentSerializer, request.data)
        services.version_reject(model_name=name, number=number, actor=actor(request), **data)
        return Response(VersionSerializer(selectors.version_get(name, number)).data)


class VersionConvertView(APIView):
    @extend_schema(request=None, responses={201: VersionUploadSerializer,
                                            200: VersionUploadSerializer, **errors(413, 422)})
    def post(self, request, name, number):
        """Convert a version too new for the installed onnxruntime (IR version or opset) to the
        highest it loads, as the next version, proven equivalent on generated inputs (lineage
        and tolerance in its `metadata`); 422 with the reason when it cannot be converted."""
        with background.unsent_tasks() as unsent:
            version, created = version_convert(model_name=name, number=number,
                                               actor=actor(request))
        return _upload_response(version, created, unsent)


class VersionArtifactView(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def get(self, request, name, number):
        version = selectors.version_get(name, number)
        response = FileResponse(default_store().open(version.sha256), as_attachment=True,
                                filename=f"{name}-v{number}.onnx",
                                content_type="application/octet-stream")
        response["X-Checksum-Sha256"] = version.sha256
        response["Content-Length"] = version.size_bytes  # an object store's stream has no size
        return response


class AliasListView(APIView):
    @extend_schema(responses=AliasSerializer(many=True))
    def get(self, request, name):
        aliases = selectors.alias_list(selectors.model_get(name))
        return Response(AliasSerializer(aliases, many=True).data)


class AliasDetailView(APIView):
    @extend_schema(request=AliasSetSerializer, responses=AliasSerializer)
    def put(self, request, name, alias):
        data = valid(AliasSetSerializer, request.data)
        obj = services.alias_set(model_name=name, alias=alias, version_number=data["version"],
                                 actor=actor(request))
        return Response(AliasSerializer(obj).data)

    @extend_schema(responses={204: None})
    def delete(self, request, name, alias):
        services.alias_remove(model_name=name, alias=alias, actor=actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


def endpoint_response(name: str, request, revision: int | None = None) -> Response:
    model = selectors.model_get(name)
    endpoint = selectors.endpoint_get(model) or Endpoint(model=model)
    used = selectors.quota_usage(name, []) if endpoint.daily_quota else {}
    body = EndpointSerializer(endpoint, context={
        "used": used, "cold_starts": selectors.cold_starts(name)}).data
    seconds = wait_seconds(request)
    if seconds is not None and revision is not None:
        body["convergence"] = wait_for_revision(revision, seconds)
    return Response(body)


class EndpointView(APIView):
    @extend_schema(responses=EndpointSerializer)
    def get(self, request, name):
        return endpoint_response(name, request)


class EndpointDeployView(APIView):
    @extend_schema(request=DeploySerializer, responses=EndpointSerializer, parameters=[WAIT])
    def post(self, request, name):
        """Make a ready version the stable one (version null: stop serving)."""
        data = valid(DeploySerializer, request.data)
        ep = services.endpoint_deploy(model_name=name, version_number=data["version"],
                                      actor=actor(request), reason=data["reason"])
        return endpoint_response(name, request, ep.revision)


class EndpointLimitsView(APIView):
    @extend_schema(request=LimitsSetSerializer, responses=EndpointSerializer, parameters=[WAIT])
    def put(self, request, name):
        """Set the endpoint's rate limit (per replica) and daily quota (cluster-wide); limits
        left out keep their values, 0 removes one."""
        data = valid(LimitsSetSerializer, request.data)
        reason = data.pop("reason")
        services.limits_set(model_name=name, actor=actor(request), reason=reason, **data)
        return endpoint_response(name, request, current_revision())


class EndpointScaleToZeroView(APIView):
    @extend_schema(request=ScaleToZeroSetSerializer, responses=EndpointSerializer,
                   parameters=[WAIT])
    def put(self, request, name):
        """Set after how many idle seconds replicas unload the endpoint's versions (0: never);
        the next request then waits for the load (a cold start)."""
        data = valid(ScaleToZeroSetSerializer, request.data)
        services.scale_to_zero_set(model_name=name, actor=actor(request),
                                   seconds=data["after_seconds"], reason=data["reason"])
        return endpoint_response(name, request, current_revision())


class ApiKeyListView(APIView):
    @extend_schema(responses=ApiKeySerializer(many=True))
    def get(self, request, name):
        ep = selectors.endpoint_get(selectors.model_get(name))
        keys = list(ep.api_keys.all()) if ep else []
        used = selectors.quota_usage(name, [k.prefix for k in keys if k.daily_quota]) \
            if any(k.daily_quota for k in keys) else {}
        return Response(ApiKeySerializer(keys, many=True, context={"used": used}).data)

    @extend_schema(request=NameSerializer, responses={201: ApiKeyCreatedSerializer})
    def post(self, request, name):
        data = valid(NameSerializer, request.data)
        key, raw = services.api_key_create(model_name=name, name=data["name"],
                                           actor=actor(request))
        return Response({**ApiKeySerializer(key).data, "key": raw},
                        status=status.HTTP_201_CREATED)


class ApiKeyDetailView(APIView):
    @extend_schema(responses={200: ApiKeyRevokedSerializer})
    def delete(self, request, name, prefix):
        """Revoke a key. The endpoint stays protected: revoking its last key refuses every
        call (401) until a key is created or the endpoint is opened (POST .../endpoint/open/);
        the answer says which."""
        revoked = services.api_key_revoke(model_name=name, prefix=prefix, actor=actor(request))
        return Response({**ApiKeyRevokedSerializer(revoked).data, "detail": revoked.detail})


class ApiKeyLimitsView(APIView):
    @extend_schema(request=LimitsSetSerializer, responses=ApiKeySerializer)
    def put(self, request, name, prefix):
        """Set one active key's rate limit (per replica) and daily quota (cluster-wide);
        limits left out keep their values, 0 removes one."""
        data = valid(LimitsSetSerializer, request.data)
        reason = data.pop("reason")
        key = services.limits_set(model_name=name, key_prefix=prefix, actor=actor(request),
                                  reason=reason, **data)
        used = selectors.quota_usage(name, [prefix]) if key.daily_quota else {}
        return Response(ApiKeySerializer(key, context={"used": used}).data)


class AuditReaders(RolePermission):
    """Global admins read every event, a team's admins that team's."""

    def has_permission(self, request, view) -> bool:
        if not super().has_permission(request, view):
            return False
        if not selectors.may_read_audit(request.user):
            self.message = "reading the audit log needs the admin role (global, or in a team)"
            return False
        return True


class AuditListView(generics.ListAPIView):
    permission_classes = [AuditReaders]
    serializer_class = AuditEventSerializer
    filterset_class = AuditFilterSet

    def get_queryset(self):
        return selectors.audit_list(self.request.user)


class ReplicaListView(APIView):
    @extend_schema(responses=ReplicaListSerializer)
    def get(self, request):
        """Live and lost replicas; a lost one stays listed until removed or forgotten."""
        revision = current_revision()
        rows = [{"replica": r.replica, "state": r.state, "lost_since": r.lost_since,
                 "revision": r.revision, "converged": r.revision >= revision,
                 "behind_since": r.behind_since,
                 "versions": selectors.visible_replica_versions(r.versions, request.user),
                 "degraded": r.degraded, "address": r.address, "started_at": r.started_at,
                 "last_seen": r.last_seen}
                for r in selectors.replicas(include_lost=True)]
        live = [r for r in rows if r["state"] == "live"]
        return Response(ReplicaListSerializer({
            "revision": revision, "replicas": rows, "converged": sum(r["converged"] for r in live),
            "live": len(live), "lost": len(rows) - len(live)}).data)


class ReplicaDetailView(APIView):
    @extend_schema(parameters=[OpenApiParameter("reason", str)], responses={204: None})
    def delete(self, request, replica):
        """Remove a lost replica (engineer+); a live one is refused with 409."""
        replica_remove(name=replica, actor=actor(request),
                       reason=request.query_params.get("reason", ""))
        return Response(status=status.HTTP_204_NO_CONTENT)


JSON_ONLY = [JSONParser]
for _view in (ModelListView, ModelDetailView, ModelArchiveView, VersionDetailView,
              VersionApproveView, VersionRejectView, VersionConvertView, AliasDetailView,
              EndpointDeployView, ApiKeyListView, EndpointLimitsView, ApiKeyLimitsView):
    _view.parser_classes = JSON_ONLY
