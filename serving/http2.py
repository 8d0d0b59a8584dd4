"""An HTTP/2 server connection (RFC 9113) on an asyncio Protocol, for the gRPC front.

grpcio's asyncio server hands every call across three threads (its poller, its event engine,
the event loop) and tops out near 4,700 empty calls/s on one core here; this connection runs
in the event loop that already serves HTTP and answers a call with one write. It does the
framing, flow control (both ways), SETTINGS/PING/GOAWAY/RST_STREAM and header decoding (hpack,
a well-kept HPACK codec); what a stream means is the `StreamHandler`'s business (serving.
grpc_server). Header blocks it sends are literal fields without indexing, so it keeps no HPACK
encoder state at all.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Protocol

from hpack import Decoder
from hpack.exceptions import HPACKError

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
# settings
S_HEADER_TABLE_SIZE, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE = 0x1, 0x3, 0x4
S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x5, 0x6

#: What we let a peer send: frames up to 1 MiB (a 3×224×224 tensor in one frame instead of 37),
#: 16 MiB per stream and 64 MiB per connection before our WINDOW_UPDATE.
MAX_FRAME = 1 << 20
STREAM_WINDOW = 1 << 24
CONNECTION_WINDOW = 1 << 26
MAX_STREAMS = 1024
MAX_HEADER_BLOCK = 1 << 16
MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65_535
DECODED_BLOCKS = 64  # header blocks remembered per connection (_decode), each at most
DECODED_BLOCK_BYTES = 512  # this long: a repeating client's indexed block is a few bytes

_HEAD = struct.Struct(">HBBBL")  # 24-bit length as 16 + 8, type, flags, stream id


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 8, n & 0xFF, ftype, flags, stream_id) + payload


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's prefixed integer (RFC 7541 §5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_field(name: bytes, value: bytes) -> bytes:
    """One literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


STATUS_200 = b"\x88"  # the static table's ":status: 200"


def status_field(status: int) -> bytes:
    return STATUS_200 if status == 200 else header_field(b":status", str(status).encode())


class StreamHandler(Protocol):
    """What one connection's streams mean (serving.grpc_server's calls)."""

    def on_headers(self, stream: Stream, headers: list[tuple[bytes, bytes]],
                   end_stream: bool) -> None: ...

    def on_data(self, stream: Stream, data: memoryview, end_stream: bool) -> None: ...

    def on_reset(self, stream: Stream) -> None: ...


