"""Registry data: models, immutable versions, aliases, endpoints (desired routing), replicas'
heartbeats (observed state), API tokens, the append-only audit log, jobs (async inference,
batch transforms) with their datasets, and serving-config searches."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from knox.models import AbstractAuthToken

from registry.choices import (  # re-exported here
    ApprovalState,
    GraphOptimizationLevel,
    TaskType,
    VersionStatus,
)
from registry.routing import RolloutState, Routing
from serving.core.rate_limits import Limits

SLUG = RegexValidator(
    r"^[a-z0-9][a-z0-9_.-]{0,99}$",
    "use 1-100 lowercase letters, digits, '-', '_' or '.', starting with a letter or digit",
)


class Team(models.Model):
    """Who owns models: a team's members hold a role in it (TeamMembership); its models are
    seen and changed only by its members and global admins (registry.roles)."""

    name = models.CharField(max_length=64, unique=True, validators=[SLUG])
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TeamMembership(models.Model):
    """One user's role in one team: viewer, engineer, approver or admin (registry.roles)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="team_memberships")
    role = models.CharField(max_length=16, choices=[(r, r) for r in
                                                    ("viewer", "engineer", "approver", "admin")])
    # "sso": set at sign-in from the identity provider's groups (MMC_OIDC_TEAM_MAP) and
    # replaced at each sign-in; "": set by an admin in the console or the API.
    source = models.CharField(max_length=8, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_role_per_team")]


def default_team_id() -> int:
    """The team models belong to unless another is named (created by migration 0027)."""
    return Team.objects.get_or_create(name=DEFAULT_TEAM)[0].pk


DEFAULT_TEAM = "default"


class RegisteredModel(models.Model):
    name = models.CharField(max_length=100, unique=True, validators=[SLUG])
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="models",
                             default=default_team_id)
    description = models.TextField(blank=True, default="")
    tags = models.JSONField(default=list, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="owned_models",
    )
    archived = models.BooleanField(default=False)
    # Promotion (deploy, canary, blue-green, the production alias) takes approved versions only.
    requires_approval = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """An immutable artifact plus what validation learned about it. Serving settings (batching,
    threads) change after upload (each change is a new route revision), and so do its
    descriptive fields, evaluation metrics and lineage (registry.evaluation says what is valid)."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    format = models.CharField(max_length=16, default="onnx")
    original_filename = models.CharField(max_length=255, blank=True, default="")
    signature = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # Evaluation metrics: name -> finite number (auc, accuracy, latency_p99_ms).
    metrics = models.JSONField(default=dict, blank=True)
    # Where it came from: run_url, git_commit, dataset (each optional).
    lineage = models.JSONField(default=dict, blank=True)
    # sha256 over the initializers (names, types, shapes, data), set by validation: two versions
    # with the same one carry the same weights even when the files differ. "" = not known.
    weights_sha256 = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=VersionStatus.choices, default=VersionStatus.UPLOADED
    )
    failure_reason = models.TextField(blank=True, default="")
    validation_report = models.JSONField(default=dict, blank=True)
    validation_started_at = models.DateTimeField(null=True, blank=True)
    # Renewed by the validating worker while it works: a stale one means the worker died.
    validation_heartbeat_at = models.DateTimeField(null=True, blank=True)
    validation_attempts = models.PositiveSmallIntegerField(default=0)
    # Serving configuration (Triton's names).
    max_batch_size = models.PositiveIntegerField(default=0)
    preferred_batch_sizes = models.JSONField(default=list, blank=True)
    max_queue_delay_us = models.PositiveIntegerField(default=0)
    max_queue_size = models.PositiveIntegerField(default=256, validators=[MinValueValidator(1)])
    instance_count = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(16)]
    )
    intra_op_threads = models.PositiveSmallIntegerField(default=0)
    graph_optimization_level = models.CharField(
        max_length=8, default=GraphOptimizationLevel.ALL, choices=GraphOptimizationLevel.choices,
    )
    # The most bytes of outputs one request may get (over it: a 400 naming it); 0 = the
    # replica's default (MMC_MAX_OUTPUT_BYTES).
    max_output_bytes = models.PositiveBigIntegerField(default=0)
    # A pipeline version (format "pipeline"): its resolved spec, steps pinned to version
    # numbers; the artifact holds the same JSON. Null for a model file.
    pipeline = models.JSONField(null=True, blank=True)
    # Answer a repeated request (same inputs) from the replica's response cache instead of
    # running the model (Triton's response_cache.enable); off unless the owner turns it on.
    response_cache = models.BooleanField(default=False)
    # The latest approval decision (history: ApprovalDecision); acted on only when the model
    # requires approval.
    approval = models.CharField(max_length=8, choices=ApprovalState.choices,
                                default=ApprovalState.PENDING)
    # What its answers are, for model quality; "" = inferred from the output signature
    # (registry/monitoring/quality.py task_of).
    task = models.CharField(max_length=10, choices=TaskType.choices, blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["model", "number"], name="version_number_unique"),
            models.UniqueConstraint(fields=["model", "sha256"], name="version_sha256_unique"),
        ]
        indexes = [models.Index(fields=["status"]), models.Index(fields=["sha256"])]

    def __str__(self) -> str:
        return f"{self.model.name}:{self.number}"


class ApprovalDecision(models.Model):
    """One approve or reject of a version, by an engineer or admin other than its uploader."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE,
                                related_name="approval_decisions")
    decision = models.CharField(max_length=8, choices=ApprovalState.choices)
    comment = models.TextField(blank=True, default="")
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    decided_by_name = models.CharField(max_length=150)
    decided_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-decided_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(decision__in=["approved", "rejected"]),
                                              name="approval_decision_valid")]


