"""gRPC calls over serving.grpc.http2 connections, in the event loop that serves HTTP.

It takes grpcio's own handler objects (`add_generic_rpc_handlers` /
`add_registered_method_handlers`, which generated `add_*_to_server` functions call), so the
KServe servicer, grpc health and reflection register on it unchanged, and hands each call a
context with the grpc.aio.ServicerContext methods they use. The wire is the gRPC over HTTP/2
protocol: length-prefixed messages (identity, gzip or deflate in), `grpc-timeout` deadlines,
status and trailing metadata in the trailers, a trailers-only answer for an error before any
message.

What a client can make it hold is bounded as grpcio's server bounds it, from the same
serving.edge_limits.EdgeLimits: a message's bytes are held only as they arrive (and refused once its
declared length is over max_receive_message_length), compressed ones inflate no further than
that limit, every call's unfinished request bytes share one budget (buffered_body_budget_bytes),
a stream's window opens only as its call takes what came, and connections are capped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import functools
import inspect
import logging
import socket
import zlib

import grpc

from serving.edge_limits import EdgeLimits
from serving.grpc.http2 import STREAM_WINDOW, Http2Connection, Stream, header_field, status_field
from serving.process.supervisor import reuse_port_listener

log = logging.getLogger(__name__)

_OK = grpc.StatusCode.OK
_HEADERS = (status_field(200) + header_field(b"content-type", b"application/grpc")
            + header_field(b"grpc-accept-encoding", b"identity,deflate,gzip"))
_STATUS_OK = header_field(b"grpc-status", b"0")
_STATUS_UNKNOWN_CT = header_field(b"grpc-status", b"2") + header_field(
    b"grpc-message", b"content-type must be application/grpc")
_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3,
                  ord("u"): 1e-6, ord("n"): 1e-9}
#: zlib window bits per grpc-encoding: gzip's header and trailer, or zlib's (deflate)
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
#: Request headers that are the protocol's, not the caller's metadata.
_RESERVED = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding",
                       b"grpc-accept-encoding", b"connection"))
_END = object()


def _code(code: grpc.StatusCode) -> int:
    return code.value[0]


def _percent(text: str) -> bytes:
    """grpc-message's percent-encoding: printable ASCII but '%' as is, the rest %XX."""
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
                    for b in text.encode())


@functools.lru_cache(maxsize=512)
def _metadata_block(metadata: tuple) -> bytes:
    """Metadata as header fields (`-bin` keys base64, as the protocol wants); the same few
    tuples (a version's `x-model-version`) come back on every call, hence the cache."""
    out = []
    for key, value in metadata:
        key = key.lower()
        if key.endswith("-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            out.append(header_field(key.encode(), base64.b64encode(raw).rstrip(b"=")))
        else:
            out.append(header_field(key.encode(), value.encode() if isinstance(value, str)
                                    else bytes(value)))
    return b"".join(out)


def _timeout(value: bytes) -> float | None:
    if 2 <= len(value) <= 9 and value[:-1].isdigit() and value[-1] in _TIMEOUT_UNITS:
        return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]
    return None


def _read_headers(headers: list) -> tuple:
    """(path, method, content type, encoding, timeout, metadata) of a call's request headers."""
    path = method = content_type = encoding = timeout = None
    metadata = []
    for name, value in headers:
        if name[:1] == b":":
            if name == b":path":
                path = value.decode("latin-1")
            elif name == b":method":
                method = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = _timeout(value)
        elif name == b"grpc-encoding":
            encoding = value
        elif name not in _RESERVED:
            key = name.decode("latin-1")
            if key.endswith("-bin"):
                try:
                    raw = base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
                except binascii.Error:
                    raise _Abort(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"metadata header {key!r} is not valid base64") from None
                metadata.append((key, raw))
            else:
                metadata.append((key, value.decode("latin-1")))
    return path, method, content_type, encoding, timeout, tuple(metadata)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _inflate(raw: bytes, encoding: bytes, limit: int) -> bytes:
    """A compressed message, inflated no further than `limit` bytes: a bomb costs the limit's
    worth of work at most, then RESOURCE_EXHAUSTED."""
    inflater = zlib.decompressobj(_WBITS[encoding])
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise _Abort(grpc.StatusCode.INTERNAL, f"cannot decompress the message: {exc}") from exc
    if len(out) > limit:
        raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                     f"Received message larger than max (more than {limit} bytes once "
                     f"inflated vs. {limit})")
    if not inflater.eof:
        raise _Abort(grpc.StatusCode.INTERNAL,
                     "cannot decompress the message: the compressed data is cut short")
    return out