class Stream:
    """One HTTP/2 stream: what the handler sends on it, within the peer's windows."""

    __slots__ = ("conn", "id", "send_window", "received", "remote_closed", "local_closed",
                 "headers_sent", "_pending", "_pending_end", "_waiter", "call")

    def __init__(self, conn: Http2Connection, stream_id: int, send_window: int) -> None:
        self.conn = conn
        self.id = stream_id
        self.send_window = send_window
        self.received = 0  # bytes taken since our last WINDOW_UPDATE for this stream
        self.remote_closed = self.local_closed = self.headers_sent = False
        self._pending = bytearray()  # DATA payload waiting for window
        self._pending_end: bytes | None = None  # the trailing HEADERS frame to follow it
        self._waiter: asyncio.Future | None = None
        self.call = None  # the handler's object for this stream

    def send_headers(self, block: bytes, *, end_stream: bool = False) -> None:
        if self.local_closed:
            return
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        if end_stream and self._pending:  # trailers wait for the data before them
            self._pending_end = self.conn.header_frames(self.id, block, flags)
            return
        self.conn.send(self.conn.header_frames(self.id, block, flags))
        self.headers_sent = True
        if end_stream:
            self._closed_locally()

    def send_data(self, payload: bytes) -> None:
        """Queue payload as DATA frames: sent now as far as both windows allow."""
        if self.local_closed:
            return
        if self._pending:
            self._pending += payload
            return
        sent = self.conn.write_data(self, payload, 0)
        if sent < len(payload):
            self._pending += payload[sent:]
            self.conn.blocked[self.id] = self

    def flush(self) -> None:
        """Send what waited for window; wake a writer waiting on drained()."""
        if self._pending:
            sent = self.conn.write_data(self, self._pending, 0)
            del self._pending[:sent]
        if not self._pending:
            self.conn.blocked.pop(self.id, None)
            if self._pending_end is not None:
                end, self._pending_end = self._pending_end, None
                self.conn.send(end)
                self._closed_locally()
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    async def drained(self) -> None:
        """Wait until what was queued has gone out (a streaming writer's back-pressure)."""
        while self._pending and not self.local_closed and not self.conn.closed:
            self._waiter = self.conn.loop.create_future()
            await self._waiter

    def reset(self, code: int = CANCEL) -> None:
        if not self.local_closed or not self.remote_closed:
            self.conn.send(frame(RST_STREAM, 0, self.id, code.to_bytes(4, "big")))
        self.local_closed = self.remote_closed = True
        self._forget()

    def _closed_locally(self) -> None:
        self.local_closed = True
        if not self.remote_closed:  # answered before the request ended: stop its sending
            self.conn.send(frame(RST_STREAM, 0, self.id, NO_ERROR.to_bytes(4, "big")))
            self.remote_closed = True
        self._forget()

    def _forget(self) -> None:
        self._pending.clear()
        self._pending_end = None
        self.conn.forget(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Http2Connection(asyncio.Protocol):
    """One client connection: frames in, streams to the handler, frames out in one write per
    event-loop turn."""

    def __init__(self, handler_factory, on_close=None) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler: StreamHandler = handler_factory(self)
        self._on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self._buf = bytearray()
        self._preface = False
        self._decoder = Decoder()
        self._decoder.max_allowed_table_size = 4096
        self._decoded: dict[bytes, list] = {}  # header blocks seen since the table last changed
        self._continued: tuple[int, int, bytearray] | None = None  # HEADERS awaiting CONTINUATION
        self.streams: dict[int, Stream] = {}
        self.blocked: dict[int, Stream] = {}
        self.last_stream = 0
        self.peer_max_frame = 16_384
        self.peer_window = DEFAULT_WINDOW  # the peer's initial window for new streams
        self.send_window = DEFAULT_WINDOW  # the connection's window for what we send
        self._received = 0  # connection bytes taken since our last WINDOW_UPDATE
        self._out: list[bytes] = []
        self.going_away = False
        self.closed = False

    # -- transport ---------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host, port = peer[0], peer[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        settings = b"".join(struct.pack(">HL", k, v) for k, v in (
            (S_MAX_CONCURRENT_STREAMS, MAX_STREAMS), (S_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (S_MAX_FRAME_SIZE, MAX_FRAME), (S_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK)))
        self.send(frame(SETTINGS, 0, 0, settings))
        grow = CONNECTION_WINDOW - DEFAULT_WINDOW
        self.send(frame(WINDOW_UPDATE, 0, 0, grow.to_bytes(4, "big")))

    def connection_lost(self, exc) -> None:
        self.closed = True
        for stream in list(self.streams.values()):
            stream.local_closed = stream.remote_closed = True
            self.handler.on_reset(stream)
            stream._forget()
        self.streams.clear()
        if self._on_close is not None:
            self._on_close(self)

    def send(self, data: bytes) -> None:
        """Frames out: gathered during this turn of the loop and written once after it."""
        if self.closed:
            return
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and not self.closed and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def close(self, code: int = NO_ERROR) -> None:
        if self.closed:
            return
        self._send_goaway(code)
        self._flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def go_away(self) -> None:
        """No new streams on this connection; the open ones finish (a graceful stop)."""
        if not self.going_away and not self.closed:
            self.going_away = True
            self._send_goaway(NO_ERROR)
            if not self.streams:
                self.loop.call_soon(self.close)

    def _send_goaway(self, code: int) -> None:
        self.send(frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_stream, code)))

    def forget(self, stream: Stream) -> None:
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        if self.going_away and not self.streams:
            self.loop.call_soon(self.close)

    # -- output ------------------------------------------------------------------------------

    def header_frames(self, stream_id: int, block: bytes, flags: int) -> bytes:
        limit = self.peer_max_frame
        if len(block) <= limit:
            return frame(HEADERS, flags, stream_id, block)
        parts = [frame(HEADERS, flags & ~END_HEADERS, stream_id, block[:limit])]
        for i in range(limit, len(block), limit):
            last = i + limit >= len(block)
            parts.append(frame(CONTINUATION, END_HEADERS if last else 0, stream_id,
                               block[i:i + limit]))
        return b"".join(parts)

    def write_data(self, stream: Stream, payload, start: int) -> int:
        """DATA frames for payload[start:] within the windows; how many bytes went."""
        sent = start
        end = len(payload)
        while sent < end:
            n = min(end - sent, self.send_window, stream.send_window, self.peer_max_frame)
            if n <= 0:
                break
            self.send(frame(DATA, 0, stream.id, bytes(payload[sent:sent + n])))
            sent += n
            self.send_window -= n
            stream.send_window -= n
        return sent - start

    # -- input -------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Frames whole in this read are parsed from it where they lie (a 600 KB message
        arrives in a few reads of many frames: none of it is copied here); only a frame cut
        by the read's end waits in `_buf` for the rest."""
        buf = self._buf
        if buf:
            buf += data
            data = buf
        if not self._preface:
            if len(data) < len(PREFACE):
                if not PREFACE.startswith(bytes(data)):
                    self.close(PROTOCOL_ERROR)
                elif not buf:
                    buf += data
                return
            if data[:len(PREFACE)] != PREFACE:
                self.close(PROTOCOL_ERROR)
                return
            self._preface = True
            pos = len(PREFACE)
        else:
            pos = 0
        size = len(data)
        view = memoryview(data)
        try:
            while size - pos >= 9 and not self.closed:
                hi, lo, ftype, flags, stream_id = _HEAD.unpack_from(data, pos)
                length = hi << 8 | lo
                if length > MAX_FRAME:
                    self.close(FRAME_SIZE_ERROR)
                    return
                end = pos + 9 + length
                if end > size:
                    break
                self._frame(ftype, flags, stream_id & 0x7FFFFFFF, view[pos + 9:end])
                pos = end
        except _ConnectionError as exc:
            log.info("HTTP/2 connection from %s closed: %s", self.peer, exc.reason)
            self.close(exc.code)
        finally:
            view.release()
            if not self.closed:
                if data is buf:
                    del buf[:pos]
                elif pos < size:
                    buf += memoryview(data)[pos:]

    def _frame(self, ftype: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continued is not None and ftype != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if ftype == DATA:
            self._data(flags, stream_id, payload)
        elif ftype == HEADERS:
            self._headers(flags, stream_id, payload)
        elif ftype == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif ftype == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif ftype == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif ftype == PING:
            if len(payload) != 8:
                raise _ConnectionError(FRAME_SIZE_ERROR, "PING of the wrong size")
            if not flags & ACK:
                self.send(frame(PING, ACK, 0, bytes(payload)))
        elif ftype == RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                stream.local_closed = stream.remote_closed = True
                self.handler.on_reset(stream)
                stream._forget()
        elif ftype == GOAWAY:
            self.going_away = True
            if not self.streams:
                self.close()
        elif ftype == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown types: ignored (RFC 9113 §5.5)

    @staticmethod
    def _unpad(flags: int, payload: memoryview) -> memoryview:
        if flags & PADDED:
            if not payload:
                raise _ConnectionError(PROTOCOL_ERROR, "padded frame without a pad length")
            pad = payload[0]
            if pad >= len(payload):
                raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1:len(payload) - pad]
        return payload

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        self._received += len(payload)
        if self._received >= CONNECTION_WINDOW // 2:
            self.send(frame(WINDOW_UPDATE, 0, 0, self._received.to_bytes(4, "big")))
            self._received = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self.last_stream:
                raise _ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream already answered or reset: its data is dropped
        stream.received += len(payload)
        end = bool(flags & END_STREAM)
        if stream.received >= STREAM_WINDOW // 2 and not end:
            self.send(frame(WINDOW_UPDATE, 0, stream_id, stream.received.to_bytes(4, "big")))
            stream.received = 0
        if end:
            stream.remote_closed = True
        self.handler.on_data(stream, self._unpad(flags, payload), end)

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(flags, stream_id, bytes(block))
        else:
            self._continued = (stream_id, flags, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continued is None or self._continued[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION out of place")
        block = self._continued[2]
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise _ConnectionError(PROTOCOL_ERROR, "header block too large")
        if flags & END_HEADERS:
            first_flags = self._continued[1]
            self._continued = None
            self._header_block(first_flags, stream_id, bytes(block))

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        headers = self._decoded.get(block)
        if headers is None:
            headers = self._decode(block)
        end = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers of a request
            if not end:
                raise _ConnectionError(PROTOCOL_ERROR, "trailers without END_STREAM")
            if not stream.remote_closed:
                stream.remote_closed = True
                self.handler.on_data(stream, memoryview(b""), True)
            return
        if stream_id % 2 == 0 or stream_id <= self.last_stream:
            if stream_id <= self.last_stream:
                return  # a stream we already closed (e.g. reset): nothing to open
            raise _ConnectionError(PROTOCOL_ERROR, "a client stream id must be odd")
        self.last_stream = stream_id
        if self.going_away or len(self.streams) >= MAX_STREAMS:
            self.send(frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            return
        stream = Stream(self, stream_id, self.peer_window)
        stream.remote_closed = end
        self.streams[stream_id] = stream
        self.handler.on_headers(stream, headers, end)

    def _decode(self, block: bytes) -> list:
        """HPACK-decode a block; remember what it said while the dynamic table stays as it was.

        A client repeating a call sends the same few bytes each time (every field indexed):
        such a block changes nothing, so while the table is unchanged it means the same
        headers again and the decoding (~10 µs in pure Python) is done once. A block that adds
        to (or evicts from) the table shifts every index: what was remembered is forgotten.
        """
        table = self._decoder.header_table.dynamic_entries
        length, front = len(table), table[0] if table else None
        try:
            headers = self._decoder.decode(block, raw=True)
        except HPACKError as exc:
            raise _ConnectionError(COMPRESSION_ERROR, f"bad header block: {exc}") from exc
        if len(table) != length or (table[0] if table else None) is not front:
            self._decoded.clear()
        elif len(block) <= DECODED_BLOCK_BYTES:
            if len(self._decoded) >= DECODED_BLOCKS:  # e.g. a grpc-timeout in every call
                self._decoded.clear()
            self._decoded[block] = headers
        return headers

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, i)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "initial window too large")
                delta, self.peer_window = value - self.peer_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not 16_384 <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, "max frame size out of range")
                self.peer_max_frame = value
        self.send(frame(SETTINGS, ACK, 0))
        self._unblock()

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
            if increment == 0 or stream.send_window > MAX_WINDOW:
                stream.reset(PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
                self.handler.on_reset(stream)
                return
        self._unblock()

    def _unblock(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            stream.flush()


class _ConnectionError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
