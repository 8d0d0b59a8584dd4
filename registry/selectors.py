"""Reads. Views and the serving source call these; none of them writes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Count, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from registry import roles
from registry.choices import ApprovalState
from registry.errors import LifecycleError, NotFound
from registry.models import (
    Alias,
    ApiToken,
    AuditEvent,
    ConfigSearch,
    Dataset,
    Endpoint,
    EndpointApiKey,
    Job,
    ModelVersion,
    RegisteredModel,
    ReplicaCredential,
    ReplicaHeartbeat,
    Team,
    VersionStatus,
)
from serving.core.desired_state import SCALED_TO_ZERO
from serving.core.rate_limits import PROCESS_STORE, quota_key, quota_store, utc_day

log = logging.getLogger(__name__)


def model_list() -> QuerySet[RegisteredModel]:
    """Models with their version count and latest version/status, via per-row correlated
    subqueries: the database evaluates them only for the rows of the page it returns, where a
    GROUP BY over every version costs ~150 ms at 1,000 models x 20 versions."""
    versions = ModelVersion.objects.filter(model=OuterRef("pk")).order_by()
    latest = versions.order_by("-number")
    count = versions.values("model").annotate(n=Count("pk")).values("n")[:1]
    return (RegisteredModel.objects
            .select_related("owner", "team", "endpoint__stable", "endpoint__candidate")
            .annotate(version_count=Coalesce(Subquery(count), 0),
                      latest_version=Subquery(latest.values("number")[:1]),
                      latest_status=Subquery(latest.values("status")[:1]))
            .order_by("name"))


def model_get(name: str) -> RegisteredModel:
    model = model_list().filter(name=name).first()
    if model is None:
        raise NotFound(f"model {name!r} does not exist", field="model")
    return model


def version_list(model: RegisteredModel) -> QuerySet[ModelVersion]:
    return (model.versions.select_related("created_by", "model")
            .prefetch_related(Prefetch("aliases", queryset=Alias.objects.only("name", "version")),
                              "approval_decisions"))


def version_get(model_name: str, number: int) -> ModelVersion:
    version = (ModelVersion.objects.select_related("model", "created_by")
               .filter(model__name=model_name, number=number).first())
    if version is None:
        model_get(model_name)
        raise NotFound(f"model {model_name!r} has no version {number}", field="version")
    return version


def ready_versions(model: RegisteredModel, numbers: list[int], *,
                   field: str = "version") -> list[ModelVersion]:
    """Versions `numbers` of `model`, in that order, each of which must exist (else NotFound)
    and be ready (else LifecycleError): the one check before a version is deployed, rolled out,
    run as a job, built with TensorRT or exported. `field` names the request field in errors."""
    found = {v.number: v for v in model.versions.filter(number__in=numbers)}
    for number in numbers:
        if number not in found:
            raise NotFound(f"model {model.name!r} has no version {number}", field=field)
    for number in numbers:
        version = found[number]
        if version.status != VersionStatus.READY:
            raise LifecycleError(
                f"version {number} of {model.name!r} is {version.status}, not ready"
                + (f": {version.failure_reason}" if version.failure_reason else ""), field=field)
    return [found[number] for number in numbers]


def ready_version(model: RegisteredModel, number: int, *, field: str = "version") -> ModelVersion:
    """Version `number` of `model`, which must exist and be ready (see ready_versions)."""
    return ready_versions(model, [number], field=field)[0]


@dataclass(frozen=True)
class TrafficRefusal:
    """Why a version may not take traffic, worded after "version 2 of 'fraud' ...": `why` is its
    own state ("is rejected") or, for a pipeline, a step's; `state` is that state alone."""

    why: str
    state: str
    rule: str  # "ready" | "requires_approval"
    hint: str = ""


def _own_refusal(version: ModelVersion) -> TrafficRefusal | None:
    if version.status != VersionStatus.READY:
        return TrafficRefusal(f"is {version.status}, not ready", version.status, "ready",
                              version.failure_reason or "")
    model = version.model
    if not model.requires_approval or version.approval == ApprovalState.APPROVED:
        return None
    if version.approval == ApprovalState.REJECTED:
        return TrafficRefusal("is rejected", "rejected", "requires_approval")
    return TrafficRefusal(f"is {version.approval} approval", version.approval,
                          "requires_approval", f"model {model.name!r} requires approval before "
                          f"promotion; approve it first")


