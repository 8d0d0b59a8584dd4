"""The serving ASGI application: /v2 (KServe Open Inference Protocol + Triton extensions),
SageMaker /ping and /invocations, Prometheus /metrics; and, when configured, the gRPC front
(serving.grpc.front) started and stopped with it.

A raw ASGI callable rather than a framework: the path is split once and dispatched with a few
string comparisons, headers are scanned once, and the JSON infer answer reuses prebuilt header
tuples (measured: 454 µs per in-process request against Starlette's 600 µs on the same stack).
Everything protocol-level lives in DataPlane; this module only adapts HTTP to it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from time import perf_counter_ns

import orjson

from serving.core.capture import CaptureQueue, capture_metrics
from serving.core.dataplane import DataPlane, with_key
from serving.core.desired_state import DEFAULT_MAX_OUTPUT_BYTES, DesiredStateSource
from serving.core.errors import (
    InvalidInput,
    MethodNotAllowed,
    ModelNotFound,
    PayloadTooLarge,
    ReplicaStarting,
    ServingError,
)
from serving.core.extras import require
from serving.core.logs import REQUEST_ID
from serving.core.rate_limits import DEFAULT_SYNC_SECONDS, Admission, quota_store
from serving.core.reconciler import Reconciler
from serving.core.response_cache import DEFAULT_RESPONSE_CACHE_BYTES
from serving.core.shared_memory import SharedMemoryRegistry
from serving.core.stats import ServingCollector, VersionStats, render_metrics
from serving.core.tracing import Tracing
from serving.edge_limits import IDLE_TRIM_S, BodyReader, EdgeLimits, trim_when_idle
from serving.http import json_numbers
from serving.http.codec import (
    decode_infer_request,
    encode_infer_response,
    sagemaker_header_length,
)
from serving.http.compression import MAX_BODY_BYTES, decompress
from serving.http.shared_memory import MAX_REGISTER_BODY, shared_memory_call
from serving.process import siblings
from serving.process.shared_settings import SettingsBoard
from serving.process.supervisor import DEFAULT_DRAIN_SECONDS

log = logging.getLogger(__name__)

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

_JSON = b"application/json"
_CT_JSON = (b"content-type", _JSON)
_LIVE = b'{"live":true}'  # the protocol's live answer (the KServe SDK reads "live")
_LIVE_HEADERS = [_CT_JSON, (b"content-length", b"%d" % len(_LIVE))]
#: MMC_DRAIN_SECONDS' default: as long as uvicorn keeps an idle keep-alive connection (5 s), so
#: a client's idle pooled connection is used (and told to close) or expires within the window;
#: and well inside Kubernetes' 30 s termination grace.


@dataclass(frozen=True)
class ServingSettings:
    """The serving process's configuration, read from the environment in one place."""

    max_body_bytes: int = MAX_BODY_BYTES
    poll_seconds: float = 1.0
    heartbeat_seconds: float = 2.0
    intra_op_threads: int = 0
    providers: list[str] = field(default_factory=list)
    # per request and version, for versions that set none (serving.core.desired_state)
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    # header/body timeouts, buffered-body budget, connection cap (serving.edge_limits)
    limits: EdgeLimits = field(default_factory=EdgeLimits)
    # the replica's response-cache budget in bytes, shared by the versions that turn the
    # cache on (serving.core.response_cache); 0 turns it off here
    response_cache_bytes: int = DEFAULT_RESPONSE_CACHE_BYTES
    # SIGTERM: answer (not ready, `Connection: close`) this long at most before the listener
    # closes; less once no connection is open (serving.http.server.DrainingServer)
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    # Daily quotas: counted in this Redis, shared by all replicas (MMC_QUOTA_REDIS_URL, else
    # REDIS_URL; empty: in this process), synced every quota_sync_seconds
    # (serving.core.rate_limits)
    quota_redis_url: str = ""
    quota_sync_seconds: float = DEFAULT_SYNC_SECONDS
    # the gRPC front (serving.grpc.front) beside HTTP, in the same loop; None: off
    grpc_port: int | None = None
    grpc_host: str = "127.0.0.1"
    # its transport: our own HTTP/2 one (default) or grpcio's server (serving.grpc.front)
    grpc_transport: str = "fast"
    # Scale to zero: how long a request waits for its scaled-to-zero model to load before a
    # 503 with Retry-After (MMC_COLD_START_WAIT_SECONDS)
    cold_start_wait_seconds: float = 30.0
    # After requests and then none this long, the heap glibc kept goes back to the OS, once per
    # pause (serving.edge_limits.IdleTrim); 0: never (MMC_IDLE_TRIM_SECONDS)
    idle_trim_seconds: float = IDLE_TRIM_S

    @classmethod
    def from_env(cls, env: dict | None = None) -> ServingSettings:
        e = os.environ if env is None else env
        return cls(
            max_body_bytes=int(e.get("MMC_MAX_BODY_BYTES", cls.max_body_bytes)),
            poll_seconds=float(e.get("MMC_POLL_SECONDS", cls.poll_seconds)),
            heartbeat_seconds=float(e.get("MMC_HEARTBEAT_SECONDS", cls.heartbeat_seconds)),
            intra_op_threads=int(e.get("MMC_ORT_INTRA_OP_THREADS", 0)),
            providers=[p for p in e.get("MMC_PROVIDERS", "").split(",") if p.strip()],
            max_output_bytes=int(e.get("MMC_MAX_OUTPUT_BYTES", cls.max_output_bytes)),
            response_cache_bytes=int(e.get("MMC_RESPONSE_CACHE_BYTES",
                                           cls.response_cache_bytes)),
            limits=EdgeLimits.from_env(e),
            drain_seconds=float(e.get("MMC_DRAIN_SECONDS") or cls.drain_seconds),
            quota_redis_url=e.get("MMC_QUOTA_REDIS_URL") or e.get("REDIS_URL", ""),
            quota_sync_seconds=float(e.get("MMC_QUOTA_SYNC_SECONDS")
                                     or cls.quota_sync_seconds),
            grpc_port=int(e["MMC_GRPC_PORT"]) if e.get("MMC_GRPC_PORT") else None,
            grpc_host=e.get("MMC_GRPC_HOST") or cls.grpc_host,
            grpc_transport=e.get("MMC_GRPC_TRANSPORT") or cls.grpc_transport,
            cold_start_wait_seconds=float(e.get("MMC_COLD_START_WAIT_SECONDS")
                                          or cls.cold_start_wait_seconds),
            idle_trim_seconds=float(e.get("MMC_IDLE_TRIM_SECONDS", cls.idle_trim_seconds)),
        )


