"""Dynamic batching for one model version: queue requests, merge compatible ones along axis 0,
run one inference off the event loop, hand each caller back its own rows.

Triton's semantics: with max_queue_delay_us 0 a free instance takes whatever is queued right
away (batches form naturally while the instances are busy, so an idle server adds almost
nothing); with a delay the batcher waits up to that long for a preferred or full batch.

Per request the cost is one future, one small record and a deque append. A model that runs for
longer than INLINE_BELOW_NS runs in worker threads, so the event loop never waits on it; a
quicker one runs on the event loop itself, because handing a batch to a thread and back costs
two wake-ups, and on a busy host each may wait for a core longer than the model runs (py-spy on
the MLP at c=32: the loop spent a quarter of its time waking the worker and being woken).
All bookkeeping (queue, stats) happens on the event loop thread, so it needs no locks; worker
threads only concatenate, run and split. Which requests form a batch, and how
outputs go back to them, is decided by the pure functions in serving.core.batch_policy.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from time import perf_counter_ns

from serving.core.batch_policy import Tensors, batch_key, form_batch, merge_inputs, split_outputs
from serving.core.desired_state import BatchingConfig
from serving.core.errors import ModelNotReady, QueueFull
from serving.core.stats import VersionStats

log = logging.getLogger(__name__)

#: a model whose runs average less than this runs on the event loop (one instance, no executor);
#: it goes back to the threads once its runs average more than INLINE_ABOVE_NS
INLINE_BELOW_NS = 200_000
INLINE_ABOVE_NS = 400_000


class _Request:
    """One caller's inputs and the future its answer goes to."""

    __slots__ = ("inputs", "future", "rows", "key", "enqueued_ns", "trace", "capture")

    def __init__(self, inputs: Tensors, future: asyncio.Future, rows: int, key: tuple | None,
                 enqueued_ns: int, trace, capture) -> None:
        self.inputs = inputs
        self.future = future
        self.rows = rows
        self.key = key
        self.enqueued_ns = enqueued_ns
        self.trace = trace  # its serving.core.tracing.RequestTrace, when it is traced
        self.capture = capture  # its serving.core.capture.Ticket, when it is sampled


class _NotTracing:
    active = False


_NOT_TRACING = _NotTracing()


