"""What the API answers, as small frozen dataclasses: the fields a script reads most, typed, and
`raw`, the whole payload as the server sent it (every field, including ones a newer server adds).
A field the answer lacks keeps its default, so an older or newer server never breaks a read.
Times are the server's ISO 8601 strings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Self

#: A version still being checked; any other status is final until someone acts.
PENDING_VERSION = ("uploaded", "validating")
#: A job that will not change any more.
FINISHED_JOB = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True, kw_only=True)
class Resource:
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    nested: ClassVar[dict[str, type[Resource]]] = {}

    @classmethod
    def of(cls, payload: Mapping[str, Any] | None) -> Self:
        """The resource for an answer's JSON object."""
        payload = dict(payload or {})
        values = {}
        for f in fields(cls):
            if f.name == "raw" or f.name not in payload:
                continue
            value = payload[f.name]
            kind = cls.nested.get(f.name)
            if kind and isinstance(value, list):
                value = [kind.of(v) if isinstance(v, Mapping) else v for v in value]
            elif kind and isinstance(value, Mapping):
                value = kind.of(value)
            values[f.name] = value
        return cls(raw=payload, **values)


@dataclass(frozen=True, kw_only=True)
class Model(Resource):
    name: str = ""
    description: str = ""
    tags: list[str] = field(default_factory=list)
    owner: str | None = None
    team: str = ""
    archived: bool = False
    requires_approval: bool = False
    version_count: int = 0
    latest_version: int | None = None
    stable_version: int | None = None
    candidate_version: int | None = None
    candidate_weight: int = 0
    created_at: str = ""
    updated_at: str = ""


@dataclass(frozen=True, kw_only=True)
class Version(Resource):
    model: str = ""
    number: int = 0
    status: str = ""  # uploaded, validating, ready, failed
    failure_reason: str = ""
    sha256: str = ""
    size_bytes: int = 0
    format: str = ""
    original_filename: str = ""
    signature: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    lineage: dict[str, str] = field(default_factory=dict)
    validation_report: dict[str, Any] = field(default_factory=dict)
    approval: str = ""
    aliases: list[str] = field(default_factory=list)
    pipeline: dict[str, Any] | None = None
    created_by: str | None = None
    created_at: str = ""
    artifact_url: str = ""
    created: bool | None = None  # an upload's answer: False when the same bytes were a version
    detail: str = ""  # an upload's answer: why nothing was created, or why validation waits

    @property
    def pending(self) -> bool:
        """Validation has not decided yet."""
        return self.status in PENDING_VERSION


@dataclass(frozen=True, kw_only=True)
class Alias(Resource):
    name: str = ""
    version: int = 0
    updated_at: str = ""


@dataclass(frozen=True, kw_only=True)
class Convergence(Resource):
    """Whether every live replica applied a change (lost replicas are named as laggards)."""

    revision: int = 0
    converged: bool = False
    laggards: list[dict[str, Any]] = field(default_factory=list)
    replicas: int = 0
    lost: int = 0


@dataclass(frozen=True, kw_only=True)
class Endpoint(Resource):
    nested = {"convergence": Convergence}

    model: str = ""
    state: str = ""
    live: int | None = None
    stable: int | None = None
    candidate: int | None = None
    candidate_weight: int = 0
    blue: int | None = None
    green: int | None = None
    live_color: str = ""
    shadow: int | None = None
    revision: int = 0
    rollout: dict[str, Any] = field(default_factory=dict)
    warm_versions: list[int] = field(default_factory=list)
    protected: bool = False
    limits: dict[str, Any] = field(default_factory=dict)
    scale_to_zero: dict[str, Any] = field(default_factory=dict)
    updated_at: str | None = None
    convergence: Convergence | None = None  # only after a change made with `wait=`

    @property
    def converged(self) -> bool:
        """Every live replica applied the change (True when nobody waited for it)."""
        return self.convergence is None or self.convergence.converged


@dataclass(frozen=True, kw_only=True)
class ShadowReport(Resource):
    model: str = ""
    shadow: int | None = None
    comparison: dict[str, Any] | None = None  # the newest shadow-vs-live comparison


