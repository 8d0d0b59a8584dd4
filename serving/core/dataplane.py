"""The data plane: what the HTTP front (serving.http.app) and the gRPC front (serving.grpc.front)
adapt to.

It reads one immutable `RouteTable` reference per request, swapped whole by the reconciler, so a
request sees either the old table or the new one, never a mix. Nothing here knows HTTP framing,
Django or the database; errors are the typed ones from serving.core.errors.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
from dataclasses import dataclass, field
from time import monotonic, perf_counter_ns
from typing import Any

import numpy as np

from serving.core.batching import DynamicBatcher
from serving.core.capture import CaptureQueue, CaptureSettings, Ticket, new_request_id
from serving.core.desired_state import (
    DEFAULT_MAX_OUTPUT_BYTES,
    SCALED_TO_ZERO,
    DesiredStateSource,
    ModelRoute,
    VersionSpec,
    api_key_hash,
    repository_action_not_offered,
)
from serving.core.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    ReplicaStarting,
    ServerFault,
    ServingError,
    Unauthorized,
)
from serving.core.logs import REQUEST_ID
from serving.core.mirror import MirrorStats
from serving.core.mirror import picked as mirror_picked
from serving.core.operator_settings import OperatorSettings
from serving.core.pipeline_graph import PipelineGraph
from serving.core.rate_limits import Admission, RateLimited
from serving.core.response_cache import DEFAULT_RESPONSE_CACHE_BYTES, ResponseCache, request_key
from serving.core.runtime import OnnxRuntime
from serving.core.shared_memory import SharedMemoryRegistry, shared_memory_off, write_outputs
from serving.core.stats import VersionStats
from serving.core.tensor_signature import validate_inputs, validate_outputs
from serving.core.tensors import InferRequest, datatype_of, output_bytes
from serving.core.tracing import RequestTrace, Tracing

log = logging.getLogger(__name__)

SERVER_NAME = "mmc"
SERVER_VERSION = "0.1.0"
EXTENSIONS = [
    "binary_tensor_data", "classification", "statistics", "model_repository",
    "model_configuration", "sagemaker", "schedule_policy", "trace", "logging",
]
_TRITON_TYPES = {"BYTES": "STRING"}
_LOADS = itertools.count(1)  # tells two loads of the same version apart in cache keys


@dataclass(eq=False)
class LoadedVersion:
    """One warmed-up model version and its batcher; owned by the reconciler."""

    spec: VersionSpec
    runtime: OnnxRuntime
    batcher: DynamicBatcher
    stats: VersionStats
    max_batch_size: int  # effective: 0 unless every input has a dynamic first dimension

    def __post_init__(self) -> None:
        self.signature = self.spec.signature
        self.version = self.spec.version
        self.batched = self.max_batch_size > 0
        # what each transport computed once for this version (its answer's version header)
        self.transport_cache: dict[str, object] = {}
        # Response-cache identity: model, version, artifact and this load. A reload (new
        # settings, a replaced file) starts with no entries; an unload drops this one's.
        spec = self.spec
        self.cache_identity = "\0".join(
            (spec.model, spec.version, spec.sha256, str(next(_LOADS)))).encode()
        self.retired = False  # left the route table: no new cache entries


@dataclass
class ShadowStats:
    """How a shadow version's answers compare with the live ones, per model."""

    version: str
    requests: int = 0
    errors: int = 0
    latency_ns: int = 0
    compared_rows: int = 0
    argmax_agree: int = 0
    max_abs_diff: float = 0.0
    last_error: str | None = None

    def to_json(self) -> dict:
        return {
            "version": self.version, "requests": self.requests, "errors": self.errors,
            "mean_latency_us": (self.latency_ns / self.requests / 1000) if self.requests else None,
            "max_abs_diff": self.max_abs_diff,
            "argmax_agreement": (self.argmax_agree / self.compared_rows)
            if self.compared_rows else None,
            "compared_rows": self.compared_rows, "last_error": self.last_error,
        }


