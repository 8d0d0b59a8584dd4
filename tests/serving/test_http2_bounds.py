"""Every bound the fast gRPC transport (serving.grpc.server over serving.grpc.http2) puts on a
client,
seen from a client that frames HTTP/2 by hand over a raw socket: what it can make the server
hold, how long it can keep a connection or header block open, and which cheap frames end its
connection. One spec per bound; each takes a fraction of a second (figures from EdgeLimits,
made small here)."""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import struct
import threading
import time
import zlib

import grpc
import pytest
from hpack import Decoder, Encoder

from serving.edge_limits import EdgeLimits
from serving.grpc import http2
from serving.grpc.http2 import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from serving.grpc.server import GrpcServer

pytestmark = pytest.mark.timeout(30)  # a net under the sockets' own 5 s timeouts

SERVICE = "test.Bounds"
LIMITS = EdgeLimits(header_timeout_s=0.4, idle_timeout_s=0.6, max_header_bytes=8192,
                    max_concurrent_streams=4, min_ping_interval_s=10.0, max_ping_strikes=2,
                    body_idle_timeout_s=0.6, buffered_body_budget_bytes=3 << 20)
MIB = 1 << 20
MAX_WINDOW = (1 << 31) - 1
ENHANCE_YOUR_CALM, COMPRESSION_ERROR, NO_ERROR, PROTOCOL_ERROR = 0xB, 0x9, 0x0, 0x1
REFUSED_STREAM, FLOW_CONTROL_ERROR, CANCEL = 0x7, 0x3, 0x8


async def _echo(request: bytes, context) -> bytes:
    return request


async def _hold(request: bytes, context) -> bytes:
    await asyncio.sleep(30)
    return b""


async def _ignore(requests, context) -> bytes:
    await asyncio.sleep(30)  # never reads its requests
    return b""


async def _big(request: bytes, context) -> bytes:
    return b"x" * MIB


async def _stream_big(request: bytes, context):
    for _ in range(200):
        yield b"y" * MIB


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)


@pytest.fixture
def serve(loop):
    """serve(**kwargs) -> (GrpcServer, port): a server of the test methods, stopped after."""
    servers = []

    def start(*, limit: int = 4 * MIB, max_connections: int = 0, limits: EdgeLimits = LIMITS):
        server = GrpcServer(max_receive_message_length=limit, limits=limits,
                            max_connections=max_connections)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Hold": grpc.unary_unary_rpc_method_handler(_hold),
            "Ignore": grpc.stream_unary_rpc_method_handler(_ignore),
            "Big": grpc.unary_unary_rpc_method_handler(_big),
            "StreamBig": grpc.unary_stream_rpc_method_handler(_stream_big),
        }),))
        port = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), loop).result(5)
        servers.append(server)
        return server, port

    yield start
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(5)


def _on_loop(loop, function):
    """function() run on the server's loop; its result."""
    async def call():
        return function()
    return asyncio.run_coroutine_threadsafe(call(), loop).result(5)