@dataclass(frozen=True, kw_only=True)
class ApiKey(Resource):
    """An endpoint's predict key; `key` is the secret, in the answer that created it only."""

    name: str = ""
    prefix: str = ""
    created_at: str = ""
    revoked_at: str | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    # a revocation's answer:
    remaining_keys: int | None = None
    refusing_all: bool = False
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Token(Resource):
    """An API token; `token` is the secret, in the answer that created it only."""

    token_key: str = ""
    name: str = ""
    user: str = ""
    created: str | None = None
    expiry: str | None = None
    read_only: bool = False
    last_used_at: str | None = None
    token: str = ""


@dataclass(frozen=True, kw_only=True)
class Me(Resource):
    nested = {"token": Token}

    username: str = ""
    role: str | None = None
    teams: list[dict] = field(default_factory=list)  # [{"team", "role"}]
    token: Token | None = None


@dataclass(frozen=True, kw_only=True)
class TeamMember(Resource):
    username: str = ""
    role: str = ""  # viewer, engineer, approver, admin
    source: str = ""  # "sso": set from the identity provider's groups


@dataclass(frozen=True, kw_only=True)
class Team(Resource):
    nested = {"members": TeamMember}

    name: str = ""
    description: str = ""
    created_at: str = ""
    models: list[str] = field(default_factory=list)
    members: list[TeamMember] = field(default_factory=list)
    your_role: str | None = None


@dataclass(frozen=True, kw_only=True)
class User(Resource):
    username: str = ""
    email: str = ""
    role: str | None = None
    is_active: bool = True
    is_superuser: bool = False
    date_joined: str = ""
    last_login: str | None = None
    token_count: int = 0
    password: str | None = None  # generated on creation, shown once


@dataclass(frozen=True, kw_only=True)
class AuditEvent(Resource):
    id: int = 0
    created_at: str = ""
    actor_name: str = ""
    action: str = ""
    target_type: str = ""
    target: str = ""
    model_name: str = ""
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Dataset(Resource):
    id: str = ""
    filename: str = ""
    format: str = ""
    size_bytes: int = 0
    sha256: str = ""
    rows: int | None = None
    columns: Any = None
    created_at: str = ""
    expires_at: str | None = None
    expired: bool = False


@dataclass(frozen=True, kw_only=True)
class Job(Resource):
    id: str = ""
    kind: str = ""  # async, batch, loadtest
    status: str = ""  # queued, running, succeeded, failed, cancelled
    model: str = ""
    version: int = 0
    dataset: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    progress: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    failure_reason: str = ""
    result_url: str | None = None
    result_bytes: int | None = None
    status_url: str = ""
    created_at: str = ""
    finished_at: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_JOB


@dataclass(frozen=True, kw_only=True)
class Webhook(Resource):
    id: int = 0
    name: str = ""
    url: str = ""
    model: str | None = None  # None: every model
    events: list[str] = field(default_factory=list)  # empty: every event
    active: bool = True
    secret: str = ""  # the signing secret, in the answer that created it only


@dataclass(frozen=True, kw_only=True)
class WebhookDelivery(Resource):
    id: int = 0
    webhook: int = 0
    event: str = ""
    status: str = ""
    attempts: int = 0
    last_status_code: int | None = None
    last_error: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    attempt_log: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Plan(Resource):
    """What an mmc.yaml changes: planned, or done when `applied`. Each change is a dict:
    resource ("endpoint fraud"), action (create, update, delete), before, after, steps."""

    changes: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, int] = field(default_factory=dict)  # create, update, delete: counts
    detail: str = ""  # the outcome in words
    sha256: str = ""  # the file's
    prune: bool = False
    not_pruned: list[str] = field(default_factory=list)  # kept: prune was not asked for
    applied: bool = False
    source: str = ""
    audit_event: int | None = None  # the apply's

    @property
    def changed(self) -> bool:
        """Whether the file changes (or changed) anything."""
        return bool(self.changes)


@dataclass(frozen=True)
class Download:
    """A file written whole: a job's result, a version's artifact."""

    path: Path
    size_bytes: int
    headers: dict[str, str]  # the answer's, names in lower case


@dataclass(frozen=True)
class Export:
    """A Triton repository archive (`path`, one file) or KServe resources (`files` in the folder
    `path`), and the versions it holds."""

    path: Path
    versions: tuple[int, ...]
    files: tuple[Path, ...]
    size_bytes: int