@dataclass(frozen=True)
class RouteTable:
    """One revision's routing, immutable: routes plus every READY loaded version by key.
    `status` lists (model, version) -> (state, reason) for every version the revision named."""

    revision: int
    routes: dict[str, ModelRoute]
    loaded: dict[tuple[str, str], LoadedVersion]
    status: dict[tuple[str, str], tuple[str, str | None]] = field(default_factory=dict)
    # The keys and limits of models that run here only as pipeline steps (DesiredState's).
    step_routes: dict[str, ModelRoute] = field(default_factory=dict)

    def versions_of(self, model: str) -> list[LoadedVersion]:
        return sorted((lv for (m, _), lv in self.loaded.items() if m == model),
                      key=lambda lv: version_order(lv.version))

    def pinnable_versions(self, model: str) -> list[str]:
        """The model's loaded versions that answer calls pinned to them (not its versions
        loaded only as pipeline steps)."""
        route = self.routes.get(model)
        return [lv.version for lv in self.versions_of(model)
                if route is not None and route.answers_pinned(lv.version)]

    def rules_of(self, model: str) -> ModelRoute | None:
        """The route whose keys and limits a call running `model` meets: its own, or the step
        route of a model that runs here only as pipeline steps (None: no endpoint, no rules)."""
        return self.routes.get(model) or self.step_routes.get(model)

    def limited_routes(self) -> dict[str, ModelRoute]:
        """Every route whose limits calls count against (the quota sync's list)."""
        return {**self.step_routes, **self.routes} if self.step_routes else self.routes

    def unavailable(self) -> list[str]:
        """Serving versions (per the routes) that are not loaded: why the replica is unready."""
        missing = []
        for name, route in self.routes.items():
            for v in route.serving_versions():
                if (name, v) not in self.loaded and not self.asleep(name, v):
                    missing.append(f"{name}:{v}")
        return missing

    def asleep(self, model: str, version: str | None) -> bool:
        """Whether the version is scaled to zero here: routed, unloaded, woken by a request."""
        return self.status.get((model, version), ("",))[0] == SCALED_TO_ZERO


EMPTY_TABLE = RouteTable(revision=-1, routes={}, loaded={})


