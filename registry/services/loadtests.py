"""Load tests of a version: checked (bounds, the live-traffic rule, a live replica with a URL, a
predict key where the endpoint wants one), audited and queued as a "loadtest" job in one
transaction; registry.jobs.loadtest runs it. A version no slot references is loaded by the
replicas (pinned only, like a warm version) while its test is queued or running."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from registry import selectors
from registry.audit import Actor, record
from registry.errors import InvalidRequest, LifecycleError, NotFound
from registry.jobs.housekeeping import enqueue_job
from registry.models import (
    ConfigSearch,
    Endpoint,
    Job,
    JobKind,
    JobStatus,
    ModelVersion,
    ReplicaHeartbeat,
)
from registry.notify import bump_revision
from serving.core.desired_state import SCALED_TO_ZERO
from serving.process.replica_address import replica_url

ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)


def live_traffic_roles(version: ModelVersion) -> list[str]:
    """What real (unpinned) traffic this version takes: stable, candidate or the live colour."""
    ep = Endpoint.objects.filter(model_id=version.model_id).first()
    if ep is None:
        return []
    roles = [name for name, pk in (("stable", ep.stable_id), ("candidate", ep.candidate_id))
             if pk == version.pk]
    if ep.live_color and getattr(ep, f"{ep.live_color}_id") == version.pk:
        roles.append(f"live ({ep.live_color})")
    return roles


def _has_url(replica: ReplicaHeartbeat) -> bool:
    return bool(replica_url(replica.address))


def _runs(replica: ReplicaHeartbeat, version: ModelVersion) -> bool:
    state = (replica.versions or {}).get(f"{version.model.name}:{version.number}") or {}
    return state.get("state") in ("READY", SCALED_TO_ZERO)  # scaled to zero: a request wakes it


def require_key_if_protected(model, key: str, *, used_for: str) -> None:
    """A protected endpoint's generated requests need one of its predict keys (`key`)."""
    if selectors.endpoint_access(selectors.endpoint_get(model)).protected and not key:
        raise InvalidRequest(f"{model.name}'s endpoint requires a predict key: pass one as "
                             f"`key` (it is used for {used_for} only and never stored)",
                             field="key")


def target_replica(version: ModelVersion, name: str = "") -> tuple[ReplicaHeartbeat, bool]:
    """The live replica to load, and whether it must load the version first: the one named,
    else the first (embedded first) that runs the version and advertises a URL
    (MMC_REPLICA_ADDRESS: a URL, or a bare host:port or IP read as http://), else the first
    with a URL (it loads the version for the test)."""
    live = selectors.replicas()
    if name:
        replica = next((r for r in live if r.replica == name), None)
        if replica is None:
            raise NotFound(f"replica {name!r} is not live", field="replica")
        candidates = [replica]
    else:
        candidates = sorted(live, key=lambda r: (r.address != "embedded" and r.replica
                                                 != "embedded", r.replica))
        if not candidates:
            raise LifecycleError("no replica is live: start one (or the embedded server) first",
                                 field="replica")
    for replica in candidates:
        if _runs(replica, version) and _has_url(replica):
            return replica, False
    for replica in candidates:
        if _has_url(replica):
            return replica, True
    replica = candidates[0]
    raise LifecycleError(
        f"replica {replica.replica!r} advertises no URL (address {replica.address!r}): "
        f"`manage.py start` and `mmc-serve` advertise where they listen; a server started "
        f"otherwise needs MMC_REPLICA_ADDRESS=http://host:port (a bare host:port or IP is "
        f"read as http://)", field="replica")


def versions_under_test() -> dict[int, set[int]]:
    """Model id -> ids of versions a queued or running load test (or serving-config search) has
    replicas load (pinned only, no traffic) though no slot references them; serving_source adds
    them as warm."""
    under: dict[int, set[int]] = {}
    rows = [*(Job.objects.filter(kind=JobKind.LOADTEST, status__in=ACTIVE,
                                 params__load_first=True)
              .values_list("version__model_id", "version_id")),
            *(ConfigSearch.objects.filter(status__in=ACTIVE, load_first=True)
              .values_list("version__model_id", "version_id"))]
    for model_id, version_id in rows:
        under.setdefault(model_id, set()).add(version_id)
    return under


def _bounds(requests: int | None, seconds: int | None, concurrency: int) -> None:
    if (requests is None) == (seconds is None):
        raise InvalidRequest("give either requests or seconds", field="requests")
    if requests is not None and not 1 <= requests <= settings.LOADTEST_MAX_REQUESTS:
        raise InvalidRequest(f"requests must be from 1 to {settings.LOADTEST_MAX_REQUESTS}",
                             field="requests")
    if seconds is not None and not 1 <= seconds <= settings.LOADTEST_MAX_SECONDS:
        raise InvalidRequest(f"seconds must be from 1 to {settings.LOADTEST_MAX_SECONDS} "
                             f"(MMC_LOADTEST_MAX_SECONDS)", field="seconds")
    if not 1 <= concurrency <= settings.LOADTEST_MAX_CONCURRENCY:
        raise InvalidRequest(f"concurrency must be from 1 to "
                             f"{settings.LOADTEST_MAX_CONCURRENCY} (MMC_LOADTEST_MAX_CONCURRENCY)",
                             field="concurrency")


def loadtest_create(*, model_name: str, number: int, actor: Actor, concurrency: int = 1,
                    requests: int | None = None, seconds: int | None = None, replica: str = "",
                    confirm: bool = False, key: str = "") -> Job:
    """Queue a load test of version `number` on a replica. A version taking real traffic is
    refused unless `confirm`; a protected endpoint's key goes only into the task arguments."""
    _bounds(requests, seconds, concurrency)
    model = selectors.model_get(model_name)
    version = selectors.ready_version(model, number)
    roles = live_traffic_roles(version)
    if roles and not confirm:
        raise LifecycleError(
            f"v{number} takes real traffic ({', '.join(roles)} of {model_name}): a load test "
            f"would slow its users down; send confirm=true to run it anyway", field="confirm",
            details={"rule": "live-traffic", "roles": roles})
    search = ConfigSearch.objects.filter(version=version, status__in=ACTIVE).first()
    if search is not None:
        raise LifecycleError(f"config search {search.pk} of v{number} is {search.status}: the "
                             f"two would measure each other; wait for it", field="version")
    require_key_if_protected(model, key, used_for="this run")
    target, load_first = target_replica(version, replica)
    params = {"requests": requests, "seconds": seconds, "concurrency": concurrency,
              "replica": target.replica, "url": replica_url(target.address),
              "confirmed": bool(roles), "key_required": bool(key), "load_first": load_first}
    with transaction.atomic():
        if load_first:  # replicas load it (pinned only) while the test is queued or running
            bump_revision()
        job = Job.objects.create(kind=JobKind.LOADTEST, version=version, rows_total=requests,
                                 created_by=actor.user, params=params)
        record(actor, "job.create", target_type="job", target=str(job.pk),
               model_name=model_name,
               after={"kind": job.kind, "version": number, **params,
                      "live_roles": roles})
        enqueue_job(job.pk, key=key or None)
    return job
