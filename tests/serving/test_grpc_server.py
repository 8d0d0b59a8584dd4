"""The gRPC transport (serving.grpc.server over serving.grpc.http2) as grpcio's own client sees it:
a test service of raw-bytes methods registered the way generated code registers servicers,
served from an event loop in a thread, called through a real channel. The inference service
over it is specified in test_grpc_front.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import grpc
import pytest

from serving.grpc.server import GrpcServer

SERVICE = "test.Wire"
LIMIT = 8 << 20  # max request message


class _Service:
    """Methods whose behaviour a spec can see from outside."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.started = threading.Event()
        self.metadata: tuple = ()

    async def echo(self, request: bytes, context) -> bytes:
        self.metadata = context.invocation_metadata()
        context.set_trailing_metadata((("x-echo-len", str(len(request))),
                                       ("x-raw-bin", b"\x00\xffok")))
        return request

    async def slow(self, request: bytes, context) -> bytes:
        self.started.set()
        try:
            await asyncio.sleep(float(request.decode()))
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"done"

    async def fail(self, request: bytes, context) -> bytes:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, request.decode())

    async def count(self, request: bytes, context):
        for i in range(int(request.decode())):
            yield str(i).encode()

    async def chat(self, requests, context):
        async for request in requests:
            yield request.upper()