class DataPlane:
    """Model metadata, readiness, inference, statistics and the repository index."""

    def __init__(self, *, replica: str,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 admission: Admission | None = None,
                 response_cache_bytes: int = DEFAULT_RESPONSE_CACHE_BYTES,
                 shared_memory: SharedMemoryRegistry | None = None,
                 tracing: Tracing | None = None) -> None:
        self.replica = replica
        # which inferences are traced (off unless OTEL_* gives an exporter); the fronts read
        # its `active` once per inference, the batchers once per batch
        self.tracing = tracing if tracing is not None else Tracing()
        # the logging and trace extensions' settings, as both fronts change them
        self.operator = OperatorSettings(self)
        # system shared-memory regions (serving.core.shared_memory); None: not offered here
        self.shared_memory = shared_memory
        # rate limits and daily quotas, and the per-key request counts (serving.core.rate_limits)
        self.admission = admission or Admission()
        self.max_output_bytes = max_output_bytes  # for versions that set no budget of their own
        # shared by every version whose spec turns it on; 0 bytes: off on this replica
        self.response_cache = ResponseCache(response_cache_bytes)
        self.table: RouteTable = EMPTY_TABLE
        self.started = False  # a first route table has been installed
        self.draining = False  # shutting down: not ready, still answering (serving.cli)
        # the other workers of this server (serving.process.siblings), when it runs several
        self.siblings: Any = None  # serving.process.siblings.Siblings, or None
        self.degraded: str | None = None  # why the source cannot be followed right now
        self.shadow: dict[str, ShadowStats] = {}
        self.mirror: dict[str, MirrorStats] = {}  # a judged canary's answers, per model
        self.source: DesiredStateSource | None = None  # set by the reconciler
        self.on_repository_change = None  # async callable: reconcile now
        self.loading: dict[tuple[str, str], Any] = {}  # versions being loaded right now
        # Scale to zero (set by the reconciler): the VersionStats of versions scaled to zero,
        # an async callable that loads a model's scaled-to-zero versions, and how long a
        # request waits for that before a 503 with Retry-After.
        self.asleep: dict[tuple[str, str], VersionStats] = {}
        self.wake = None
        self.cold_start_wait_s = 30.0
        # model -> [requests in flight, monotonic time of the last start or end]: when the
        # model was last used, for the idle timeout.
        self.activity: dict[str, list] = {}
        self._background: set[asyncio.Task] = set()
        # Data capture (serving.core.capture): no sink until the app gives it its source's.
        self.capture = CaptureQueue(None)

    # -- health ------------------------------------------------------------------------------

    def ready(self) -> tuple[bool, dict]:
        table = self.table
        missing = table.unavailable()
        ok = self.started and not missing and not self.draining
        body = {"ready": ok, "replica": self.replica, "revision": table.revision,
                "degraded": self.degraded, "unavailable": missing}
        if self.draining:
            body["draining"] = True
        return ok, body

    def server_metadata(self) -> dict:
        extensions = EXTENSIONS if self.shared_memory is None else [
            *EXTENSIONS, "system_shared_memory"]
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": extensions}

    def shared_memory_regions(self) -> SharedMemoryRegistry:
        """The registry the shared-memory calls act on; NotSupported where it is off."""
        if self.shared_memory is None:
            raise shared_memory_off()
        return self.shared_memory

    # -- lookup ------------------------------------------------------------------------------

    def _route(self, model: str) -> ModelRoute:
        route = self.table.routes.get(model)
        if route is None:
            raise self.unknown_model(model)
        return route

    def unknown_model(self, model: str, named_by: str = "") -> ServingError:
        """A model no route names: 404 once the first table is in, 503 until then (a starting
        replica cannot know yet whether it will serve the model). `named_by`: where the request
        named it, when not in the path."""
        if not self.started:
            return ReplicaStarting(self.replica)
        return ModelNotFound(f"unknown model '{model}'" + (f" ({named_by})" if named_by else ""))

    def _keyed(self, model: str, api_key: str | None) -> ModelRoute:
        """The model's route, once the caller showed its key (if it has keys), as infer asks."""
        route = self._route(model)
        if route.protected:
            _authorize(route, presented_keys(api_key))
        return route

    def resolve(self, model: str, version: str | None, *,
                steps_too: bool = False) -> LoadedVersion:
        """The loaded version a non-infer request is about (unpinned: the stable / live one).
        A version loaded only as a pipeline step is not one, unless `steps_too` (statistics)."""
        table = self.table
        route = self._route(model)
        if version is None:
            version = route.default_version
            if version is None:
                raise ModelNotReady(f"model '{model}' has no version serving traffic",
                                    retry_after=1)
        lv = table.loaded.get((model, version))
        if lv is not None:
            if not steps_too:
                _pinnable(route, version, table)
            return lv
        state = table.status.get((model, version))
        if state is None:
            raise ModelNotFound(f"unknown version '{version}' of model '{model}'")
        if state[0] == SCALED_TO_ZERO:
            raise ModelNotReady(f"model '{model}' version '{version}' is scaled to zero on this "
                                "replica: an inference request loads it", retry_after=1)
        reason = f": {state[1]}" if state[1] else ""
        raise ModelNotReady(f"model '{model}' version '{version}' is {state[0]}{reason}",
                            retry_after=1)

    def model_ready(self, model: str, version: str | None) -> bool:
        try:
            self.resolve(model, version)
        except ModelNotReady:
            return False
        return True

    def model_metadata(self, model: str, version: str | None, *,
                       api_key: str | None = None) -> dict:
        self._keyed(model, api_key)
        lv = self.resolve(model, version)
        sig = lv.signature
        return {
            "name": model,
            "versions": self.table.pinnable_versions(model),
            "platform": "ensemble" if lv.spec.pipeline is not None else "onnxruntime_onnx",
            "inputs": [_meta_tensor(t) for t in sig["inputs"]],
            "outputs": [_meta_tensor(t) for t in sig["outputs"]],
        }

    def model_config(self, model: str, version: str | None, *,
                     api_key: str | None = None) -> dict:
        """Triton's model configuration: dims exclude the batch dimension when batching."""
        self._keyed(model, api_key)
        lv = self.resolve(model, version)
        cfg = lv.spec.batching
        if lv.spec.pipeline is not None:
            return triton_ensemble_config(
                name=model, signature=lv.signature, max_batch_size=lv.max_batch_size,
                graph=lv.spec.pipeline, versions=[lv.version])
        providers = lv.runtime.providers
        return triton_model_config(
            name=model, signature=lv.signature, max_batch_size=lv.max_batch_size,
            preferred_batch_sizes=cfg.preferred_batch_sizes,
            max_queue_delay_us=cfg.max_queue_delay_us, max_queue_size=cfg.max_queue_size,
            instance_count=cfg.instance_count,
            kind="KIND_CPU" if providers[:1] == ["CPUExecutionProvider"] else "KIND_GPU",
            versions=self.table.pinnable_versions(model), providers=providers,
            response_cache=lv.spec.response_cache)

    # -- inference ---------------------------------------------------------------------------

    def busy_since(self) -> tuple[int, float]:
        """Requests in flight now, and when the last one ended (monotonic; 0: none yet)."""
        in_flight, last = 0, 0.0
        for count, ended in list(self.activity.values()):
            in_flight += count
            last = max(last, ended)
        return in_flight, last

    async def predict(
        self, model: str, version: str | None, request: InferRequest, *,
        routing_key: str | None = None, api_key: str | None = None,
        trace: RequestTrace | None = None,
    ) -> tuple[dict[str, np.ndarray], LoadedVersion]:
        """Pick (or pin), validate, queue: the model's outputs (tensors, never bytes) and who
        answered. Each transport encodes them its own way (serving.http.codec,
        serving.grpc.codec). `trace`: the inference's trace, when the front began one."""
        table = self.table
        route = table.routes.get(model)
        if route is None:
            raise self.unknown_model(model)
        keys = presented_keys(api_key)
        key_hash = _authorize(route, keys) if route.protected else None
        pinned = version is not None
        if not pinned:
            version = route.pick(routing_key)
        lv = table.loaded.get((model, version)) if version is not None else None
        if lv is not None and pinned:
            _pinnable(route, version, table)
        if lv is not None and lv.spec.pipeline is not None:
            self._admit_pipeline(model, lv.spec.pipeline, table, route, key_hash, keys)
        else:
            self.admission.admit(model, route.limits, route.key(key_hash))
        activity = self.activity.get(model)
        if activity is None:
            activity = self.activity[model] = [0, monotonic()]
        activity[0] += 1  # in flight: never idle, so the last-request time is set at the end
        try:
            return await self._infer(model, version, pinned, lv, request, table, route,
                                     routing_key, trace)
        finally:
            activity[0] -= 1
            activity[1] = monotonic()

    def _admit_pipeline(self, model: str, graph: PipelineGraph, table: RouteTable,
                        route: ModelRoute, key_hash: str | None, keys: tuple[str, ...]) -> None:
        """A call to a pipeline meets every step model's rules as a direct call to it would:
        one of the keys it presented must be the step endpoint's (where that is keyed), and
        the step's rate limits and quota count it, admitted together with the pipeline's own
        (nothing is taken unless all let it in). A refusal names the step."""
        steps = []
        for step_model, names in graph.step_models.items():
            rules = table.rules_of(step_model) if step_model != model else None
            if rules is None:  # no endpoint of its own (or the pipeline's): nothing to meet
                continue
            who = f"{_steps(names, step_model)} of pipeline '{model}'"
            step_hash = _authorize(rules, keys, who=who) if rules.protected else None
            steps.append((step_model, rules.limits, rules.key(step_hash)))
        try:
            self.admission.admit(model, route.limits, route.key(key_hash), also=steps)
        except RateLimited as exc:
            if exc.model == model:
                raise
            raise RateLimited(f"{_steps(graph.step_models[exc.model], exc.model)} of pipeline "
                              f"'{model}': {exc.message}", reason=exc.reason,
                              retry_after=exc.retry_after, model=exc.model) from None

    async def _infer(self, model: str, version: str | None, pinned: bool,
                     lv: LoadedVersion | None, request: InferRequest, table: RouteTable,
                     route: ModelRoute, routing_key: str | None, trace: RequestTrace | None,
                     ) -> tuple[dict[str, np.ndarray], LoadedVersion]:
        started = perf_counter_ns()
        if lv is None and table.asleep(model, version):
            lv, route = await self._cold_start(model, version if pinned else None, routing_key)
        if lv is None:
            if not pinned:
                raise ModelNotReady(f"model '{model}' has no ready version serving traffic",
                                    retry_after=1)
            self.resolve(model, version)  # raises the right 404 / 503
        targets = None
        try:
            if request.shared_memory:  # inputs read from, outputs checked against their regions
                targets = self.shared_memory_regions().attach(request)
            feeds = validate_inputs(request.inputs, lv.signature, lv.max_batch_size)
            if request.outputs:
                validate_outputs([o.name for o in request.outputs], lv.signature)
            feeds = lv.runtime.text_inputs(feeds)
        except InvalidInput:
            lv.stats.record_failure(0)
            raise
        ticket = None
        if route.capture.percent > 0 and self.capture.sampled(route.capture):
            # offered by the batcher's run with the rest of its batch (a cache hit: here)
            ticket = self._ticket(model, lv, capture_role(route, lv.version, pinned), started,
                                  route.capture)
        if lv.stats.cached:
            outputs = await self._cached_run(model, lv, feeds, trace, ticket)
        else:
            outputs = await self._run(model, lv, feeds, trace, ticket)
        shadow = route.shadow is not None and route.shadow != lv.version
        mirror = (route.mirror_percent and not pinned and route.candidate is not None
                  and lv.version == route.stable and mirror_picked(route.mirror_percent))
        if (shadow or mirror) and targets is not None:  # the client may rewrite its region
            feeds = {name: np.array(array) for name, array in feeds.items()}
        if shadow:
            self._spawn(self._shadow(model, route.shadow, feeds, outputs))
        if mirror:
            self._spawn(self._mirror(model, route.candidate, lv.version, feeds, outputs))
        if targets:
            write_outputs(targets, outputs)
        return outputs, lv

    async def _cold_start(self, model: str, pinned: str | None, routing_key: str | None,
                          ) -> tuple[LoadedVersion | None, ModelRoute]:
        """Wake a scaled-to-zero model and wait (at most cold_start_wait_s) until the version
        this request gets is loaded. Concurrent requests share one load; a new route table
        arriving meanwhile (a rollout) is followed: the request is picked again from it."""
        deadline = monotonic() + self.cold_start_wait_s
        while True:
            if self.wake is None:
                raise ModelNotReady(f"model '{model}' is scaled to zero and this replica "
                                    "cannot load it now", retry_after=1)
            load = self.wake(model)  # started (or joined) even by a request that will give up
            try:
                # shielded: a request that gives up does not cancel the load others wait for
                await asyncio.wait_for(asyncio.shield(load), max(deadline - monotonic(), 0))
            except TimeoutError:
                raise ModelNotReady(
                    f"model '{model}' is starting from zero on this replica (cold start); "
                    "retry shortly",
                    retry_after=max(1, math.ceil(self.cold_start_wait_s / 10))) from None
            table = self.table
            route = table.routes.get(model)
            if route is None:
                raise self.unknown_model(model)
            version = pinned if pinned is not None else route.pick(routing_key)
            lv = table.loaded.get((model, version)) if version is not None else None
            if lv is not None or not table.asleep(model, version):
                return lv, route

    def _budget(self, lv: LoadedVersion) -> int:
        """The version's output budget: its own, else this replica's."""
        budget = lv.spec.max_output_bytes
        return budget if budget > 0 else self.max_output_bytes

    async def _run(self, model: str, lv: LoadedVersion, feeds: dict,
                   trace: RequestTrace | None = None, ticket: Ticket | None = None,
                   ) -> dict[str, np.ndarray]:
        """One request's outputs from the version's batcher, within the version's output
        budget (its own, else this replica's): over it, or too large to allocate, is a 400.
        `ticket`: its capture ticket when it is sampled (the batcher's run offers it)."""
        budget = self._budget(lv)
        try:
            outputs = await lv.batcher.infer(feeds, trace, ticket)
        except ServingError:
            raise
        except Exception as exc:  # noqa: BLE001 - the runtime's own error types
            error = _runtime_error(model, lv.version, exc, budget)
            if isinstance(error, ModelFailed):
                lv.stats.record_model_failure()
            if isinstance(error, ServerFault | ModelFailed):
                log.error("%s", error.message)  # one line: the batcher counted the failure
            raise error from None
        size = output_bytes(outputs)
        if size > budget:
            raise InvalidInput(
                f"model '{model}' version '{lv.version}': this request's outputs are {size} "
                f"bytes, over the version's output budget of {budget} bytes (max_output_bytes)")
        return outputs

    async def _cached_run(self, model: str, lv: LoadedVersion, feeds: dict,
                          trace: RequestTrace | None, ticket: Ticket | None,
                          ) -> dict[str, np.ndarray]:
        """The outputs from the response cache when this version answered the same inputs
        before (the batcher is not touched; a sampled request is offered to capture here),
        else from `_run`, then kept for next time."""
        cache = self.response_cache
        started = perf_counter_ns()
        key = request_key(lv.cache_identity, feeds)
        outputs = cache.get(key)
        if outputs is not None:
            lv.stats.record_cache_hit(perf_counter_ns() - started)
            if ticket is not None:
                self.capture.offer_ticket(ticket, feeds, outputs)
            return outputs
        lv.stats.record_cache_miss(perf_counter_ns() - started)  # a lookup, even if the run fails
        outputs = await self._run(model, lv, feeds, trace, ticket)
        if not lv.retired:  # an unloading version's entries would never be dropped
            inserting = perf_counter_ns()
            cache.put(key, lv, outputs)
            lv.stats.cache_miss_ns += perf_counter_ns() - inserting  # Triton: lookup + insertion
        return outputs

    def admit(self, lv: LoadedVersion) -> None:
        """A freshly loaded version: it uses the response cache if its spec asks and this
        replica has a budget (only then are its cache counters exported)."""
        lv.stats.cached = lv.spec.response_cache and self.response_cache.enabled

    def retire(self, lv: LoadedVersion) -> None:
        """`lv` left the route table: drop its cached answers and keep no new ones."""
        lv.retired = True
        self.response_cache.drop(lv)

    def _ticket(self, model: str, lv: LoadedVersion, role: str, started_ns: int,
                settings: CaptureSettings) -> Ticket:
        """A sampled request's capture ticket (serving.core.capture.Ticket). A request without
        an id gets one here, which the front returns (X-Request-Id)."""
        request_id = REQUEST_ID.get()
        if not request_id and role != "shadow":
            request_id = new_request_id()
            REQUEST_ID.set(request_id)
        return self.capture.ticket(model, lv.version, role, request_id, started_ns, settings,
                                   self._budget(lv))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _shadow(self, model: str, version: str, feeds: dict, live: dict) -> None:
        """Fire-and-forget copy to the shadow version: recorded, never returned."""
        stats = self.shadow.get(model)
        if stats is None or stats.version != version:
            stats = self.shadow[model] = ShadowStats(version)
        stats.requests += 1
        started = perf_counter_ns()
        try:
            lv = self.table.loaded.get((model, version))
            if lv is None:
                raise ModelNotReady(f"shadow version '{version}' is not loaded")
            feeds = validate_inputs(
                [_Fed(n, a) for n, a in feeds.items()], lv.signature,
                lv.max_batch_size)
            route = self.table.routes.get(model)
            ticket = None
            if route is not None and route.capture.percent > 0 and self.capture.sampled(
                    route.capture):
                ticket = self._ticket(model, lv, "shadow", started, route.capture)
            out = await lv.batcher.infer(feeds, None, ticket)
        except Exception as exc:  # noqa: BLE001 - a shadow failure is data, not an error
            stats.errors += 1
            stats.last_error = str(exc)[:300]
            return
        stats.latency_ns += perf_counter_ns() - started
        for name, a in live.items():
            b = out.get(name)
            if b is None or a.shape != b.shape or a.dtype.kind not in "biuf" or not a.size:
                continue
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            if math.isfinite(diff) and diff > stats.max_abs_diff:
                stats.max_abs_diff = diff
            if a.ndim >= 1:
                rows = a.reshape(a.shape[0], -1) if a.ndim >= 2 else a.reshape(1, -1)
                other = b.reshape(rows.shape)
                stats.compared_rows += rows.shape[0]
                stats.argmax_agree += int(np.sum(rows.argmax(1) == other.argmax(1)))
            break  # the first comparable output decides agreement

    async def _mirror(self, model: str, version: str, stable: str, feeds: dict,
                      answered: dict) -> None:
        """Fire-and-forget: the candidate answers what the stable just answered; the two are
        compared (serving.core.mirror), never returned. The candidate's batcher counts it as
        a request like any other (the same model ran it), so its error rate and latency are
        judged on its share and the mirrored copies together."""
        stats = self.mirror.get(model)
        if stats is None or (stats.version, stats.against) != (version, stable):
            stats = self.mirror[model] = MirrorStats(version, stable)
        try:
            lv = self.table.loaded.get((model, version))
            if lv is None:
                raise ModelNotReady(f"candidate version '{version}' is not loaded")
            feeds = validate_inputs([_Fed(n, a) for n, a in feeds.items()], lv.signature,
                                    lv.max_batch_size)
            out = await lv.batcher.infer(feeds)
        except Exception as exc:  # noqa: BLE001 - a mirrored failure is data, not an error
            stats.failed(exc)
            return
        stats.compare(answered, out)

    # -- statistics and repository -----------------------------------------------------------

    async def fresh_statistics(self) -> None:
        """Before statistics are answered: the other workers' counters as of now."""
        if self.siblings is not None:
            await self.siblings.refresh()

    def model_stats(self, model: str | None, version: str | None, *,
                    api_key: str | None = None) -> dict:
        table = self.table
        if model is None:  # every model, less those with keys the caller did not show
            routes = table.routes
            lvs = [table.loaded[k] for k in sorted(table.loaded)
                   if _opens(routes.get(k[0]), api_key)]
        elif model not in table.routes and table.versions_of(model):
            # Loaded without a route of its own: a pipeline's step, counted all the same.
            lvs = [lv for lv in table.versions_of(model) if version in (None, lv.version)]
            if not lvs:
                raise ModelNotFound(f"unknown version '{version}' of model '{model}'")
        elif version is not None:
            self._keyed(model, api_key)
            lvs = [self.resolve(model, version, steps_too=True)]
        else:
            self._keyed(model, api_key)
            lvs = table.versions_of(model)
        stats = [lv.stats for lv in lvs]
        if self.siblings is not None:  # one of several workers: their counts too
            stats = self.siblings.merge(stats)
        answer: dict[str, Any] = {"model_stats": [s.to_triton() for s in stats]}
        if model is not None and model in self.shadow:
            answer["shadow"] = self.shadow[model].to_json()
        return answer

    def all_stats(self) -> list[VersionStats]:
        """Every loaded version's statistics, and those of versions scaled to zero (kept, so
        counters run on across a sleep)."""
        return [lv.stats for lv in self.table.loaded.values()] + list(self.asleep.values())

    def repository_index(self, ready_only: bool = False) -> list[dict]:
        if not self.started:  # an empty index would say "no models", which is not known yet
            raise ReplicaStarting(self.replica)
        table = self.table
        keys = set(table.status) | set(table.loaded) | set(self.loading)
        index = []
        for model, version in sorted(keys):
            if (model, version) in table.loaded:
                index.append({"name": model, "version": version, "state": "READY", "reason": ""})
            elif (model, version) in self.loading:
                if not ready_only:
                    index.append({"name": model, "version": version, "state": "LOADING",
                                  "reason": "loading"})
            elif not ready_only:
                state, reason = table.status[(model, version)]
                if state == SCALED_TO_ZERO:
                    reason = "scaled to zero: an inference request loads it"
                index.append({"name": model, "version": version,
                              "state": "LOADING" if state == "LOADING" else "UNAVAILABLE",
                              "reason": reason or state})
        return index

    async def repository_action(self, action: str, model: str,
                                authorization: str | None = None) -> None:
        """Load/unload go through the source (the registry: audited, authorised)."""
        # No source yet, or one written before load/unload joined the protocol (asked by name,
        # not isinstance: a source need not have every later method, such as leave).
        request = getattr(self.source, "request_load" if action == "load" else "request_unload",
                          None)
        if request is None:
            raise repository_action_not_offered(action, model)
        try:
            await asyncio.get_running_loop().run_in_executor(None, request, model, authorization)
        except (Unauthorized, Forbidden, ModelNotFound, Conflict, InvalidInput) as exc:
            # A source raises typed errors (the protocol says so): name the action refused.
            raise type(exc)(f"{action} of model '{model}' refused: {exc.message}",
                            headers=exc.headers) from None
        if self.on_repository_change is not None:
            await self.on_repository_change()