class DynamicBatcher:
    """The per-version request queue in front of a model's run function.

    `run` is called from worker threads (onnxruntime releases the GIL) with at most
    `config.instance_count` calls in flight. An exception from `run` fails exactly the requests
    that were in that batch. Without an `executor` the batcher starts instance_count threads of
    its own fed by a SimpleQueue: measured ~30 µs cheaper per hand-off than
    ThreadPoolExecutor.submit, which matters when the model itself takes ~25 µs.
    """

    def __init__(
        self,
        run: Callable[[Tensors], Tensors],
        config: BatchingConfig,
        stats: VersionStats,
        executor: Executor | None = None,
        tracing=None,
    ) -> None:
        self._run = run
        # serving.core.tracing.Tracing: while it is active, a batch's traced requests get its
        # queue and compute spans (one attribute read per batch otherwise)
        self._tracing = tracing if tracing is not None else _NOT_TRACING
        self.config = config
        self.stats = stats
        self._max_rows = max(0, config.max_batch_size)
        self._instances = max(1, config.instance_count)
        self._delay_ns = max(0, config.max_queue_delay_us) * 1000
        self._preferred = frozenset(
            p for p in config.preferred_batch_sizes if 0 < p <= (self._max_rows or p))
        self._max_queue = max(1, config.max_queue_size)
        self._executor = executor
        self._jobs: queue.SimpleQueue | None = None
        self._threads: list[threading.Thread] = []
        self._queue: deque[_Request] = deque()
        self._in_flight = 0
        self._dispatch_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._drain_waiters: list[asyncio.Future] = []
        self._closed = False
        self.requests = 0  # infer() calls this batcher has taken (refused ones included)
        # run time per batch, a moving average; None until the first run (in a thread) says
        self._run_ns: float | None = None
        self._inline = False
        self._may_inline = executor is None and self._instances == 1

    @property
    def runs_inline(self) -> bool:
        """Whether batches now run on the event loop (the model is quicker than a hand-off)."""
        return self._inline

    @property
    def queue_depth(self) -> int:
        """Requests waiting for an instance (not counting those executing)."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Model executions running right now."""
        return self._in_flight

    async def infer(self, inputs: Tensors, trace=None, capture=None) -> Tensors:
        """Queue one request and wait for its own rows of the batch it ran in (`trace`: its
        RequestTrace, when it is traced; `capture`: its capture Ticket, when it is sampled: the
        run that answers it offers it to the capture queue with the rest of its batch).

        Raises QueueFull when max_queue_size requests already wait, ModelNotReady after close().
        """
        stats = self.stats
        self.requests += 1
        if self._closed:
            stats.record_failure(0)
            raise ModelNotReady(f"model {stats.model!r} version {stats.version!r} is unloading",
                                retry_after=1)
        if len(self._queue) >= self._max_queue:
            stats.record_failure(0)
            raise QueueFull(f"model {stats.model!r} version {stats.version!r}: queue full "
                            f"({self._max_queue} requests waiting)")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._max_rows:
            rows, key = batch_key(inputs)
        else:
            rows, key = 1, None
        self._queue.append(_Request(inputs, future, rows, key, perf_counter_ns(), trace,
                                    capture))
        stats.pending += 1
        if self._in_flight < self._instances and not self._dispatch_scheduled:
            # call_soon rather than dispatching here: requests arriving in the same loop
            # iteration (a burst) then leave together in one batch, at the cost of one tick.
            self._dispatch_scheduled = True
            loop.call_soon(self._dispatch)
        return await future

    # -- event-loop side -----------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Start batches while instances are free and the queue has (ready) requests."""
        self._dispatch_scheduled = False
        loop = asyncio.get_running_loop()
        while self._in_flight < self._instances and self._queue:
            batch = self._take(loop)
            if not batch:
                break
            start = perf_counter_ns()
            stats = self.stats
            for r in batch:
                stats.queue_count += 1
                stats.queue_ns += start - r.enqueued_ns
            if self._inline:
                self._finish(batch, *self._run_batch(batch))
                continue
            self._in_flight += 1
            try:
                if self._executor is not None:
                    self._executor.submit(self._execute, loop, batch)
                else:
                    self._submit(loop, batch)
            except RuntimeError as exc:  # executor shut down under us
                self._in_flight -= 1
                self._finish(batch, None, exc, (0, 0, 0), start)
        self._wake_drainers()

    def _take(self, loop: asyncio.AbstractEventLoop) -> list[_Request] | None:
        """Remove and return the next batch, or None to wait (queue delay not yet spent)."""
        q = self._queue
        while q and q[0].future.done():  # callers that went away before their turn
            q.popleft()
            self.stats.pending -= 1
        if not q:
            return None
        delay_ns = self._delay_ns
        decision = form_batch(
            ((r.rows, None if r.future.done() else r.key) for r in q),
            max_rows=self._max_rows, preferred=self._preferred, delay_ns=delay_ns,
            waited_ns=perf_counter_ns() - q[0].enqueued_ns if delay_ns else 0)
        take = decision.take
        if not take:
            if self._timer is None:
                self._timer = loop.call_later(decision.wait_ns / 1e9, self._on_timer)
            return None
        if take[-1] == len(take) - 1:  # a prefix of the queue: the common case
            chosen = [q.popleft() for _ in take]
            self.stats.pending -= len(chosen)
            return chosen
        chosen = [q[i] for i in take]
        taken = {id(r) for r in chosen}
        self._queue = deque(r for r in q if id(r) not in taken and not r.future.done())
        self.stats.pending = len(self._queue)
        return chosen

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _finish(self, batch: list[_Request], parts: list[Tensors] | None,
                error: BaseException | None, times: tuple[int, int, int],
                started: int) -> None:
        """On the loop: resolve the batch's futures, account for it, start the next batch.
        `started`: perf_counter_ns() when the batch began to run."""
        now = perf_counter_ns()
        stats = self.stats
        if self._tracing.active:
            self._trace(batch, times, started, error)
        if error is None:
            rows = 0
            for r, part in zip(batch, parts, strict=True):  # type: ignore[arg-type]
                rows += r.rows
                if not r.future.done():
                    r.future.set_result(part)
                stats.record_success(now - r.enqueued_ns)
            stats.record_execution(len(batch), rows, *times)
        else:
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(error)
                stats.record_failure(now - r.enqueued_ns)
        if self._may_inline:
            run_ns = times[1]
            avg = self._run_ns = run_ns if self._run_ns is None else \
                0.875 * self._run_ns + 0.125 * run_ns
            self._inline = avg < (INLINE_ABOVE_NS if self._inline else INLINE_BELOW_NS)

    def _trace(self, batch: list[_Request], times: tuple[int, int, int], started: int,
               error: BaseException | None) -> None:
        """The queue and compute spans of the batch's traced requests."""
        traced = [r for r in batch if r.trace is not None]
        if traced:
            rows = sum(r.rows for r in batch)
            for r in traced:
                r.trace.batch(r.enqueued_ns, started, times, len(batch), rows, error)

    def _complete(self, batch: list[_Request], parts: list[Tensors] | None,
                  error: BaseException | None, times: tuple[int, int, int],
                  started: int) -> None:
        self._in_flight -= 1
        self._finish(batch, parts, error, times, started)
        if self._queue and not self._closed:
            self._dispatch()
        else:
            self._wake_drainers()

    def _wake_drainers(self) -> None:
        if self._drain_waiters and not self._in_flight and not self._queue:
            waiters, self._drain_waiters = self._drain_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    # -- worker-thread side --------------------------------------------------------------------

    def _submit(self, loop: asyncio.AbstractEventLoop, batch: list[_Request]) -> None:
        if self._jobs is None:  # threads start on first use, not at construction
            self._jobs = queue.SimpleQueue()
            for i in range(self._instances):
                t = threading.Thread(
                    target=self._worker, args=(self._jobs,), daemon=True,
                    name=f"infer-{self.stats.model}-{self.stats.version}-{i}")
                t.start()
                self._threads.append(t)
        self._jobs.put((loop, batch))

    def _worker(self, jobs: queue.SimpleQueue) -> None:
        get = jobs.get
        execute = self._execute
        while (job := get()) is not None:
            execute(*job)
            # Drop the batch now, not when the next one arrives: a large request's tensors
            # must go with its answer.
            job = None

    def _execute(self, loop: asyncio.AbstractEventLoop, batch: list[_Request]) -> None:
        """In a worker thread: merge, run, split; hand the outcome back to the loop."""
        outcome = self._run_batch(batch)
        try:
            loop.call_soon_threadsafe(self._complete, batch, *outcome)
        except RuntimeError:  # the loop is gone (shutdown): nobody is waiting any more
            pass

    def _run_batch(self, batch: list[_Request]) -> tuple[
            list[Tensors] | None, BaseException | None, tuple[int, int, int], int]:
        """Merge, run, split: each caller's outputs or the error, the three times, and when
        it began. A run that succeeded offers its sampled requests to the capture queue, from
        the joined arrays (one record for the run where it can)."""
        t0 = perf_counter_ns()
        parts: list[Tensors] | None = None
        error: BaseException | None = None
        t1 = t2 = t0
        try:
            feeds = merge_inputs([r.inputs for r in batch])
            t1 = perf_counter_ns()
            outputs = self._run(feeds)
            t2 = perf_counter_ns()
            rows = [r.rows for r in batch]
            parts = split_outputs(outputs, rows)
        except BaseException as exc:  # noqa: BLE001 - any failure belongs to this batch's callers
            error = exc
            parts = None
        t3 = perf_counter_ns()
        if parts is not None:
            tickets = [r.capture for r in batch]
            if tickets.count(None) != len(tickets):
                _capture(tickets, batch, feeds, outputs, parts, rows)
        return parts, error, (t1 - t0, t2 - t1, t3 - t2), t0

    # -- lifecycle -----------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until nothing is queued or running (before unloading the version)."""
        while self._in_flight or self._queue:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            if self._queue and not self._dispatch_scheduled and self._timer is None:
                self._dispatch()
            await waiter

    def close(self) -> None:
        """Refuse new requests, fail queued ones, release the worker threads."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        error = ModelNotReady(
            f"model {self.stats.model!r} version {self.stats.version!r} was unloaded",
            retry_after=1)
        while self._queue:
            r = self._queue.popleft()
            if not r.future.done():
                r.future.set_exception(error)
            self.stats.record_failure(perf_counter_ns() - r.enqueued_ns)
        self.stats.pending = 0
        if self._jobs is not None:
            for _ in self._threads:  # each worker exits after the batch it may be running
                self._jobs.put(None)
            self._threads = []


def _capture(tickets: list, batch: list[_Request], feeds: Tensors, outputs: Tensors,
             parts: list[Tensors], rows: list[int]) -> None:
    """A run's sampled requests to their capture queue (serving.core.capture): never a reason
    for the run's callers to fail."""
    ticket = next(t for t in tickets if t is not None)
    try:
        ticket.queue.offer_batch(tickets, [r.inputs for r in batch], feeds, outputs, parts,
                                 rows)
    except Exception:  # noqa: BLE001 - capture is a side effect: logged, requests unharmed
        log.exception("capture: the records of a run of %s:%s not offered", ticket.model,
                      ticket.version)
