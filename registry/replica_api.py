"""The replica API: how a serving replica with no database settings follows the control plane.

    GET    /api/v1/replica/desired-state[?wait=S]   If-None-Match: "r<revision>"
    PUT    /api/v1/replica/heartbeats/<replica>     (its observed state, serving.core.state_wire;
                                                     "same": true when nothing changed)
    DELETE /api/v1/replica/heartbeats/<replica>     (a graceful stop)
    GET    /api/v1/replica/artifacts/<sha256>       (an artifact the desired state references)
    POST   /api/v1/replica/capture                  (captured requests: gzip JSON Lines,
                                                     registry.monitoring.capture_store)

Every call shows a replica credential (`Authorization: Bearer mmcr_…`, or MMC_REPLICA_TOKEN),
which is good here and nowhere else; an API token or a session is refused here (401).

The desired state is answered from one snapshot per revision, built once by whichever request
first needs it, gzip'd once, and then sent as it is however many replicas ask. A request whose
ETag is current waits up to S seconds (at most MMC_REPLICA_WAIT_SECONDS) for the next revision:
one watcher per process reads the revision (every MMC_POLL_SECONDS, and at once on the Redis or
in-process notice) and wakes every waiting request; nothing per replica touches the database
while it waits. Raw ASGI on the console's event loop, so waiting requests hold no thread.

The control path (the watcher's revision, credential checks, snapshot builds) has threads of its
own, apart from heartbeats, leaves and artifacts, and at most HEARTBEAT_SLOTS heartbeats are
read, decoded and stored at once; the others wait unread. A fleet whose heartbeats outrun the
database so slows its heartbeats, not its deploys, and the event loop decodes no heartbeat
before it can be stored (bench/fanout.py, 1,000 replicas × 215 loaded versions: with one queue
for both, every deploy waited behind thousands of heartbeat writes and none reached a replica
within 30 s).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qs

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from registry.logfilters import database_unavailable
from registry.monitoring import capture_check, capture_store
from registry.notify import current_revision, listen_redis, subscribe_in_process
from registry.services import analysis_watch
from registry.services.replicas import (
    credential_check,
    heartbeat_merge,
    heartbeat_store,
    heartbeats_touch,
    replica_leave,
)
from registry.serving_source import build_desired_state
from registry.store.artifacts import ArtifactUnavailable, default_store
from serving.core.state_wire import WireError, decode_observed, encode_desired

log = logging.getLogger(__name__)

PREFIX = "/api/v1/replica/"
HEARTBEAT = re.compile(r"^heartbeats/([A-Za-z0-9._:@-]{1,100})$")
ARTIFACT = re.compile(r"^artifacts/([0-9a-f]{64})$")
#: The largest heartbeat body read (a replica serving 1,000 versions sends ~1 MB).
MAX_HEARTBEAT_BYTES = 8 * 1024 * 1024
CHUNK = 1024 * 1024
#: The largest capture body read (one Parquet file), what its footer may say it takes once
#: decompressed and decoded, and the records in one (registry.monitoring.capture_check).
MAX_CAPTURE_BYTES = 16 * 1024 * 1024
MAX_CAPTURE_DECODED_BYTES = 128 * 1024 * 1024
MAX_CAPTURE_RECORDS = 20000
#: How long a credential found good (or bad) is believed before the database is asked again:
#: a revoked one is refused at most this long after (a waiting poll too, before it answers).
CREDENTIAL_TTL_S = 5.0
#: Heartbeats read, decoded and stored at once (the write threads); the rest wait unread.
HEARTBEAT_SLOTS = 4
#: Whole-state heartbeats waiting for a slot past which the next is answered 503 + Retry-After
#: (2-10 s): a fleet that outruns the database is told to come back, not left to time out and
#: send it again at once.
HEARTBEAT_QUEUE = 64
#: A heartbeat body this small is read at once: a "same" one (or next to nothing loaded).
SMALL_HEARTBEAT_BYTES = 4096
#: "same" heartbeats arriving within this long are touched by one statement.
TOUCH_GATHER_S = 0.2


@dataclass(frozen=True)
class Snapshot:
    revision: int
    etag: str
    body: bytes
    gzipped: bytes
    artifacts: frozenset[str]


def etag_of(revision: int) -> str:
    return f'"r{revision}"'


class ReplicaApi:
    """One per process (console/asgi.py mounts it at PREFIX)."""

    def __init__(self) -> None:
        # Its own threads for the ORM: replicas never queue behind the console's pages (Django
        # runs every synchronous view on one thread under ASGI), nor those pages behind them.
        # The control path apart from heartbeats and artifacts: a deploy never waits behind them.
        self._pool = ThreadPoolExecutor(HEARTBEAT_SLOTS, thread_name_prefix="mmc-replica-api")
        self._reads = ThreadPoolExecutor(2, thread_name_prefix="mmc-replica-api-control")
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._waiting = 0  # whole-state heartbeats waiting for a slot
        self._touches: list = []  # gathered "same" heartbeats: (observed, address, future)
        self._toucher: asyncio.Task | None = None
        self._snapshot: Snapshot | None = None
        self._build = asyncio.Lock()
        self._start = asyncio.Lock()
        self._revision: int | None = None
        self._changed: asyncio.Event | None = None
        self._hint: asyncio.Event | None = None
        self._watcher: asyncio.Task | None = None
        self._credentials: dict[str, tuple[float, str | None]] = {}
        self.builds = 0  # snapshots built by this process (specs and the fan-out bench read it)

    # -- plumbing ------------------------------------------------------------------------------

    async def _db(self, fn, *args, _executor=None, **kwargs):
        def call():
            try:
                return fn(*args, **kwargs)
            finally:
                close_old_connections()
        return await sync_to_async(call, thread_sensitive=False,
                                   executor=_executor or self._pool)()

    async def _read(self, fn, *args, **kwargs):
        return await self._db(fn, *args, _executor=self._reads, **kwargs)

    def _heartbeat_slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:  # a semaphore keeps to one loop
            self._slots = (loop, asyncio.Semaphore(HEARTBEAT_SLOTS))
        return self._slots[1]

    @staticmethod
    async def _answer(send, status: int, body: bytes = b"", headers=()) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _error(self, send, status: int, message: str, headers=()) -> None:
        await self._answer(send, status, orjson.dumps({"error": message}),
                           [(b"content-type", b"application/json"), *headers])

    # -- entry ---------------------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        headers = dict(scope.get("headers") or ())
        rest, method = scope["path"][len(PREFIX):], scope.get("method", "GET")
        try:
            name = await self._credential(headers.get(b"authorization", b""))
            if name is None:
                return await self._error(
                    send, 401, "the replica API needs a replica credential (Authorization: "
                    "Bearer mmcr_…, made on the console's Replicas page, or MMC_REPLICA_TOKEN)",
                    [(b"www-authenticate", b"Bearer")])
            if rest == "desired-state" and method == "GET":
                return await self._desired(scope, headers, send)
            if (match := HEARTBEAT.match(rest)) and method in ("PUT", "DELETE"):
                if method == "DELETE":
                    await self._db(replica_leave, match[1])
                    return await self._answer(send, 204)
                return await self._heartbeat(match[1], headers, receive, send)
            if (match := ARTIFACT.match(rest)) and method == "GET":
                return await self._artifact(match[1], send)
            if rest == "capture" and method == "POST":
                return await self._capture(name, headers, receive, send)
            known = rest in ("desired-state", "capture") or HEARTBEAT.match(rest) \
                or ARTIFACT.match(rest)
            return await self._error(send, 405 if known else 404,
                                     f"{method} {scope['path']} is not part of the replica API")
        except Exception as exc:
            if not database_unavailable(exc):
                raise
            log.warning("replica API %s %s: database unavailable: %s", method, scope["path"],
                        type(exc).__name__)
            return await self._error(send, 503, "the registry database is not answering; "
                                     "keep serving what you run and ask again",
                                     [(b"retry-after", b"5")])

    async def _credential(self, header: bytes) -> str | None:
        scheme, _, raw = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            return None
        raw = raw.strip()
        now = time.monotonic()
        cached = self._credentials.get(raw)
        if cached is not None and cached[0] > now:
            return cached[1]
        name = await self._read(credential_check, raw)
        if len(self._credentials) > 1000:
            self._credentials.clear()  # guessing costs the guesser a lookup each, no memory
        self._credentials[raw] = (now + CREDENTIAL_TTL_S, name)
        return name

    # -- desired state -------------------------------------------------------------------------

    async def _desired(self, scope, headers, send) -> None:
        wait = _wait_seconds(scope.get("query_string", b""))
        known = headers.get(b"if-none-match", b"").decode("latin-1").strip()
        revision = await self._current()
        deadline = time.monotonic() + wait
        while etag_of(revision) == known and (left := deadline - time.monotonic()) > 0:
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                break
            revision = self._revision
        if etag_of(revision) == known:
            return await self._answer(send, 304, headers=[(b"etag", known.encode())])
        if time.monotonic() > deadline - wait + 1.0 and await self._credential(
                headers.get(b"authorization", b"")) is None:
            # revoked while this poll waited (known within CREDENTIAL_TTL_S)
            return await self._error(send, 401, "this replica credential was revoked",
                                     [(b"www-authenticate", b"Bearer")])
        snapshot = await self._snapshot_for(revision)
        if snapshot.etag == known:  # built later, at the revision the replica already has
            return await self._answer(send, 304, headers=[(b"etag", known.encode())])
        gzip_ok = b"gzip" in headers.get(b"accept-encoding", b"")
        body = snapshot.gzipped if gzip_ok else snapshot.body
        extra = [(b"content-encoding", b"gzip")] if gzip_ok else []
        await self._answer(send, 200, body, [(b"content-type", b"application/json"),
                                             (b"etag", snapshot.etag.encode()),
                                             (b"vary", b"accept-encoding"), *extra])

    async def _current(self) -> int:
        """The newest revision this process knows (read now if the watcher has not yet)."""
        if self._watcher is not None and not self._watcher.done():
            return self._revision
        async with self._start:
            if self._watcher is None or self._watcher.done():
                self._changed, self._hint = asyncio.Event(), asyncio.Event()
                self._revision = await self._read(current_revision)
                self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self._revision

    async def _snapshot_for(self, revision: int) -> Snapshot:
        snapshot = self._snapshot
        if snapshot is not None and snapshot.revision >= revision:
            return snapshot
        async with self._build:  # one build per revision, whoever waits for it
            snapshot = self._snapshot
            if snapshot is None or snapshot.revision < revision:
                snapshot = self._snapshot = await self._read(_build_snapshot)
                self.builds += 1
            return snapshot

    async def _watch(self) -> None:
        """Read the revision every poll interval or at a notice; wake the waiting requests."""
        loop = asyncio.get_running_loop()
        hint = self._hint

        def notice(_revision=None) -> None:
            loop.call_soon_threadsafe(hint.set)

        unsubscribe = subscribe_in_process(notice)
        stop = threading.Event()
        if settings.REDIS_URL:
            threading.Thread(target=listen_redis, args=(notice, stop), daemon=True,
                             name="mmc-replica-api-sub").start()
        try:
            while True:
                try:
                    await asyncio.wait_for(hint.wait(), settings.REPLICA_POLL_SECONDS)
                except TimeoutError:
                    pass
                hint.clear()
                try:
                    revision = await self._read(_revision_and_watch)
                except Exception as exc:  # the database away: waiting requests time out
                    log.debug("replica API watcher: %s", exc)
                    continue
                if revision != self._revision:
                    self._revision = revision
                    changed, self._changed = self._changed, asyncio.Event()
                    changed.set()
        finally:
            unsubscribe()
            stop.set()

    # -- heartbeats ----------------------------------------------------------------------------

    async def _heartbeat(self, replica: str, headers, receive, send) -> None:
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit()
                                     or int(declared) > MAX_HEARTBEAT_BYTES):
            return await self._error(send, 413, f"a heartbeat is at most {MAX_HEARTBEAT_BYTES} "
                                     "bytes")
        if declared is not None and int(declared) <= SMALL_HEARTBEAT_BYTES:
            # "same" (or a replica that runs next to nothing): read at once, gathered
            return await self._heartbeat_in_slot(replica, receive, send, small=True)
        if self._waiting >= HEARTBEAT_QUEUE:  # shed: a retry later beats a timeout
            return await self._error(send, 503, "the control plane is storing other replicas' "
                                     "heartbeats; send this one again later",
                                     [(b"retry-after", b"%d" % random.randint(2, 10)),
                                      (b"connection", b"close")])
        slots = self._heartbeat_slots()
        self._waiting += 1
        try:
            await slots.acquire()  # its turn before a byte of it is read
        finally:
            self._waiting -= 1
        try:
            return await self._heartbeat_in_slot(replica, receive, send)
        finally:
            slots.release()

    async def _body(self, receive, send, limit: int, what: str) -> bytearray | None:
        """The request body, at most `limit` bytes; None when the client went away or the body
        was too large (answered 413 here)."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                await self._error(send, 413, f"{what} is at most {limit} bytes")
                return None
            if not message.get("more_body"):
                return body

    async def _heartbeat_in_slot(self, replica: str, receive, send, *,
                                 small: bool = False) -> None:
        body = await self._body(receive, send, MAX_HEARTBEAT_BYTES, "a heartbeat")
        if body is None:
            return
        try:
            doc = orjson.loads(body)
            observed = decode_observed(doc, replica=replica)
            address = doc.get("address", "")
            started = doc.get("started_at")
            if not isinstance(address, str) or not isinstance(started, int | float) \
                    or isinstance(started, bool):
                raise WireError("heartbeat: address (text) and started_at (unix seconds) "
                                "are needed")
            started_at = datetime.fromtimestamp(started, tz=UTC)
        except (orjson.JSONDecodeError, WireError, ValueError, OverflowError, OSError) as exc:
            return await self._error(send, 400, f"not a heartbeat: {exc}"[:500])
        held = True
        if observed.versions is None and not observed.changed and not observed.removed:
            held = await self._touch(observed, address)  # "same": gathered, one statement
        elif small:  # a small change (or whole state): its turn like any other
            async with self._heartbeat_slots():
                held = await self._store(observed, address, started_at)
        else:
            held = await self._store(observed, address, started_at)
        if not held:
            return await self._error(send, 409, f"no state of replica {replica!r} is held "
                                     "(removed, forgotten or left): send all of it")
        await self._answer(send, 204)

    async def _store(self, observed, address: str, started_at) -> bool:
        if observed.versions is None:  # what changed since the last acknowledged one
            return await self._db(heartbeat_merge, observed, address=address)
        await self._db(heartbeat_store, observed, address=address, started_at=started_at)
        return True

    async def _touch(self, observed, address: str) -> bool:
        """Gather a "same" heartbeat with the others arriving within TOUCH_GATHER_S: one
        statement touches them all (services.replicas.heartbeats_touch). Whether its row was
        there to touch."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._touches.append((observed, address, done))
        if self._toucher is None or self._toucher.done() or self._toucher.get_loop() is not loop:
            self._toucher = loop.create_task(self._write_touches())
        return await done

    async def _write_touches(self) -> None:
        while self._touches:
            await asyncio.sleep(TOUCH_GATHER_S)
            batch, self._touches = self._touches, []
            try:
                touched = await self._db(heartbeats_touch, [(o, a) for o, a, _ in batch])
            except Exception as exc:  # each answers it (503: the database is away)
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for observed, _, done in batch:
                if not done.done():
                    done.set_result(observed.replica in touched)

    # -- capture -------------------------------------------------------------------------------

    async def _capture(self, replica: str, headers, receive, send) -> None:
        """A capture file a replica flushed: read within MAX_CAPTURE_BYTES, checked off the
        event loop (footer first: rows, schema, decoded bytes; then values), and stored as it
        came."""
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit()
                                     or int(declared) > MAX_CAPTURE_BYTES):
            return await self._error(send, 413, f"a capture body is at most {MAX_CAPTURE_BYTES} "
                                     "bytes")
        body = await self._body(receive, send, MAX_CAPTURE_BYTES, "a capture body")
        if body is None:
            return
        payload = bytes(body)
        try:
            checked = await self._db(capture_check.check, payload,
                                     max_records=MAX_CAPTURE_RECORDS,
                                     max_decoded_bytes=MAX_CAPTURE_DECODED_BYTES)
        except capture_check.BadCapture as exc:
            return await self._error(send, 400, f"not a capture file: {exc}"[:500])
        if checked.rows:
            await self._db(capture_store.put_file, model=checked.model,
                           first_ts=checked.first_ts, payload=payload, writer=replica)
        await self._answer(send, 204)

    # -- artifacts -----------------------------------------------------------------------------

    async def _artifact(self, sha256: str, send) -> None:
        snapshot = await self._snapshot_for(await self._current())
        if sha256 not in snapshot.artifacts:
            return await self._error(send, 404, f"artifact {sha256} is not referenced by the "
                                     "desired state (a replica fetches only what it runs)")
        try:
            path = await self._db(default_store().local_path, sha256)
        except (ArtifactUnavailable, FileNotFoundError) as exc:
            return await self._error(send, 503, f"the artifact store did not give {sha256}: "
                                     f"{exc}", [(b"retry-after", b"5")])
        loop = asyncio.get_running_loop()
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/octet-stream"),
                (b"content-length", str(size).encode()), (b"etag", f'"{sha256}"'.encode())]})
            while chunk := await loop.run_in_executor(self._pool, f.read, CHUNK):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _wait_seconds(query: bytes) -> float:
    """`?wait=S` of a desired-state request, within 0..MMC_REPLICA_WAIT_SECONDS (0 if absent
    or not a number)."""
    try:
        wait = float(parse_qs(query.decode("latin-1")).get("wait", ["0"])[-1])
    except ValueError:
        return 0.0
    return max(0.0, min(wait, settings.REPLICA_WAIT_SECONDS))


def _revision_and_watch() -> int:
    # Replicas no longer reach the database: the control plane notices a silent canary
    # analysis for them (at most once per tick interval, never raising).
    analysis_watch.watch()
    return current_revision()


def _build_snapshot() -> Snapshot:
    state = build_desired_state()
    body = orjson.dumps(encode_desired(state))
    return Snapshot(revision=state.revision, etag=etag_of(state.revision), body=body,
                    gzipped=gzip.compress(body, compresslevel=6),
                    artifacts=frozenset(s.sha256 for s in state.versions.values()))


replica_api = ReplicaApi()
