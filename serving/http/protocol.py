"""uvicorn's httptools protocol with the bounds it lacks: a deadline for a request's headers,
a cap on their size, and a cap on open connections.

uvicorn arms no timer before a request's headers are complete (only keep-alive, after a
response), and httptools accepts headers of any size, so without these a client that sends a
byte a second, or megabytes of headers, holds its connection and memory for as long as it likes.
Use it with `uvicorn.run(..., http=GuardedHttpToolsProtocol)` or
`uvicorn --http serving.http.protocol:GuardedHttpToolsProtocol`; limits come from the environment
(serving.edge_limits.EdgeLimits). The body side is the app's (serving.edge_limits.BodyReader).
"""

from __future__ import annotations

import asyncio
import os

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.edge_limits import EdgeLimits


def _raw_response(status: str, message: str, extra: bytes = b"") -> bytes:
    body = orjson.dumps({"error": message})
    return b"".join([b"HTTP/1.1 ", status.encode(), b"\r\ncontent-type: application/json\r\n",
                     extra, b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body),
                     body])


class _CoalescingTransport:
    """The connection's transport, but a response's head and body leave in one send.

    uvicorn writes the status line and headers, then the body: two write(2) calls per answer,
    each one a trip through the loopback stack that wakes the client. This holds a write that
    finds nothing held and sends it together with the next one (writelines: one writev); a
    callback at the end of the loop tick sends what is still held, so a lone write (a 100
    Continue, a streamed response waiting for its next chunk) is only late by that tick.
    """

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._held = None
            self._transport.writelines((held, data))

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def writelines(self, chunks) -> None:
        self.flush()
        self._transport.writelines(chunks)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default=None):
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str):  # pause_reading, abort, ...: the real transport's
        return getattr(self._transport, name)


class _Chunks:
    """A request body's chunks as httptools delivered them, where uvicorn keeps a bytearray.

    uvicorn appends each chunk to `cycle.body` (a copy), and its receive() hands the app
    `bytes(cycle.body)` (a second copy): a 600 KB binary tensor crossed memory twice before
    the app saw it (about a tenth of a conv request's time on one core). This container takes
    `+=` without copying, and `bytes()` of it is the one chunk itself, or the chunks joined.
    """

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def __iadd__(self, chunk: bytes) -> _Chunks:
        self.parts.append(chunk)
        self.size += len(chunk)
        return self

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol plus a header deadline (408), a header size cap (431) and a
    connection cap (503); an answer's head and body leave in one send (_CoalescingTransport).

    Per request it adds one check after each read: is a request's head still incomplete
    (uvicorn's scope has no "method" until on_headers_complete)? A request that arrives in one
    read never arms a timer; a connection's one timer re-arms itself while heads trickle in.
    """

    limits: EdgeLimits | None = None  # read from the environment at the first connection
    #: this listener's share of the process's connection budget (EdgeLimits.connection_caps)
    connection_cap = 0
    #: Set (on the class) by serving.http.server.DrainingServer on SIGTERM: from then on every
    #: answer says `Connection: close`, so no client keeps a pooled connection the exit would
    #: cut.
    draining = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        HttpToolsProtocol.connection_made(self, _CoalescingTransport(transport, self.loop))
        limits = type(self).limits
        if limits is None:
            limits = type(self).limits = EdgeLimits.from_env()
            type(self).connection_cap = limits.connection_caps(
                grpc=bool(os.environ.get("MMC_GRPC_PORT")))[0]
        self._limits = limits
        self._timed_scope: dict | None = None  # the head the clock below belongs to
        self._head_since = self.loop.time()  # the first head's clock starts at connect
        self._head_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        cap = self.connection_cap
        if cap and len(self.connections) > cap:
            # refused at once, not at its first request: a crowd of silent connections over
            # the cap would otherwise hold a file descriptor each until the header timeout
            self.transport.write(_raw_response("503 Service Unavailable", (
                f"the server has its maximum of {cap} connections open: retry shortly"),
                b"retry-after: 1\r\n"))
            self.transport.close()
            return
        if limits.header_timeout_s > 0:  # an idle new connection is a slow header sender too
            self._header_timer = self.loop.call_later(limits.header_timeout_s,
                                                      self._header_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None
        HttpToolsProtocol.connection_lost(self, exc)

    def on_headers_complete(self) -> None:
        HttpToolsProtocol.on_headers_complete(self)
        if self.draining and self.cycle is not None:
            self.cycle.keep_alive = False  # uvicorn adds `Connection: close`, then closes

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle.body) is not _Chunks:  # uvicorn's receive() leaves a new bytearray
            chunks = _Chunks()
            if cycle.body:
                chunks += bytes(cycle.body)
            cycle.body = chunks
        HttpToolsProtocol.on_body(self, body)

    def shutdown(self) -> None:
        """The server stops: a connection accepted a moment ago whose request has not been read
        yet is answered (with `Connection: close`), not cut; the header deadline bounds a
        silent one. Otherwise uvicorn's (idle: close; mid-request: close after the answer)."""
        if self.draining and self.cycle is None and not self.transport.is_closing():
            return
        HttpToolsProtocol.shutdown(self)

    def data_received(self, data: bytes) -> None:
        HttpToolsProtocol.data_received(self, data)
        scope = self.scope
        if scope is not None and "method" not in scope and not self.transport.is_closing():
            self._head_in_progress(scope, len(data))

    def _head_in_progress(self, scope: dict, n: int) -> None:
        """This read ended inside a request's head: count it, and make sure a clock runs."""
        limits = self._limits
        if scope is not self._timed_scope:  # a new head (the first one keeps the connect time)
            if self._timed_scope is not None:
                self._head_since = self.loop.time()
            self._timed_scope = scope
            self._head_bytes = 0
        self._head_bytes += n
        if limits.max_header_bytes and self._head_bytes > limits.max_header_bytes:
            self._refuse("431 Request Header Fields Too Large",
                         f"request headers exceed {limits.max_header_bytes} bytes")
        elif self._header_timer is None and limits.header_timeout_s > 0:
            self._header_timer = self.loop.call_at(self._head_since + limits.header_timeout_s,
                                                   self._header_deadline)

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        scope = self.scope
        if scope is None:  # connected and sent nothing
            self.transport.close()
            return
        if "method" in scope:  # heads complete; a trickling next one arms the clock again
            return
        timeout = self._limits.header_timeout_s
        if scope is self._timed_scope:
            left = self._head_since + timeout - self.loop.time()
            if left <= 0:
                self._refuse("408 Request Timeout",
                             f"request headers not complete within {timeout:g} s")
                return
        else:  # a head began but has not ended a read yet: time it from now
            self._timed_scope, self._head_since, self._head_bytes = scope, self.loop.time(), 0
            left = timeout
        self._header_timer = self.loop.call_later(left, self._header_deadline)

    def _refuse(self, status: str, message: str) -> None:
        self.transport.write(_raw_response(status, message))
        self.transport.close()