class _Requests:
    """A streaming call's request messages as an async iterator (the handler's
    request_iterator). Each message taken tells the call, which opens the stream's window."""

    def __init__(self, call: Call) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.call = call
        self.sizes: collections.deque[int] = collections.deque()  # wire bytes of each queued
        self.queued = 0

    def put(self, message, size: int) -> None:
        self.sizes.append(size)
        self.queued += size
        self.queue.put_nowait(message)

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if item is _END:
            self.queue.put_nowait(_END)  # a second reader ends too
            raise StopAsyncIteration
        size = self.sizes.popleft()
        self.queued -= size
        self.call.taken(size)
        return item


class Call:
    """One RPC on one stream, and its handler's context (the grpc.aio.ServicerContext
    methods the servicers here call)."""

    def __init__(self, server: GrpcServer, stream: Stream, handler, metadata: tuple,
                 encoding: bytes | None, timeout: float | None) -> None:
        self.server = server
        self.stream = stream
        self.handler = handler
        self.metadata = metadata
        self.encoding = encoding
        self.body = bytearray()
        self.size: int | None = None  # a unary call's message, prefix included, once known
        self.held = 0  # request bytes held across DATA frames (the server's budget)
        self.requests: _Requests | None = _Requests(self) if handler.request_streaming else None
        self.task: asyncio.Task | None = None
        self.trailing: tuple = ()
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self.finished = False
        self._cancelled = False
        loop = stream.conn.loop
        self.deadline = loop.time() + timeout if timeout is not None else None
        self._timer = loop.call_at(self.deadline, self._deadline) if timeout is not None else None

    # -- the context -------------------------------------------------------------------------

    def invocation_metadata(self) -> tuple:
        return self.metadata

    def add_done_callback(self, callback) -> None:
        """`callback(self)` once the call's stream has ended: its answer sent in full, or the
        stream reset or its connection gone (grpc.aio's; serving.grpc.front's answer budget)."""
        stream = self.stream
        if stream.conn.streams.get(stream.id) is not stream:  # ended already (_forget)
            callback(self)
            return
        if stream.on_done is None:
            stream.on_done = []
        stream.on_done.append(lambda: callback(self))

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing = tuple(metadata)

    def trailing_metadata(self) -> tuple:
        return self.trailing

    async def send_initial_metadata(self, metadata) -> None:
        if not self.stream.headers_sent:
            self.stream.send_headers(_HEADERS + _metadata_block(tuple(metadata)))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise _Abort(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self):
        return self._code

    def details(self) -> str:
        return self._details

    def peer(self) -> str:
        return self.stream.conn.peer

    def time_remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self.stream.conn.loop.time())

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self.finished

    async def write(self, message) -> None:
        if self.finished:
            raise asyncio.CancelledError
        self._send_message(self._serialize(message))
        await self.stream.drained()

    async def read(self):
        try:
            return await self.requests.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF

    def disable_next_message_compression(self) -> None:
        pass  # answers are never compressed

    # -- the wire ----------------------------------------------------------------------------

    def on_data(self, data: memoryview, end: bool) -> None:
        if self.requests is None:  # unary: one message, taken whole at the end
            self._unary_data(data, end)
            return
        body = self.body
        if data:
            if not self._hold(len(data)):
                return
            body += data
        limit = self.server.max_receive_message_length
        while len(body) >= 5:
            length = int.from_bytes(body[1:5], "big")
            if length > limit:
                self._too_large(length)
                return
            if len(body) < 5 + length:
                break
            size = 5 + length  # what the message holds while queued: inflated, if compressed
            try:
                raw = bytes(body[5:size])
                if body[0]:
                    raw = self._inflate(raw)
                    grown = len(raw) - length
                    if grown > 0:
                        if not self._hold(grown):
                            return
                        size += grown
                message = self._deserialize(raw)
            except _Abort as exc:
                self.fail(exc.code, exc.details)
                return
            del body[:5 + length]
            self.requests.put(message, size)
        if end:
            if body:
                self.fail(grpc.StatusCode.INTERNAL, "the request ended inside a message")
                return
            self.requests.queue.put_nowait(_END)
        else:
            self._open_window()

    def taken(self, size: int) -> None:
        """The handler took a message: its bytes leave the budget, the window opens again."""
        size = min(size, self.held)
        self.held -= size
        self.server.buffered -= size
        if not self.finished:
            self._open_window()

    def _open_window(self) -> None:
        """A streaming call may hold a window's worth of bytes its handler has not taken; with
        none waiting to be taken, the rest of the message it is receiving, however long."""
        want = STREAM_WINDOW - self.held
        if not self.requests.queued:
            body = self.body
            rest = 5 + int.from_bytes(body[1:5], "big") - len(body) if len(body) >= 5 else 5
            want = max(want, rest)
        self.stream.open_window(want)

    def _hold(self, n: int) -> bool:
        """Count n more request bytes held; past the server's budget the call fails."""
        server = self.server
        if server.buffered + n > server.buffer_budget:
            self.fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"the server is buffering {server.buffered} bytes of requests; "
                      f"{n} more would exceed its budget of {server.buffer_budget}: retry")
            return False
        self.held += n
        server.buffered += n
        return True

    def _release(self) -> None:
        if self.held:
            self.server.buffered -= self.held
            self.held = 0
        if self.body:
            self.body = bytearray()

    def _message(self, compressed: int, raw):
        return self._deserialize(self._inflate(raw) if compressed else raw)

    def _inflate(self, raw: bytes) -> bytes:
        if self.encoding not in _WBITS:
            raise _Abort(grpc.StatusCode.INTERNAL,
                         "a compressed message without a grpc-encoding that says how")
        return _inflate(raw, self.encoding, self.server.max_receive_message_length)

    def _deserialize(self, raw):
        deserialize = self.handler.request_deserializer
        if deserialize is None:
            return bytes(raw)
        try:
            return deserialize(raw)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's
            raise _Abort(grpc.StatusCode.INTERNAL,
                         f"Exception deserializing request: {exc}") from exc

    def _unary_data(self, data: memoryview, end: bool) -> None:
        """The message's bytes are held as they arrive, never as its length declares (a
        length is a claim; memory is spent on bytes received), and none past that length."""
        n = len(data)
        if n:
            body = self.body
            size = self.size
            if size is None:
                if not end and not self._hold(n):
                    return
                body += data
                if len(body) >= 5:
                    length = int.from_bytes(body[1:5], "big")
                    if length > self.server.max_receive_message_length:
                        self._too_large(length)
                        return
                    size = self.size = 5 + length
                    if len(body) > size:
                        self._past_the_end()
                        return
            else:
                if len(body) + n > size:
                    self._past_the_end()
                    return
                if not end and not self._hold(n):
                    return
                body += data
            if not end and size is not None:
                self.stream.open_window(size - len(body))
        if end:
            self._unary_request()

    def _past_the_end(self) -> None:
        self.fail(grpc.StatusCode.UNIMPLEMENTED, "a unary call takes exactly one request message")

    def _unary_request(self) -> None:
        body = self.body
        if self.size is None or len(body) != self.size:
            code = grpc.StatusCode.INTERNAL if self.size is None else grpc.StatusCode.UNIMPLEMENTED
            self.fail(code, "a unary call takes exactly one request message")
            return
        try:
            request = self._message(body[0], memoryview(body)[5:] if not body[0]
                                    else bytes(body[5:]))
        except _Abort as exc:
            self.fail(exc.code, exc.details)
            return
        finally:
            self.body = bytearray()
            if self.held:
                self._release()
        self.start(request)

    def start(self, request=None) -> None:
        self.server.calls.add(self)
        self.task = self.stream.conn.loop.create_task(self._run(request))

    async def _run(self, request) -> None:
        handler = self.handler
        argument = self.requests if handler.request_streaming else request
        try:
            if not handler.response_streaming:
                method = (handler.stream_unary if handler.request_streaming
                          else handler.unary_unary)
                response = method(argument, self)
                if inspect.isawaitable(response):
                    response = await response
                if self._code not in (None, _OK):
                    self.fail(self._code, self._details)
                elif response is None:
                    self.fail(grpc.StatusCode.INTERNAL, "the method returned no response")
                else:
                    self._send_message(self._serialize(response))
                    self._finish(_OK, "")
            else:
                method = (handler.stream_stream if handler.request_streaming
                          else handler.unary_stream)
                answers = method(argument, self)
                if hasattr(answers, "__aiter__"):
                    async for answer in answers:
                        await self.write(answer)
                elif inspect.isawaitable(answers):
                    await answers
                self._finish(self._code or _OK, self._details)
        except _Abort as exc:
            self.fail(exc.code, exc.details)
        except asyncio.CancelledError:
            self.fail(grpc.StatusCode.CANCELLED, "the call was cancelled")
        except Exception as exc:  # noqa: BLE001 - a handler's fault: UNKNOWN, as grpcio says
            log.exception("gRPC %s failed", self.stream.id)
            self.fail(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
        finally:
            self.finished = True
            if self._timer is not None:
                self._timer.cancel()
            self.server.calls.discard(self)
            if self.held:  # a streaming call's messages its handler left
                self._release()

    def _serialize(self, message) -> bytes:
        serialize = self.handler.response_serializer
        return serialize(message) if serialize is not None else message

    def _send_message(self, payload: bytes) -> None:
        stream = self.stream
        if not stream.headers_sent:
            stream.send_headers(_HEADERS)
        stream.send_data(b"\x00" + len(payload).to_bytes(4, "big") + payload)

    def _finish(self, code: grpc.StatusCode, details: str) -> None:
        if self.finished or self.stream.local_closed:
            self.finished = True
            return
        self.finished = True
        block = (_STATUS_OK if code is _OK
                 else header_field(b"grpc-status", str(_code(code)).encode()))
        if details:
            block += header_field(b"grpc-message", _percent(details))
        if self.trailing:
            block += _metadata_block(self.trailing)
        if not self.stream.headers_sent:  # trailers-only
            block = _HEADERS + block
        self.stream.send_headers(block, end_stream=True)

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with a status (once; a handler still running is cancelled)."""
        self._finish(code, details)
        self._release()
        task = self.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        if self.requests is not None:
            self.requests.queue.put_nowait(_END)

    def _too_large(self, length: int) -> None:
        self.fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                  f"Received message larger than max ({length} vs. "
                  f"{self.server.max_receive_message_length})")

    def _deadline(self) -> None:
        self._timer = None
        if not self.finished:
            self.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def cancel(self) -> None:
        """The client reset the stream or went away: stop the handler."""
        self._cancelled = True
        self.finished = True
        if self._timer is not None:
            self._timer.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.requests is not None:
            self.requests.queue.put_nowait(_END)
        self.server.calls.discard(self)
        self._release()


class GrpcServer:
    """The gRPC server object the servicers register on: handlers by method path,
    one listening socket, graceful stop."""

    def __init__(self, *, max_receive_message_length: int, limits: EdgeLimits | None = None,
                 max_connections: int = 0) -> None:
        self.max_receive_message_length = max_receive_message_length
        self.limits = limits = limits if limits is not None else EdgeLimits()
        self.max_connections = max_connections  # 0: no cap
        self.buffer_budget = limits.buffered_body_budget_bytes
        self.buffered = 0  # request bytes all calls hold across DATA frames right now
        # the sweep's period: a fraction of the shortest time bound it judges
        self._tick = min(1.0, max(0.02, min(limits.header_timeout_s, limits.idle_timeout_s,
                                            limits.body_idle_timeout_s) / 4))
        self._sweeping: asyncio.TimerHandle | None = None
        self._methods: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list = []
        self.connections: set[Http2Connection] = set()
        self.calls: set[Call] = set()
        self._listener: asyncio.AbstractServer | None = None
        self._read_headers: list | None = None  # the last request headers read, and what
        self._read: tuple = ()  # they said (on_headers)

    # -- registration (what generated add_*_to_server functions call) -------------------------

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        for name, handler in handlers.items():
            self._methods[f"/{service}/{name}"] = handler

    def _lookup(self, path: str, metadata: tuple):
        handler = self._methods.get(path)
        if handler is None:
            for generic in self._generic:
                handler = generic.service(_CallDetails(path, metadata))
                if handler is not None:
                    break
        return handler

    # -- streams (serving.grpc.http2's StreamHandler) ---------------------------------------------

    def on_headers(self, stream: Stream, headers: list, end_stream: bool) -> None:
        if headers is self._read_headers:  # the same block again (Http2Connection._decode)
            path, method, content_type, encoding, timeout, metadata = self._read
        else:
            try:
                read = _read_headers(headers)
            except _Abort as exc:  # e.g. a -bin value that is not base64: this call fails
                stream.send_headers(_HEADERS + header_field(b"grpc-status", str(
                    _code(exc.code)).encode()) + header_field(b"grpc-message",
                                                              _percent(exc.details)),
                                    end_stream=True)
                return
            self._read, self._read_headers = read, headers
            path, method, content_type, encoding, timeout, metadata = read
        if method != b"POST":
            stream.send_headers(status_field(405), end_stream=True)
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            stream.send_headers(status_field(415) + _STATUS_UNKNOWN_CT, end_stream=True)
            return
        handler = self._lookup(path or "", metadata)
        if handler is None or (encoding not in (None, b"identity") and encoding not in _WBITS):
            details = (f"Method not found: {path}" if handler is None
                       else f"Compression algorithm '{encoding.decode('latin-1')}' not supported")
            stream.send_headers(_HEADERS + header_field(b"grpc-status", b"12")
                                + header_field(b"grpc-message", _percent(details)),
                                end_stream=True)
            return
        call = Call(self, stream, handler, metadata, encoding, timeout)
        stream.call = call
        if handler.request_streaming:
            call.start()
        if end_stream:
            call.on_data(memoryview(b""), True)

    def on_data(self, stream: Stream, data: memoryview, end_stream: bool) -> None:
        if stream.call is not None and not stream.call.finished:
            stream.call.on_data(data, end_stream)

    def on_reset(self, stream: Stream) -> None:
        if stream.call is not None:
            stream.call.cancel()

    # -- listening ---------------------------------------------------------------------------

    def _connection(self) -> asyncio.Protocol:
        if self.max_connections and len(self.connections) >= self.max_connections:
            return _Refused()
        conn = Http2Connection(lambda _: self, on_close=self.connections.discard,
                               limits=self.limits)
        self.connections.add(conn)
        return conn

    def _sweep(self) -> None:
        """Every connection's time bounds judged at once (Http2Connection.sweep): no timer per
        connection, frame or call."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in list(self.connections):
            conn.sweep(now)
        self._sweeping = loop.call_later(self._tick, self._sweep)

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on host:port (OSError when taken); the port bound."""
        host = host.strip("[]")
        if reuse_port:
            sock = reuse_port_listener(host, port)
        else:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(2048)
            except OSError:
                sock.close()
                raise
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._connection, sock=sock)
        self._sweeping = loop.call_later(self._tick, self._sweep)
        return sock.getsockname()[1]

    async def stop(self, grace: float) -> None:
        """No new calls (GOAWAY); the ones in flight get `grace` seconds, then are cancelled."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for conn in list(self.connections):
            conn.go_away()
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        while self.calls and loop.time() < until:
            await asyncio.sleep(0.02)
        for call in list(self.calls):
            call.fail(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
        for conn in list(self.connections):
            conn.close()
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None


class _Refused(asyncio.Protocol):
    """A connection over max_connections: closed as soon as it is made, nothing read."""

    def connection_made(self, transport) -> None:
        transport.abort()


class _CallDetails(grpc.HandlerCallDetails):
    def __init__(self, method: str, invocation_metadata: tuple) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata
