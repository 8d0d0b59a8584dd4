from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from registry.choices import ApprovalState, GraphOptimizationLevel
from registry.models import (
    Alias,
    ApiToken,
    ApprovalDecision,
    AuditEvent,
    EndpointApiKey,
    ModelVersion,
    RegisteredModel,
)


def _number(version):
    return version.number if version is not None else None


def username(source: str) -> serializers.CharField:
    """The name of the user at `source` (owner, created_by); null for a system actor."""
    return serializers.CharField(source=f"{source}.username", default=None, read_only=True,
                                 allow_null=True)


class ErrorSerializer(serializers.Serializer):
    """What every error under /api/ answers (registry/api/errors.py)."""

    error = serializers.CharField(help_text="what was wrong")
    field = serializers.CharField(required=False, help_text="which field (when one was)")
    fields = serializers.DictField(child=serializers.JSONField(), required=False,
                                   help_text="each invalid field's messages")
    details = serializers.JSONField(required=False, help_text="more, e.g. the refusing state")


class ModelSerializer(serializers.ModelSerializer):
    owner = username("owner")
    team = serializers.CharField(source="team.name", read_only=True,
                                 help_text="the team that owns the model")
    version_count = serializers.IntegerField(read_only=True, default=0)
    latest_version = serializers.IntegerField(read_only=True, default=None, allow_null=True)
    stable_version = serializers.SerializerMethodField()
    candidate_version = serializers.SerializerMethodField()
    candidate_weight = serializers.SerializerMethodField()

    class Meta:
        model = RegisteredModel
        fields = ["name", "description", "tags", "owner", "team", "archived",
                  "requires_approval", "created_at", "updated_at", "version_count",
                  "latest_version",
                  "stable_version", "candidate_version", "candidate_weight"]

    def _endpoint(self, obj):
        try:
            return obj.endpoint
        except RegisteredModel.endpoint.RelatedObjectDoesNotExist:
            return None

    def get_stable_version(self, obj) -> int | None:
        ep = self._endpoint(obj)
        return _number(ep.stable) if ep else None

    def get_candidate_version(self, obj) -> int | None:
        ep = self._endpoint(obj)
        return _number(ep.candidate) if ep else None

    def get_candidate_weight(self, obj) -> int:
        ep = self._endpoint(obj)
        return ep.candidate_weight if ep and ep.candidate_id else 0


class ModelCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    team = serializers.CharField(max_length=64, required=False, allow_null=True, default=None,
                                 help_text=(
        "the team that will own it; left out: the team 'default' where you are an engineer "
        "there, else your only team where you are one"))
    description = serializers.CharField(required=False, allow_blank=True, default="")
    tags = serializers.ListField(child=serializers.CharField(), required=False, default=list)


class ModelUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(required=False, allow_blank=True)
    tags = serializers.ListField(child=serializers.CharField(), required=False)
    requires_approval = serializers.BooleanField(required=False, help_text=(
        "promotion (deploy, canary, blue-green, the production alias) takes approved versions "
        "only"))


class ArchiveSerializer(serializers.Serializer):
    archived = serializers.BooleanField(default=True)
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class ApprovalDecisionSerializer(serializers.ModelSerializer):
    decided_by = serializers.CharField(source="decided_by_name", read_only=True)

    class Meta:
        model = ApprovalDecision
        fields = ["decision", "comment", "decided_by", "decided_at"]


class LineageSerializer(serializers.Serializer):
    run_url = serializers.CharField(required=False, help_text="the training run (http/https)")
    git_commit = serializers.CharField(required=False, help_text="7-64 hexadecimal digits")
    dataset = serializers.CharField(required=False, help_text="what it was trained on")


METRICS_HELP = ("evaluation metrics: name -> finite number, e.g. {\"auc\": 0.91}; lower is better "
                "for names ending in _ms/_us/_s/_seconds/_bytes or containing latency, loss, "
                "error, mse, mae, rmse, perplexity or wer, higher otherwise")


class VersionSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.name", read_only=True)
    metrics = serializers.DictField(child=serializers.FloatField(), read_only=True,
                                    help_text=METRICS_HELP)
    lineage = LineageSerializer(read_only=True)
    weights_sha256 = serializers.CharField(
        read_only=True, help_text="sha256 over the initializers (set by validation; empty "
        "until then): equal on two versions = same weights")
    created_by = username("created_by")
    pipeline = serializers.JSONField(read_only=True, allow_null=True, help_text=(
        "a pipeline version's spec (steps pinned to version numbers, edges); null for a model "
        "file"))
    aliases = serializers.SerializerMethodField()
    artifact_url = serializers.SerializerMethodField()
    approval = serializers.ChoiceField(choices=ApprovalState.choices, read_only=True,
                                       help_text=ApprovalState.help_lines())
    approvals = ApprovalDecisionSerializer(source="approval_decisions", many=True,
                                           read_only=True, help_text="decisions, newest first")

    class Meta:
        model = ModelVersion
        fields = ["model", "number", "status", "failure_reason", "sha256", "size_bytes", "format",
                  "original_filename", "signature", "metadata", "metrics", "lineage",
                  "weights_sha256", "validation_report",
                  "validation_attempts", "max_batch_size", "preferred_batch_sizes",
                  "max_queue_delay_us", "max_queue_size", "instance_count", "intra_op_threads",
                  "graph_optimization_level", "max_output_bytes", "pipeline", "response_cache",
                  "aliases",
                  "approval", "approvals", "created_by", "created_at", "artifact_url"]

    def get_aliases(self, obj) -> list[str]:
        return [a.name for a in obj.aliases.all()]

    def get_artifact_url(self, obj) -> str:
        return reverse("api:version-artifact", args=[obj.model.name, obj.number])


class VersionConfigSerializer(serializers.Serializer):
    """PATCH of a version: serving settings, and the descriptive metrics and lineage."""

    metrics = serializers.DictField(
        child=serializers.JSONField(allow_null=True), required=False,
        help_text="merged into the version's metrics; a metric set to null is removed. "
        + METRICS_HELP)
    lineage = serializers.DictField(
        child=serializers.JSONField(allow_null=True), required=False,
        help_text="merged into the lineage (run_url, git_commit, dataset); null removes one")
    max_batch_size = serializers.IntegerField(required=False)
    preferred_batch_sizes = serializers.ListField(child=serializers.IntegerField(), required=False)
    max_queue_delay_us = serializers.IntegerField(required=False)
    max_queue_size = serializers.IntegerField(required=False)
    instance_count = serializers.IntegerField(required=False)
    intra_op_threads = serializers.IntegerField(required=False)
    max_output_bytes = serializers.IntegerField(
        required=False, help_text="the most bytes of outputs one request may get; 0 = the "
        "replica's default (MMC_MAX_OUTPUT_BYTES)")
    response_cache = serializers.BooleanField(
        required=False, help_text="true: answer a request whose inputs this version answered "
        "before from the replica's response cache (MMC_RESPONSE_CACHE_BYTES), without running "
        "the model; false (the default): run every request")
    # A CharField, not a ChoiceField: the service judges the value and words the error.
    graph_optimization_level = serializers.CharField(
        required=False, help_text=GraphOptimizationLevel.help_lines())


class ApprovalCommentSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="",
                                    max_length=2000, help_text="required to reject")


class UploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="the .onnx file")
    metadata = serializers.JSONField(required=False, help_text="free-form JSON object")
    metrics = serializers.JSONField(required=False, help_text=METRICS_HELP)
    lineage = serializers.JSONField(required=False,
                                    help_text="JSON object: run_url, git_commit, dataset")


class AliasSerializer(serializers.ModelSerializer):
    version = serializers.IntegerField(source="version.number")

    class Meta:
        model = Alias
        fields = ["name", "version", "updated_at"]


class AliasSetSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1)


class DeploySerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1, allow_null=True)
    reason = serializers.CharField(required=False, allow_blank=True, default="")


def _version_number(slot: str) -> serializers.IntegerField:
    """The number of the version in an endpoint's slot (None when the slot is empty)."""
    return serializers.IntegerField(source=f"{slot}.number", read_only=True, allow_null=True)


class LaggardSerializer(serializers.Serializer):
    replica = serializers.CharField()
    revision = serializers.IntegerField(help_text="the route revision it last reported")
    state = serializers.ChoiceField(choices=["live", "lost"])
    reason = serializers.CharField(help_text="e.g. 'lost: no heartbeat since 12:03:04 UTC'")


class ConvergenceSerializer(serializers.Serializer):
    """registry.convergence.wait_for_revision: whether every replica applied `revision`. Lost
    replicas are not waited for, but named as laggards: they keep `converged` false."""

    revision = serializers.IntegerField()
    converged = serializers.BooleanField()
    laggards = LaggardSerializer(many=True)
    replicas = serializers.IntegerField(help_text="live replicas")
    lost = serializers.IntegerField(help_text="lost replicas (no heartbeat recently)")


class LimitsSerializer(serializers.Serializer):
    """An endpoint's or key's rate limit and daily quota (0: none), and today's count."""

    rps = serializers.FloatField(help_text="requests per second on each replica (token bucket); "
                                           "0: no rate limit")
    burst = serializers.IntegerField(help_text="bucket size: requests let through at once "
                                               "(0: ceil(rps))")
    daily_quota = serializers.IntegerField(help_text="requests per UTC day, counted across all "
                                                     "replicas; 0: no quota")
    used_today = serializers.IntegerField(read_only=True, allow_null=True, help_text=(
        "requests counted today (UTC) against the daily quota; null without a quota or when "
        "the count store does not answer"))


def limits_body(row, used: dict, label) -> dict:
    """`row`'s limits as LimitsSerializer says them, with today's count from `used`."""
    return {"rps": row.rate_limit_rps, "burst": row.rate_limit_burst,
            "daily_quota": row.daily_quota,
            "used_today": used.get(label) if row.daily_quota else None}


class LimitsSetSerializer(serializers.Serializer):
    """Limits to change; those left out keep their values (checked by the limits service)."""

    rps = serializers.FloatField(required=False, help_text="0 to 1000000; 0: no rate limit")
    burst = serializers.IntegerField(required=False, help_text="0 to 10000000; 0: ceil(rps)")
    daily_quota = serializers.IntegerField(required=False,
                                           help_text="0 to 10**12 a UTC day; 0: no quota")
    reason = serializers.CharField(required=False, allow_blank=True, default="",
                                   max_length=500)


class ColdStartSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    count = serializers.IntegerField(help_text="cold starts on the live replicas, in total")
    last_seconds = serializers.FloatField(allow_null=True, help_text=(
        "how long the latest cold start kept its first request waiting"))
    last_at = serializers.DateTimeField(allow_null=True, help_text="when it finished")
    scaled_to_zero_on = serializers.ListField(child=serializers.CharField(), help_text=(
        "live replicas that have the version unloaded right now"))


class ScaleToZeroSerializer(serializers.Serializer):
    """When an endpoint scales to zero, and its cold starts so far."""

    after_seconds = serializers.IntegerField(help_text=(
        "idle seconds after which replicas unload the endpoint's versions; 0: never"))
    cold_starts = ColdStartSerializer(many=True, help_text=(
        "per version, from the live replicas' heartbeats"))


class ScaleToZeroSetSerializer(serializers.Serializer):
    after_seconds = serializers.IntegerField(help_text=(
        "whole seconds, 1 to 604800 (a week); 0: never scale to zero"))
    reason = serializers.CharField(required=False, allow_blank=True, default="",
                                   max_length=500)


