"""An HTTP/2 server connection (RFC 9113) on an asyncio Protocol, for the gRPC front.

grpcio's asyncio server hands every call across three threads (its poller, its event engine,
the event loop) and tops out near 4,700 empty calls/s on one core here; this connection runs
in the event loop that already serves HTTP and answers a call with one write. It does the
framing, flow control (both ways), SETTINGS/PING/GOAWAY/RST_STREAM and header decoding (hpack,
a well-kept HPACK codec); what a stream means is the `StreamHandler`'s business (serving.
grpc_server). Header blocks it sends are literal fields without indexing, so it keeps no HPACK
encoder state at all.

Every bound a client meets here is a figure of serving.edge_limits.EdgeLimits (handshake and idle
timeouts, header bytes, streams, pings) or a protocol constant below (frames, windows, budgets).
Time is judged by one sweep per server (`sweep`), never by a timer per frame or per stream.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Protocol

from hpack import Decoder
from hpack.exceptions import HPACKError

from serving.edge_limits import EdgeLimits

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB
# settings
S_HEADER_TABLE_SIZE, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE = 0x1, 0x3, 0x4
S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x5, 0x6

#: What we let a peer send: frames up to 1 MiB (a 3×224×224 tensor in one frame instead of 37),
#: 16 MiB per stream and 64 MiB per connection before our WINDOW_UPDATE.
MAX_FRAME = 1 << 20
STREAM_WINDOW = 1 << 24
CONNECTION_WINDOW = 1 << 26
#: What we hold for a peer that does not read: answers waiting for its window or for the socket
#: to drain, per connection (as much as we let it send us before a WINDOW_UPDATE).
MAX_HELD_OUTPUT = CONNECTION_WINDOW
#: Frames that make us work without carrying a call (RST_STREAM, a refused stream, SETTINGS,
#: PRIORITY, unknown types, empty DATA, PING during calls): a burst of this many, refilled at
#: this rate (nghttp2's rapid-reset budget is 1,000 and 33/s); past it, GOAWAY ENHANCE_YOUR_CALM.
FLOOD_BURST = 1000
FLOOD_PER_S = 200.0
MAX_SETTINGS_ENTRIES = 32  # per SETTINGS frame (7 settings are defined)
MAX_CONTINUATIONS = 32  # CONTINUATION frames in one header block
MAX_TABLE_SIZE_UPDATES = 2  # per header block: RFC 7541 §4.2 needs at most two
HEADER_TABLE_SIZE = 4096  # the HPACK table we allow (the default: we never advertise another)
#: Frames parsed per read before the connection lets the loop run others (and reads on after):
#: no connection holds the shared event loop for long, however many small frames it sends.
FRAMES_PER_TURN = 200
#: DATA bytes framed per loop turn per connection (a message begun is framed whole): past it,
#: streams wait for the write (and for pause_writing) as for window, so a writer that never
#: awaits still holds little.
OUT_PER_TURN = 4 << 20
#: The socket's user-space buffer past which writing pauses (pause_writing): a few turns' output,
#: so that the kernel always has the next bytes while a fast reader drains it.
WRITE_BUFFER_HIGH = OUT_PER_TURN
#: How long a connection we end keeps reading (and dropping) what its peer still sends, so the
#: peer reads our GOAWAY before the close: closing with unread input resets the connection,
#: and a reset loses what the peer had not read yet.
LINGER_S = 1.0
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
    """What one connection's streams mean (serving.grpc.server's calls)."""

    def on_headers(self, stream: Stream, headers: list[tuple[bytes, bytes]],
                   end_stream: bool) -> None: ...

    def on_data(self, stream: Stream, data: memoryview, end_stream: bool) -> None: ...

    def on_reset(self, stream: Stream) -> None: ...


class Stream:
    """One HTTP/2 stream: what the handler sends on it, within the peer's windows, and what the
    peer may send on it (`recv_window`, opened by the handler as its call takes the data)."""

    __slots__ = ("conn", "id", "send_window", "recv_window", "remote_closed", "local_closed",
                 "headers_sent", "_pending", "_pending_end", "_waiter", "call", "on_done")

    def __init__(self, conn: Http2Connection, stream_id: int, send_window: int) -> None:
        self.conn = conn
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW  # bytes the peer may still send before our update
        self.remote_closed = self.local_closed = self.headers_sent = False
        self._pending = bytearray()  # DATA payload waiting for window
        self._pending_end: bytes | None = None  # the trailing HEADERS frame to follow it
        self._waiter: asyncio.Future | None = None
        self.call = None  # the handler's object for this stream
        self.on_done: list | None = None  # called once when the stream ends (_forget)

    def open_window(self, want: int) -> None:
        """Let the peer send `want` more bytes: what the call can take now. Granted only once
        the window left is half of that or less, so a steady sender costs few updates."""
        window = self.recv_window
        if window < want and window <= want >> 1 and not self.remote_closed:
            grow = min(want, MAX_WINDOW) - window
            self.conn.send(frame(WINDOW_UPDATE, 0, self.id, grow.to_bytes(4, "big")))
            self.recv_window = window + grow

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
        """Queue payload as DATA frames: sent now as far as both windows allow; what waits
        counts against the connection's MAX_HELD_OUTPUT: past it, a stream that adds to what
        others already hold is reset (one message alone, however long, waits)."""
        if self.local_closed:
            return
        conn = self.conn
        if self._pending:
            sent = 0
        else:
            sent = conn.write_data(self, payload, 0)
            if sent == len(payload):
                return
            conn.blocked[self.id] = self
        conn.held_output += len(payload) - sent
        self._pending += memoryview(payload)[sent:]
        if conn.held_output > MAX_HELD_OUTPUT and conn.held_output > len(self._pending):
            log.info("HTTP/2 stream %d of %s reset: %d bytes of output wait for a peer that "
                     "does not read", self.id, conn.peer, conn.held_output)
            conn.reset_stream(self, CANCEL)

    def flush(self) -> None:
        """Send what waited for window; wake a writer waiting on drained()."""
        if self._pending:
            sent = self.conn.write_data(self, self._pending, 0)
            del self._pending[:sent]
            self.conn.held_output -= sent
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
        if self._pending:
            self.conn.held_output -= len(self._pending)
            self._pending.clear()
        self._pending_end = None
        self.conn.forget(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        done, self.on_done = self.on_done, None
        for callback in done or ():  # its answer went out, or the stream ended without it
            callback()


class Http2Connection(asyncio.Protocol):
    """One client connection: frames in, streams to the handler, frames out in one write per
    event-loop turn."""

    # slots: past ~30 attributes an instance dict no longer shares its keys, and every
    # attribute read on the per-frame path gets slower (CPython 3.11)
    __slots__ = ("_buf", "_continuations", "_continued", "_continued_seen", "_continued_since",
                 "_decoded", "_decoder", "_flood", "_idle_mark", "_idle_since", "_made_at",
                 "_max_header_bytes", "_max_streams", "_on_close", "_out", "_out_size",
                 "_ping_at", "_ping_mark", "_ping_strikes", "_preface", "_reading_paused",
                 "_received", "_settled", "_stalls", "_swept_at", "_write_paused",
                 "_write_paused_at", "_yielded", "blocked", "closed", "going_away", "handler",
                 "held_output", "last_stream", "limits", "loop", "peer", "peer_max_frame",
                 "peer_window", "send_window", "streams", "transport")

    def __init__(self, handler_factory, on_close=None, limits: EdgeLimits | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler: StreamHandler = handler_factory(self)
        self._on_close = on_close
        self.limits = limits = limits if limits is not None else EdgeLimits()
        self._max_streams = limits.max_concurrent_streams
        self._max_header_bytes = limits.max_header_bytes
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self._buf = bytearray()
        self._preface = False
        self._settled = False  # the peer's first SETTINGS arrived: the handshake is done
        self._decoder = Decoder(max_header_list_size=limits.max_header_bytes)
        self._decoder.max_allowed_table_size = HEADER_TABLE_SIZE
        self._decoded: dict[bytes, list] = {}  # header blocks seen since the table last changed
        self._continued: tuple[int, int, bytearray] | None = None  # HEADERS awaiting CONTINUATION
        self._continuations = 0
        self.streams: dict[int, Stream] = {}
        self.blocked: dict[int, Stream] = {}
        self.last_stream = 0
        self.peer_max_frame = 16_384
        self.peer_window = DEFAULT_WINDOW  # the peer's initial window for new streams
        self.send_window = DEFAULT_WINDOW  # the connection's window for what we send
        self._received = 0  # connection bytes taken since our last WINDOW_UPDATE (the peer may
        # send CONNECTION_WINDOW less these)
        self.held_output = 0  # DATA bytes of streams waiting for window or for the socket
        self._out: list[bytes] = []
        self._out_size = 0  # DATA bytes of _out
        self.going_away = False
        self.closed = False
        self._flood = 0.0  # FLOOD_BURST's spent part
        self._ping_at = float("-inf")  # the last PING taken with no call in flight
        self._ping_strikes = 0
        self._ping_mark = 0  # last_stream at the last PING
        self._write_paused = False  # the transport's buffer is over its high-water mark
        self._write_paused_at = 0.0
        self._yielded = False  # FRAMES_PER_TURN reached: the rest of the read waits a turn
        self._reading_paused = False
        # the sweep's marks: when the connection was made, went idle, or began a header block
        self._made_at = self._swept_at = self._idle_since = self._continued_since = 0.0
        self._idle_mark = 0
        self._continued_seen: tuple | None = None
        self._stalls: dict[int, tuple] = {}  # blocked stream -> (what was seen of it, since)

    # -- transport ---------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_HIGH // 4)
        self._made_at = self._swept_at = self._idle_since = self.loop.time()
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host, port = peer[0], peer[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        settings = b"".join(struct.pack(">HL", k, v) for k, v in (
            (S_MAX_CONCURRENT_STREAMS, self.limits.max_concurrent_streams),
            (S_INITIAL_WINDOW_SIZE, STREAM_WINDOW), (S_MAX_FRAME_SIZE, MAX_FRAME),
            (S_MAX_HEADER_LIST_SIZE, self.limits.max_header_bytes)))
        self.send(frame(SETTINGS, 0, 0, settings))
        grow = CONNECTION_WINDOW - DEFAULT_WINDOW
        self.send(frame(WINDOW_UPDATE, 0, 0, grow.to_bytes(4, "big")))

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._end_streams()
        if self._on_close is not None:
            self._on_close(self)

    def _end_streams(self) -> None:
        """The connection is over: every call on it is told, as if its stream were reset."""
        for stream in list(self.streams.values()):
            stream.local_closed = stream.remote_closed = True
            self.handler.on_reset(stream)
            stream._forget()
        self.streams.clear()
        self.blocked.clear()
        self._buf = bytearray()

    def pause_writing(self) -> None:
        """The socket takes less than we write: stop reading (no PING or SETTINGS answers pile
        up behind it) and hold DATA back (streams wait as for window)."""
        self._write_paused = True
        self._write_paused_at = self.loop.time()
        self._pace_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._pace_reading()
        self._unblock()

    def _pace_reading(self) -> None:
        paused = self._write_paused or self._yielded
        if paused != self._reading_paused and not self.closed and self.transport is not None:
            self._reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def send(self, data: bytes) -> None:
        """Frames out: gathered during this turn of the loop and written once after it."""
        if self.closed:
            return
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        self._out_size = 0
        if out and not self.closed and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])
            if self.blocked and not self._write_paused:  # those held back by OUT_PER_TURN
                self._unblock()

    def close(self, code: int = NO_ERROR, debug: bytes = b"") -> None:
        if self.closed:
            return
        self._send_goaway(code, debug)
        self._flush()
        self.closed = True
        self._end_streams()
        transport = self.transport
        if transport is None:
            return
        if self._write_paused or not transport.can_write_eof():  # a peer that does not read
            transport.abort()  # would keep it open
            return
        try:
            transport.write_eof()  # the GOAWAY, then our end; what the peer still sends is dropped
        except OSError:  # the peer is already gone (ENOTCONN): nothing left to tell it
            transport.abort()
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self.loop.call_later(LINGER_S, transport.close)

    def go_away(self) -> None:
        """No new streams on this connection; the open ones finish (a graceful stop)."""
        if not self.going_away and not self.closed:
            self.going_away = True
            self._send_goaway(NO_ERROR)
            if not self.streams:
                self.loop.call_soon(self.close)

    def _send_goaway(self, code: int, debug: bytes = b"") -> None:
        self.send(frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_stream, code) + debug))

    def forget(self, stream: Stream) -> None:
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        if self.going_away and not self.streams:
            self.loop.call_soon(self.close)

    def reset_stream(self, stream: Stream, code: int) -> None:
        """End a stream from our side: RST_STREAM, and its call is told as if the peer had."""
        if stream.id in self.streams:
            stream.reset(code)
            self.handler.on_reset(stream)

    # -- the sweep ---------------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Judge what takes time (the owner calls it every fraction of a second): the handshake
        (EdgeLimits.header_timeout_s, as is a header block left unfinished), idleness (no
        stream for idle_timeout_s), a peer that stops reading (writes paused, or a stream's
        output stuck, for body_idle_timeout_s); and refill the flood budget."""
        if self.closed:
            return
        limits = self.limits
        if self._flood:
            self._flood = max(0.0, self._flood - FLOOD_PER_S * (now - self._swept_at))
        self._swept_at = now
        if not self._settled:
            if now - self._made_at > limits.header_timeout_s:
                self._expire("no HTTP/2 handshake within %gs", limits.header_timeout_s)
            return
        continued = self._continued
        if continued is not None:
            if continued is not self._continued_seen:
                self._continued_seen, self._continued_since = continued, now
            elif now - self._continued_since > limits.header_timeout_s:
                self._expire("a header block unfinished for %gs", limits.header_timeout_s)
                return
        if self.streams or self.last_stream != self._idle_mark:
            self._idle_mark, self._idle_since = self.last_stream, now
        elif now - self._idle_since > limits.idle_timeout_s:
            self.close(NO_ERROR)  # no GOAWAY code to blame: an idle client just reconnects
            return
        stuck = limits.body_idle_timeout_s
        if self._write_paused and now - self._write_paused_at > stuck:
            self._expire("the peer read nothing for %gs", stuck)
            return
        stalls, self._stalls = self._stalls, {}
        for stream in list(self.blocked.values()):
            mark = (len(stream._pending), stream.send_window, self.send_window)
            seen = stalls.get(stream.id)
            if seen is None or seen[0] != mark:
                self._stalls[stream.id] = (mark, now)
            elif now - seen[1] <= stuck:
                self._stalls[stream.id] = seen
            else:
                log.info("HTTP/2 stream %d of %s reset: its output waited %gs for window",
                         stream.id, self.peer, stuck)
                self.reset_stream(stream, CANCEL)

    def _expire(self, reason: str, seconds: float) -> None:
        log.info("HTTP/2 connection from %s closed: " + reason, self.peer, seconds)
        self.close(PROTOCOL_ERROR if not self._settled else ENHANCE_YOUR_CALM)

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
        """DATA frames for payload[start:] within the windows; how many bytes went (none while
        the socket is not draining)."""
        if self._write_paused or self._out_size >= OUT_PER_TURN:
            return 0
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
        self._out_size += sent - start
        return sent - start

    # -- input -------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Frames whole in this read are parsed from it where they lie (a 600 KB message
        arrives in a few reads of many frames: none of it is copied here); only a frame cut
        by the read's end, or frames past FRAMES_PER_TURN, wait in `_buf` for the rest."""
        buf = self._buf
        if self.closed:
            return
        if self._yielded:  # read before reading paused: it waits behind what is parsed next
            buf += data
            return
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
            for _ in range(FRAMES_PER_TURN):
                if size - pos < 9 or self.closed:
                    break
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
            else:
                if size - pos >= 9 and not self.closed:
                    self._yield()
        except _ConnectionError as exc:
            log.info("HTTP/2 connection from %s closed: %s", self.peer, exc.reason)
            self.close(exc.code, exc.debug)
        except Exception:  # a fault of ours: this connection ends, the others go on
            log.exception("HTTP/2 connection from %s failed", self.peer)
            self.close(INTERNAL_ERROR)
        finally:
            view.release()
            if not self.closed:
                if data is buf:
                    del buf[:pos]
                elif pos < size:
                    buf += memoryview(data)[pos:]

    def _yield(self) -> None:
        self._yielded = True
        self._pace_reading()
        self.loop.call_soon(self._read_on)

    def _read_on(self) -> None:
        self._yielded = False
        if not self.closed:
            self.data_received(b"")
            self._pace_reading()

    def _spend(self, what: str) -> None:
        """One frame that makes us work without carrying a call (FLOOD_BURST)."""
        self._flood += 1
        if self._flood > FLOOD_BURST:
            raise _ConnectionError(ENHANCE_YOUR_CALM, f"too many frames without calls ({what})")

    def _frame(self, ftype: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continued is not None and ftype != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if ftype == DATA:
            self._data(flags, stream_id, payload)
        elif ftype == HEADERS:
            self._headers(flags, stream_id, payload)
        elif not self._settled and ftype != SETTINGS:
            raise _ConnectionError(PROTOCOL_ERROR, "the preface is not followed by SETTINGS")
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
                self._ping()
                self.send(frame(PING, ACK, 0, bytes(payload)))
        elif ftype == RST_STREAM:
            self._spend("RST_STREAM")
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
        else:  # PRIORITY and unknown types: ignored (RFC 9113 §5.5), and counted
            self._spend("PRIORITY or unknown")

    def _ping(self) -> None:
        """grpcio's ping policy: with no call in flight a PING sooner than min_ping_interval_s
        after the last is a strike, and past max_ping_strikes the connection ends (GOAWAY
        ENHANCE_YOUR_CALM "too_many_pings"); during calls PINGs are flood frames."""
        if self.streams:
            self._spend("PING")
            return
        if self._ping_mark != self.last_stream:  # a call since the last PING: strikes forgiven
            self._ping_mark, self._ping_strikes = self.last_stream, 0
        now = self.loop.time()
        if now - self._ping_at < self.limits.min_ping_interval_s:
            self._ping_strikes += 1
            if self._ping_strikes > self.limits.max_ping_strikes:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "too many pings", b"too_many_pings")
        self._ping_at = now

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
        n = len(payload)
        received = self._received = self._received + n
        if received >= CONNECTION_WINDOW // 2:  # the connection's window is given back as
            # data arrives: each stream's window bounds what its call holds
            if received > CONNECTION_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA past the connection's window")
            self.send(frame(WINDOW_UPDATE, 0, 0, received.to_bytes(4, "big")))
            self._received = 0
        end = bool(flags & END_STREAM)
        if not n and not end:
            self._spend("empty DATA")
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self.last_stream:
                raise _ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream already answered or reset: its data is dropped
        stream.recv_window -= n
        if stream.recv_window < 0:
            log.info("HTTP/2 stream %d of %s reset: DATA past its window", stream_id, self.peer)
            self.reset_stream(stream, FLOW_CONTROL_ERROR)
            return
        if end:
            stream.remote_closed = True
        self.handler.on_data(stream, self._unpad(flags, payload), end)

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        if not self._settled:
            raise _ConnectionError(PROTOCOL_ERROR, "the preface is not followed by SETTINGS")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        if len(block) > self._max_header_bytes:
            self._too_many_header_bytes()
        if flags & END_HEADERS:
            self._header_block(flags, stream_id, bytes(block))
        else:
            self._continued = (stream_id, flags, bytearray(block))
            self._continuations = 0

    def _too_many_header_bytes(self) -> None:
        raise _ConnectionError(COMPRESSION_ERROR, "a header block over "
                               f"{self.limits.max_header_bytes} bytes (max_header_bytes)")

    def _continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continued is None or self._continued[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION out of place")
        self._continuations += 1
        if self._continuations > MAX_CONTINUATIONS:
            raise _ConnectionError(ENHANCE_YOUR_CALM,
                                   f"a header block in over {MAX_CONTINUATIONS} CONTINUATIONs")
        block = self._continued[2]
        block += payload
        if len(block) > self._max_header_bytes:
            self._too_many_header_bytes()
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
            if stream_id <= self.last_stream:  # a stream we already closed (e.g. reset):
                self._spend("HEADERS of a closed stream")  # nothing to open
                return
            raise _ConnectionError(PROTOCOL_ERROR, "a client stream id must be odd")
        self.last_stream = stream_id
        if self.going_away or len(self.streams) >= self._max_streams:
            self.send(frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            self._spend("refused stream")
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
        _count_table_size_updates(block)
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
        """The peer's settings, applied once per frame whatever it repeats: a new initial
        window moves every stream's window once."""
        if stream_id != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        if len(payload) > 6 * MAX_SETTINGS_ENTRIES:
            raise _ConnectionError(ENHANCE_YOUR_CALM,
                                   f"SETTINGS of over {MAX_SETTINGS_ENTRIES} entries")
        self._settled = True
        self._spend("SETTINGS")
        window = None
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, i)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "initial window too large")
                window = value
            elif key == S_MAX_FRAME_SIZE:
                if not 16_384 <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, "max frame size out of range")
                self.peer_max_frame = value
        if window is not None and window != self.peer_window:
            delta, self.peer_window = window - self.peer_window, window
            for stream in self.streams.values():
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "a stream window overflowed")
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
                self.reset_stream(stream, PROTOCOL_ERROR if increment == 0
                                  else FLOW_CONTROL_ERROR)
                return
            if stream.id in self.blocked:
                stream.flush()
            return  # the others wait on their own windows or on the connection's
        self._unblock()

    def _unblock(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0 or self._write_paused:
                break
            stream.flush()


def _count_table_size_updates(block: bytes) -> None:
    """HPACK dynamic table size updates lead a block (RFC 7541 §4.2); more than
    MAX_TABLE_SIZE_UPDATES of them is a peer resizing our table for its own sake."""
    i, n, size = 0, 0, len(block)
    while i < size and block[i] & 0xE0 == 0x20:
        n += 1
        if n > MAX_TABLE_SIZE_UPDATES:
            raise _ConnectionError(COMPRESSION_ERROR, "too many table size updates")
        if block[i] & 0x1F == 0x1F:  # a multi-byte integer follows the prefix
            i += 1
            while i < size and block[i] & 0x80:
                i += 1
        i += 1


class _ConnectionError(Exception):
    def __init__(self, code: int, reason: str, debug: bytes = b"") -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.debug = debug