def _serve(methods: dict) -> tuple[GrpcServer, int, asyncio.AbstractEventLoop]:
    """A GrpcServer with `methods` of the test service, listening, on a loop thread."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = GrpcServer(max_receive_message_length=LIMIT)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    port = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), loop).result(5)
    return server, port, loop


@pytest.fixture(scope="module")
def wire():
    """(service, GrpcServer, address, loop) on a loop thread."""
    service = _Service()
    server, port, loop = _serve({
        "Echo": grpc.unary_unary_rpc_method_handler(service.echo),
        "Slow": grpc.unary_unary_rpc_method_handler(service.slow),
        "Fail": grpc.unary_unary_rpc_method_handler(service.fail),
        "Count": grpc.unary_stream_rpc_method_handler(service.count),
        "Chat": grpc.stream_stream_rpc_method_handler(service.chat),
    })
    yield service, server, f"127.0.0.1:{port}", loop
    asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)


@pytest.fixture
def channel(wire):
    # No BDP probing: the client's receive window stays at 64 KiB, so a bigger answer has to
    # wait for its WINDOW_UPDATEs.
    with grpc.insecure_channel(wire[2], options=[("grpc.http2.bdp_probe", 0),
                                                 ("grpc.max_receive_message_length", -1)]) as ch:
        yield ch


def _method(channel, name: str, kind: str = "unary_unary"):
    return getattr(channel, kind)(f"/{SERVICE}/{name}")


def test_a_message_many_windows_long_goes_both_ways_whole(channel):
    payload = bytes(range(256)) * (5 * 4096 + 17)  # ~5 MB, 80 windows of 64 KiB
    answer, call = _method(channel, "Echo").with_call(payload)
    assert answer == payload
    assert ("x-echo-len", str(len(payload))) in call.trailing_metadata()


def test_metadata_reaches_the_method_and_trailing_metadata_comes_back_with_binary_values(
        wire, channel):
    service = wire[0]
    _, call = _method(channel, "Echo").with_call(
        b"x", metadata=(("x-routing-key", "user-7"), ("x-token-bin", b"\x01\x02\xfe")))
    assert ("x-routing-key", "user-7") in service.metadata
    assert ("x-token-bin", b"\x01\x02\xfe") in service.metadata
    assert ("x-raw-bin", b"\x00\xffok") in call.trailing_metadata()


def test_each_call_on_a_connection_gets_its_own_metadata_as_the_header_table_changes(wire):
    # repeated blocks are decoded once while the HPACK table stands still; a new value
    # enters the table and shifts every index, so the same bytes later mean another header
    # ("a", "a": index 62 is a; "b": b is 62 now, and "b" again is the very block "a" was)
    service, connection = wire[0], _RawConnection(wire[2])
    try:
        for value in ["a", "a", "b", "b", "a", "a", "c", "c", "d" * 300, "d" * 300, "a"]:
            headers = connection.call(b"\x00\x00\x00\x00\x01x", indexed=True,
                                      metadata=((b"x-pick", value.encode()),))
            assert headers[b"grpc-status"] == b"0"
            assert ("x-pick", value) in service.metadata
    finally:
        connection.close()


def test_an_abort_is_the_status_and_details_the_method_gave_even_unprintable_ones(channel):
    details = "naïve 100% wrong\nline"
    with pytest.raises(grpc.RpcError) as info:
        _method(channel, "Fail")(details.encode())
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == details


def test_an_unknown_method_is_unimplemented(channel):
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(f"/{SERVICE}/Nope")(b"")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "/test.Wire/Nope" in info.value.details()


def test_a_message_over_the_limit_is_resource_exhausted_naming_both_sizes(channel):
    with pytest.raises(grpc.RpcError) as info:
        _method(channel, "Echo")(b"\x00" * (LIMIT + 1))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{LIMIT + 1} vs. {LIMIT}" in info.value.details()


def test_a_gzip_compressed_request_is_read(wire):
    with grpc.insecure_channel(wire[2], compression=grpc.Compression.Gzip) as ch:
        payload = b"compress me " * 10_000
        assert _method(ch, "Echo")(payload) == payload


def test_a_deadline_ends_the_call_and_cancels_the_method(wire, channel):
    service = wire[0]
    service.cancelled.clear()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        _method(channel, "Slow")(b"30", timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert service.cancelled.wait(5)
    assert time.monotonic() - started < 10


def test_a_call_the_client_cancels_cancels_the_method(wire, channel):
    service = wire[0]
    service.cancelled.clear()
    service.started.clear()
    future = _method(channel, "Slow").future(b"30")
    assert service.started.wait(5)
    future.cancel()
    assert service.cancelled.wait(5)


def test_server_and_bidirectional_streams_keep_order(channel):
    assert list(_method(channel, "Count", "unary_stream")(b"300")) == [
        str(i).encode() for i in range(300)]
    words = [f"word {i}".encode() for i in range(50)]
    assert list(_method(channel, "Chat", "stream_stream")(iter(words))) == [
        w.upper() for w in words]


def test_two_hundred_concurrent_calls_on_one_connection_all_answer(channel):
    echo = _method(channel, "Echo")
    futures = [echo.future(str(i).encode() * 100) for i in range(200)]
    assert [f.result(timeout=30) for f in futures] == [str(i).encode() * 100 for i in range(200)]


def test_a_connection_that_is_not_http2_is_dropped_and_others_are_served(wire, channel):
    host, port = wire[2].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        raw.settimeout(5)
        received = b""
        while chunk := raw.recv(4096):  # our SETTINGS, then GOAWAY, then the close
            received += chunk
    assert received[3] == 0x4 and b"\x07\x00\x00\x00\x00\x00" in received  # SETTINGS … GOAWAY
    assert _method(channel, "Echo")(b"still here") == b"still here"


def test_a_unary_method_sent_two_messages_is_unimplemented(channel):
    with pytest.raises(grpc.RpcError) as info:
        channel.stream_unary(f"/{SERVICE}/Echo")(iter([b"one", b"two"]))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "exactly one request message" in info.value.details()


_REQUEST_HEADERS = ((b":method", b"POST"), (b":scheme", b"http"),
                    (b":path", f"/{SERVICE}/Echo".encode()), (b":authority", b"x"),
                    (b"content-type", b"application/grpc"), (b"te", b"trailers"))


class _RawConnection:
    """An HTTP/2 connection framed by hand: calls to Echo, one after another, header blocks
    either literal or from an HPACK encoder that indexes what it sends."""

    def __init__(self, address: str) -> None:
        from hpack import Decoder, Encoder

        host, port = address.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.encoder, self.decoder = Encoder(), Decoder()
        self.received = b""
        self.stream = 1
        self.preface_sent = False

    def call(self, message: bytes, *, metadata: tuple = (), byte_by_byte: bool = False,
             indexed: bool = False) -> dict[bytes, bytes]:
        """Sends one call; the trailers (or trailers-only headers) that come back."""
        from hpack import NeverIndexedHeaderTuple

        from serving.grpc.http2 import (
            DATA,
            END_HEADERS,
            END_STREAM,
            HEADERS,
            PREFACE,
            SETTINGS,
            frame,
            header_field,
        )

        if indexed:  # the metadata indexed, the rest literal: its indices alone make the block
            block = self.encoder.encode(
                [NeverIndexedHeaderTuple(k, v) for k, v in _REQUEST_HEADERS] + list(metadata))
        else:
            block = b"".join(header_field(k, v) for k, v in (*_REQUEST_HEADERS, *metadata))
        wire = (b"" if self.preface_sent else PREFACE + frame(SETTINGS, 0, 0)) + frame(
            HEADERS, END_HEADERS, self.stream, block) + frame(DATA, END_STREAM, self.stream,
                                                              message)
        self.preface_sent, self.stream = True, self.stream + 2
        for i in range(len(wire)) if byte_by_byte else [None]:
            self.sock.sendall(wire[i:i + 1] if i is not None else wire)
        headers: dict[bytes, bytes] = {}
        while b"grpc-status" not in headers:
            while len(self.received) < 9 or len(self.received) < 9 + int.from_bytes(
                    self.received[:3], "big"):
                chunk = self.sock.recv(65536)
                assert chunk, f"closed before the call's status: {headers}"
                self.received += chunk
            length, ftype = int.from_bytes(self.received[:3], "big"), self.received[3]
            if ftype == HEADERS:
                headers.update(self.decoder.decode(self.received[9:9 + length], raw=True))
            self.received = self.received[9 + length:]
        return headers

    def close(self) -> None:
        self.sock.close()


def _raw_call(address: str, message: bytes, *, byte_by_byte: bool) -> dict[bytes, bytes]:
    connection = _RawConnection(address)
    try:
        return connection.call(message, byte_by_byte=byte_by_byte)
    finally:
        connection.close()


def test_a_call_framed_by_hand_is_answered_even_sent_a_byte_at_a_time(wire):
    headers = _raw_call(wire[2], b"\x00" + (3).to_bytes(4, "big") + b"abc", byte_by_byte=True)
    assert headers[b"grpc-status"] == b"0"
    assert headers[b"x-echo-len"] == b"3"


def test_a_message_cut_short_is_an_error_not_a_hang(wire, channel):
    headers = _raw_call(wire[2], b"\x00" + (10).to_bytes(4, "big") + b"abc", byte_by_byte=False)
    assert headers[b"grpc-status"] == b"12"  # UNIMPLEMENTED, as for two messages
    assert _method(channel, "Echo")(b"still here") == b"still here"


def test_stop_lets_a_call_in_flight_finish_and_takes_no_new_calls():
    service = _Service()
    server, port, loop = _serve({"Slow": grpc.unary_unary_rpc_method_handler(service.slow)})
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            slow = ch.unary_unary(f"/{SERVICE}/Slow")
            future = slow.future(b"0.5")
            assert service.started.wait(5)
            stopping = asyncio.run_coroutine_threadsafe(server.stop(10), loop)
            assert future.result(timeout=10) == b"done"
            stopping.result(10)
            with pytest.raises(grpc.RpcError) as info:
                slow(b"0", timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        loop.call_soon_threadsafe(loop.stop)
