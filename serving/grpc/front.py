"""The gRPC front: KServe v2 `inference.GRPCInferenceService` (with Triton's extensions that
tritonclient.grpc calls) over the same DataPlane as the HTTP front, in the HTTP server's event
loop; plus gRPC health checking and server reflection, grpcio's own servicers.

Two transports carry it (MMC_GRPC_TRANSPORT), both bounded by the listeners' one set of limits
(serving.edge_limits.EdgeLimits) and by the answer budget below: `fast` (the default) is our own
HTTP/2 connection (serving.grpc.server over serving.grpc.http2), answered in the event loop with one
write; `grpcio` is grpcio's asyncio server configured from the same figures, whose calls cross
three threads (about a seventh of `fast`'s MLP calls per second on one core here). Both meet
the same attacks at least as well as a plain grpcio server (tests/serving/test_edge_attacks.py,
bench/edge.py; docs/edge.md has the figures).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from time import perf_counter_ns

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from serving.core.dataplane import DataPlane, with_key
from serving.core.errors import InvalidInput, ModelNotFound, ReplicaStarting, ServingError
from serving.core.logs import REQUEST_ID
from serving.core.shared_memory import cuda_shared_memory_refusal
from serving.edge_limits import EdgeLimits, trim_heap_soon
from serving.grpc.codec import (
    decode_model_infer_request,
    encode_model_infer_response,
    log_settings_changes,
    log_settings_response,
    parse_model_infer_request,
    trace_setting_changes,
    trace_setting_response,
)

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
#: The data plane's HTTP status -> the gRPC status code a client sees (once, for every call).
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
#: The metadata a traced call's W3C trace context comes in.
_TRACE_CONTEXT = ("traceparent", "tracestate", "baggage")
#: How often the health service re-reads the data plane's readiness (for Watch; Check reads
#: it at once).
HEALTH_POLL_SECONDS = 0.5


def status_code(error: ServingError) -> grpc.StatusCode:
    return getattr(error, "grpc_code", None) or STATUS_CODES.get(error.status,
                                                                  grpc.StatusCode.INTERNAL)


class AnswerBudgetExhausted(ServingError):
    """The process holds as many unsent answer bytes as EdgeLimits allows (gRPC only: HTTP
    writes wait for the client to read)."""

    status = 503
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "1"})


class AnswerBudget:
    """Bytes of gRPC answers handed to the transport and not yet sent, whole process.

    A unary answer is queued whole whether or not the client reads it: the transport keeps it
    until the client's flow-control window lets it out, so clients that grant a window of 0
    and keep asking would otherwise make the server compute and hold every answer. An answer
    holds its size here from when it is made until its call is done (the context's done
    callback: the answer went out, or the call ended); one that does not fit is refused
    RESOURCE_EXHAUSTED, and while the budget is full a call is refused before its inference."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._high_water = 0  # most bytes held since the heap was last trimmed

    def full(self) -> bool:
        return bool(self.limit) and self.held >= self.limit

    def refusal(self, size: int | None = None) -> AnswerBudgetExhausted:
        what = f"an answer of {size} bytes" if size is not None else "another answer"
        return AnswerBudgetExhausted(
            f"the server holds {self.held} bytes of answers its clients have not read yet; "
            f"{what} would exceed its budget of {self.limit} bytes "
            "(MMC_UNSENT_ANSWER_BUDGET_BYTES): retry shortly")

    def hold(self, size: int, context) -> bool:
        """Take `size` bytes until `context`'s call is done; False when they do not fit (one
        answer alone always fits)."""
        if not self.limit:
            return True
        add_done = context.add_done_callback
        if self.held and self.held + size > self.limit:
            return False
        self.held += size
        self._high_water = max(self._high_water, self.held)
        add_done(lambda _call: self._release(size))
        return True

    def _release(self, size: int) -> None:
        self.held -= size
        if not self.held and self._high_water >= self.limit // 2:
            # what the held answers freed goes back to the OS, as serving.edge_limits does for
            # request bodies: glibc would keep it in its heap after the attack
            self._high_water = 0
            trim_heap_soon()