class Alias(models.Model):
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=64, validators=[SLUG])
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="aliases")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["model", "name"], name="alias_unique")]


class RateLimits(models.Model):
    """Requests per second (a token bucket on each replica), its burst, and a daily quota counted
    cluster-wide per UTC day; 0 means none. Set through registry.services.limits."""

    rate_limit_rps = models.FloatField(default=0)
    rate_limit_burst = models.PositiveIntegerField(default=0)  # 0: ceil(rps)
    daily_quota = models.PositiveBigIntegerField(default=0)

    class Meta:
        abstract = True

    @property
    def limits(self) -> Limits:
        return Limits(rps=self.rate_limit_rps, burst=self.rate_limit_burst,
                      daily_quota=self.daily_quota)


class Endpoint(RateLimits):
    """Desired routing for one model: stable, weighted candidate, blue/green slots, shadow."""

    model = models.OneToOneField(RegisteredModel, on_delete=models.CASCADE, related_name="endpoint")
    stable = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT,
                               related_name="+")
    candidate = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="+")
    candidate_weight = models.PositiveSmallIntegerField(default=0,
                                                        validators=[MaxValueValidator(100)])
    blue = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT,
                             related_name="+")
    green = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="+")
    live_color = models.CharField(max_length=5, blank=True, default="",
                                  choices=[("", "none"), ("blue", "blue"), ("green", "green")])
    shadow = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT,
                               related_name="+")
    # Versions kept loaded without traffic until `warm_until` (instant rollback / switch back).
    warm_versions = models.JSONField(default=list, blank=True)
    warm_until = models.DateTimeField(null=True, blank=True)
    # What the rollout remembers beyond the columns above: registry.routing.RolloutState.
    rollout_state = models.JSONField(default=dict, blank=True)
    revision = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)
    # Scale to zero: replicas unload the endpoint's versions after this many seconds without a
    # request and load them again on the next one (a cold start); 0 = always loaded.
    scale_to_zero_after_seconds = models.PositiveIntegerField(default=0)
    # Callers of /infer must show one of its active predict keys; with none, every call is
    # refused (401). Set by creating a key or by "protect", cleared only by "open" (audited):
    # revoking the last key never opens an endpoint.
    protected = models.BooleanField(default=False)
    # Data capture (registry.services.capture): the share of requests recorded (0: off),
    # which tensors, the most tensor bytes one record keeps, and how long records are kept.
    capture_percent = models.DecimalField(max_digits=6, decimal_places=3, default=0)
    capture_mode = models.CharField(max_length=7, default="both",
                                    choices=[("inputs", "inputs"), ("outputs", "outputs"),
                                             ("both", "both")])
    capture_max_bytes = models.PositiveIntegerField(default=65536)
    capture_retention_days = models.PositiveIntegerField(default=30)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(candidate_weight__lte=100), name="weight_le_100"),
            models.CheckConstraint(condition=Q(rate_limit_rps__gte=0),
                                   name="endpoint_rps_not_negative"),
        ]

    @property
    def routing(self) -> Routing[int]:
        """This endpoint's routing (version ids), read from its columns and rollout state."""
        return Routing.of(self)

    @property
    def rollout(self) -> RolloutState:
        return RolloutState.from_json(self.rollout_state)

    @rollout.setter
    def rollout(self, value: RolloutState) -> None:
        self.rollout_state = value.to_json()

    @property
    def live_version(self) -> ModelVersion | None:
        """The version taking unpinned traffic by default (blue-green's live slot, or stable)."""
        return getattr(self, self.live_color) if self.live_color else self.stable