class _Metrics:
    """What /metrics renders: per-version Triton counters plus the replica's own gauges."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.collector = ServingCollector(dataplane.replica, dataplane.all_stats,
                                          siblings=self._sibling_stats)
        self._others: list[dict] = []  # the other workers' files, read once per scrape

    def _sibling_stats(self) -> list[tuple[str, list[VersionStats]]]:
        return siblings.stats_of(self._others)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        dp = self.dataplane
        self._others = dp.siblings.others() if dp.siblings is not None else []
        yield from self.collector.collect()
        degraded = GaugeMetricFamily(
            "mmc_serving_degraded", "1 while the route source cannot be followed (the replica "
            "serves its last route table)", labels=["replica", "reason"])
        degraded.add_metric([dp.replica, dp.degraded or ""], 1 if dp.degraded else 0)
        yield degraded
        revision = GaugeMetricFamily("mmc_route_revision", "Route revision being served",
                                     labels=["replica"])
        revision.add_metric([dp.replica], dp.table.revision)
        yield revision
        cache = dp.response_cache
        for name, doc, value in (
                ("mmc_response_cache_bytes", "Bytes the response cache holds", cache.used_bytes),
                ("mmc_response_cache_capacity_bytes", "The response cache's budget in bytes "
                 "(MMC_RESPONSE_CACHE_BYTES)", cache.capacity_bytes),
                ("mmc_response_cache_entries", "Answers the response cache holds", len(cache)),
                ("mmc_response_cache_evictions", "Answers evicted to make room (cumulative)",
                 cache.evictions)):
            gauge = GaugeMetricFamily(name, doc, labels=["replica"])
            gauge.add_metric([dp.replica], value)
            yield gauge
        shadow = GaugeMetricFamily("mmc_shadow_argmax_agreement", "Share of shadow rows whose "
                                   "argmax equals the live answer's", labels=["model", "version"])
        for model, s in list(dp.shadow.items()):
            if s.compared_rows:
                shadow.add_metric([model, s.version], s.argmax_agree / s.compared_rows)
        yield shadow
        yield from capture_metrics(dp.capture)
        admission = dp.admission
        requests = CounterMetricFamily(
            "mmc_predict_requests", "Inference requests let in by the rate limits and quotas, "
            "per predict key (its prefix; 'none': an endpoint without keys)",
            labels=["model", "key", "replica"])
        for (model, key), n in list(admission.requests.items()):
            requests.add_metric([model, key, dp.replica], n)
        for other in self._others:
            for model, key, n in other["counters"].get("requests", ()):
                requests.add_metric([model, key, other["replica"]], n)
        yield requests
        rejected = CounterMetricFamily(
            "mmc_predict_rejected", "Inference requests refused with 429, per predict key and "
            "reason (key_rate, endpoint_rate, key_quota, endpoint_quota)",
            labels=["model", "key", "reason", "replica"])
        for (model, key, reason), n in list(admission.rejected.items()):
            rejected.add_metric([model, key, reason, dp.replica], n)
        for other in self._others:
            for model, key, reason, n in other["counters"].get("rejected", ()):
                rejected.add_metric([model, key, reason, other["replica"]], n)
        yield rejected
        store_up = GaugeMetricFamily(
            "mmc_quota_store_up", "0 while the shared quota store (Redis) does not answer and "
            "daily quotas are counted on this replica only", labels=["replica"])
        store_up.add_metric([dp.replica], 0 if admission.quota.unreachable else 1)
        yield store_up


class ServingApp:
    """ASGI application over one DataPlane and the Reconciler that feeds it."""

    def __init__(self, dataplane: DataPlane, reconciler: Reconciler | None,
                 settings: ServingSettings) -> None:
        self.dataplane = dataplane
        self.reconciler = reconciler
        self.settings = settings
        self._limit = settings.max_body_bytes
        self._reader = BodyReader(settings.limits)
        self._metrics = _Metrics(dataplane)
        self._tracing = dataplane.tracing  # its `active`: read once per inference
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self.grpc = None  # the GrpcFront, while settings.grpc_port asks for one
        self._drain_task: asyncio.Task | None = None
        self._trim_task: asyncio.Task | None = None  # the heap back to the OS once idle

    # -- lifecycle ---------------------------------------------------------------------------

    async def startup(self) -> None:
        """Start following the source (the first reconcile runs in the background, so
        /v2/health/live answers while models load and /v2/health/ready says when they are)."""
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self._started and self.reconciler is not None:
                await self.reconciler.start()
            if not self._started:
                self.dataplane.admission.start(lambda: self.dataplane.table.limited_routes())
            if not self._started and self.settings.grpc_port is not None:
                await self._start_grpc()
            if not self._started and self.dataplane.siblings is not None:
                self.dataplane.siblings.start()
            board = self.dataplane.operator.board
            if not self._started and board is not None:  # the other workers' log and trace
                board.follow(self.dataplane.operator.adopt)  # settings changes
            if not self._started and self.settings.idle_trim_seconds > 0:
                self._trim_task = asyncio.get_running_loop().create_task(trim_when_idle(
                    self.dataplane.busy_since, self.settings.idle_trim_seconds))
            self._started = True

    async def _start_grpc(self) -> None:
        from serving.grpc.front import GrpcFront  # grpcio is imported only when asked for

        settings = self.settings
        self.grpc = GrpcFront(
            self.dataplane, host=settings.grpc_host, port=settings.grpc_port,
            max_message_bytes=settings.max_body_bytes, limits=settings.limits,
            transport=settings.grpc_transport,
            # one of several workers (serving.process.supervisor): each binds the port itself
            reuse_port=os.environ.get("MMC_SERVE_WORKER_INDEX") is not None)
        await self.grpc.start()

    def begin_drain(self) -> None:
        """SIGTERM (serving.cli): stop saying ready at once (HTTP and gRPC health); requests
        and calls are still answered."""
        self.dataplane.draining = True
        front = self.grpc
        if front is not None:  # from a signal handler: schedule it on the loop
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            def drain() -> None:
                self._drain_task = loop.create_task(front.begin_drain())  # kept: not collected

            loop.call_soon_threadsafe(drain)

    async def shutdown(self) -> None:
        """Stop taking gRPC calls (those in flight finish, as HTTP's did before lifespan
        shutdown), stop following the source, release the models and leave the source (last)."""
        if self.grpc is not None:
            await self.grpc.stop(self.settings.drain_seconds)
            self.grpc = None
        if self._started and self.reconciler is not None:
            await self.reconciler.stop()
        if self._started:
            await self.dataplane.admission.stop()
        if self._started and self.dataplane.siblings is not None:
            await self.dataplane.siblings.stop()
        if self._trim_task is not None:
            self._trim_task.cancel()
            self._trim_task = None
        if self.dataplane.operator.board is not None:
            await self.dataplane.operator.board.stop()
        # captured records still queued are written before the process ends
        await asyncio.get_running_loop().run_in_executor(None, self.dataplane.capture.stop)
        if self._tracing.exporting:  # the spans still buffered go out before the process ends
            await asyncio.get_running_loop().run_in_executor(None, self._tracing.flush)
        if self.dataplane.shared_memory is not None:  # every region unmapped
            self.dataplane.shared_memory.close()
        self._started = False

    # -- ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self._started:  # a host that does not send lifespan events
                await self.startup()
            try:
                await self._http(scope, receive, send)
            except ServingError as exc:
                await _respond(send, exc.status, exc.body(), _headers(exc.headers))
            except Exception as exc:  # noqa: BLE001 - a genuine fault: 500, logged once
                log.exception("request failed: %s %s", scope.get("method"), scope.get("path"))
                body = orjson.dumps({"error": f"internal error: {type(exc).__name__}: {exc}"})
                await _respond(send, 500, body, [_CT_JSON])
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # noqa: BLE001
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        root = scope.get("root_path")
        if root and path.startswith(root):
            path = path[len(root):]
        method: str = scope["method"]
        parts = path.rstrip("/").split("/")
        n = len(parts)
        dp = self.dataplane
        head = parts[1] if n > 1 else ""

        if head == "v2":
            section = parts[2] if n > 2 else ""
            if section == "models" and n > 3:
                model = parts[3]
                version = None
                action = parts[4] if n > 4 else ""
                if action == "versions" and n > 5:
                    version = parts[5]
                    action = parts[6] if n > 6 else ""
                    extra = n > 7
                else:
                    extra = n > 5
                if action == "trace" and version is None and n == 6 and parts[5] == "setting":
                    return await self._settings_call(scope, receive, send, "trace", model)
                if extra:
                    raise ModelNotFound(f"no such endpoint {path}")
                if action == "infer":
                    _method(method, "POST")
                    return await self._infer(scope, receive, send, model, version)
                _method(method, "GET")
                key = _api_key(scope["headers"])  # a keyed model's details need its key too
                if model == "stats" and n == 4:
                    await dp.fresh_statistics()
                    return await _json(send, 200, dp.model_stats(None, None, api_key=key))
                if action == "":
                    return await _json(send, 200,
                                       dp.model_metadata(model, version, api_key=key))
                if action == "ready":
                    ok = dp.model_ready(model, version)
                    return await _json(send, 200 if ok else 503, {"name": model, "ready": ok})
                if action == "config":
                    return await _json(send, 200, dp.model_config(model, version, api_key=key))
                if action == "stats":
                    await dp.fresh_statistics()
                    return await _json(send, 200, dp.model_stats(model, version, api_key=key))
                raise ModelNotFound(f"no such endpoint {path}")
            if section == "health" and n == 4:
                _method(method, "GET")
                if parts[3] == "live":
                    return await _respond(send, 200, _LIVE, _LIVE_HEADERS)
                if parts[3] == "ready":
                    ok, body = dp.ready()
                    return await _json(send, 200 if ok else 503, body)
            if section == "" and n <= 2:
                _method(method, "GET")
                return await _json(send, 200, dp.server_metadata())
            if section == "repository":
                return await self._repository(scope, receive, send, parts, path)
            if (section == "trace" and n == 4 and parts[3] == "setting") or \
                    (section == "logging" and n == 3):
                return await self._settings_call(scope, receive, send, section, None)
            if section in ("systemsharedmemory", "cudasharedmemory"):
                body = await self._reader.read(receive, -1, MAX_REGISTER_BODY)
                return await _json(send, 200, shared_memory_call(dp, method, parts, body, path))
        elif head == "invocations" and n == 2:
            _method(method, "POST")
            return await self._infer(scope, receive, send, None, None, sagemaker=True)
        elif head == "ping" and n == 2:
            _method(method, "GET")
            ok, body = dp.ready()
            return await _json(send, 200 if ok else 503, body)
        elif head == "metrics" and n == 2:
            _method(method, "GET")
            await dp.fresh_statistics()
            body, content_type = render_metrics(self._metrics)
            return await _respond(send, 200, body, [(b"content-type", content_type.encode())])
        raise ModelNotFound(f"no such endpoint {path}")

    async def _repository(self, scope, receive, send, parts: list[str], path: str) -> None:
        _method(scope["method"], "POST")
        n = len(parts)
        body = await self._reader.read(receive, -1, 1 << 20)
        if n == 4 and parts[3] == "index":
            ready_only = False
            if body.strip():
                try:
                    doc = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    raise InvalidInput(f"request body is not valid JSON: {exc}") from None
                ready_only = bool(doc.get("ready")) if type(doc) is dict else False
            return await _json(send, 200, self.dataplane.repository_index(ready_only))
        if n == 6 and parts[3] == "models" and parts[5] in ("load", "unload"):
            authorization = next((v.decode("latin-1") for k, v in scope["headers"]
                                  if k == b"authorization"), None)
            await self.dataplane.repository_action(parts[5], parts[4], authorization)
            return await _json(send, 200, {})
        raise ModelNotFound(f"no such endpoint {path}")

    async def _settings_call(self, scope, receive, send, kind: str, model: str | None) -> None:
        """The logging (`kind` "logging") or trace extension's settings: GET reads them, POST
        changes them (an operator's call: serving.core.operator_settings says who may)."""
        operator = self.dataplane.operator
        method = scope["method"]
        if method == "GET":
            return await _json(send, 200, operator.log_settings() if kind == "logging"
                               else operator.trace_settings(model))
        if method != "POST":
            raise MethodNotAllowed(f"method {method} not allowed here (use GET or POST)",
                                   headers={"Allow": "GET, POST"})
        body = await self._reader.read(receive, -1, 1 << 16)
        changes = None
        if body.strip():
            try:
                changes = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(f"request body is not valid JSON: {exc}") from None
        authorization = next((v.decode("latin-1") for k, v in scope["headers"]
                              if k == b"authorization"), None)
        if kind == "logging":
            answer = await operator.change_log_settings(
                {} if changes is None else changes, authorization)
        else:
            answer = await operator.change_trace_settings(changes, authorization, model)
        await _json(send, 200, answer)

    # -- inference ---------------------------------------------------------------------------

    async def _infer(self, scope, receive, send, model: str | None, version: str | None, *,
                     sagemaker: bool = False) -> None:
        if self._tracing.active:  # all that an inference reads of tracing while it is off
            return await self._traced_infer(scope, receive, send, model, version, sagemaker)
        model, request, routing_key, api_key = await self._infer_request(
            scope, receive, model, sagemaker)
        outputs, lv = await self.dataplane.predict(
            model, version, request, routing_key=routing_key, api_key=api_key)
        out, raw = _infer_answer(model, request, outputs, lv)
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        await send({"type": "http.response.body", "body": out})

    async def _traced_infer(self, scope, receive, send, model: str | None, version: str | None,
                            sagemaker: bool) -> None:
        """_infer when tracing may pick this inference: its spans (serving.core.tracing)."""
        started = perf_counter_ns()
        model, request, routing_key, api_key = await self._infer_request(
            scope, receive, model, sagemaker)
        decoded = perf_counter_ns()
        if not self._tracing.picks(model):
            outputs, lv = await self.dataplane.predict(
                model, version, request, routing_key=routing_key, api_key=api_key)
            out, raw = _infer_answer(model, request, outputs, lv)
        else:
            route = "/invocations" if sagemaker else "/v2/models/{model}/infer"
            trace = self._tracing.start(
                _trace_carrier(scope["headers"]), name=f"POST {route}", start_ns=started,
                attributes={"http.request.method": "POST", "http.route": route,
                            "url.path": scope["path"], "mmc.model": model,
                            "mmc.replica": self.dataplane.replica,
                            "mmc.request_id": REQUEST_ID.get() or ""})
            trace.span("decode", started, decoded)
            try:
                outputs, lv = await self.dataplane.predict(
                    model, version, request, routing_key=routing_key, api_key=api_key,
                    trace=trace)
                encoding = perf_counter_ns()
                out, raw = _infer_answer(model, request, outputs, lv)
                trace.span("encode", encoding, perf_counter_ns())
            except BaseException as exc:
                trace.end(exc, {"http.response.status_code": getattr(exc, "status", 500)})
                raise
            trace.end(attributes={"http.response.status_code": 200,
                                  "mmc.version": lv.version})
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        await send({"type": "http.response.body", "body": out})

    async def _infer_request(self, scope, receive, model: str | None,
                             sagemaker: bool) -> tuple:
        """(model, decoded request, routing key, predict keys) of an infer call; the request's
        id (X-Request-Id, else the body's `id`) set for the log lines it causes."""
        header_length = content_type = encoding = routing_key = api_key = target = None
        request_id = None
        length = -1
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                header_length = value
            elif key == b"content-length":
                length = int(value) if value.isdigit() else -1
            elif key == b"content-type":
                content_type = value
            elif key == b"content-encoding":
                encoding = value
            elif key == b"x-routing-key":
                routing_key = value.decode("latin-1")
            elif key == b"authorization":
                api_key = with_key(api_key, _bearer(value))
            elif key == b"x-api-key":
                api_key = with_key(api_key, value.decode("latin-1"))
            elif key == b"x-amzn-sagemaker-target-model":
                target = value.decode("latin-1")
            elif key == b"x-request-id":
                request_id = value.decode("latin-1")[:128]
        limit = self._limit
        if length > limit:
            raise PayloadTooLarge(f"request body of {length} bytes exceeds the limit of "
                                  f"{limit} bytes")
        body = await self._reader.read(receive, length, limit)
        if encoding is not None:
            body = decompress(body, encoding.decode("latin-1"), limit=limit)
        hlen = None
        if header_length is not None:
            if not header_length.isdigit():
                raise InvalidInput(f"Inference-Header-Content-Length must be a byte count, got "
                                   f"{header_length.decode('latin-1')!r}")
            hlen = int(header_length)
        if sagemaker:
            smlen = sagemaker_header_length(content_type.decode("latin-1")
                                            if content_type else None)
            if smlen is not None:
                hlen = smlen
            model = self._sagemaker_model(target)
        request = decode_infer_request(body, header_length=hlen)
        REQUEST_ID.set(request_id or request.id)
        return model, request, routing_key, api_key

    def _sagemaker_model(self, target: str | None) -> str:
        dp = self.dataplane
        routes = dp.table.routes
        if target:
            if target in routes:
                return target
            for suffix in (".tar.gz", ".onnx"):
                if target.endswith(suffix) and target[: -len(suffix)] in routes:
                    return target[: -len(suffix)]
            raise dp.unknown_model(target, "X-Amzn-SageMaker-Target-Model")
        if len(routes) == 1:
            return next(iter(routes))
        if not dp.started:
            raise ReplicaStarting(dp.replica)
        raise InvalidInput(
            f"this container serves {len(routes)} models ({', '.join(sorted(routes))}); name "
            "one with the X-Amzn-SageMaker-Target-Model header")


# -- helpers -------------------------------------------------------------------------------


def _infer_answer(model: str, request, outputs, lv) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """An infer call's answer: its body and headers (X-Model-Version names who answered)."""
    out, headers = encode_infer_response(
        model_name=model, model_version=lv.version, request_id=request.id, outputs=outputs,
        requested=request.outputs, binary_output=request.binary_output, batched=lv.batched)
    version_header = lv.transport_cache.get("http")
    if version_header is None:
        version_header = lv.transport_cache["http"] = (b"x-model-version", lv.version.encode())
    named = (version_header,)
    request_id = REQUEST_ID.get()
    if request_id and request_id != request.id:  # X-Request-Id's, or one capture gave it
        named = (version_header, (b"x-request-id", request_id.encode("latin-1", "replace")))
    if len(headers) == 1:  # JSON answer: the common case, prebuilt tuples
        return out, [_CT_JSON, *named, (b"content-length", b"%d" % len(out))]
    raw = _headers(headers)
    raw.extend(named)
    raw.append((b"content-length", b"%d" % len(out)))
    return out, raw


def _trace_carrier(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The W3C trace context headers a traced request came with (traceparent, tracestate,
    baggage), for OpenTelemetry's propagator."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers
            if k in (b"traceparent", b"tracestate", b"baggage")}


def _method(method: str, wanted: str) -> None:
    if method != wanted:
        raise MethodNotAllowed(f"method {method} not allowed here (use {wanted})",
                               headers={"Allow": wanted})


def _bearer(value: bytes) -> str | None:
    scheme, _, token = value.decode("latin-1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _api_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The predict keys from `Authorization: Bearer <key>` and `X-Api-Key` (a list, or the
    header repeated), as infer reads them (infer scans its headers once for everything)."""
    api_key = None
    for key, value in headers:
        if key == b"authorization":
            api_key = with_key(api_key, _bearer(value))
        elif key == b"x-api-key":
            api_key = with_key(api_key, value.decode("latin-1"))
    return api_key



def _headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def _respond(send: Send, status: int, body: bytes,
                   headers: list[tuple[bytes, bytes]]) -> None:
    if not any(k == b"content-type" for k, _ in headers):
        headers = [*headers, _CT_JSON]
    if not any(k == b"content-length" for k, _ in headers):
        headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, doc) -> None:
    body = orjson.dumps(doc)
    await send({"type": "http.response.start", "status": status,
                "headers": [_CT_JSON, (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def shared_memory_registry(limits: EdgeLimits) -> SharedMemoryRegistry | None:
    """System shared memory where MMC_SHM turns it on, bounded by the limits; else None."""
    if not limits.shared_memory:
        return None
    return SharedMemoryRegistry(max_regions=limits.shared_memory_max_regions,
                                max_bytes=limits.shared_memory_max_bytes)


def create_app(source: DesiredStateSource, *, replica: str,
               settings: ServingSettings | None = None) -> ServingApp:
    """The serving ASGI app over `source`; mount it at /v2, /ping, /invocations, /metrics.
    Lifespan startup starts the reconciler (or the first request does, if no lifespan)."""
    settings = settings or ServingSettings.from_env()
    if settings.grpc_port is not None:  # its extra missing: stop now, not at the first call
        require("grpc", feature=f"gRPC is on (MMC_GRPC_PORT={settings.grpc_port})")
    json_numbers.log_if_unavailable()
    admission = Admission(store=quota_store(settings.quota_redis_url,
                                            workers_folder=siblings.shared_folder()),
                          sync_seconds=settings.quota_sync_seconds)
    dataplane = DataPlane(replica=replica, max_output_bytes=settings.max_output_bytes,
                          admission=admission,
                          tracing=Tracing.from_env(service="mmc-serve", instance=replica),
                          response_cache_bytes=settings.response_cache_bytes,
                          shared_memory=shared_memory_registry(settings.limits))
    dataplane.capture = CaptureQueue.from_env(getattr(source, "store_capture", None))
    dataplane.siblings = siblings.from_environment(replica, dataplane.all_stats,
                                                   counters=admission.counters)
    if dataplane.siblings is not None:  # log and trace settings changed on one worker reach all
        dataplane.operator.board = SettingsBoard(dataplane.siblings.folder)
    reconciler = Reconciler(
        source, dataplane, poll_seconds=settings.poll_seconds,
        heartbeat_seconds=settings.heartbeat_seconds,
        intra_op_threads=settings.intra_op_threads, providers=settings.providers,
        cold_start_wait_seconds=settings.cold_start_wait_seconds)
    return ServingApp(dataplane, reconciler, settings)