def _step_versions(versions: list[ModelVersion]) -> dict[tuple[str, int], ModelVersion]:
    """The step versions of every pipeline among `versions`, in one query."""
    pairs = {(s["model"], s["version"]) for v in versions if v.pipeline
             for s in v.pipeline.get("steps", [])}
    if not pairs:
        return {}
    match = Q()
    for model_name, number in pairs:
        match |= Q(model__name=model_name, number=number)
    return {(v.model.name, v.number): v
            for v in ModelVersion.objects.select_related("model").filter(match)}


def traffic_refusal(version: ModelVersion, *,
                    steps: dict[tuple[str, int], ModelVersion] | None = None
                    ) -> TrafficRefusal | None:
    """The one rule for taking traffic (stable, a candidate's weight, a blue-green slot, shadow,
    the production alias, a pipeline step): the version is ready and, where its model requires
    approval, approved; a pipeline, and each of its steps too. None: it may."""
    own = _own_refusal(version)
    if own is not None or not version.pipeline:
        return own
    steps = _step_versions([version]) if steps is None else steps
    for step in version.pipeline.get("steps", []):
        found = steps.get((step["model"], step["version"]))
        label = f"step {step['name']!r} on version {step['version']} of {step['model']!r}"
        if found is None:
            return TrafficRefusal(f"runs {label}, which does not exist", "missing", "ready")
        refused = _own_refusal(found)
        if refused is not None:
            return replace(refused, why=f"runs {label}, which {refused.why}")
    return None


def traffic_versions(model: RegisteredModel) -> list[ModelVersion]:
    """The model's versions that may take traffic (traffic_refusal), newest first: what every
    routing picker offers, and what a refused routing change names as the choices."""
    versions = list(model.versions.filter(status=VersionStatus.READY).order_by("-number"))
    for v in versions:
        v.model = model
    steps = _step_versions(versions)
    return [v for v in versions if traffic_refusal(v, steps=steps) is None]


def alias_list(model: RegisteredModel) -> QuerySet[Alias]:
    return model.aliases.select_related("version")


def endpoint_get(model: RegisteredModel) -> Endpoint | None:
    return (Endpoint.objects.select_related("stable", "candidate", "blue", "green", "shadow")
            .filter(model=model).first())


@dataclass(frozen=True)
class EndpointAccess:
    """Who may call an endpoint's /infer: its active predict keys, whether the endpoint is
    protected, and whether this installation requires a key everywhere
    (MMC_REQUIRE_PREDICT_KEYS); and the endpoint's limits with today's use (each key carries its
    own as `used_today`; None: the count store did not answer)."""

    keys: list[EndpointApiKey]
    required: bool
    endpoint: Endpoint | None = None
    used_today: int | None = None

    @property
    def protected(self) -> bool:
        return (bool(self.keys) or self.required
                or bool(self.endpoint is not None and self.endpoint.protected))

    @property
    def refusing_all(self) -> bool:
        """Protected with no key: every inference is refused (401)."""
        return self.protected and not self.keys

    @property
    def may_open(self) -> bool:
        """Whether "open" is offered: protected by its own setting, no keys left."""
        return (not self.required and not self.keys and self.endpoint is not None
                and self.endpoint.protected)


def endpoint_access(endpoint: Endpoint | None) -> EndpointAccess:
    keys = [] if endpoint is None else list(
        endpoint.api_keys.filter(revoked_at__isnull=True).select_related("created_by")
        .order_by("-created_at", "-id"))
    quotas = [k.prefix for k in keys if k.daily_quota]
    used = (quota_usage(endpoint.model.name, quotas)
            if endpoint is not None and (quotas or endpoint.daily_quota) else {})
    for key in keys:
        key.used_today = used.get(key.prefix)
    return EndpointAccess(keys=keys, required=settings.REQUIRE_PREDICT_KEYS, endpoint=endpoint,
                          used_today=used.get(None))


#: How long a page waits for Redis to say today's counts before showing them as unknown.
USAGE_TIMEOUT_SECONDS = 0.5


def quota_usage(model_name: str, key_prefixes: list[str]) -> dict[str | None, int]:
    """Requests counted today (UTC) against the daily quotas of the endpoint (None) and of each
    key, as replicas count them: in Redis when clustered, in this process when embedded. Counts
    start when a quota is set; empty when the store does not answer."""
    day = utc_day(timezone.now().timestamp())
    names = {quota_key(model_name, p, day): p for p in [None, *key_prefixes]}
    store = quota_store(settings.QUOTA_REDIS_URL, timeout=USAGE_TIMEOUT_SECONDS)
    try:
        counts = store.read(list(names))
    except Exception as exc:  # noqa: BLE001 - a page without today's counts, not a 500
        log.warning("cannot read today's quota counts: %s: %s", type(exc).__name__, exc)
        return {}
    finally:
        if store is not PROCESS_STORE:
            store.close()
    return {names[k]: v for k, v in counts.items()}