class EndpointSerializer(serializers.Serializer):
    """An endpoint's routing (registry.routing.Routing) with version numbers. A model that was
    never deployed answers the same shape, empty (an unsaved Endpoint: revision 0, no
    updated_at)."""

    model = serializers.CharField(source="model.name")
    state = serializers.SerializerMethodField()
    live = _version_number("live_version")
    stable = _version_number("stable")
    candidate = _version_number("candidate")
    candidate_weight = serializers.IntegerField()
    blue = _version_number("blue")
    green = _version_number("green")
    live_color = serializers.CharField()
    shadow = _version_number("shadow")
    revision = serializers.IntegerField()
    rollout = serializers.JSONField(source="rollout_state",
                                    help_text="automated analysis, blue-green, pending rollback")
    settings = serializers.JSONField(source="rollout_state",
                                     help_text="deprecated: the same as `rollout`")
    warm_versions = serializers.SerializerMethodField(
        help_text="versions kept loaded without traffic, for an instant way back")
    updated_at = serializers.DateTimeField(allow_null=True)
    convergence = ConvergenceSerializer(required=False, help_text=(
        "with ?wait on a change: whether every live replica applied it"))
    limits = serializers.SerializerMethodField()
    scale_to_zero = serializers.SerializerMethodField()
    protected = serializers.SerializerMethodField(help_text=(
        "every call to /infer needs one of the endpoint's predict keys (with none, every call "
        "is refused); set by protect or by creating a key, cleared only by open"))

    def get_protected(self, obj) -> bool:
        return obj.protected or settings.REQUIRE_PREDICT_KEYS

    @extend_schema_field(LimitsSerializer)
    def get_limits(self, obj) -> dict:
        return limits_body(obj, self.context.get("used", {}), None)

    @extend_schema_field(ScaleToZeroSerializer)
    def get_scale_to_zero(self, obj) -> dict:
        return ScaleToZeroSerializer({"after_seconds": obj.scale_to_zero_after_seconds,
                                      "cold_starts": self.context.get("cold_starts", [])}).data

    def get_state(self, obj) -> str:
        return obj.routing.state

    def get_warm_versions(self, obj) -> list[int]:
        if not obj.warm_versions:
            return []
        return sorted(ModelVersion.objects.filter(pk__in=obj.warm_versions)
                      .values_list("number", flat=True))


class ApiKeySerializer(serializers.ModelSerializer):
    limits = serializers.SerializerMethodField()

    class Meta:
        model = EndpointApiKey
        fields = ["name", "prefix", "created_at", "revoked_at", "limits"]

    @extend_schema_field(LimitsSerializer)
    def get_limits(self, obj) -> dict:
        return limits_body(obj, self.context.get("used", {}), obj.prefix)


class ApiKeyRevokedSerializer(serializers.Serializer):
    prefix = serializers.CharField()
    remaining_keys = serializers.IntegerField(help_text="the endpoint's active keys left")
    protected = serializers.BooleanField(help_text="the endpoint still needs a key on every call")
    refusing_all = serializers.BooleanField(help_text=(
        "the last key was revoked: every call is refused (401) until a key is created or the "
        "endpoint is opened"))
    detail = serializers.CharField()


class NameSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)


class TokenSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username")
    read_only = serializers.BooleanField(help_text="the token may only read (GET/HEAD/OPTIONS)")
    last_used_at = serializers.DateTimeField(allow_null=True, help_text=(
        "when it last authenticated a request (updated at most once a minute)"))

    class Meta:
        model = ApiToken
        fields = ["token_key", "name", "user", "created", "expiry", "read_only", "last_used_at"]


class TokenCreateSerializer(serializers.Serializer):
    user = serializers.CharField(required=False, help_text=(
        "admins only: whose token it is (default: the caller's own)"))
    name = serializers.CharField(max_length=100)
    expires_in_days = serializers.IntegerField(required=False, allow_null=True, default=90,
                                               max_value=36500)
    read_only = serializers.BooleanField(required=False, default=False, help_text=(
        "the token may only read, whatever its user's role"))


