"""Data capture on a replica: a sample of requests recorded off the request path.

A request that is sampled offers a tuple of references (its time, id, model, version, role,
latency and its input/output arrays) to a bounded queue; a background thread takes batches and
turns each into capture files (serving.core.capture_files: Parquet built a column at a time,
tensors past the endpoint's byte cap left out) that it hands, one at a time, to a sink: the
artifact store directly where the replica has the database, the control plane's replica API
where it follows over HTTP, a folder where it serves a model repository. A sink is any callable
taking a CaptureFile (model, first ts, Parquet bytes, records per version); pyarrow is imported
on the first flush, so a replica that never captures does not load it.

When the queue is full, or holds its byte budget, the request is dropped and counted: capture
never slows or fails a request. A replica killed with -9 loses at most what was in its queue
(MMC_CAPTURE_QUEUE_RECORDS records, MMC_CAPTURE_QUEUE_BYTES bytes) and the batch being written
(MMC_CAPTURE_BATCH_RECORDS records).
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from serving.core import capture_files
from serving.core.capture_files import (  # noqa: F401 - MODES re-exported for route settings
    MODES,
    CaptureFile,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureSettings:
    """One endpoint's capture, as its route carries it. percent 0: off."""

    percent: float = 0.0
    mode: str = "both"
    max_bytes: int = 65536

    @property
    def on(self) -> bool:
        return self.percent > 0


CAPTURE_OFF = CaptureSettings()