class RouteRevision(models.Model):
    """A single row: the global route revision replicas poll. Bumped in the same transaction as
    every change that alters what serving should run."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    value = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)


class TickRecord(models.Model):
    """When a periodic task last finished, by task name: the automated canary analysis is
    watched through it (registry.services.analysis_watch), so a tick that stopped running
    (Celery beat or Redis down, the scheduler hung) is seen by every process that reads it."""

    name = models.CharField(max_length=100, primary_key=True)
    last_run_at = models.DateTimeField()


class EndpointApiKey(RateLimits):
    """A key applications send to /infer when the endpoint requires one; only its hash is kept."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=12)
    key_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(rate_limit_rps__gte=0),
                                              name="apikey_rps_not_negative")]


class ReplicaHeartbeat(models.Model):
    """Observed state of one serving replica, replaced on every heartbeat. The row outlives a
    replica that stops heartbeating (it is then "lost") until an operator removes it, the replica
    leaves gracefully, or MMC_REPLICA_FORGET_SECONDS pass."""

    replica = models.CharField(max_length=100, primary_key=True)
    revision = models.BigIntegerField(default=0)
    versions = models.JSONField(default=dict)
    degraded = models.CharField(max_length=200, blank=True, default="")
    address = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    # Since when its heartbeats have said it is behind the current route revision, without a
    # break; null while it is at the current revision. Converging turns degraded past a bound.
    behind_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["replica"]

    @property
    def lost(self) -> bool:
        """No heartbeat within REPLICA_STALE_SECONDS: killed, hung, or cut off."""
        silent = (timezone.now() - self.last_seen).total_seconds()
        return silent > settings.REPLICA_STALE_SECONDS

    @property
    def lost_since(self):
        """Its last heartbeat, when it is lost; None while it is live."""
        return self.last_seen if self.lost else None

    @property
    def state(self) -> str:
        return "lost" if self.lost else "live"


class ApiToken(AbstractAuthToken):
    """A named API token for CI (knox stores only its digest). A read-only token may only read,
    whatever its user's role; `last_used_at` is refreshed at most once a minute."""

    name = models.CharField(max_length=100, default="token")
    read_only = models.BooleanField(default=False)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]


class ReplicaCredential(models.Model):
    """A serving replica's credential: it may read the desired state, fetch the artifacts that
    state references and heartbeat, nothing else (not an API token: every API route refuses
    it). Created by an admin, shown once; only its sha256 is kept."""

    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]