class UserSerializer(serializers.Serializer):
    username = serializers.CharField()
    email = serializers.CharField()
    role = serializers.CharField(allow_null=True, help_text="viewer, engineer or admin; null: none")
    is_active = serializers.BooleanField()
    is_superuser = serializers.BooleanField()
    date_joined = serializers.DateTimeField()
    last_login = serializers.DateTimeField(allow_null=True)
    token_count = serializers.IntegerField(help_text="API tokens the user holds")


class UserCreateSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    email = serializers.EmailField(required=False, allow_blank=True, default="")
    role = serializers.ChoiceField(choices=["viewer", "engineer", "admin"])
    password = serializers.CharField(required=False, allow_blank=True, default="",
                                     write_only=True, help_text=(
                                         "initial password; leave out to have one generated "
                                         "(returned once)"))


class UserCreatedSerializer(UserSerializer):
    password = serializers.CharField(allow_null=True, help_text=(
        "the generated password, shown once (null when one was given)"))


class UserUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=["viewer", "engineer", "admin"], required=False)
    is_active = serializers.BooleanField(required=False)


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor_name", "action", "target_type", "target",
                  "model_name", "before", "after", "reason", "request_id", "client_address"]


class VersionUploadSerializer(VersionSerializer):
    """An upload's answer: the version, and whether this upload created it."""

    created = serializers.BooleanField(help_text="false: the same bytes were already a version")
    detail = serializers.CharField(required=False, help_text=(
        "why nothing was created, or why validation waits (task queue unreachable)"))

    class Meta(VersionSerializer.Meta):
        fields = [*VersionSerializer.Meta.fields, "created", "detail"]


class TokenLoginSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False,
                                     style={"input_type": "password"})
    client = serializers.RegexField(
        r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,99}$", required=False, default="mmc-cli",
        help_text="the token's name, e.g. mmc-cli@<hostname> (letters, digits, . _ @ : -)")


class TeamRoleSerializer(serializers.Serializer):
    team = serializers.CharField()
    role = serializers.CharField(help_text="viewer, engineer, approver or admin")


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(allow_null=True, help_text="viewer, engineer or admin")
    teams = TeamRoleSerializer(many=True, help_text=(
        "your role in each team you belong to (a global viewer or engineer is one in the team "
        "'default'; a global admin is admin everywhere and listed in every team)"))
    token = TokenSerializer(allow_null=True, help_text=(
        "the API token this request was authenticated with (null for a browser session)"))


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="the key, shown once")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]


class TokenCreatedSerializer(TokenSerializer):
    token = serializers.CharField(read_only=True, help_text="the token, shown once")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]


class ReplicaSerializer(serializers.Serializer):
    replica = serializers.CharField()
    state = serializers.ChoiceField(choices=["live", "lost"], help_text=(
        "lost: no heartbeat for MMC_REPLICA_STALE_SECONDS; listed until removed (DELETE), "
        "shut down gracefully, or forgotten after MMC_REPLICA_FORGET_SECONDS"))
    lost_since = serializers.DateTimeField(allow_null=True, help_text="its last heartbeat, if lost")
    revision = serializers.IntegerField(help_text="the route revision it applied")
    converged = serializers.BooleanField(help_text="it applied the current revision")
    behind_since = serializers.DateTimeField(allow_null=True, help_text=(
        "since when it has been behind the current revision without a break"))
    versions = serializers.JSONField(help_text="loaded versions: state, providers, queue")
    degraded = serializers.CharField(help_text="why it is degraded; empty when it is not")
    address = serializers.CharField()
    started_at = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()


class ReplicaListSerializer(serializers.Serializer):
    revision = serializers.IntegerField(help_text="the current route revision")
    replicas = ReplicaSerializer(many=True)
    converged = serializers.IntegerField(help_text="how many live replicas applied it")
    live = serializers.IntegerField()
    lost = serializers.IntegerField()