def token_list(*, user=None) -> QuerySet[ApiToken]:
    """Every API token (an admin's view), or only `user`'s; newest first."""
    tokens = ApiToken.objects.select_related("user").order_by("-created")
    return tokens if user is None else tokens.filter(user=user)


def replica_credentials() -> QuerySet:
    """Every replica credential, revoked ones too (their digests never leave the database)."""
    return ReplicaCredential.objects.defer("digest").order_by("name")


def user_list() -> QuerySet:
    """Users with their groups (for the role) and how many API tokens each holds."""
    return (get_user_model().objects.prefetch_related("groups")
            .annotate(token_count=Count("auth_token_set", distinct=True))
            .order_by("username"))


def user_get(username: str):
    user = user_list().filter(username=username).first()
    if user is None:
        raise NotFound(f"no user {username!r}", field="username")
    return user


def audit_list(user=None) -> QuerySet[AuditEvent]:
    """Audit events: all of them for a global admin (or no user: the system); for a team admin,
    those about the models and the teams where they are admin."""
    events = AuditEvent.objects.all()
    teams = None if user is None else roles.teams_where(user, "admin")
    if teams is None:
        return events
    names = RegisteredModel.objects.filter(team_id__in=teams).values_list("name", flat=True)
    team_names = Team.objects.filter(pk__in=teams).values_list("name", flat=True)
    return events.filter(Q(model_name__in=names) & ~Q(model_name="")
                         | Q(target_type="team", target__in=team_names))


def may_read_audit(user) -> bool:
    """A global admin, or an admin of a team (who reads that team's part)."""
    teams = roles.teams_where(user, "admin")
    return teams is None or bool(teams)


def team_list(user) -> list[Team]:
    """The teams the user holds a role in (every team for a global admin), each with
    `model_count` and `member_count`."""
    ids = roles.teams_where(user)
    rows = Team.objects.all() if ids is None else Team.objects.filter(pk__in=ids)
    return list(rows.annotate(model_count=Count("models", distinct=True),
                              member_count=Count("memberships", distinct=True))
                .order_by("name"))


def my_teams(user) -> list[dict]:
    """[{"team", "role"}] for each team the user holds a role in (every team for an admin)."""
    held = roles.team_roles(user)
    if roles.is_admin(user):
        return [{"team": t.name, "role": "admin"} for t in Team.objects.all()]
    names = dict(Team.objects.filter(pk__in=held).values_list("pk", "name"))
    return sorted(({"team": names[t], "role": r} for t, r in held.items() if t in names),
                  key=lambda row: row["team"])


def visible_replica_versions(versions: dict, user) -> dict:
    """A replica's {"model:version": …} report without the models the user may not see."""
    names = roles.visible_model_names(user)
    if names is None:
        return versions
    return {k: v for k, v in versions.items() if k.rpartition(":")[0] in names}


def replicas(*, include_lost: bool = False) -> list[ReplicaHeartbeat]:
    """Live replicas (a heartbeat within REPLICA_STALE_SECONDS); with include_lost also the lost
    ones, which stay until removed, gone gracefully or forgotten (see ReplicaHeartbeat)."""
    qs = ReplicaHeartbeat.objects.all()
    if not include_lost:
        qs = qs.filter(last_seen__gte=_lost_cutoff())
    return list(qs)


@dataclass(frozen=True)
class CacheCounts:
    """A version's response-cache hits and misses, summed over the live replicas that load it
    (each counts since it loaded the version)."""

    hits: int = 0
    misses: int = 0
    replicas: int = 0

    @property
    def hit_ratio(self) -> float | None:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else None


def version_cache_counts(version: ModelVersion) -> CacheCounts:
    """Response-cache hits and misses of `version`, from the live replicas' last heartbeats."""
    key = f"{version.model.name}:{version.number}"
    hits = misses = count = 0
    for replica in replicas():
        stats = ((replica.versions or {}).get(key) or {}).get("stats") or {}
        if "cache_hits" in stats:
            hits += int(stats["cache_hits"])
            misses += int(stats.get("cache_misses", 0))
            count += 1
    return CacheCounts(hits=hits, misses=misses, replicas=count)


def replica_states() -> list[ReplicaHeartbeat]:
    """Every replica, live or lost, without the versions it reports (large, and not needed to
    say whether it is live and which revision it has applied)."""
    return list(ReplicaHeartbeat.objects.defer("versions"))


#: The version columns of an endpoint that `endpoint_routes` reads.
_ROUTED = ("stable", "candidate", "blue", "green", "shadow")