class AuditEvent(models.Model):
    """Append-only record of a mutation, written in the transaction that made it."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                              on_delete=models.SET_NULL, related_name="+")
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=32)
    target = models.CharField(max_length=200)
    model_name = models.CharField(max_length=100, blank=True, default="", db_index=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    request_id = models.CharField(max_length=64, blank=True, default="")
    client_address = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("audit events are append-only")


class MetricSample(models.Model):
    """A replica's cumulative counters for one version at one time bucket (one row per bucket,
    overwritten by later heartbeats in the same bucket). Windows and charts are differences of
    samples, summed over replicas."""

    replica = models.CharField(max_length=100)
    model_name = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    bucket = models.BigIntegerField(help_text="unix seconds // METRICS_BUCKET_SECONDS")
    at = models.DateTimeField()
    count = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    latency_sum_s = models.FloatField(default=0)
    latency_buckets = models.JSONField(default=list)
    counting_since = models.DateTimeField(
        null=True, blank=True, help_text="when the replica's counters for this version started: "
                                         "the span of its first sample")
    shadow = models.JSONField(null=True, blank=True)
    # A candidate's answers compared with the stable's on a mirrored slice of its traffic
    # (cumulative counters, serving/core/mirror.py), read by the canary analysis.
    mirror = models.JSONField(null=True, blank=True)
    level = models.PositiveSmallIntegerField(
        default=0, help_text="history tier: 1 = last sample of its minute, 2 = of its 10 minutes "
                             "(registry/metrics_retention.py keeps each tier for its own time)")

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["replica", "model_name", "version", "bucket"], name="metric_sample_unique")]
        indexes = [models.Index(fields=["model_name", "version", "bucket"]),
                   models.Index(fields=["level", "bucket"], name="metric_sample_tier")]


class DatasetFormat(models.TextChoices):
    NPY = "npy"
    NPZ = "npz"
    JSONL = "jsonl"


class Dataset(models.Model):
    """An uploaded input file for batch transforms, kept under ARTIFACT_ROOT/jobs/datasets/.
    `columns` is what the header said (name -> dtype, row shape); JSON Lines has none."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    filename = models.CharField(max_length=255, blank=True, default="")
    format = models.CharField(max_length=8, choices=DatasetFormat.choices)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    rows = models.BigIntegerField(null=True, blank=True)
    columns = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    # The file goes DATASET_TTL after the last use; the row stays (jobs refer to it).
    expires_at = models.DateTimeField(null=True, blank=True)
    expired = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["expired", "expires_at"])]