class _Peer:
    """A client connection framed by hand; it grants the server `window` bytes (stream and
    connection) and never renews it."""

    def __init__(self, port: int, *, handshake: bool = True, window: int = MAX_WINDOW) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.encoder, self.decoder = Encoder(), Decoder()
        self.received = b""
        self.next_stream = 1
        if handshake:
            grow = max(0, window - 65_535)
            self.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HL", 0x4, window)) + (
                frame(WINDOW_UPDATE, 0, 0, grow.to_bytes(4, "big")) if grow else b""))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def block(self, method: str, metadata: tuple = ()) -> bytes:
        return self.encoder.encode([
            (b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"x"),
            (b":path", f"/{SERVICE}/{method}".encode()),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"), *metadata])

    def open(self, method: str, *, metadata: tuple = (), end: bool = False) -> int:
        stream = self.next_stream
        self.next_stream += 2
        flags = END_HEADERS | (END_STREAM if end else 0)
        self.send(frame(HEADERS, flags, stream, self.block(method, metadata)))
        return stream

    def call(self, method: str, message: bytes, *, metadata: tuple = (),
             encoding: bytes | None = None) -> dict[bytes, bytes]:
        """One call sent whole; the trailers that end it."""
        if encoding is not None:
            metadata = (*metadata, (b"grpc-encoding", encoding))
        stream = self.open(method, metadata=metadata)
        self.send_call(stream, message, compressed=b"\x01" if encoding is not None else b"\x00")
        return self.status(stream)

    def send_call(self, stream: int, message: bytes, *, compressed: bytes) -> None:
        self.send(_data(stream, compressed + len(message).to_bytes(4, "big") + message,
                        end=True))

    def frame(self) -> tuple[int, int, int, bytes] | None:
        """The next frame (type, flags, stream, payload); None once the server closed."""
        while len(self.received) < 9 or len(self.received) < 9 + int.from_bytes(
                self.received[:3], "big"):
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.received += chunk
        length = int.from_bytes(self.received[:3], "big")
        ftype, flags = self.received[3], self.received[4]
        stream = int.from_bytes(self.received[5:9], "big") & 0x7FFFFFFF
        payload, self.received = self.received[9:9 + length], self.received[9 + length:]
        return ftype, flags, stream, payload

    def until(self, want) -> tuple[int, int, int, bytes] | None:
        """Frames read until one that want(frame) accepts (that frame), or None at the close."""
        while (got := self.frame()) is not None:
            if got[0] == HEADERS:
                self.decoder.decode(got[3], raw=True)  # keep the table in step
            if want(got):
                return got
        return None

    def status(self, stream: int) -> dict[bytes, bytes]:
        """The headers that end `stream` (grpc-status), or {b"rst": code} if it is reset."""
        while (got := self.frame()) is not None:
            ftype, flags, sid, payload = got
            if ftype == HEADERS:
                headers = dict(self.decoder.decode(payload, raw=True))
                if sid == stream and b"grpc-status" in headers:
                    return headers
            elif ftype == RST_STREAM and sid == stream:
                return {b"rst": int.from_bytes(payload, "big")}
        raise AssertionError(f"the connection closed before stream {stream} ended")

    def goaway(self) -> tuple[int, bytes]:
        """(error code, debug data) of the GOAWAY that ends the connection, which then closes."""
        got = self.until(lambda f: f[0] == GOAWAY)
        assert got is not None, "closed without a GOAWAY"
        assert self.closed(), "a GOAWAY but the connection stays open"
        return int.from_bytes(got[3][4:8], "big"), got[3][8:]

    def closed(self) -> bool:
        while self.frame() is not None:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


def _resident() -> int:
    """This process's resident memory in bytes (the server runs in it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def _data(stream: int, payload: bytes, *, end: bool = False) -> bytes:
    """DATA frames of at most the 1 MiB the server allows."""
    parts = [payload[i:i + MIB] for i in range(0, len(payload), MIB)] or [b""]
    return b"".join(frame(DATA, END_STREAM if end and i == len(parts) - 1 else 0, stream, part)
                    for i, part in enumerate(parts))


def _bomb(encoding: bytes, size: int) -> bytes:
    """A gzip or zlib stream of `size` zero bytes, made without compressing them all: after a
    full flush every MiB of zeros compresses to the same bytes (the checksum at its end is the
    first MiB's: a bounded reader stops long before it)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == b"gzip" else 15)
    zeros = b"\x00" * MIB
    first = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    again = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    return first + again * (size // MIB - 2) + deflate.flush()


# -- 1. a declared length allocates nothing -------------------------------------------------

def test_a_declared_message_length_holds_no_memory_only_bytes_that_arrive_do(serve, loop):
    server, port = serve(limit=256 * MIB)
    peer = _Peer(port)
    try:
        before = _resident()
        for _ in range(3):  # each declares 64 MiB and sends 10 bytes of it
            stream = peer.open("Echo")
            peer.send(frame(DATA, 0, stream, b"\x00" + (64 * MIB).to_bytes(4, "big")
                            + b"0123456789"))
        assert peer.call("Echo", b"ok")[b"grpc-status"] == b"0"  # a call beside them
        assert _on_loop(loop, lambda: server.buffered) == 3 * 15
        assert _resident() - before < 64 * MIB  # allocating the declared sizes: 192 MiB
    finally:
        peer.close()


def test_a_message_declared_over_the_limit_is_refused_before_its_bytes_arrive(serve):
    server, port = serve(limit=MIB)
    peer = _Peer(port)
    try:
        stream = peer.open("Echo")
        peer.send(frame(DATA, 0, stream, b"\x00" + (MIB + 1).to_bytes(4, "big")))
        headers = peer.status(stream)
        assert headers[b"grpc-status"] == b"8"  # RESOURCE_EXHAUSTED
        assert f"{MIB + 1} vs. {MIB}".encode() in headers[b"grpc-message"]
    finally:
        peer.close()


def test_request_bytes_held_across_frames_share_one_budget_and_are_freed_after(serve, loop):
    server, port = serve(limit=4 * MIB)  # LIMITS' budget is 3 MiB
    peer = _Peer(port)
    try:
        first, second = peer.open("Echo"), peer.open("Echo")
        part = b"\x00" + (2 * MIB).to_bytes(4, "big") + b"a" * (2 * MIB - 100)
        peer.send(_data(first, part))
        peer.send(_data(second, part))  # 4 MiB held at once: over the budget
        headers = peer.status(second)
        assert headers[b"grpc-status"] == b"8"
        assert b"budget" in headers[b"grpc-message"]
        peer.send(frame(DATA, END_STREAM, first, b"a" * 100))
        assert peer.status(first)[b"grpc-status"] == b"0"
        assert _on_loop(loop, lambda: server.buffered) == 0
    finally:
        peer.close()


# -- 2. compression bombs -------------------------------------------------------------------

@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
def test_a_compressed_message_inflating_past_the_limit_is_refused_cheaply(serve, encoding):
    _, port = serve(limit=2 * MIB)
    bomb = _bomb(encoding, 1 << 30)
    assert len(bomb) < 2 * MIB  # under the limit as sent: only inflating it can exceed it
    peer = _Peer(port)
    try:
        started = time.monotonic()
        headers = peer.call("Echo", bomb, encoding=encoding)
        assert time.monotonic() - started < 1  # inflating 1 GiB whole takes longer
        assert headers[b"grpc-status"] == b"8"
        assert peer.call("Echo", gzip.compress(b"fine" * 1000), encoding=b"gzip")[
            b"grpc-status"] == b"0"
    finally:
        peer.close()


def test_compressed_messages_a_streaming_call_has_not_taken_count_inflated_in_the_budget(
        serve):
    _, port = serve(limit=2 * MIB)  # LIMITS' budget is 3 MiB
    peer = _Peer(port)
    try:
        stream = peer.open("Ignore", metadata=((b"grpc-encoding", b"gzip"),))
        small = gzip.compress(b"\x00" * MIB)  # 1 KiB on the wire, 1 MiB once inflated
        for _ in range(4):
            peer.send(frame(DATA, 0, stream, b"\x01" + len(small).to_bytes(4, "big") + small))
        headers = peer.status(stream)
        assert headers[b"grpc-status"] == b"8"
        assert b"budget" in headers[b"grpc-message"]
    finally:
        peer.close()


# -- 3. bad binary metadata -----------------------------------------------------------------

def test_a_bin_header_that_is_not_base64_is_invalid_argument_naming_it_without_a_traceback(
        serve, caplog):
    _, port = serve()
    peer = _Peer(port)
    try:
        headers = peer.call("Echo", b"x", metadata=((b"x-token-bin", b"!!not base64!!"),))
        assert headers[b"grpc-status"] == b"3"  # INVALID_ARGUMENT
        assert b"x-token-bin" in headers[b"grpc-message"]
        assert peer.call("Echo", b"again")[b"grpc-status"] == b"0"  # the connection stays
    finally:
        peer.close()
    assert not [r for r in caplog.records if r.exc_info]


# -- 4. connections: a cap, a handshake timeout, an idle timeout -----------------------------

def test_connections_over_the_cap_are_closed_at_once_and_the_others_served(serve):
    _, port = serve(max_connections=2)
    peers = [_Peer(port), _Peer(port)]
    try:
        for peer in peers:
            assert peer.frame()[0] == SETTINGS
        extra = _Peer(port, handshake=False)
        started = time.monotonic()
        assert extra.frame() is None  # closed, nothing sent
        assert time.monotonic() - started < 2
        assert peers[0].call("Echo", b"x")[b"grpc-status"] == b"0"
    finally:
        for peer in peers:
            peer.close()


@pytest.mark.parametrize("sent", [b"", PREFACE, PREFACE[:10]])
def test_a_connection_without_a_handshake_in_header_timeout_is_closed(serve, sent):
    _, port = serve()
    peer = _Peer(port, handshake=False)
    try:
        peer.send(sent)
        started = time.monotonic()
        assert peer.closed()
        assert 0.3 < time.monotonic() - started < 3  # LIMITS.header_timeout_s is 0.4
    finally:
        peer.close()


def test_an_idle_connection_gets_goaway_no_error_then_is_closed(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        assert peer.call("Echo", b"x")[b"grpc-status"] == b"0"
        started = time.monotonic()
        assert peer.goaway()[0] == NO_ERROR
        assert 0.4 < time.monotonic() - started < 3  # LIMITS.idle_timeout_s is 0.6
    finally:
        peer.close()


def test_an_unfinished_header_block_keeps_no_connection_open(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        block = peer.block("Echo")
        peer.send(frame(HEADERS, 0, 1, block[:10]))  # its CONTINUATION never comes
        started = time.monotonic()
        peer.goaway()
        assert time.monotonic() - started < 3
    finally:
        peer.close()


# -- 5. cheap frames ------------------------------------------------------------------------

def test_a_huge_settings_frame_ends_the_connection_enhance_your_calm(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        stream = peer.open("Hold", end=False)
        peer.send(frame(SETTINGS, 0, 0, struct.pack(">HL", 0x4, 65_535) * 32))  # 32: taken
        assert peer.until(lambda f: f[0] == SETTINGS and f[1] & 1) is not None
        try:
            peer.send(frame(SETTINGS, 0, 0, struct.pack(">HL", 0x4, 1000) * (MIB // 6)))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert peer.goaway()[0] == ENHANCE_YOUR_CALM
        assert stream == 1  # the frame came with a stream open: refused all the same
    finally:
        peer.close()


@pytest.mark.parametrize("updates", [
    b"\x3f\x81\x20",  # one table size update to 4096 + 32: over what we allow
    b"\x3f\xe1\x1f" * 3,  # three in one block, each to 4096
])
def test_hpack_table_size_updates_past_the_table_we_allow_are_a_compression_error(
        serve, updates):
    _, port = serve()
    peer = _Peer(port)
    try:
        peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, updates + peer.block("Echo")))
        assert peer.goaway()[0] == COMPRESSION_ERROR
    finally:
        peer.close()


def test_a_header_block_over_max_header_bytes_ends_the_connection_even_in_one_frame(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        padding = http2.header_field(b"x-pad", b"p" * (LIMITS.max_header_bytes + 100))
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.block("Echo") + padding))
        assert peer.goaway()[0] == COMPRESSION_ERROR
    finally:
        peer.close()


def test_a_header_block_over_max_header_bytes_in_continuations_ends_the_connection(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        peer.send(frame(HEADERS, 0, 1, peer.block("Echo")))
        for _ in range(LIMITS.max_header_bytes // 1000 + 1):
            peer.send(frame(CONTINUATION, 0, 1, b"\x00" * 1000))
        assert peer.goaway()[0] == COMPRESSION_ERROR
    finally:
        peer.close()


def test_endless_empty_continuation_frames_end_the_connection(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        peer.send(frame(HEADERS, 0, 1, peer.block("Echo")))
        try:
            peer.send(frame(CONTINUATION, 0, 1) * 100_000)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending
        assert peer.goaway()[0] == ENHANCE_YOUR_CALM
    finally:
        peer.close()


def test_rapid_reset_ends_the_connection_enhance_your_calm(serve):
    _, port = serve()
    peer = _Peer(port)
    first, again = peer.block("Hold"), peer.block("Hold")  # the second: table indices only
    try:
        storm = bytearray()
        for i in range(5000):
            stream = 2 * i + 1
            storm += frame(HEADERS, END_HEADERS, stream, again if i else first)
            storm += frame(RST_STREAM, 0, stream, CANCEL.to_bytes(4, "big"))
        try:
            peer.send(bytes(storm))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert peer.goaway()[0] == ENHANCE_YOUR_CALM
    finally:
        peer.close()


def test_pings_faster_than_the_minimum_interval_without_calls_end_in_too_many_pings(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        for i in range(LIMITS.max_ping_strikes + 2):  # the first is free; then strikes
            peer.send(frame(PING, 0, 0, i.to_bytes(8, "big")))
        code, debug = peer.goaway()
        assert (code, debug) == (ENHANCE_YOUR_CALM, b"too_many_pings")
    finally:
        peer.close()


def test_priority_frames_without_end_run_out_of_budget(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        try:
            peer.send(frame(PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10") * 20_000)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert peer.goaway()[0] == ENHANCE_YOUR_CALM
    finally:
        peer.close()


# -- 6. concurrent streams ------------------------------------------------------------------

def test_max_concurrent_streams_is_advertised_and_a_stream_over_it_is_refused(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        settings = peer.until(lambda f: f[0] == SETTINGS and not f[1] & 1)[3]
        advertised = dict(struct.unpack_from(">HL", settings, i)
                          for i in range(0, len(settings), 6))
        assert advertised[0x3] == LIMITS.max_concurrent_streams
        for _ in range(LIMITS.max_concurrent_streams):  # calls that take 30 s to answer
            peer.send_call(peer.open("Hold"), b"", compressed=b"\x00")
        over = peer.open("Echo", end=True)
        assert peer.status(over) == {b"rst": REFUSED_STREAM}
    finally:
        peer.close()


# -- 7. back-pressure, both ways ------------------------------------------------------------

def test_data_past_a_unary_message_end_ends_the_call_and_its_window_is_not_renewed(serve):
    _, port = serve()
    peer = _Peer(port)
    try:
        stream = peer.open("Echo")
        peer.send(frame(DATA, 0, stream, _message(b"0123456789")))
        peer.send(frame(DATA, 0, stream, b"z" * MIB))
        headers = peer.status(stream)
        assert headers[b"grpc-status"] == b"12"
        peer.send(frame(DATA, 0, stream, b"z" * MIB))  # dropped, not held
        assert peer.call("Echo", b"next")[b"grpc-status"] == b"0"
    finally:
        peer.close()


def test_a_stream_whose_call_takes_nothing_gets_no_window_beyond_the_first(serve, loop):
    server, port = serve(limits=EdgeLimits(**{**LIMITS.__dict__,
                                              "buffered_body_budget_bytes": 64 * MIB}))
    peer = _Peer(port)
    try:
        stream = peer.open("Ignore")
        chunk = _message(b"m" * (MIB - 5))
        for _ in range(http2.STREAM_WINDOW // MIB):  # the stream's whole window, no more
            peer.send(frame(DATA, 0, stream, chunk))
        peer.send(frame(PING, 0, 0, b"12345678"))
        updates = []
        while (got := peer.frame())[0] != PING:
            if got[0] == WINDOW_UPDATE:
                updates.append(got[2])
        assert stream not in updates
        assert _on_loop(loop, lambda: server.buffered) == http2.STREAM_WINDOW
        peer.send(frame(DATA, 0, stream, b"over"))
        assert peer.status(stream) == {b"rst": FLOW_CONTROL_ERROR}
        assert _on_loop(loop, lambda: server.buffered) == 0
    finally:
        peer.close()


def test_output_for_a_peer_that_grants_no_window_is_dropped_after_body_idle_timeout(
        serve, loop):
    server, port = serve()
    peer = _Peer(port, window=0)
    try:
        stream = peer.open("Big")
        peer.send(frame(DATA, END_STREAM, stream, _message(b"")))
        started = time.monotonic()
        assert peer.status(stream) == {b"rst": CANCEL}
        assert 0.5 < time.monotonic() - started < 3  # LIMITS.body_idle_timeout_s is 0.6
        assert _on_loop(loop, lambda: sum(c.held_output for c in server.connections)) == 0
    finally:
        peer.close()


def test_a_peer_that_never_reads_holds_bounded_output_and_is_closed(serve, loop):
    server, port = serve()
    peer = _Peer(port)
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    try:
        stream = peer.open("StreamBig")
        peer.send(frame(DATA, END_STREAM, stream, _message(b"")))
        try:
            peer.send(frame(PING, 0, 0, b"p" * 8) * 500)  # their answers cannot pile up
        except (BrokenPipeError, ConnectionResetError):
            pass
        time.sleep(0.3)

        def held():
            return sum(c.held_output + (c.transport.get_write_buffer_size() if c.transport
                                        else 0) for c in server.connections)
        assert _on_loop(loop, held) < 16 * MIB  # the method would send 200 MiB
        deadline = time.monotonic() + 4
        while _on_loop(loop, lambda: len(server.connections)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _on_loop(loop, lambda: len(server.connections))
    finally:
        peer.close()


# -- 8. bounded work per read ---------------------------------------------------------------

def test_a_read_of_many_small_frames_is_parsed_a_slice_per_loop_turn(serve, loop):
    server, port = serve()
    peer = _Peer(port, window=65_535)
    try:
        assert peer.until(lambda f: f[0] == SETTINGS and f[1] & 1) is not None
        conn = _on_loop(loop, lambda: next(iter(server.connections)))
        before = _on_loop(loop, lambda: conn.send_window)
        n = 20_000
        flood = frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")) * n

        def feed():
            conn.data_received(flood)  # as one read: one slice now, the rest later turns
            return conn.send_window - before
        assert _on_loop(loop, feed) == http2.FRAMES_PER_TURN
        deadline = time.monotonic() + 4
        while _on_loop(loop, lambda: conn.send_window - before) < n:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert peer.call("Echo", b"after")[b"grpc-status"] == b"0"
    finally:
        peer.close()
