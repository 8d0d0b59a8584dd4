"""Bounds on what a client can make a listener hold, in one place (EdgeLimits): the HTTP
listener (serving.http.protocol: header timeout and size, its share of the connection budget), the
gRPC port (serving.grpc.front: grpcio's server configured from the same figures) and the ASGI
side here (BodyReader: how long a request body may take to arrive, and how many body bytes the
whole process buffers at once). BodyReader knows nothing of uvicorn. The hot path, a small
body that arrives with its headers, costs one dict insert and one delete: deadlines are checked
by one periodic sweep per process, not by a timer per request.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from serving.core.errors import BodyBudgetExhausted, InvalidInput, PayloadTooLarge, RequestTimeout

#: Bodies up to this size stay outside the budget: the server reads this much per connection
#: before it stops reading (uvicorn's flow-control high-water mark), so the connection cap
#: bounds them already.
UNBUDGETED_BYTES = 64 * 1024
#: Once bodies held this much at the same time, give the freed heap back to the OS when none is
#: being read any more: glibc keeps up to 64 MiB of freed memory in its heap (its dynamic mmap
#: threshold), so without a trim an attack's memory would stay resident after the attack. Not
#: after every large body: trimming under a steady load of them costs page faults (measured:
#: conv binary c=8 lost 6 % trimming once a second).
TRIM_AFTER_BYTES = 32 * 1024 * 1024
TRIM_DELAY_S = 1.0
#: A worker that answered requests and then none for this long trims its heap (trim_when_idle).
IDLE_TRIM_S = 5.0


@dataclass(frozen=True)
class EdgeLimits:
    """Every bound a client meets at the network edge, for every listener (HTTP/1.1, the gRPC
    port, the embedded console), read from MMC_* environment variables in one place (from_env):
    the transports take their figures from here and restate none.

    `max_connections` is one process-wide budget of client connections: it is capped by the
    file descriptors the process may open, less `fd_reserve` kept for the database, the
    artifact store and logs, and split between the listeners (connection_caps).
    """

    header_timeout_s: float = 10.0  # HTTP: a request's head; gRPC: the connection's handshake
    max_header_bytes: int = 64 * 1024  # HTTP: a request's head; gRPC: a call's metadata
    body_idle_timeout_s: float = 10.0
    body_min_rate: float = 16 * 1024  # bytes/s on average, enforced after body_idle_timeout_s
    buffered_body_budget_bytes: int = 256 * 1024 * 1024
    #: gRPC answers computed and handed to the transport but not yet sent (a client that grants
    #: no window holds them), whole process: past it a call is refused RESOURCE_EXHAUSTED
    unsent_answer_budget_bytes: int = 16 * 1024 * 1024
    max_connections: int = 2048
    fd_reserve: int = 256
    #: the share of max_connections the gRPC port may hold when it is on (the rest is HTTP's)
    grpc_connection_share: float = 0.25
    idle_timeout_s: float = 60.0  # a connection with no call in flight is closed after this
    max_concurrent_streams: int = 100  # gRPC calls in flight on one connection
    #: keepalive: a client may ping at most this often with no call in flight; pings faster
    #: than that are strikes, and a few strikes end the connection (GOAWAY too_many_pings)
    min_ping_interval_s: float = 10.0
    max_ping_strikes: int = 2
    #: System shared memory (serving.core.shared_memory): whether clients may register regions
    #: at all (off: a client that reaches the port could otherwise have the server map any
    #: object of its user under /dev/shm), and how many regions and bytes the process maps
    shared_memory: bool = False
    shared_memory_max_regions: int = 64
    shared_memory_max_bytes: int = 1 << 30

    @classmethod
    def from_env(cls, env=None) -> EdgeLimits:
        e = os.environ if env is None else env

        def get(name: str, kind, default):
            value = e.get(name)
            return kind(value) if value not in (None, "") else default

        return cls(
            header_timeout_s=get("MMC_HEADER_TIMEOUT_S", float, cls.header_timeout_s),
            max_header_bytes=get("MMC_MAX_HEADER_BYTES", int, cls.max_header_bytes),
            body_idle_timeout_s=get("MMC_BODY_IDLE_TIMEOUT_S", float, cls.body_idle_timeout_s),
            body_min_rate=get("MMC_BODY_MIN_RATE", float, cls.body_min_rate),
            buffered_body_budget_bytes=get("MMC_BUFFERED_BODY_BUDGET_BYTES", int,
                                           cls.buffered_body_budget_bytes),
            unsent_answer_budget_bytes=get("MMC_UNSENT_ANSWER_BUDGET_BYTES", int,
                                           cls.unsent_answer_budget_bytes),
            max_connections=get("MMC_MAX_CONNECTIONS", int, cls.max_connections),
            fd_reserve=get("MMC_FD_RESERVE", int, cls.fd_reserve),
            grpc_connection_share=get("MMC_GRPC_CONNECTION_SHARE", float,
                                      cls.grpc_connection_share),
            idle_timeout_s=get("MMC_IDLE_TIMEOUT_S", float, cls.idle_timeout_s),
            max_concurrent_streams=get("MMC_MAX_CONCURRENT_STREAMS", int,
                                       cls.max_concurrent_streams),
            min_ping_interval_s=get("MMC_MIN_PING_INTERVAL_S", float, cls.min_ping_interval_s),
            max_ping_strikes=get("MMC_MAX_PING_STRIKES", int, cls.max_ping_strikes),
            shared_memory=get("MMC_SHM", _switch, cls.shared_memory),
            shared_memory_max_regions=get("MMC_SHM_MAX_REGIONS", int,
                                          cls.shared_memory_max_regions),
            shared_memory_max_bytes=get("MMC_SHM_MAX_BYTES", int, cls.shared_memory_max_bytes),
        )

    def connection_budget(self) -> int:
        """Client connections the whole process may hold: max_connections, or fewer where the
        file-descriptor limit less the reserve is lower (0: no cap asked for)."""
        if not self.max_connections:
            return 0
        return max(1, min(self.max_connections, open_files_limit() - self.fd_reserve))

    def connection_caps(self, *, grpc: bool) -> tuple[int, int]:
        """(HTTP, gRPC) connection caps: one budget, split when the gRPC port is on."""
        budget = self.connection_budget()
        if not grpc or not budget:
            return budget, 0
        grpc_cap = max(1, int(budget * self.grpc_connection_share))
        return max(1, budget - grpc_cap), grpc_cap


def _switch(value: str) -> bool:
    """An on/off setting as the console reads its own: on/true/yes/1, off/false/no/0."""
    word = value.strip().lower()
    if word in ("on", "true", "yes", "1"):
        return True
    if word in ("off", "false", "no", "0"):
        return False
    raise ValueError(f"MMC_SHM={value!r}: on or off")


def raise_open_files_limit() -> int:
    """Lift the soft file-descriptor limit to the hard one (the default soft limit, often
    1,024, is lower than the connection budget), and return what is in force."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, OSError, ValueError):
        pass
    return open_files_limit()


