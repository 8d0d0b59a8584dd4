"""Data capture on a replica: a sample of requests recorded off the request path.

A request that is sampled is packed, as it is offered, into the open batch of a bounded queue
(serving.core.capture_wire: its time, id, model, version, role, latency and the bytes of its
input/output arrays, tensors past the endpoint's byte cap left out). It is offered by the
dynamic-batcher run that answers it (serving.core.batching, through its Ticket): a run whose
requests were all sampled alike is packed once, from its joined arrays, as one record that
still reads back as one row per request. A background thread hands
each batch to the encoder, a child process by default (serving.core.capture_encoder), which
makes the Parquet files (serving.core.capture_files) outside the serving process's
interpreter, and each file it gets back to a sink: the artifact store directly where the
replica has the database, the control plane's replica API where it follows over HTTP, a folder
where it serves a model repository. A sink is any callable taking a CaptureFile (model, first
ts, Parquet bytes, records per version). pyarrow loads in the encoder process on its first
batch: a replica never loads it (nor the encoder, until it first captures).

When the queue is full, or holds its byte budget, the request is dropped and counted: capture
never slows or fails a request. A replica killed with -9 loses at most what was in its queue
(MMC_CAPTURE_QUEUE_RECORDS records, MMC_CAPTURE_QUEUE_BYTES bytes) and the batch being written
(MMC_CAPTURE_BATCH_RECORDS records).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from serving.core import capture_wire
from serving.core.capture_encoder import ENCODERS, EncoderProcess, encode_packed
from serving.core.capture_files import (  # noqa: F401 - MODES re-exported for route settings
    MODES,
    CaptureFile,
)
from serving.core.capture_wire import (  # noqa: F401 - new_request_id re-exported
    BATCH,
    BATCH_ENTRY,
    HAS_INPUTS,
    HAS_OUTPUTS,
    NO_ID,
    RECORD,
    TRUNCATED,
    new_request_id,
)
from serving.core.tensors import output_bytes

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


class Ticket:
    """A request sampled for capture, before it runs: what its record needs besides its
    tensors. The dynamic batcher hands the tickets of a run to `CaptureQueue.offer_batch`
    (serving.core.batching); an answer that never reaches a batcher (a response-cache hit)
    is offered with `CaptureQueue.offer_ticket`. `budget`: the version's output budget (an
    answer over it is refused with a 400, so it is not captured)."""

    __slots__ = ("queue", "model", "version", "role", "request_id", "started_ns", "settings",
                 "budget")

    def __init__(self, queue: CaptureQueue, model: str, version: str, role: str,
                 request_id: str | None, started_ns: int, settings: CaptureSettings,
                 budget: int) -> None:
        self.queue = queue
        self.model = model
        self.version = version
        self.role = role
        self.request_id = request_id
        self.started_ns = started_ns
        self.settings = settings
        self.budget = budget


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
    failed: int = 0  # records lost: the sink failed, or a tensor the format cannot hold


_FIXED = RECORD.size
_HAS = (HAS_INPUTS, HAS_OUTPUTS)
_NUMERIC = frozenset("biuf")


def _id_bytes(request_id: str) -> bytes:
    rid = request_id.encode("utf-8", "surrogatepass")
    if len(rid) >= NO_ID:  # an id nobody sends: kept recognisable
        rid = request_id[:1024].encode("utf-8", "surrogatepass")
    return rid


class _Batch:
    """Records packed one after another (serving.core.capture_wire), and how many of each
    model and version it holds."""

    __slots__ = ("buf", "records", "versions")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.records = 0
        self.versions: dict[tuple[str, str], int] = {}


class CaptureQueue:
    """Bounded in records and bytes; `offer` never blocks. A sampled request is packed into the
    open batch as it is offered; a batch of `batch` records is sealed and wakes the flusher,
    which every `flush_s` seconds also takes the open one. The flusher hands each batch to the
    encoder (a separate process by default, so the files are made outside this interpreter)
    and each file it gets back to `sink`."""

    def __init__(self, sink: Callable[[CaptureFile], None] | None, *, max_records: int = 10000,
                 max_bytes: int = 64 * 1024 * 1024, flush_s: float = 2.0, batch: int = 2000,
                 encoder: str = "process", rnd: random.Random | None = None) -> None:
        if encoder not in ENCODERS:
            raise ValueError(f"capture encoder {encoder!r}: one of {', '.join(ENCODERS)}")
        self.sink = sink
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.flush_s = flush_s
        self.batch = batch
        self.encoder = encoder
        self._rnd = rnd or random.Random()
        self._packer = capture_wire.Packer()
        self._open = _Batch()
        self._sealed: list[_Batch] = []
        self._records = 0
        self._bytes = 0
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time (the encoder is sequential)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: EncoderProcess | None = None
        self._stopped = False
        self._warned: set[tuple[str, str]] = set()
        self.counts: dict[tuple[str, str], CaptureCounts] = {}

    @classmethod
    def from_env(cls, sink: Callable[[CaptureFile], None] | None,
                 env: dict | None = None) -> CaptureQueue:
        e = os.environ if env is None else env
        return cls(sink, max_records=int(e.get("MMC_CAPTURE_QUEUE_RECORDS") or 10000),
                   max_bytes=int(e.get("MMC_CAPTURE_QUEUE_BYTES") or 64 * 1024 * 1024),
                   flush_s=float(e.get("MMC_CAPTURE_FLUSH_SECONDS") or 2.0),
                   batch=int(e.get("MMC_CAPTURE_BATCH_RECORDS") or 2000),
                   encoder=e.get("MMC_CAPTURE_ENCODER") or "process")

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
        """Pack one request into the open batch (its tensors in order, inputs then outputs,
        each left out when it would pass the record's byte cap); False, counted as dropped,
        when the queue is full in records or bytes. A record with a tensor the format cannot
        hold is counted failed (logged once per model and version).

        Called on the request path: a tensor of the usual kind (numeric, C-ordered, of a shape
        seen before) costs a dictionary look-up and an append; the packer makes the rest."""
        mode = settings.mode
        if mode != "both":
            if mode == "outputs":
                inputs = None
            else:
                outputs = None
        packer = self._packer
        headers = packer.headers
        budget, flags, length = settings.max_bytes, 0, 0
        heads: list[bytes] = []
        datas: list = []
        try:
            for part, tensors in ((0, inputs), (1, outputs)):
                if tensors is None:
                    continue
                flags |= _HAS[part]
                for name, array in tensors.items():
                    try:  # the usual tensor: its header known, its array written as it is
                        header = headers.get((part, name, array.dtype, array.shape,
                                              array.strides))
                    except (AttributeError, TypeError):  # not numpy, or a name no key takes
                        header = None
                    if header is None:  # text, not C-ordered, the first of its kind
                        header, data, size = packer.tensor(part, name, array)
                        stored = len(data)
                    else:
                        data, size = array, array.nbytes
                        stored = size
                    if size > budget:
                        flags |= TRUNCATED
                        continue
                    budget -= size
                    length += stored
                    heads.append(header)
                    if stored:  # (an empty array has no bytes to write)
                        datas.append(data)
            route = packer.route(model, version, role)
        except capture_wire.Uncapturable as exc:
            self._uncapturable(model, version, exc)
            return True
        layout = route + b"".join(heads) if heads else route
        if request_id is None:
            rid, id_size = b"", NO_ID
        else:
            rid = _id_bytes(request_id)
            id_size = len(rid)
        length += _FIXED + len(rid) + len(layout)
        head = RECORD.pack(length, time.time(), latency_ms, flags, len(heads), id_size,
                           len(layout))
        return self._append(model, version, 1, length, head, rid, layout, datas)

    def ticket(self, model: str, version: str, role: str, request_id: str | None,
               started_ns: int, settings: CaptureSettings, budget: int) -> Ticket:
        return Ticket(self, model, version, role, request_id, started_ns, settings, budget)

    def offer_ticket(self, ticket: Ticket, inputs: dict, outputs: dict,
                     now_ns: int | None = None) -> bool:
        """Offer one sampled request's record (`offer`), its latency up to `now_ns` (or now);
        nothing when its answer is over the version's output budget (the caller gets a 400)."""
        if output_bytes(outputs) > ticket.budget > 0:
            return False
        if now_ns is None:
            now_ns = time.perf_counter_ns()
        return self.offer(request_id=ticket.request_id, model=ticket.model,
                          version=ticket.version, role=ticket.role,
                          latency_ms=(now_ns - ticket.started_ns) / 1e6, inputs=inputs,
                          outputs=outputs, settings=ticket.settings)

    def offer_batch(self, tickets: Sequence[Ticket | None], inputs: Sequence[dict],
                    feeds: dict, outputs: dict, parts: Sequence[dict],
                    rows: Sequence[int]) -> None:
        """The sampled requests of one dynamic-batcher run, on the thread that ran it, after it
        succeeded: `tickets` per request (None: not sampled), `inputs`/`parts` each request's
        own inputs/outputs, `rows` its rows, `feeds`/`outputs` the run's joined arrays.

        When every request of the run was sampled alike and no answer is cut by the byte cap
        or over the output budget, they become one batch record packed from the joined arrays
        (one header and one copy per tensor for the whole run, the usual case at 100 %
        sampling); otherwise each sampled request is offered alone."""
        now = time.perf_counter_ns()
        first = tickets[0]
        if first is not None and len(tickets) > 1 and self._offer_joined(
                first, tickets, feeds, outputs, rows, now):
            return
        for ticket, given, answered in zip(tickets, inputs, parts, strict=True):
            if ticket is not None:
                self.offer_ticket(ticket, given, answered, now)

    def _offer_joined(self, first: Ticket, tickets: Sequence[Ticket | None], feeds: dict,
                      outputs: dict, rows: Sequence[int], now: int) -> bool:
        """`offer_batch`'s one record for the whole run; False (nothing packed) where the
        requests must be offered one by one."""
        settings, role = first.settings, first.role
        for t in tickets:
            if t is None or t.role != role or (t.settings is not settings
                                               and t.settings != settings):
                return False
        if len(tickets) >= NO_ID:
            return False
        total, most = sum(rows), max(rows)
        if output_bytes(outputs) * most > first.budget * total > 0:
            return False  # someone's answer is over the budget: only theirs is left out
        mode = settings.mode
        packer = self._packer
        headers = packer.headers
        budget, flags, length = settings.max_bytes, BATCH, 0
        heads: list[bytes] = []
        datas: list = []
        for part, tensors in ((0, feeds if mode != "outputs" else None),
                              (1, outputs if mode != "inputs" else None)):
            if tensors is None:
                continue
            flags |= _HAS[part]
            for name, array in tensors.items():
                if type(array) is not np.ndarray or array.dtype.kind not in _NUMERIC \
                        or array.ndim == 0 or array.shape[0] != total:
                    return False  # text, or no rows to tell the requests apart: one by one
                header = headers.get((part, name, array.dtype, array.shape, array.strides))
                if header is None:
                    try:
                        header, data, size = packer.tensor(part, name, array)
                    except capture_wire.Uncapturable:
                        return False
                else:
                    data, size = array, array.nbytes
                share = size // total * most  # the largest request's part of it
                if share > budget:
                    return False  # the cap cuts someone's record: each request alone
                budget -= share
                length += size
                heads.append(header)
                if size:
                    datas.append(data)
        try:
            route = packer.route(first.model, first.version, role)
        except capture_wire.Uncapturable:
            return False
        table, ids = [], []
        for t, n in zip(tickets, rows, strict=True):
            latency = (now - t.started_ns) / 1e6  # type: ignore[union-attr]
            if t.request_id is None:  # type: ignore[union-attr]
                table.append(BATCH_ENTRY.pack(latency, n, NO_ID))
            else:
                rid = _id_bytes(t.request_id)  # type: ignore[union-attr]
                table.append(BATCH_ENTRY.pack(latency, n, len(rid)))
                ids.append(rid)
        index = b"".join(table) + b"".join(ids)
        layout = route + b"".join(heads)
        length += _FIXED + len(index) + len(layout)
        head = RECORD.pack(length, time.time(), 0.0, flags, len(heads), len(tickets),
                           len(layout))
        self._append(first.model, first.version, len(tickets), length, head, index, layout,
                     datas)
        return True

    def _append(self, model: str, version: str, records: int, length: int, head: bytes,
                index: bytes, layout: bytes, datas: list) -> bool:
        """One packed record (of `records` requests) into the open batch; False, the records
        counted dropped, when the queue is full."""
        key = (model, version)
        with self._lock:
            counts = self.counts.get(key) or self._count(model, version)
            if self._records + records > self.max_records \
                    or self._bytes + length > self.max_bytes:
                counts.dropped += records
                return False
            batch = self._open
            extend = batch.buf.extend
            extend(head)
            extend(index)
            extend(layout)
            for data in datas:
                extend(data)
            batch.records += records
            versions = batch.versions
            versions[key] = versions.get(key, 0) + records
            self._records += records
            self._bytes += length
            counts.captured += records
            full = batch.records >= self.batch
            if full:
                self._sealed.append(batch)
                self._open = _Batch()
        if self._thread is None:
            self.start()
        if full:
            self._wake.set()
        return True

    def _uncapturable(self, model: str, version: str, exc: Exception) -> None:
        with self._lock:
            counts = self._count(model, version)
            counts.captured += 1
            counts.failed += 1
            warn = (model, version) not in self._warned
            self._warned.add((model, version))
        if warn:
            log.warning("capture: a record of %s:%s not written (and others like it, "
                        "counted in mmc_capture_failed_total): %s", model, version, exc)

    @property
    def depth(self) -> int:
        """Records waiting to be written (what a kill -9 would lose, with the batch in the
        encoder)."""
        return self._records

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self.sink is None:
                return
            self._thread = threading.Thread(target=self._loop, name="mmc-capture", daemon=True)
            self._thread.start()

    def _take(self, whole: bool) -> list[_Batch]:
        """The sealed batches, and the open one too unless `whole`."""
        with self._lock:
            taken, self._sealed = self._sealed, []
            if not whole and self._open.records:
                taken.append(self._open)
                self._open = _Batch()
            for batch in taken:
                self._records -= batch.records
                self._bytes -= len(batch.buf)
        return taken

    def flush(self, *, whole: bool = False) -> int:
        """Write what is queued (the flusher's work; also called at shutdown): each batch
        encoded into files, each file to the sink; records counted written or failed per
        version. `whole`: only sealed batches. Returns the records written."""
        done = 0
        with self._flushing:
            while True:
                taken = self._take(whole)
                if not taken:
                    return done
                for batch in taken:
                    done += self._write(batch)
                if whole:
                    return done

    def _write(self, batch: _Batch) -> int:
        try:
            files, lost = self._encode(batch.buf)
        except Exception as exc:  # noqa: BLE001 - the encoder died or failed: this batch only
            log.warning("capture: %d records not written: the encoder failed: %s: %s",
                        batch.records, type(exc).__name__, str(exc)[:200])
            self._tally("failed", batch.versions)
            return 0
        self._tally("failed", lost)  # a tensor the format cannot hold
        done = 0
        for file in files:
            try:
                self.sink(file)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - a store outage loses the file only
                log.warning("capture: %d records of %s not stored: %s: %s", file.rows,
                            file.model, type(exc).__name__, str(exc)[:200])
                self._tally("failed", {(file.model, v): n for v, n in file.versions.items()})
                continue
            self._tally("written", {(file.model, v): n for v, n in file.versions.items()})
            done += file.rows
        return done

    def _tally(self, what: str, records: dict[tuple[str, str], int]) -> None:
        """Records written or failed per (model, version), under the lock: batches are offered
        from the batcher's threads as well as the event loop."""
        with self._lock:
            for (model, version), n in records.items():
                counts = self._count(model, version)
                setattr(counts, what, getattr(counts, what) + n)

    def _encode(self, buf: bytearray) -> tuple[list[CaptureFile], dict[tuple[str, str], int]]:
        if self.encoder == "thread":
            return encode_packed(buf)
        if self._process is None:
            self._process = EncoderProcess()
        return self._process.encode(buf)

    def _loop(self) -> None:
        while not self._stopped:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            # whole batches when there are any (records that arrive meanwhile wait for the next
            # batch or tick: one file per batch, not one every few ms), else what is open
            self.flush(whole=bool(self._sealed))

    def stop(self) -> None:
        """Flush what is queued and stop the thread and the encoder (graceful shutdown)."""
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.sink is not None:
            self.flush()
        if self._process is not None:
            self._process.close()

    def snapshot(self, model: str, version: str) -> dict | None:
        c = self.counts.get((model, version))
        if c is None:
            return None
        return {"captured": c.captured, "dropped": c.dropped, "written": c.written,
                "failed": c.failed}


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