class _Fed:
    """Adapter so validate_inputs can re-check already-decoded feeds for the shadow."""

    __slots__ = ("name", "datatype", "array")

    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name = name
        self.array = array
        self.datatype = datatype_of(array)


def triton_model_config(
    *, name: str, signature: dict, max_batch_size: int, preferred_batch_sizes, max_queue_delay_us:
    int, max_queue_size: int, instance_count: int, kind: str, versions: list,
    providers: list[str] | None = None, response_cache: bool = False,
) -> dict:
    """Triton's model configuration (its JSON form) from a v2 signature and batching settings.

    Pure, so `/config` here and the registry's Triton export build the same document. With
    `max_batch_size` > 0 the dims exclude the batch dimension, as Triton's do.
    """
    mbs = max_batch_size

    def tensor(t: dict) -> dict:
        shape = list(t["shape"] or [-1])
        dt = t["datatype"]
        return {"name": t["name"], "data_type": "TYPE_" + _TRITON_TYPES.get(dt, dt),
                "dims": shape[1:] if mbs else shape}

    config: dict[str, Any] = {
        "name": name,
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "version_policy": {"specific": {"versions": list(versions)}},
        "max_batch_size": mbs,
        "input": [tensor(t) for t in signature["inputs"]],
        "output": [tensor(t) for t in signature["outputs"]],
        "instance_group": [{"name": name, "kind": kind, "count": max(1, instance_count)}],
        "default_model_filename": "model.onnx",
    }
    if response_cache:
        config["response_cache"] = {"enable": True}
    if providers is not None:
        config["parameters"] = {"providers": {"string_value": ",".join(providers)}}
    if mbs:
        config["dynamic_batching"] = {
            "preferred_batch_size": list(preferred_batch_sizes),
            "max_queue_delay_microseconds": max_queue_delay_us,
            "default_queue_policy": {"max_queue_size": max_queue_size},
        }
    return config