def open_files_limit() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError):
        return 1 << 20
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class _Read:
    """One body being read: what the sweep needs to judge it."""

    __slots__ = ("start", "last", "received", "expired")

    def __init__(self, now: float) -> None:
        self.start = self.last = now
        self.received = 0
        self.expired = ""


class BodyReader:
    """Reads ASGI request bodies under EdgeLimits, with one process-wide byte budget."""

    def __init__(self, limits: EdgeLimits) -> None:
        self.limits = limits
        self.budget = limits.buffered_body_budget_bytes
        self.buffered = 0  # bytes of unfinished bodies held (or reserved) right now
        self._reads: dict[asyncio.Task, _Read | None] = {}  # None: not judged yet
        self._sweep_loop: asyncio.AbstractEventLoop | None = None  # where the sweep runs
        self._tick = min(1.0, max(0.02, limits.body_idle_timeout_s / 4))
        self._high_water = 0  # most bytes held at once since the last trim

    async def read(self, receive, declared: int, limit: int) -> bytes:
        """The whole request body.

        `declared` is the Content-Length (-1 if none). 413 past `limit`, 503 + Retry-After when
        the budget cannot take it, 408 when it stalls or trickles, 400 if the client leaves.
        """
        task = asyncio.current_task()
        reads = self._reads
        reads[task] = None  # a body that arrived with its headers is gone before any sweep
        loop = task.get_loop()
        if self._sweep_loop is not loop:
            self._sweep_loop = loop
            loop.call_later(self._tick, self._sweep, loop)
        held = 0
        try:
            if declared > UNBUDGETED_BYTES:  # reserve up front: refuse before reading a byte
                held = self._reserve(declared, declared)
            message = await receive()
            body = message.get("body", b"")
            if not message.get("more_body"):
                if message["type"] != "http.request":
                    raise _gone()
                if len(body) > limit:
                    raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
                return body
            read = reads[task] or _Read(loop.time())
            reads[task] = read
            read.last = loop.time()
            parts = [body]
            size = len(body)
            while True:
                read.received = size
                message = await receive()
                if message["type"] != "http.request":
                    raise _gone()
                chunk = message.get("body", b"")
                if chunk:
                    read.last = loop.time()
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
                    if declared < 0 and size > UNBUDGETED_BYTES:
                        held += self._reserve(len(chunk), size)
                    parts.append(chunk)
                if not message.get("more_body"):
                    return b"".join(parts)
        except asyncio.CancelledError:
            read = reads[task]
            if read is None or not read.expired:
                raise
            task.uncancel()
            raise RequestTimeout(read.expired) from None
        finally:
            del reads[task]
            parts = None  # a failed body is freed now, not when its traceback goes
            if held:
                self.buffered -= held
                if not self.buffered and self._high_water >= TRIM_AFTER_BYTES:
                    trim_heap_soon(ready=self._trim_ready)

    def _reserve(self, n: int, total: int) -> int:
        if self.buffered + n > self.budget:
            raise BodyBudgetExhausted(
                f"the server is buffering {self.buffered} bytes of request bodies; a body of "
                f"{total} bytes would exceed its budget of {self.budget} bytes: retry shortly")
        self.buffered += n
        if self.buffered > self._high_water:
            self._high_water = self.buffered
        return n

    def _trim_ready(self) -> bool:
        """The heap is trimmed once the bodies are gone: a second after the last large one was
        read, if no other is buffering by then (else the next release schedules it again)."""
        if self.buffered:
            return False
        self._high_water = 0
        return True

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the reads that went idle or fell under the minimum rate (they answer 408)."""
        if self._sweep_loop is not loop:
            return  # another loop took over (a host that runs more than one, one at a time)
        if not self._reads:
            self._sweep_loop = None
            return
        now = loop.time()
        idle = self.limits.body_idle_timeout_s
        rate = self.limits.body_min_rate
        for task, read in list(self._reads.items()):
            if read is None:  # its clock starts now
                self._reads[task] = _Read(now)
            elif read.expired:
                continue
            elif now - read.last > idle:
                read.expired = (f"no request body bytes arrived for {idle:g} s "
                                f"({read.received} bytes received)")
                task.cancel()
            elif rate > 0 and read.received < rate * (now - read.start - idle):
                read.expired = (f"request body arrives slower than the minimum of {rate:g} "
                                f"bytes/s ({read.received} bytes in {now - read.start:.0f} s)")
                task.cancel()
        loop.call_later(self._tick, self._sweep, loop)


def trim_heap_soon(delay: float = TRIM_DELAY_S, ready: Callable[[], bool] | None = None) -> None:
    """Give freed heap pages back to the OS (glibc's malloc_trim; elsewhere nothing) `delay`
    seconds from now, unless `ready()` then says not yet; at most one is pending per process."""
    global _trim_pending
    if _trim_pending:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _trim_pending = True

    def trim() -> None:
        global _trim_pending
        _trim_pending = False
        if ready is not None and not ready():
            return
        malloc_trim = _malloc_trim()
        if malloc_trim is not None:
            malloc_trim(0)

    loop.call_later(delay, trim)


_trim_pending = False


def trim_heap_now() -> None:
    """Give freed heap pages back to the OS now (glibc's malloc_trim; elsewhere nothing)."""
    malloc_trim = _malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)


class IdleTrim:
    """When to give the heap back: once the process has answered requests and then none for
    `quiet_s`, once per such pause. Under a steady load never (trimming under load costs page
    faults); a burst's arenas (tens of MB after a few hundred conv requests) go back when it
    ends."""

    def __init__(self, quiet_s: float = IDLE_TRIM_S, *, now: float = 0.0) -> None:
        self.quiet_s = quiet_s
        self.trimmed_at = now

    def due(self, in_flight: int, last_end: float, now: float) -> bool:
        """Whether to trim now, given the requests in flight and when the last one ended."""
        if in_flight or last_end <= self.trimmed_at or now - last_end < self.quiet_s:
            return False
        self.trimmed_at = now
        return True


async def trim_when_idle(busy_since: Callable[[], tuple[int, float]],
                         quiet_s: float = IDLE_TRIM_S) -> None:
    """Forever: trim the heap when IdleTrim says so. `busy_since()` says how many requests are
    in flight and when the last one ended (monotonic)."""
    policy = IdleTrim(quiet_s, now=time.monotonic())
    while True:
        await asyncio.sleep(quiet_s)
        if policy.due(*busy_since(), time.monotonic()):
            trim_heap_now()


@functools.cache
def _malloc_trim():
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    return trim


def _gone() -> InvalidInput:
    return InvalidInput("the client disconnected before the request body was complete")
