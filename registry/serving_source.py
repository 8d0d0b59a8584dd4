"""The registry as a serving replica's DesiredStateSource: reads desired routing in one consistent
snapshot, stores heartbeats, and delivers revision notifications (Redis pub/sub when clustered,
in-process when embedded). Runs on the reconciler's thread, never on the request path."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed

from registry.api.authentication import ApiTokenAuthentication
from registry.api.permissions import READ_ONLY_REFUSAL
from registry.audit import Actor
from registry.errors import RegistryError
from registry.integrations.tensorrt import BUILT
from registry.models import Endpoint, EndpointApiKey, ModelVersion, VersionStatus
from registry.notify import current_revision, listen_redis, subscribe_in_process
from registry.roles import has_role
from registry.routing import Routing
from registry.services import analysis_watch, endpoint_deploy
from registry.services.loadtests import versions_under_test
from registry.services.pipelines import batch_size
from registry.services.replicas import heartbeat_store, replica_leave
from registry.store.artifacts import ArtifactUnavailable, default_store
from serving.core.capture import CAPTURE_OFF, CaptureFile, CaptureSettings
from serving.core.desired_state import (
    BatchingConfig,
    DesiredState,
    ModelRoute,
    ObservedState,
    VersionSpec,
)
from serving.core.errors import Conflict, Forbidden, InvalidInput, ModelNotFound, Unauthorized
from serving.core.pipeline_graph import PipelineGraph
from serving.core.rate_limits import NO_LIMITS, Limits, PredictKey
from serving.core.reconciler import LoadFailed

log = logging.getLogger(__name__)


def _spec(version: ModelVersion, root, steps: dict | None = None) -> VersionSpec:
    if version.pipeline is not None:
        return _pipeline_spec(version, root, steps or {})
    return VersionSpec(
        model=version.model.name, version=str(version.number),
        artifact_path=str(root.cached_path(version.sha256)), sha256=version.sha256,
        signature=version.signature,
        batching=BatchingConfig(
            max_batch_size=version.max_batch_size,
            preferred_batch_sizes=tuple(version.preferred_batch_sizes or ()),
            max_queue_delay_us=version.max_queue_delay_us,
            max_queue_size=version.max_queue_size, instance_count=version.instance_count),
        intra_op_threads=version.intra_op_threads,
        graph_optimization_level=version.graph_optimization_level,
        trt_precision=served_precision(version), trt_cache_root=str(settings.TRT_CACHE_DIR),
        max_output_bytes=version.max_output_bytes, response_cache=version.response_cache,
    )


def _pipeline_spec(version: ModelVersion, root, steps: dict) -> VersionSpec:
    """A pipeline version: its graph, and the rows a request may carry as its steps' batching
    allows now (a step's max_batch_size can change after the pipeline was made)."""
    graph = PipelineGraph.from_json(version.pipeline)
    found = [steps.get(key) for key in sorted(graph.step_keys)]
    max_batch = batch_size(version.signature, found) if all(found) else 0
    return VersionSpec(
        model=version.model.name, version=str(version.number),
        artifact_path=str(root.cached_path(version.sha256)), sha256=version.sha256,
        signature=version.signature, batching=BatchingConfig(max_batch_size=max_batch),
        max_output_bytes=version.max_output_bytes, pipeline=graph)


def _steps_of(versions) -> dict[tuple[str, str], ModelVersion]:
    """The ready step versions of every pipeline among `versions`, by (model, number)."""
    wanted = {(s["model"], s["version"]) for v in versions if v.pipeline
              for s in v.pipeline["steps"]}
    if not wanted:
        return {}
    match = Q()
    for model, number in wanted:
        match |= Q(model__name=model, number=number)
    return {(v.model.name, str(v.number)): v for v in ModelVersion.objects.select_related("model")
            .filter(match, status=VersionStatus.READY)}


def served_precision(version: ModelVersion) -> str:
    """The precision of the version's most recently built TensorRT engine (fp32 if none): a
    replica with TensorRT then loads that engine from the shared cache instead of building."""
    builds = (version.validation_report or {}).get("tensorrt") or {}
    built = [(e.get("finished_at") or "", p) for p, e in builds.items()
             if isinstance(e, dict) and e.get("status") == BUILT]
    return max(built)[1] if built else "fp32"


def build_desired_state() -> DesiredState:
    """All endpoints that serve something, and the specs of every version they reference."""
    store = default_store()
    now = timezone.now()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        revision = current_revision()
        endpoints = list(Endpoint.objects.select_related("model"))
        keys: dict[int, dict[str, PredictKey]] = {}
        for key in EndpointApiKey.objects.filter(revoked_at__isnull=True).only(
                "endpoint_id", "key_hash", "prefix", "rate_limit_rps", "rate_limit_burst",
                "daily_quota"):
            keys.setdefault(key.endpoint_id, {})[key.key_hash] = PredictKey(key.prefix,
                                                                            key.limits)
        under_test = versions_under_test()
        routings = {ep.pk: _with_tests(Routing.of(ep, now=now), under_test.get(ep.model_id))
                    for ep in endpoints}
        wanted = set().union(*(r.referenced() for r in routings.values()))
        versions = {v.pk: v for v in ModelVersion.objects.select_related("model").filter(
            pk__in=wanted, status=VersionStatus.READY)}
        steps = _steps_of(versions.values())
    routes, specs, idle = {}, {}, {}
    for ep in endpoints:
        ready = routings[ep.pk].map(versions.get)  # a version not (or no longer) ready drops out
        route = model_route(ep.model.name, ready, keys.get(ep.pk, {}),
                            keys_required=settings.REQUIRE_PREDICT_KEYS or ep.protected,
                            limits=ep.limits,
                            scale_to_zero_after_s=ep.scale_to_zero_after_seconds,
                            capture=capture_settings(ep))
        if not route.versions():
            idle[route.model] = route  # serves nothing, yet its keys and limits bind its steps
            continue
        routes[route.model] = route
        for version in ready.referenced():
            spec = _spec(version, store, steps)
            specs[spec.key] = spec
            for key in sorted(spec.pipeline.step_keys) if spec.pipeline else ():
                # a step no longer ready is left out: the replica holds the pipeline back
                if key in steps and key not in specs:
                    specs[key] = _spec(steps[key], store)
    # A pipeline's step whose model's endpoint serves nothing itself: its keys and limits
    # still apply to calls through the pipeline (DesiredState.step_routes).
    step_routes = {model: idle[model] for model, _ in specs if model in idle}
    return DesiredState(revision=revision, routes=routes, versions=specs,
                        step_routes=step_routes)


def _with_tests(routing: Routing[int], testing: set[int] | None) -> Routing[int]:
    """A version under load test joins the warm ones: loaded everywhere, pinned traffic only."""
    extra = tuple(sorted((testing or set()) - routing.referenced()))
    return replace(routing, warm=routing.warm + extra) if extra else routing


def model_route(model: str, routing: Routing[ModelVersion], keys: dict[str, PredictKey], *,
                keys_required: bool = False, limits: Limits = NO_LIMITS,
                scale_to_zero_after_s: float = 0,
                capture: CaptureSettings = CAPTURE_OFF) -> ModelRoute:
    """The data plane's route for one model: the one place registry routing meets serving's.
    `keys`: the active predict keys by hash, each with its label (prefix) and limits."""
    ref = routing.map(lambda v: str(v.number))
    analysis = ref.rollout.analysis
    mirror = (analysis.plan.mirror_percent
              if ref.candidate and analysis is not None and not analysis.paused else 0)
    return ModelRoute(
        model=model, stable=ref.stable, candidate=ref.candidate,
        candidate_weight=ref.candidate_weight if ref.candidate else 0,
        blue=ref.blue, green=ref.green, live_color=ref.live_color or None, shadow=ref.shadow,
        warm=ref.warm, mirror_percent=mirror, api_key_hashes=frozenset(keys),
        keys_required=keys_required,
        limits=limits, keys=dict(keys), scale_to_zero_after_s=scale_to_zero_after_s,
        capture=capture)


def capture_settings(endpoint) -> CaptureSettings:
    """An endpoint's capture columns as its route carries them to replicas."""
    return CaptureSettings(percent=float(endpoint.capture_percent), mode=endpoint.capture_mode,
                           max_bytes=endpoint.capture_max_bytes)


class RegistrySource:
    """DesiredStateSource backed by the registry database (see serving/core/desired_state.py)."""

    def __init__(self, *, address: str = ""):
        self.address = address or socket.gethostname()
        self.started_at = timezone.now()
        self._stop = threading.Event()

    def revision(self) -> int:
        close_old_connections()
        # A replica that reads the registry notices a silent canary analysis too (at most once
        # per tick interval, never raising): a candidate nobody judges drops to 0 %.
        analysis_watch.watch()
        try:
            return current_revision()
        except Exception:
            connection.close()  # a broken connection must not stick after the database returns
            raise

    def fetch(self) -> DesiredState:
        close_old_connections()
        try:
            return build_desired_state()
        except Exception:
            connection.close()
            raise

    def report(self, observed: ObservedState) -> None:
        close_old_connections()
        try:
            heartbeat_store(observed, address=self.address, started_at=self.started_at)
        except Exception:
            connection.close()
            raise

    def fetch_artifact(self, spec: VersionSpec) -> None:
        """Make sure the version's blob is at `spec.artifact_path` before it loads: from an
        object store, fetched into this host's cache and checked against its sha256. Missing
        or wrong bytes fail the version; the store not answering is retried by the caller."""
        try:
            default_store().local_path(spec.sha256)
        except ArtifactUnavailable as exc:
            raise LoadFailed(str(exc)) from None

    def store_capture(self, file: CaptureFile) -> None:
        """A capture file straight into the artifact store (this replica has the registry's
        settings); called on the capture queue's flusher thread, never on a request."""
        from registry.monitoring.capture_store import store_file
        store_file(file, writer=f"{self.address}-{os.getpid()}")

    def leave(self, replica: str) -> None:
        """A graceful shutdown: drop this replica's heartbeat, so it is not shown as lost."""
        close_old_connections()
        try:
            replica_leave(replica)
        except Exception:
            connection.close()
            raise

    def subscribe(self, callback: Callable[[int], None]) -> None:
        if not settings.REDIS_URL:
            subscribe_in_process(callback)
            return
        threading.Thread(target=listen_redis, args=(callback, self._stop),
                         name="mmc-routes-sub", daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    # Model-repository extension: load/unload act through the registry, audited and authorised.
    def request_load(self, model: str, authorization: str | None = None) -> None:
        actor = self._authorise(authorization)
        latest = (ModelVersion.objects.filter(model__name=model, status=VersionStatus.READY)
                  .order_by("-number").values_list("number", flat=True).first())
        if latest is None:
            raise ModelNotFound(f"model {model!r} has no ready version to load")
        with serving_errors():
            endpoint_deploy(model_name=model, version_number=latest, actor=actor,
                            reason="repository load request")

    def request_unload(self, model: str, authorization: str | None = None) -> None:
        actor = self._authorise(authorization)
        with serving_errors():
            endpoint_deploy(model_name=model, version_number=None, actor=actor,
                            reason="repository unload request")

    def authorize_operator(self, authorization: str | None, what: str) -> None:
        """Log and trace settings: an engineer's API token that may write, as load/unload."""
        self._authorise(authorization, what)

    def _authorise(self, authorization: str | None,
                   what: str = "repository load/unload") -> Actor:
        """A registry API token with the engineer role, as for the REST API."""
        close_old_connections()
        parts = (authorization or "").split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            raise Unauthorized(f"{what} needs 'Authorization: Bearer <API token>'")
        try:
            user, token = ApiTokenAuthentication().authenticate_credentials(parts[1].encode())
        except AuthenticationFailed:
            raise Unauthorized("invalid or expired API token") from None
        if token.read_only:
            raise Forbidden(READ_ONLY_REFUSAL)
        if not has_role(user, "engineer"):
            raise Forbidden(f"{what} needs the engineer role")
        return Actor(user=user, name=user.get_username(), request_id="",
                     client_address=f"serving:{os.getpid()}")


#: How a registry refusal reads on the data plane.
_AS_SERVING = {404: ModelNotFound, 409: Conflict, 403: Forbidden}


@contextmanager
def serving_errors():
    """Registry errors raised inside become the data plane's typed errors, status kept."""
    try:
        yield
    except RegistryError as exc:
        raise _AS_SERVING.get(exc.status, InvalidInput)(exc.message) from None