def triton_ensemble_config(*, name: str, signature: dict, max_batch_size: int,
                           graph: PipelineGraph, versions: list) -> dict:
    """A pipeline as Triton's ensemble configuration (JSON form): one `ensemble_scheduling`
    step per pipeline step, pinned to its version, with input_map / output_map (the step
    model's tensor → the ensemble's tensor). A step output is named `step.tensor` in the
    ensemble unless it is a pipeline output, which keeps the pipeline's name."""
    config = triton_model_config(
        name=name, signature=signature, max_batch_size=max_batch_size, preferred_batch_sizes=(),
        max_queue_delay_us=0, max_queue_size=0, instance_count=1, kind="KIND_CPU",
        versions=versions)
    for key in ("backend", "instance_group", "default_model_filename", "dynamic_batching"):
        config.pop(key, None)
    config["platform"] = "ensemble"
    named: dict[tuple[str, str], str] = {}
    for output, source in graph.outputs():
        if source in named:
            raise ValueError(f"step output {source[0]}.{source[1]} is both pipeline outputs "
                             f"{named[source]!r} and {output!r}; a Triton ensemble cannot "
                             "name one tensor twice")
        named[source] = output

    def tensor(source: tuple[str, str]) -> str:
        step, out = source
        return out if not step else named.get(source, f"{step}.{out}")

    steps = []
    for step in graph.steps:
        produced = sorted({e.source[1] for e in graph.edges if e.source[0] == step.name})
        steps.append({
            "model_name": step.model,
            "model_version": int(step.version) if step.version.isdigit() else -1,
            "input_map": {inp: tensor(src) for inp, src in graph.feeds_of(step.name)},
            "output_map": {out: tensor((step.name, out)) for out in produced},
        })
    config["ensemble_scheduling"] = {"step": steps}
    return config


