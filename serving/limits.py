"""Bounds on what a client can make the data plane hold: how long a request body may take to
arrive, and how many body bytes the whole process buffers at once.

The header side (header timeout and size, connection cap) lives in serving/protocol.py, below
the ASGI app; this module is the ASGI side and knows nothing of uvicorn. The hot path, a small
body that arrives with its headers, costs one dict insert and one delete: deadlines are checked
by one periodic sweep per process, not by a timer per request.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
from dataclasses import dataclass

from serving.errors import BodyBudgetExhausted, InvalidInput, PayloadTooLarge, RequestTimeout

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


@dataclass(frozen=True)
class RequestLimits:
    """Request-side limits, from MMC_* environment variables (see from_env for the names)."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    body_idle_timeout_s: float = 10.0
    body_min_rate: float = 16 * 1024  # bytes/s on average, enforced after body_idle_timeout_s
    buffered_body_budget_bytes: int = 256 * 1024 * 1024
    max_connections: int = 2048

    @classmethod
    def from_env(cls, env=None) -> RequestLimits:
        e = os.environ if env is None else env
        return cls(
            header_timeout_s=float(e.get("MMC_HEADER_TIMEOUT_S", cls.header_timeout_s)),
            max_header_bytes=int(e.get("MMC_MAX_HEADER_BYTES", cls.max_header_bytes)),
            body_idle_timeout_s=float(e.get("MMC_BODY_IDLE_TIMEOUT_S", cls.body_idle_timeout_s)),
            body_min_rate=float(e.get("MMC_BODY_MIN_RATE", cls.body_min_rate)),
            buffered_body_budget_bytes=int(e.get("MMC_BUFFERED_BODY_BUDGET_BYTES",
                                                 cls.buffered_body_budget_bytes)),
            max_connections=int(e.get("MMC_MAX_CONNECTIONS", cls.max_connections)),
        )


class _Read:
    """One body being read: what the sweep needs to judge it."""

    __slots__ = ("start", "last", "received", "expired")

    def __init__(self, now: float) -> None:
        self.start = self.last = now
        self.received = 0
        self.expired = ""


class BodyReader:
    """Reads ASGI request bodies under RequestLimits, with one process-wide byte budget."""

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        self.budget = limits.buffered_body_budget_bytes
        self.buffered = 0  # bytes of unfinished bodies held (or reserved) right now
        self._reads: dict[asyncio.Task, _Read | None] = {}  # None: not judged yet
        self._sweep_loop: asyncio.AbstractEventLoop | None = None  # where the sweep runs
        self._tick = min(1.0, max(0.02, limits.body_idle_timeout_s / 4))
        self._high_water = 0  # most bytes held at once since the last trim
        self._trim_pending = False

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
                if (not self.buffered and self._high_water >= TRIM_AFTER_BYTES
                        and not self._trim_pending):
                    self._trim_pending = True
                    task.get_loop().call_later(TRIM_DELAY_S, self._trim)

    def _reserve(self, n: int, total: int) -> int:
        if self.buffered + n > self.budget:
            raise BodyBudgetExhausted(
                f"the server is buffering {self.buffered} bytes of request bodies; a body of "
                f"{total} bytes would exceed its budget of {self.budget} bytes: retry shortly")
        self.buffered += n
        if self.buffered > self._high_water:
            self._high_water = self.buffered
        return n

    def _trim(self) -> None:
        """Return freed heap pages to the OS (glibc's malloc_trim; elsewhere nothing), once the
        bodies are gone: a second after the last large one was read, if no other is buffering."""
        self._trim_pending = False
        if self.buffered:
            return  # the next release schedules it again
        self._high_water = 0
        trim = _malloc_trim()
        if trim is not None:
            trim(0)

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