def _trailers(error: ServingError) -> tuple[tuple[str, str], ...]:
    """The error's HTTP headers (Retry-After, WWW-Authenticate) as trailing metadata."""
    return tuple((k.lower(), v) for k, v in error.headers.items() if k.lower() != "connection")


def _answers(method):
    """Run one unary call; a typed data-plane error aborts it with its status code."""

    @functools.wraps(method)
    async def call(self, request, context: grpc.aio.ServicerContext):
        try:
            return await method(self, request, context)
        except ServingError as exc:
            await context.abort(status_code(exc), exc.message, _trailers(exc))
        except Exception as exc:  # noqa: BLE001 - a genuine fault: INTERNAL, logged once
            log.exception("gRPC %s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"internal error: {type(exc).__name__}: {exc}")

    return call


class _Caller:
    """What a call's metadata says: predict key, routing key, pinned version, authorization,
    request id (and the metadata itself, where a traced call's traceparent is)."""

    __slots__ = ("api_key", "routing_key", "version", "authorization", "request_id", "metadata")

    def __init__(self, metadata) -> None:
        self.api_key = self.routing_key = self.version = self.authorization = None
        self.request_id = None
        self.metadata = metadata
        for key, value in metadata or ():
            if key == "authorization":
                self.authorization = value
                scheme, _, token = value.partition(" ")
                if scheme.lower() == "bearer":
                    self.api_key = with_key(self.api_key, token)
            elif key == "x-api-key":
                self.api_key = with_key(self.api_key, value)
            elif key == "x-routing-key":
                self.routing_key = value
            elif key == "x-model-version":
                self.version = value
            elif key == "x-request-id":
                self.request_id = value[:128]


def _version(request_version: str, caller: _Caller) -> str | None:
    """The pinned version: the request's `model_version`, else `x-model-version` metadata."""
    if request_version and caller.version and request_version != caller.version:
        raise InvalidInput(f"model_version '{request_version}' and x-model-version metadata "
                      f"'{caller.version}' disagree")
    return request_version or caller.version or None


class _Health(health.aio.HealthServicer):
    """grpc.health.v1.Health whose Check reads the data plane's readiness at once (Watch
    follows it through GrpcFront's poll)."""

    def __init__(self, refresh) -> None:
        super().__init__()
        self._refresh = refresh

    async def Check(self, request, context):
        await self._refresh()
        return await super().Check(request, context)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """`inference.GRPCInferenceService` over one DataPlane."""

    def __init__(self, dataplane: DataPlane, answers: AnswerBudget | None = None) -> None:
        self.dataplane = dataplane
        self.answers = answers if answers is not None else AnswerBudget(0)
        self.tracing = dataplane.tracing  # its `active`: read once per inference

    # -- health and metadata -----------------------------------------------------------------

    @_answers
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    @_answers
    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.dataplane.ready()[0])

    @_answers
    async def ModelReady(self, request, context):
        """Unknown models are simply not ready (Triton's answer; tritonclient's bool)."""
        try:
            ready = self.dataplane.model_ready(request.name, request.version or None)
        except (ModelNotFound, ReplicaStarting):
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    @_answers
    async def ServerMetadata(self, request, context):
        meta = self.dataplane.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                         extensions=meta["extensions"])

    @_answers
    async def ModelMetadata(self, request, context):
        caller = _Caller(context.invocation_metadata())
        meta = self.dataplane.model_metadata(request.name, request.version or None,
                                             api_key=caller.api_key)
        return json_format.ParseDict(meta, pb.ModelMetadataResponse())

    @_answers
    async def ModelConfig(self, request, context):
        caller = _Caller(context.invocation_metadata())
        config = self.dataplane.model_config(request.name, request.version or None,
                                             api_key=caller.api_key)
        versions = config["version_policy"]["specific"]["versions"]
        if not all(v.isdigit() for v in versions):  # Triton's versions are numbers
            del config["version_policy"]
        message = json_format.ParseDict(config, model_config_pb2.ModelConfig(),
                                        ignore_unknown_fields=True)
        return pb.ModelConfigResponse(config=message)

    @_answers
    async def ModelStatistics(self, request, context):
        caller = _Caller(context.invocation_metadata())
        await self.dataplane.fresh_statistics()
        stats = self.dataplane.model_stats(request.name or None, request.version or None,
                                           api_key=caller.api_key)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)  # `shadow` is ours

    # -- inference ---------------------------------------------------------------------------

    async def _infer(self, request: pb.ModelInferRequest, caller: _Caller, raw=None,
                     method: str = "ModelInfer"):
        if not request.model_name:
            raise InvalidInput("model_name is required")
        if self.tracing.active:  # all that an inference reads of tracing while it is off
            return await self._traced_infer(request, caller, raw, method)
        decoded = decode_model_infer_request(request, raw)
        REQUEST_ID.set(caller.request_id or decoded.id or None)  # for the log lines it causes
        outputs, lv = await self.dataplane.predict(
            request.model_name, _version(request.model_version, caller), decoded,
            routing_key=caller.routing_key, api_key=caller.api_key)
        response = encode_model_infer_response(
            model_name=request.model_name, model_version=lv.version, request=decoded,
            outputs=outputs, batched=lv.batched)
        return response, lv

    async def _traced_infer(self, request: pb.ModelInferRequest, caller: _Caller, raw,
                            method: str):
        """_infer when tracing may pick this call: its spans (serving.core.tracing)."""
        started = perf_counter_ns()
        model = request.model_name
        decoded = decode_model_infer_request(request, raw)
        REQUEST_ID.set(caller.request_id or decoded.id or None)
        done = perf_counter_ns()
        version = _version(request.model_version, caller)
        if not self.tracing.picks(model):
            outputs, lv = await self.dataplane.predict(
                model, version, decoded, routing_key=caller.routing_key, api_key=caller.api_key)
            return encode_model_infer_response(
                model_name=model, model_version=lv.version, request=decoded, outputs=outputs,
                batched=lv.batched), lv
        trace = self.tracing.start(
            {k: v for k, v in caller.metadata or () if k in _TRACE_CONTEXT},
            name=f"{SERVICE}/{method}", start_ns=started,
            attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method,
                        "mmc.model": model, "mmc.replica": self.dataplane.replica,
                        "mmc.request_id": REQUEST_ID.get() or ""})
        trace.span("decode", started, done)
        try:
            outputs, lv = await self.dataplane.predict(
                model, version, decoded, routing_key=caller.routing_key, api_key=caller.api_key,
                trace=trace)
            encoding = perf_counter_ns()
            response = encode_model_infer_response(
                model_name=model, model_version=lv.version, request=decoded, outputs=outputs,
                batched=lv.batched)
            trace.span("encode", encoding, perf_counter_ns())
        except BaseException as exc:
            code = status_code(exc) if isinstance(exc, ServingError) else grpc.StatusCode.UNKNOWN
            trace.end(exc, {"rpc.grpc.status_code": code.value[0]})
            raise
        trace.end(attributes={"rpc.grpc.status_code": 0, "mmc.version": lv.version})
        return response, lv

    @_answers
    async def ModelInfer(self, request, context):
        if isinstance(request, InvalidInput):  # _parse_infer_request's: not a message
            raise request
        message, raw = request  # parse_model_infer_request's, registered in start()
        if self.answers.full():  # refused before it costs a computation
            raise self.answers.refusal()
        response, lv = await self._infer(message, _Caller(context.invocation_metadata()), raw)
        size = response.ByteSize()
        if not self.answers.hold(size, context):
            del response  # not kept alive by the refusal's traceback
            raise self.answers.refusal(size)
        # Trailing, not initial: sent with the answer and its status in one batch, where
        # send_initial_metadata costs a write of its own (~15% of a call's loop time).
        metadata = lv.transport_cache.get("grpc")
        if metadata is None:
            metadata = lv.transport_cache["grpc"] = (("x-model-version", lv.version),)
        context.set_trailing_metadata(metadata)
        return response

    async def ModelStreamInfer(self, request_iterator, context):
        """Each request runs as it arrives; answers go back as they finish (tritonclient
        matches them by id). A failed request is an answer with `error_message`, and the
        stream goes on, as Triton does."""
        caller = _Caller(context.invocation_metadata())
        answers: asyncio.Queue = asyncio.Queue()
        running: set[asyncio.Task] = set()

        async def one(request) -> None:
            try:
                response, _ = await self._infer(request, caller, method="ModelStreamInfer")
                answers.put_nowait(pb.ModelStreamInferResponse(infer_response=response))
            except ServingError as exc:
                answers.put_nowait(_stream_error(request, exc.message))
            except Exception as exc:  # noqa: BLE001 - a genuine fault, logged once
                log.exception("gRPC ModelStreamInfer request failed")
                answers.put_nowait(_stream_error(request, f"internal error: {exc}"))

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.create_task(one(request))
                running.add(task)
                task.add_done_callback(running.discard)

        reader = asyncio.create_task(read())
        try:
            while True:
                getter = asyncio.ensure_future(answers.get())
                await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                    continue
                getter.cancel()
                if reader.exception() is not None:
                    raise reader.exception()
                if running:
                    await asyncio.gather(*running, return_exceptions=True)
                while not answers.empty():
                    yield answers.get_nowait()
                return
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    # -- repository --------------------------------------------------------------------------

    @_answers
    async def RepositoryIndex(self, request, context):
        index = self.dataplane.repository_index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in index])

    @_answers
    async def RepositoryModelLoad(self, request, context):
        caller = _Caller(context.invocation_metadata())
        await self.dataplane.repository_action("load", request.model_name, caller.authorization)
        return pb.RepositoryModelLoadResponse()

    @_answers
    async def RepositoryModelUnload(self, request, context):
        caller = _Caller(context.invocation_metadata())
        await self.dataplane.repository_action("unload", request.model_name,
                                               caller.authorization)
        return pb.RepositoryModelUnloadResponse()

    # -- the trace and logging extensions (serving.core.operator_settings) ----------------------

    @_answers
    async def TraceSetting(self, request, context):
        """No settings: read them (the model's, with model_name); else change them."""
        operator = self.dataplane.operator
        model = request.model_name or None
        if not request.settings:
            return trace_setting_response(operator.trace_settings(model))
        caller = _Caller(context.invocation_metadata())
        return trace_setting_response(await operator.change_trace_settings(
            trace_setting_changes(request), caller.authorization, model))

    @_answers
    async def LogSettings(self, request, context):
        operator = self.dataplane.operator
        if not request.settings:
            return log_settings_response(operator.log_settings())
        caller = _Caller(context.invocation_metadata())
        return log_settings_response(await operator.change_log_settings(
            log_settings_changes(request), caller.authorization))

    # -- system shared memory (serving.core.shared_memory) -------------------------------------

    @_answers
    async def SystemSharedMemoryStatus(self, request, context):
        regions = self.dataplane.shared_memory_regions().status(request.name or None)
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(
            regions={region["name"]: status(**region) for region in regions})

    @_answers
    async def SystemSharedMemoryRegister(self, request, context):
        self.dataplane.shared_memory_regions().register(
            name=request.name, key=request.key, offset=request.offset,
            byte_size=request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_answers
    async def SystemSharedMemoryUnregister(self, request, context):
        regions = self.dataplane.shared_memory_regions()
        if request.name:
            regions.unregister(request.name)
        else:
            regions.unregister_all()
        return pb.SystemSharedMemoryUnregisterResponse()

    @_answers
    async def CudaSharedMemoryStatus(self, request, context):
        raise cuda_shared_memory_refusal()

    CudaSharedMemoryRegister = CudaSharedMemoryUnregister = CudaSharedMemoryStatus


def _parse_infer_request(data):
    """ModelInfer's request, or the InvalidInput saying why it is not one: a deserializer that
    raises makes grpcio answer UNKNOWN, where a caller's malformed message is INVALID_ARGUMENT."""
    try:
        return parse_model_infer_request(data)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and kin
        return InvalidInput(f"the ModelInferRequest message cannot be parsed: {exc}")


def _stream_error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """A stream answer for a failed request: tritonclient reads `error_message`; the echoed
    name, version and id say which request it was."""
    return pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id))