def capture_role(route: ModelRoute, version: str, pinned: bool) -> str:
    """The route role a captured answer is filed under."""
    if pinned:
        return "pinned"
    if version == route.candidate and version != route.stable and not route.live_color:
        return "candidate"
    return "stable"


def version_order(version: str) -> tuple[int, int, str]:
    """Numeric versions first, in numeric order; then the others by name."""
    return (0, int(version), "") if version.isdigit() else (1, 0, version)


def _meta_tensor(t: dict) -> dict:
    return {"name": t["name"], "datatype": t["datatype"],
            "shape": t["shape"] if t["shape"] is not None else [-1]}


#: onnxruntime's words for an allocation it could not make (a size the request chose): BFC
#: arena, plain malloc, and a size computation that overflowed 64 bits.
_ALLOCATION_FAILED = ("Failed to allocate memory", "bad_alloc", "Integer overflow")
_REQUESTED_SIZE = re.compile(r"buffer of size (\d+)")
#: onnxruntime's words for sizes the request sent that cannot go together: two inputs whose
#: dimensions do not broadcast (2 rows and 3), a shape value it sent that is negative.
_REQUEST_SHAPES = ("Attempting to broadcast", "shape.Size() must be >= 0")
#: A failure inside a GPU provider is the server's, even while running a node.
_GPU_WORDS = ("CUDA", "cuda", "TensorRT", "cuDNN", "CUBLAS", "cublas")


