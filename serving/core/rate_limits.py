"""Rate limits and daily quotas per endpoint and per predict key, checked on the request path
without the database or a network round trip.

- Requests per second: a token bucket per endpoint and per key **in each replica's memory**, so N
  replicas behind a load balancer each allow the rate (the cluster allows about N times it).
- Daily quota: one count per endpoint and per key per UTC day, shared by every replica through
  Redis when the replica has a Redis URL (clustered), in this process when it has none (embedded).
  A request is admitted against the count this replica knows (the cluster's total at the last
  sync plus what it admitted since); a background task adds its own admissions to Redis and reads
  the others' in one pipeline every `sync_seconds`. A slow, hung or stopped Redis therefore never
  delays a request: the sync fails after a short timeout, is logged once, and requests go on being
  admitted against the local count (fail open); what was admitted meanwhile is added once Redis
  answers again. The price: the cluster may overshoot a quota by what the replicas admit within
  one sync interval.

Clocks are parameters (monotonic for buckets, wall time for the UTC day) so specs feed them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from serving.core.errors import ServingError

log = logging.getLogger(__name__)

DAY = 86_400
#: Seconds between quota syncs with Redis (MMC_QUOTA_SYNC_SECONDS): the bound on how long a
#: replica goes without learning what the others admitted.
DEFAULT_SYNC_SECONDS = 0.5
#: Redis socket timeouts for the quota sync: a hung Redis costs the sync task this, never a request.
REDIS_TIMEOUT_SECONDS = 0.5
#: Kept past the day's end, so replicas whose clocks lag a little still count into the same key.
EXPIRY_GRACE_SECONDS = 3600

#: Why a request was refused, as the rejection metric's `reason` label says it.
KEY_RATE, ENDPOINT_RATE, KEY_QUOTA, ENDPOINT_QUOTA = (
    "key_rate", "endpoint_rate", "key_quota", "endpoint_quota")
#: The `key` label of requests to an endpoint without predict keys.
NO_KEY = "none"


@dataclass(frozen=True)
class Limits:
    """One endpoint's or key's limits; 0 means none. `burst` 0: ceil(rps), at least 1."""

    rps: float = 0.0
    burst: int = 0
    daily_quota: int = 0

    @property
    def capacity(self) -> float:
        return float(self.burst or max(1, math.ceil(self.rps)))

    def __bool__(self) -> bool:
        return bool(self.rps or self.daily_quota)

    def to_json(self) -> dict:
        return {"rps": self.rps, "burst": self.burst, "daily_quota": self.daily_quota}


NO_LIMITS = Limits()


@dataclass(frozen=True)
class PredictKey:
    """What a replica knows of one predict key besides its hash: a label for metrics, 429s and
    quota counters (the registry's prefix; never the secret) and its limits."""

    label: str
    limits: Limits = NO_LIMITS


class RateLimited(ServingError):
    """A rate limit or daily quota refused the request; `Retry-After` says when to come back."""

    status = 429

    def __init__(self, message: str, *, reason: str, retry_after: int,
                 model: str = "") -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})
        self.reason = reason
        self.retry_after = retry_after
        self.model = model  # whose limit refused it