class JobKind(models.TextChoices):
    ASYNC = "async"
    BATCH = "batch"
    LOADTEST = "loadtest", "Load test"


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: a job's or a config search's end states
FINISHED_JOB_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class Job(models.Model):
    """An async inference, a batch transform or a load test of one version. A worker holds it
    by a lease (`worker`, `heartbeat_at`); a lease not renewed in time means the worker died and
    the job is taken over, resuming from its finished chunks."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=8, choices=JobKind.choices)
    status = models.CharField(max_length=12, choices=JobStatus.choices,
                              default=JobStatus.QUEUED)
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="jobs")
    dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.PROTECT,
                                related_name="jobs")
    params = models.JSONField(default=dict, blank=True)
    input_bytes = models.BigIntegerField(default=0)
    failure_reason = models.TextField(blank=True, default="")
    # Lease and attempts.
    worker = models.CharField(max_length=200, blank=True, default="")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # Progress (batch: rows and chunks; load test: requests); rate over the current attempt.
    rows_total = models.BigIntegerField(null=True, blank=True)
    rows_done = models.BigIntegerField(default=0)
    chunks_total = models.PositiveIntegerField(null=True, blank=True)
    chunks_done = models.PositiveIntegerField(default=0)
    chunks_resumed = models.PositiveIntegerField(default=0)
    rows_per_second = models.FloatField(null=True, blank=True)
    # Result.
    result_name = models.CharField(max_length=100, blank=True, default="")
    result_bytes = models.BigIntegerField(null=True, blank=True)
    result_headers = models.JSONField(default=dict, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    expired = models.BooleanField(default=False)
    # A load test's measurements (req/s, p50/p95/p99 ms, errors by status): registry.jobs.loadtest.
    summary = models.JSONField(default=dict, blank=True)
    # Completion callback (signed with HMAC-SHA256; the secret is never shown again).
    callback_url = models.URLField(max_length=500, blank=True, default="")
    callback_secret = models.CharField(max_length=200, blank=True, default="")
    callback_status = models.CharField(max_length=300, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "heartbeat_at"]),
                   models.Index(fields=["expired", "expires_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["queued", "running", "succeeded", "failed", "cancelled"]),
                name="job_status_valid"),
            models.CheckConstraint(condition=~Q(kind="batch") | Q(dataset__isnull=False),
                                   name="batch_job_has_dataset"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} job {self.id}"

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_JOB_STATUSES


class ConfigSearch(models.Model):
    """A bounded sweep over one version's serving settings (what Triton's Model Analyzer does
    offline): each point of `grid`'s cross product is applied to the version in turn and
    measured with the load generator; the settings from before are put back at the end
    (registry.services.config_search)."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE,
                                related_name="config_searches")
    status = models.CharField(max_length=12, choices=JobStatus.choices,
                              default=JobStatus.QUEUED)
    # The settings searched, each a short list of values: {"max_batch_size": [0, 8], ...}.
    grid = models.JSONField(default=dict)
    concurrency = models.PositiveIntegerField()
    seconds = models.PositiveIntegerField()  # measured per point
    p99_budget_ms = models.FloatField()
    # Where it measures, decided when it was queued; the real traffic it was confirmed over.
    replica = models.CharField(max_length=100)
    url = models.CharField(max_length=300)
    load_first = models.BooleanField(default=False)
    key_required = models.BooleanField(default=False)
    live_roles = models.JSONField(default=list, blank=True)
    # The version's searchable settings before the search (put back after it), and the ones the
    # search has applied now: null while the version carries its own settings.
    original = models.JSONField(default=dict)
    trial = models.JSONField(null=True, blank=True)
    restore_note = models.CharField(max_length=300, blank=True, default="")
    # Points measured so far, in grid order: {"settings", "rps", "p50_ms", "p95_ms", "p99_ms",
    # "requests", "ok", "errors", "failure"}; the best under the budget; the one applied.
    points_total = models.PositiveIntegerField()
    points = models.JSONField(default=list, blank=True)
    progress = models.JSONField(default=dict, blank=True)  # the point at work: phase, requests
    best = models.PositiveIntegerField(null=True, blank=True)
    applied_point = models.PositiveIntegerField(null=True, blank=True)
    failure_reason = models.TextField(blank=True, default="")
    worker = models.CharField(max_length=200, blank=True, default="")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["queued", "running", "succeeded", "failed", "cancelled"]),
                name="config_search_status_valid"),
            # two searches of one version would undo each other's trial settings
            models.UniqueConstraint(fields=["version"],
                                    condition=Q(status__in=["queued", "running"]),
                                    name="one_active_config_search_per_version"),
        ]

    def __str__(self) -> str:
        return f"config search {self.pk}"

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_JOB_STATUSES

    @property
    def best_point(self) -> dict | None:
        return self.points[self.best] if self.best is not None else None


class WebhookSubscription(models.Model):
    """Where lifecycle events are POSTed: for one model, or for every model when `model` is
    empty. `events` empty means every event. The secret signs each body (HMAC-SHA256)."""

    name = models.CharField(max_length=100, blank=True, default="")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200)
    model = models.ForeignKey(RegisteredModel, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="webhooks")
    events = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} → {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class WebhookDelivery(models.Model):
    """One event sent to one subscription; `body` is the exact JSON signed and sent, so every
    retry carries the same bytes and signature."""

    subscription = models.ForeignKey(WebhookSubscription, on_delete=models.CASCADE,
                                     related_name="deliveries")
    event = models.CharField(max_length=64)
    audit_event = models.ForeignKey(AuditEvent, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    body = models.TextField()
    status = models.CharField(max_length=12, choices=DeliveryStatus.choices,
                              default=DeliveryStatus.PENDING)
    max_attempts = models.PositiveSmallIntegerField(default=5)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["subscription", "status"])]