def _runtime_error(model: str, version: str, exc: Exception, budget: int) -> ServingError:
    """Whose fault a failed run is. The request's inputs passed the signature before the run
    (serving/core/tensor_signature.py), so what fails inside it is the model's (ModelFailed,
    500, counted against the version) or the server's (a GPU provider: ServerFault), except
    where the request is: an allocation its size asked for, values onnxruntime itself calls invalid
    arguments (an index out of an embedding's range), sizes the request sent that cannot go
    together (_REQUEST_SHAPES): 400s. Typed errors, so no traceback is written to the log."""
    text = str(exc)
    if any(words in text for words in _ALLOCATION_FAILED):
        size = _REQUESTED_SIZE.search(text)
        needed = (f"{int(size[1])} bytes of memory" if size else
                  "more than 2**64 bytes" if "overflow" in text else
                  "more memory than this process can have")
        return InvalidInput(
            f"model '{model}' version '{version}': this request asks for {needed}, which "
            f"could not be allocated; the version's output budget is {budget} bytes "
            "(max_output_bytes)")
    message = f"model '{model}' version '{version}' failed: {text[:500]}"
    if "INVALID_ARGUMENT" in text or type(exc).__name__ in ("InvalidArgument", "ValueError"):
        return InvalidInput(message)
    if any(words in text for words in _REQUEST_SHAPES):
        return InvalidInput(message)
    if any(w in text for w in _GPU_WORDS):
        return ServerFault(message)
    return ModelFailed(message)