def utc_day(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")


def seconds_to_midnight(now: float) -> int:
    """Whole seconds (at least 1) until the next UTC midnight: a quota's Retry-After."""
    return max(1, math.ceil(DAY - now % DAY))


def quota_key(model: str, key_label: str | None, day: str) -> str:
    """The counter of one endpoint (key_label None) or one of its keys on one UTC day: the same
    name in Redis, in the in-process store, and where the console reads today's usage."""
    scope = f"key:{key_label}" if key_label is not None else "endpoint"
    return f"mmc:quota:{model}:{scope}:{day}"


# -- token buckets (per replica) ---------------------------------------------------------------


class TokenBuckets:
    """Token buckets by name; `retry_after` and `take` are pure arithmetic over one dict."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._state: dict[object, tuple[float, float]] = {}  # name -> (tokens, at)

    def tokens(self, name: object, limits: Limits, now: float) -> float:
        state = self._state.get(name)
        capacity = limits.capacity
        if state is None:
            return capacity
        return min(capacity, state[0] + (now - state[1]) * limits.rps)

    def wait(self, name: object, limits: Limits, now: float) -> float:
        """Seconds until the bucket holds a whole token (0: it does now)."""
        missing = 1.0 - self.tokens(name, limits, now)
        return missing / limits.rps if missing > 0 else 0.0

    def take(self, name: object, limits: Limits, now: float) -> None:
        self._state[name] = (self.tokens(name, limits, now) - 1.0, now)

    def set(self, name: object, tokens: float, now: float) -> None:
        self._state[name] = (tokens, now)

    def keep_only(self, names: set) -> None:
        for name in [n for n in self._state if n not in names]:
            del self._state[name]


# -- daily quota counts ------------------------------------------------------------------------


class LocalQuotaStore:
    """Counts in this process (the embedded mode): the console, in the same process, reads them."""

    inline = True

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, increments: dict[str, int], ttl: int,
            watch: Iterable[str] = ()) -> dict[str, int]:
        with self._lock:
            for key, n in increments.items():
                self._counts[key] = self._counts.get(key, 0) + n
            return {k: self._counts.get(k, 0) for k in (*increments, *watch)}

    def read(self, keys: list[str]) -> dict[str, int]:
        with self._lock:
            return {k: self._counts.get(k, 0) for k in keys}

    def forget_except(self, day: str) -> None:
        with self._lock:
            for key in [k for k in self._counts if not k.endswith(day)]:
                del self._counts[key]


class RedisQuotaStore:
    """Counts in Redis, shared by every replica: INCRBY with an expiry at the UTC day's end."""

    inline = False

    def __init__(self, url: str, *, timeout: float = REDIS_TIMEOUT_SECONDS) -> None:
        import redis  # clustered mode only

        self.client = redis.Redis.from_url(url, socket_timeout=timeout,
                                           socket_connect_timeout=timeout)

    def add(self, increments: dict[str, int], ttl: int,
            watch: Iterable[str] = ()) -> dict[str, int]:
        watch = [k for k in watch if k not in increments]
        pipe = self.client.pipeline(transaction=False)
        for key, n in increments.items():
            pipe.incrby(key, n)
            pipe.expire(key, ttl)
        for key in watch:
            pipe.get(key)
        replies = pipe.execute()
        totals = {key: int(replies[2 * i]) for i, key in enumerate(increments)}
        for key, value in zip(watch, replies[2 * len(increments):], strict=True):
            totals[key] = int(value or 0)
        return totals

    def read(self, keys: list[str]) -> dict[str, int]:
        return {k: int(v or 0) for k, v in zip(keys, self.client.mget(keys), strict=True)} \
            if keys else {}

    def close(self) -> None:
        self.client.close()


class WorkersQuotaStore:
    """Counts in a SQLite file shared by the workers of one `mmc-serve --workers N` without
    Redis (serving/process/supervisor.py's folder): one day's count per server, not per process.
    Synced like Redis (in the background, every MMC_QUOTA_SYNC_SECONDS)."""

    inline = False

    def __init__(self, path: str) -> None:
        import sqlite3

        self._db = sqlite3.connect(path, timeout=REDIS_TIMEOUT_SECONDS, isolation_level=None,
                                   check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS quota (key TEXT PRIMARY KEY, "
                             "n INTEGER NOT NULL)")

    def add(self, increments: dict[str, int], ttl: int,
            watch: Iterable[str] = ()) -> dict[str, int]:
        keys = [*increments, *(k for k in watch if k not in increments)]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO quota VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                    "SET n = n + excluded.n", list(increments.items()))
                totals = self._read(keys)
            finally:
                self._db.execute("COMMIT")
        return totals

    def read(self, keys: list[str]) -> dict[str, int]:
        with self._lock:
            return self._read(keys)

    def _read(self, keys: list[str]) -> dict[str, int]:
        found = dict(self._db.execute(
            f"SELECT key, n FROM quota WHERE key IN ({','.join('?' * len(keys))})", keys))
        return {k: found.get(k, 0) for k in keys}

    def close(self) -> None:
        self._db.close()


QuotaStore = LocalQuotaStore | RedisQuotaStore | WorkersQuotaStore
#: This process's in-process counts (the embedded mode's console reads them).
PROCESS_STORE = LocalQuotaStore()


def quota_store(redis_url: str, *, timeout: float = REDIS_TIMEOUT_SECONDS,
                workers_folder: str = "") -> QuotaStore:
    """Where daily counts live: Redis when there is one (clustered), else the file the workers
    of one server share (`workers_folder`), else this process."""
    if redis_url:
        return RedisQuotaStore(redis_url, timeout=timeout)
    if workers_folder:
        return WorkersQuotaStore(os.path.join(workers_folder, "quota.sqlite3"))
    return PROCESS_STORE


class QuotaCounter:
    """What this replica knows of each day's counts: the cluster's total at the last sync
    (`known`) plus what it admitted since (`pending`)."""

    def __init__(self, store: QuotaStore,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.known: dict[str, int] = {}
        self.pending: dict[str, int] = {}
        self.unreachable: str | None = None  # why the last sync failed (logged once)
        self._day = ""

    def count(self, key: str) -> int:
        return self.known.get(key, 0) + self.pending.get(key, 0)

    def add(self, key: str) -> None:
        if self.store.inline:
            self.known[key] = self.store.add({key: 1}, 0)[key]
        else:
            self.pending[key] = self.pending.get(key, 0) + 1

    async def sync(self, watch: Iterable[str]) -> None:
        """Add this replica's admissions to the store and read everyone's totals. The store is
        called in a worker thread; the dicts are only touched here, on the event loop."""
        now = self.clock()
        day = utc_day(now)
        if day != self._day:  # yesterday's counters are not needed any more
            self._day = day
            for d in (self.known, self.pending):
                for key in [k for k in d if not k.endswith(day)]:
                    del d[key]
            if self.store.inline:
                self.store.forget_except(day)
        increments = {k: n for k, n in self.pending.items() if n}
        watch = [k for k in watch if k.endswith(day)]
        if not increments and not watch:
            return
        ttl = seconds_to_midnight(now) + EXPIRY_GRACE_SECONDS
        try:
            totals = await asyncio.get_running_loop().run_in_executor(
                None, self.store.add, increments, ttl, watch)
        except Exception as exc:  # noqa: BLE001 - any Redis failure: fail open
            if self.unreachable is None:
                log.warning("daily quotas are counted on this replica only until Redis answers "
                            "again (requests are still served): %s: %s", type(exc).__name__, exc)
            self.unreachable = f"{type(exc).__name__}: {exc}"
            return
        if self.unreachable is not None:
            log.warning("Redis answers again: daily quotas are counted cluster-wide")
            self.unreachable = None
        for key, n in increments.items():
            left = self.pending.get(key, 0) - n  # admitted while the sync ran stay pending
            if left > 0:
                self.pending[key] = left
            else:
                self.pending.pop(key, None)
        for key, total in totals.items():
            if key.endswith(self._day):
                self.known[key] = total


# -- admission: both kinds, and their metrics -------------------------------------------------


class Admission:
    """Decides, per request, whether an endpoint's and its key's limits let it in, and counts
    requests and rejections per key for /metrics."""

    def __init__(self, *, store: QuotaStore | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 sync_seconds: float = DEFAULT_SYNC_SECONDS) -> None:
        self.clock = clock
        self.monotonic = monotonic
        self.buckets = TokenBuckets(monotonic)
        self.quota = QuotaCounter(store or LocalQuotaStore(), clock)
        self.sync_seconds = sync_seconds
        self.requests: dict[tuple[str, str], int] = {}  # (model, key label) -> admitted
        self.rejected: dict[tuple[str, str, str], int] = {}  # (+ reason) -> refused
        self._task: asyncio.Task | None = None
        self._stopping: asyncio.Event | None = None
        self._syncing = False
        self._day_number, self._day = -1, ""

    def counters(self) -> dict:
        """The per-key request and refusal counts as JSON (for the other workers' /metrics)."""
        return {"requests": [[m, k, n] for (m, k), n in list(self.requests.items())],
                "rejected": [[m, k, r, n] for (m, k, r), n in list(self.rejected.items())]}

    def admit(self, model: str, endpoint: Limits, key: PredictKey | None, *,
              also: Sequence[tuple[str, Limits, PredictKey | None]] = ()) -> None:
        """Let the request in (taking its tokens and counting it) or raise RateLimited; nothing
        is taken unless every limit lets it in. `also`: the (model, endpoint limits, key) of
        other endpoints the same call runs (a pipeline's steps), admitted with it or not at
        all. Messages are only built for a refusal."""
        if not also:
            self._take(self._check(model, endpoint, key))
            return
        checked = [self._check(model, endpoint, key)]
        checked.extend(self._check(*call) for call in also)
        for plan in checked:
            self._take(plan)

    def _check(self, model: str, endpoint: Limits, key: PredictKey | None) -> tuple:
        """What admitting one request to `model` takes, or RateLimited (counted) if a limit
        refuses it; nothing is taken here."""
        label = key.label if key is not None else NO_KEY
        mine = key.limits if key is not None else NO_LIMITS
        now = mine_left = endpoint_left = 0.0
        if mine.rps > 0 or endpoint.rps > 0:
            now, buckets = self.monotonic(), self.buckets
            if mine.rps > 0:
                mine_left = buckets.tokens((model, label), mine, now)
                if mine_left < 1.0:
                    self._refuse(model, label, KEY_RATE,
                                 math.ceil((1.0 - mine_left) / mine.rps), mine)
            if endpoint.rps > 0:
                endpoint_left = buckets.tokens(model, endpoint, now)
                if endpoint_left < 1.0:
                    self._refuse(model, label, ENDPOINT_RATE,
                                 math.ceil((1.0 - endpoint_left) / endpoint.rps), endpoint)
        counters = ()
        if mine.daily_quota > 0 or endpoint.daily_quota > 0:
            wall = self.clock()
            day = self._today(wall)
            counters = []
            if mine.daily_quota > 0:
                counters.append((quota_key(model, label, day), mine, KEY_QUOTA))
            if endpoint.daily_quota > 0:
                counters.append((quota_key(model, None, day), endpoint, ENDPOINT_QUOTA))
            for counter, limits, reason in counters:
                if self.quota.count(counter) >= limits.daily_quota:
                    self._refuse(model, label, reason, seconds_to_midnight(wall), limits)
        return (model, label, mine, endpoint, now, mine_left, endpoint_left, counters)

    def _take(self, plan: tuple) -> None:
        """Take what `_check` found the request may have."""
        model, label, mine, endpoint, now, mine_left, endpoint_left, counters = plan
        if mine.rps > 0:
            self.buckets.set((model, label), mine_left - 1.0, now)
        if endpoint.rps > 0:
            self.buckets.set(model, endpoint_left - 1.0, now)
        for counter, _, _ in counters:
            self.quota.add(counter)
        self.requests[(model, label)] = self.requests.get((model, label), 0) + 1

    def _today(self, wall: float) -> str:
        number = int(wall // DAY)
        if number != self._day_number:
            self._day_number, self._day = number, utc_day(wall)
        return self._day

    def _refuse(self, model: str, label: str, reason: str, retry_after: int,
                limits: Limits) -> None:
        k = (model, label, reason)
        self.rejected[k] = self.rejected.get(k, 0) + 1
        who = f"predict key {label}… of model '{model}'" if reason in (KEY_RATE, KEY_QUOTA) \
            else f"model '{model}'"
        if reason in (KEY_RATE, ENDPOINT_RATE):
            message = (f"rate limit of {who} exceeded: {limits.rps:g} requests per second "
                       f"(burst {limits.capacity:g}) on each replica")
        else:
            message = (f"daily quota of {who} used up: {limits.daily_quota} requests per UTC "
                       "day; it resets at 00:00 UTC")
        raise RateLimited(message, reason=reason, retry_after=retry_after, model=model)

    # -- the background sync ------------------------------------------------------------------

    async def sync(self, routes: dict) -> None:
        """One sync of the quota counts (off the event loop), and forget buckets no route
        names any more. At most one runs at a time: a hung Redis stalls only this."""
        if self._syncing:
            return
        self._syncing = True
        try:
            day = utc_day(self.clock())
            watch, names = [], set()
            for model, route in routes.items():
                if route.limits.daily_quota:
                    watch.append(quota_key(model, None, day))
                names.add(model)
                for key in route.keys.values():
                    if key.limits.daily_quota:
                        watch.append(quota_key(model, key.label, day))
                    names.add((model, key.label))
            self.buckets.keep_only(names)
            await self.quota.sync(watch)
        finally:
            self._syncing = False

    def start(self, routes: Callable[[], dict]) -> None:
        if self._task is None:
            self._stopping = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(routes))

    async def _loop(self, routes: Callable[[], dict]) -> None:
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), self.sync_seconds)
            except TimeoutError:
                pass
            try:
                await self.sync(routes())
            except Exception:  # noqa: BLE001 - never let the loop die
                log.exception("quota sync failed")

    async def stop(self) -> None:
        """Stop the loop after its last sync, which adds what is still pending (bounded by
        the store's timeout). Not cancelled mid-sync: a sync whose answer is lost would add the
        same admissions again."""
        if self._task is not None:
            self._stopping.set()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