class FolderCaptureSink:
    """Capture files into a folder, in the artifact store's layout (registry.monitoring.
    capture_store reads it with a FileStore on the folder): a replica serving a model
    repository, which has no registry to send them to."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.writer = f"{socket.gethostname()}-{os.getpid()}"
        self._seq = 0

    def __call__(self, file: CaptureFile) -> None:
        self._seq += 1
        folder = f"capture/{file.model}/{datetime.fromtimestamp(file.first_ts, UTC):%Y-%m-%d/%H}"
        path = self.root / folder / f"{int(file.first_ts * 1000)}-{self.writer}-{self._seq}" \
                                    ".parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.part")
        part.write_bytes(file.payload)
        os.replace(part, path)


@dataclass
class CaptureCounts:
    captured: int = 0  # records accepted into the queue
    dropped: int = 0  # records refused: the queue was full
    written: int = 0  # records the sink stored
    failed: int = 0  # records lost because the sink failed


class CaptureQueue:
    """Bounded in records and bytes; `offer` never blocks. A daemon thread flushes batches of
    up to `batch` records every `flush_s` seconds (sooner when a batch is full) to `sink`, a
    file at a time."""

    def __init__(self, sink: Callable[[CaptureFile], None] | None, *, max_records: int = 10000,
                 max_bytes: int = 64 * 1024 * 1024, flush_s: float = 2.0, batch: int = 2000,
                 rnd: random.Random | None = None) -> None:
        self.sink = sink
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.flush_s = flush_s
        self.batch = batch
        self._rnd = rnd or random.Random()
        # entries as serving.core.capture_files takes them: (ts, request id, model, version,
        # role, latency ms, inputs, outputs, byte cap, truncated, size)
        self._items: deque[tuple] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.counts: dict[tuple[str, str], CaptureCounts] = {}

    @classmethod
    def from_env(cls, sink: Callable[[CaptureFile], None] | None,
                 env: dict | None = None) -> CaptureQueue:
        e = os.environ if env is None else env
        return cls(sink, max_records=int(e.get("MMC_CAPTURE_QUEUE_RECORDS") or 10000),
                   max_bytes=int(e.get("MMC_CAPTURE_QUEUE_BYTES") or 64 * 1024 * 1024),
                   flush_s=float(e.get("MMC_CAPTURE_FLUSH_SECONDS") or 2.0),
                   batch=int(e.get("MMC_CAPTURE_BATCH_RECORDS") or 2000))

    def sampled(self, settings: CaptureSettings) -> bool:
        """Whether this request is recorded (cheap: called on every request)."""
        if settings.percent <= 0 or self.sink is None:
            return False
        return settings.percent >= 100 or self._rnd.random() * 100 < settings.percent

    def _count(self, model: str, version: str) -> CaptureCounts:
        c = self.counts.get((model, version))
        if c is None:
            c = self.counts[(model, version)] = CaptureCounts()
        return c

    def offer(self, *, request_id: str | None, model: str, version: str, role: str,
              latency_ms: float, inputs: dict | None, outputs: dict | None,
              settings: CaptureSettings) -> bool:
        """Queue one request's tensors (references: the record is built on the flusher's
        thread); False, counted as dropped, when the queue is full in records or bytes."""
        mode, cap = settings.mode, settings.max_bytes
        if mode == "outputs":
            inputs = None
        if mode == "inputs":
            outputs = None
        size = 256 + _capped(inputs, cap) + _capped(outputs, cap)
        counts = self.counts.get((model, version)) or self._count(model, version)
        with self._lock:
            if len(self._items) >= self.max_records or self._bytes + size > self.max_bytes:
                counts.dropped += 1
                return False
            self._items.append((time.time(), request_id, model, version, role, latency_ms,
                                inputs, outputs, cap, False, size))
            self._bytes += size
            full = len(self._items) >= self.batch
        counts.captured += 1
        if self._thread is None:
            self.start()
        if full:
            self._wake.set()
        return True

    @property
    def depth(self) -> int:
        return len(self._items)

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self.sink is None:
                return
            self._thread = threading.Thread(target=self._loop, name="mmc-capture", daemon=True)
            self._thread.start()

    def _take(self, most: int) -> list[tuple]:
        with self._lock:
            n = min(len(self._items), self.batch, most)
            taken = [self._items.popleft() for _ in range(n)]
            self._bytes -= sum(item[-1] for item in taken)
        return taken

    def flush(self, most: int | None = None) -> int:
        """Write what is queued (the flusher's work; also called at shutdown), at most `most`
        records (None: until the queue is empty): each batch as files, each file to the sink;
        records counted written or failed per version."""
        done, left = 0, len(self._items) if most is None else most
        while True:
            taken = self._take(left) if left > 0 else []
            if not taken:
                if most is None and self._items:
                    left = len(self._items)  # offered meanwhile: shutdown writes them too
                    continue
                return done
            left -= len(taken)
            files, lost = capture_files.encode(taken, new_id=new_request_id)
            for entry in lost:  # a tensor the format cannot hold (logged by encode)
                self._count(entry[2], entry[3]).failed += 1
            for file in files:
                try:
                    self.sink(file)  # type: ignore[misc]
                except Exception as exc:  # noqa: BLE001 - a store outage loses the file only
                    log.warning("capture: %d records of %s not stored: %s: %s", file.rows,
                                file.model, type(exc).__name__, str(exc)[:200])
                    for version, n in file.versions.items():
                        self._count(file.model, version).failed += n
                    continue
                for version, n in file.versions.items():
                    self._count(file.model, version).written += n
                done += file.rows

    def _loop(self) -> None:
        while not self._stopped:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            # what is queued now, not what arrives while it is written: draining until empty
            # wrote a file of a few dozen records every few ms under steady traffic (each file
            # ~0.6 ms of CPU and ~2 KB of footer), where one file per flush_s was meant
            # (whole batches when there are any: the rest waits for the next batch or tick)
            queued = len(self._items)
            self.flush(most=queued - queued % self.batch if queued >= self.batch else queued)

    def stop(self) -> None:
        """Flush what is queued and stop the thread (graceful shutdown)."""
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.sink is not None:
            self.flush()

    def snapshot(self, model: str, version: str) -> dict | None:
        c = self.counts.get((model, version))
        if c is None:
            return None
        return {"captured": c.captured, "dropped": c.dropped, "written": c.written,
                "failed": c.failed}


#: Request ids this process gives: a random prefix per process and a counter (cheaper than a
#: uuid per request, unique across replicas all the same).
_ID_PREFIX = os.urandom(6).hex()
_ID_COUNT = itertools.count(1)


def _capped(tensors: dict | None, cap: int) -> int:
    """The bytes `tensors` count against the queue's budget: theirs, at most the record cap."""
    if not tensors:
        return 0
    n = 0
    for array in tensors.values():
        n += getattr(array, "nbytes", 0)
    return n if n < cap else cap


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNT):012x}"


def capture_metrics(queue: CaptureQueue):
    """Prometheus families of the capture queue: records captured, dropped (queue full) and
    lost to a failed write, per model and version, and the queue's depth."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    families = {
        "captured": CounterMetricFamily("mmc_capture_records", "Requests sampled into the "
                                        "capture queue", labels=["model", "version"]),
        "dropped": CounterMetricFamily("mmc_capture_dropped", "Sampled requests not captured "
                                       "because the capture queue was full",
                                       labels=["model", "version"]),
        "failed": CounterMetricFamily("mmc_capture_failed", "Captured records lost because "
                                      "the store did not take them", labels=["model", "version"]),
    }
    for (model, version), counts in list(queue.counts.items()):
        for what, family in families.items():
            family.add_metric([model, version], getattr(counts, what))
    yield from families.values()
    depth = GaugeMetricFamily("mmc_capture_queue_records", "Records waiting in the capture "
                              "queue (what a kill -9 would lose)")
    depth.add_metric([], queue.depth)
    yield depth