def _opens(route: ModelRoute | None, api_key: str | None) -> bool:
    """Whether the caller may read about this route: it has no keys, or the caller's is one."""
    if route is None or not route.protected:
        return True
    return any(api_key_hash(k) in route.api_key_hashes for k in presented_keys(api_key))


#: The most predict keys one call may present (a pipeline's own and its keyed steps').
MAX_PRESENTED_KEYS = 8


def presented_keys(api_key: str | None) -> tuple[str, ...]:
    """The predict keys a call presents: the fronts join every key header into one
    comma-separated list (keys are URL-safe base64, never a comma)."""
    if not api_key:
        return ()
    if "," not in api_key:
        return (api_key.strip(),) if api_key.strip() else ()
    keys = tuple(k for k in (part.strip() for part in api_key.split(",")) if k)
    if len(keys) > MAX_PRESENTED_KEYS:
        raise InvalidInput(f"a call may present at most {MAX_PRESENTED_KEYS} predict keys, "
                           f"this one presents {len(keys)}")
    return keys


def with_key(keys: str | None, more: str | None) -> str | None:
    """`keys` with one more header's keys: how a front gathers every predict key a call
    presents into one comma-separated list (a call through a pipeline may need its own key
    and each keyed step's)."""
    more = more.strip() if more else ""
    if not more:
        return keys
    return f"{keys},{more}" if keys else more


def _authorize(route: ModelRoute, keys: tuple[str, ...], *, who: str = "") -> str:
    """The hash of the presented key that is one of the route's; else 401. `who`: what the
    refusal names when it is not the model called (a pipeline's step)."""
    hint = ("; a call through a pipeline presents the pipeline's key and each keyed step's, "
            "comma-separated (X-Api-Key: <key>, <key>)") if who else ""
    who = who or f"model '{route.model}'"
    if not route.api_key_hashes:  # keys are required here, and this endpoint has none yet
        raise Unauthorized(f"{who} has no predict key and this server requires "
                           "one for every model: create a key for its endpoint (console "
                           "deployment page, or POST /api/v1/models/<name>/endpoint/keys/)")
    if not keys:
        raise Unauthorized(f"{who} needs an API key "
                           "(Authorization: Bearer <key> or X-Api-Key)" + hint)
    for key in keys:
        key_hash = api_key_hash(key)
        if key_hash in route.api_key_hashes:
            return key_hash
    raise Unauthorized(f"API key not accepted for {who}" + hint)


def _steps(names: tuple[str, ...], model: str) -> str:
    """"step 'score' (model 't-keyed')": how a refusal names the steps that run `model`."""
    quoted = ", ".join(f"'{n}'" for n in names)
    return f"step{'s' if len(names) > 1 else ''} {quoted} (model '{model}')"


def _pinnable(route: ModelRoute, version: str, table: RouteTable) -> None:
    """404 for a call pinned to a version loaded here only as a pipeline's step: loading it for
    the pipeline gives it no traffic of its own (registry/services/gate.py decides that)."""
    if not route.answers_pinned(version):
        raise ModelNotFound(
            f"model '{route.model}' version '{version}' is not deployed: it runs on this "
            "replica only as a pipeline step, so only calls to that pipeline reach it")