def endpoint_routes() -> list[Endpoint]:
    """Every endpoint with its model's name and its routed versions' number and queue size, in
    one query (no version's signature or report)."""
    return list(Endpoint.objects.select_related("model", *_ROUTED).only(
        "revision", "candidate_weight", "live_color", "warm_versions", "warm_until",
        "rollout_state", "model__name",
        *(f"{slot}__{field}" for slot in _ROUTED for field in ("number", "max_queue_size")),
    ).order_by("model__name"))


def lost_replicas() -> list[ReplicaHeartbeat]:
    return list(ReplicaHeartbeat.objects.filter(last_seen__lt=_lost_cutoff()))


def _lost_cutoff():
    return timezone.now() - timedelta(seconds=settings.REPLICA_STALE_SECONDS)


def job_list(*, kind: str = "", status: str = "", model: str = "", user=None) -> QuerySet[Job]:
    """Jobs, newest first, narrowed by kind, status and model name (blank = any), and to the
    models of the teams where `user` (when given) is an engineer: jobs are engineers' work."""
    qs = Job.objects.select_related("version__model", "created_by", "dataset")
    if user is not None:
        qs = roles.visible_by_model(qs, user, "version__model", "engineer")
    if kind:
        qs = qs.filter(kind=kind)
    if status:
        qs = qs.filter(status=status)
    if model:
        qs = qs.filter(version__model__name=model)
    return qs


def dataset_list(user=None) -> QuerySet[Dataset]:
    """Datasets: every one for a global admin (or the system); else the user's own uploads and
    those that jobs of their teams' models (where they are engineers) read."""
    qs = Dataset.objects.select_related("created_by")
    teams = None if user is None else roles.teams_where(user, "engineer")
    if teams is None:
        return qs
    return qs.filter(Q(created_by=user) | Q(jobs__version__model__team_id__in=teams)).distinct()


def job_get(job_id, user=None) -> Job:
    job = job_list(user=user).filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"job {job_id} does not exist", field="job")
    return job


def loadtest_runs(version: ModelVersion, *, limit: int = 10) -> list[Job]:
    """The version's latest load tests, newest first (any status: a failed one says why)."""
    return list(Job.objects.select_related("created_by").filter(
        version=version, kind="loadtest").order_by("-created_at")[:limit])


def config_search_list(version: ModelVersion) -> QuerySet[ConfigSearch]:
    """The version's serving-config searches, newest first."""
    return (ConfigSearch.objects.select_related("version__model", "created_by")
            .filter(version=version).order_by("-created_at", "-id"))


def loadtest_latest_per_version(model: RegisteredModel, *, exclude: ModelVersion | None = None
                                ) -> list[Job]:
    """Each other version's latest succeeded load test, for comparing versions."""
    qs = (Job.objects.select_related("version").filter(
        version__model=model, kind="loadtest", status="succeeded")
        .order_by("version__number", "-created_at"))
    if exclude is not None:
        qs = qs.exclude(version=exclude)
    latest: dict[int, Job] = {}
    for job in qs[:500]:
        latest.setdefault(job.version.number, job)
    return list(latest.values())


@dataclass(frozen=True)
class ColdStarts:
    """Scale to zero of one version, from the live replicas' heartbeats: cold starts counted
    (all replicas), the latest one's seconds and end, and the replicas it is scaled to zero on."""

    version: int
    count: int
    last_seconds: float | None
    last_at: datetime | None
    scaled_to_zero_on: list[str]


def cold_starts(model_name: str) -> list[ColdStarts]:
    """Per version of the model that a live replica reports, newest version first."""
    prefix = f"{model_name}:"
    seen: dict[int, dict] = {}
    for r in replicas():
        for key, state in (r.versions or {}).items():
            if not key.startswith(prefix) or not key[len(prefix):].isdigit():
                continue
            row = seen.setdefault(int(key[len(prefix):]), {"count": 0, "last": None, "at": None,
                                                           "asleep": []})
            stats = state.get("stats") or {}
            row["count"] += stats.get("cold_starts") or 0
            at = stats.get("cold_start_at")
            if at and (row["at"] is None or at > row["at"]):
                row["at"], row["last"] = at, stats.get("cold_start_last_s")
            if state.get("state") == SCALED_TO_ZERO:
                row["asleep"].append(r.replica)
    return [ColdStarts(version=v, count=row["count"], last_seconds=row["last"],
                       last_at=datetime.fromtimestamp(row["at"], tz=UTC) if row["at"] else None,
                       scaled_to_zero_on=sorted(row["asleep"]))
            for v, row in sorted(seen.items(), reverse=True)]