#: MMC_GRPC_TRANSPORT's values (see the module's docstring)
TRANSPORTS = ("fast", "grpcio")


def grpcio_options(limits: EdgeLimits, *, max_message_bytes: int, max_connections: int,
                   reuse_port: bool) -> list[tuple[str, int]]:
    """grpcio's channel arguments for our limits: each bound a number from EdgeLimits."""
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ("grpc.server_handshake_timeout_ms", int(limits.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(limits.idle_timeout_s * 1000)),
        ("grpc.http2.min_ping_interval_without_data_ms", int(limits.min_ping_interval_s * 1000)),
        ("grpc.http2.max_ping_strikes", limits.max_ping_strikes),
        ("grpc.max_metadata_size", limits.max_header_bytes),
        ("grpc.absolute_max_metadata_size", limits.max_header_bytes),
        # grpcio binds with SO_REUSEPORT unless told not to: a second server on a taken port
        # would then share it silently instead of failing to start
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]
    if max_connections:
        options.append(("grpc.max_allowed_incoming_connections", max_connections))
    return options


class _GrpcioServer:
    """grpcio's asyncio server behind the few calls GrpcFront makes of a transport."""

    def __init__(self, options: list) -> None:
        self._server = grpc.aio.server(options=options)

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self._server.add_registered_method_handlers(service, handlers)

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        bound = self._server.add_insecure_port(f"{host}:{port}")
        if not bound:
            raise OSError(f"gRPC: cannot listen on {host}:{port}")
        await self._server.start()
        return bound

    async def stop(self, grace: float) -> None:
        await self._server.stop(grace)