class WebhookAttempt(models.Model):
    """One HTTP try of a delivery: what the receiver answered, or why there was no answer."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE,
                                 related_name="attempt_log")
    number = models.PositiveSmallIntegerField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    duration_ms = models.FloatField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"],
                                               name="webhook_attempt_unique")]


class FeedbackStatus(models.TextChoices):
    PENDING = "pending"   # not joined yet
    JOINED = "joined"     # its captured prediction was found
    UNKNOWN = "unknown"   # no captured prediction with its request id (tried again a while)


class Feedback(models.Model):
    """Ground truth for one answered request (by request id), joined with what the version that
    answered it said (registry/monitoring/feedback.py). The first label of a request id is kept;
    later posts of the same id only count as duplicates."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="feedback")
    request_id = models.CharField(max_length=128)
    label = models.JSONField()
    received_at = models.DateTimeField(default=timezone.now)
    duplicates = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=8, choices=FeedbackStatus.choices,
                              default=FeedbackStatus.PENDING)
    # From the captured record, once joined: who answered, when, and the answer's first output.
    version = models.PositiveIntegerField(null=True, blank=True)
    role = models.CharField(max_length=16, blank=True, default="")
    predicted_at = models.DateTimeField(null=True, blank=True)
    prediction = models.JSONField(null=True, blank=True)
    # Joined into a quality window that had already been computed: counted, and that window
    # is computed again on the next run.
    late = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "request_id"],
                                               name="feedback_request_unique")]
        indexes = [models.Index(fields=["model", "status"], name="feedback_status"),
                   models.Index(fields=["model", "version", "predicted_at"],
                                name="feedback_version_time")]


class QualityPoint(models.Model):
    """One version's model quality over one window of prediction time, from joined feedback."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE,
                              related_name="quality_points")
    version = models.PositiveIntegerField()
    window_start = models.DateTimeField()
    window_seconds = models.PositiveIntegerField()
    task = models.CharField(max_length=10, choices=TaskType.choices)
    count = models.PositiveIntegerField(default=0)
    metrics = models.JSONField(default=dict)  # accuracy/f1/auc or rmse/mae (None: undefined)
    late = models.PositiveIntegerField(default=0)
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["model", "version", "window_start"]
        constraints = [models.UniqueConstraint(fields=["model", "version", "window_start"],
                                               name="quality_point_unique")]


class Baseline(models.Model):
    """Statistics of a version's input features and outputs (registry.monitoring.stats), from an
    uploaded dataset or from captured traffic in a window; what drift compares recent traffic
    with. One per version: a new one replaces it."""

    version = models.OneToOneField(ModelVersion, on_delete=models.CASCADE, related_name="baseline")
    source = models.CharField(max_length=8, choices=[("dataset", "dataset"),
                                                     ("capture", "capture")])
    dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    rows = models.PositiveBigIntegerField(default=0)
    features = models.JSONField(default=dict)  # {"inputs": {feature: summary}, "outputs": {...}}
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)


class DriftSettings(models.Model):
    """An endpoint's drift thresholds (registry.services.drift: defaults and ranges)."""

    endpoint = models.OneToOneField(Endpoint, on_delete=models.CASCADE,
                                    related_name="drift_settings")
    psi_threshold = models.FloatField(default=0.2)
    p_value = models.FloatField(default=0.01)
    window_minutes = models.PositiveIntegerField(default=60)
    min_samples = models.PositiveIntegerField(default=200)


class DriftEpisode(models.Model):
    """A stretch of windows in which some feature of a version drifted; open while ended_at is
    null. Audited (and a monitor.drift webhook) once when it starts, once when it ends."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE,
                              related_name="drift_episodes")
    version = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    features = models.JSONField(default=list)

    class Meta:
        ordering = ["model", "version", "-started_at"]
        constraints = [models.UniqueConstraint(fields=["model", "version"],
                                               condition=Q(ended_at__isnull=True),
                                               name="one_open_drift_episode")]


class DriftPoint(models.Model):
    """One feature of one version compared with its baseline over the window ending at
    window_end: PSI on the baseline's bins and a two-sample test (KS or chi-square)."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE,
                              related_name="drift_points")
    version = models.PositiveIntegerField()
    feature = models.CharField(max_length=200)
    part = models.CharField(max_length=7, default="inputs")
    window_end = models.DateTimeField()
    psi = models.FloatField()
    statistic = models.FloatField()
    p_value = models.FloatField()
    n = models.PositiveIntegerField()
    drifted = models.BooleanField(default=False)

    class Meta:
        ordering = ["model", "version", "window_end", "feature"]
        indexes = [models.Index(fields=["model", "version", "window_end"],
                                name="drift_point_time")]