class GrpcFront:
    """The gRPC server beside the HTTP one, in the same event loop and process: started after
    the reconciler, NOT_SERVING from the drain's start, stopped (no new calls, in-flight ones
    finish) before the models are released."""

    def __init__(self, dataplane: DataPlane, *, host: str, port: int,
                 max_message_bytes: int, reuse_port: bool = False,
                 limits: EdgeLimits | None = None, transport: str = "fast") -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"MMC_GRPC_TRANSPORT={transport!r}: one of {', '.join(TRANSPORTS)}")
        self.dataplane = dataplane
        self.address = f"{host}:{port}"
        self.port = port
        self.max_message_bytes = max_message_bytes
        self.reuse_port = reuse_port
        self.limits = limits if limits is not None else EdgeLimits()
        self.transport = transport
        self.server = None  # the transport's server, while started
        self.health = _Health(self._sync_health)
        self._watch: asyncio.Task | None = None
        self._draining = False

    async def start(self) -> None:
        server = self._new_server()
        servicer = InferenceServicer(self.dataplane,
                                     AnswerBudget(self.limits.unsent_answer_budget_bytes))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        # ModelInfer's large raw inputs stay in the received buffer (no protobuf copy)
        server.add_registered_method_handlers(SERVICE, {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(
                servicer.ModelInfer, request_deserializer=_parse_infer_request,
                response_serializer=pb.ModelInferResponse.SerializeToString)})
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection.aio.ReflectionServicer(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME)), server)
        host, _, _ = self.address.rpartition(":")
        self.port = await server.start(host, self.port, reuse_port=self.reuse_port)
        await self._sync_health()
        self.server = server
        self._watch = asyncio.create_task(self._follow_readiness())
        log.info("gRPC on %s", self.address)

    def _new_server(self):
        connections = self.limits.connection_caps(grpc=True)[1]
        if self.transport == "fast":
            from serving.grpc.server import GrpcServer

            return GrpcServer(max_receive_message_length=self.max_message_bytes,
                              limits=self.limits, max_connections=connections)
        return _GrpcioServer(grpcio_options(
            self.limits, max_message_bytes=self.max_message_bytes, max_connections=connections,
            reuse_port=self.reuse_port))

    async def _sync_health(self) -> None:
        """'' (the server) and the inference service: SERVING exactly when /v2/health/ready
        says ready."""
        if self._draining:
            return
        serving = self.dataplane.ready()[0]
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", SERVICE):
            await self.health.set(service, status)

    async def _follow_readiness(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_POLL_SECONDS)
            try:
                await self._sync_health()
            except Exception:  # noqa: BLE001 - keep following; the next tick tries again
                log.exception("gRPC health update failed")

    async def begin_drain(self) -> None:
        """SIGTERM: health says NOT_SERVING from now on; calls are still answered."""
        self._draining = True
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace: float) -> None:
        """No new calls; the ones in flight get `grace` seconds to finish."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self.server is not None:
            if not self._draining:
                await self.begin_drain()
            await self.server.stop(grace)
            self.server = None
