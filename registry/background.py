"""The one door for background work. A task is declared once (`@task` in a `tasks.py`) and
started with `enqueue(name, ...)`: after the asking transaction commits, on Celery when the
product runs clustered, else on an in-process pool. Periodic tasks run from Celery beat
(clustered) or from the one scheduler loop here (embedded); both read `settings.PERIODIC_TASKS`.

In-process pools are per lane, so a long batch job never delays a validation and a slow webhook
receiver delays neither."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections, connections, transaction

log = logging.getLogger(__name__)

#: Lane -> in-process worker threads (embedded mode).
LANES = {"default": 1, "jobs": 1, "webhooks": 2}


@dataclass(frozen=True)
class Task:
    name: str
    fn: Callable
    lane: str
    celery: object  # the Celery task of the same name


_tasks: dict[str, Task] = {}
_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()
_pending: set[Future] = set()
_scheduler: threading.Thread | None = None


def task(name: str, *, lane: str = "default", **celery_options) -> Callable:
    """Declare a background task: registered with Celery under `name` and runnable in-process
    on `lane`. Returns the Celery task (so Celery's own tooling sees it as usual)."""
    if lane not in LANES:
        raise ValueError(f"unknown lane {lane!r}")

    def declare(fn: Callable):
        celery_task = shared_task(name=name, **celery_options)(fn)
        _tasks[name] = Task(name, fn, lane, celery_task)
        return celery_task

    return declare


def enqueue(name: str, *, delay: float = 0.0, on_unsent: Callable[[], None] | None = None,
            **kwargs) -> None:
    """Run task `name` with kwargs after the current transaction commits (at once outside
    one), `delay` seconds later if given: never eagerly inside the request.

    Sending never fails the caller: what committed stays committed, and every task is one that
    a periodic tick starts again if its message never arrived. A broker that is down or hung
    costs at most the broker's socket timeouts (settings); `unsent_tasks()` tells the request,
    and `on_unsent` (if given) runs, e.g. to mark the work due for the next tick."""
    declared = _tasks[name]
    transaction.on_commit(lambda: _send(declared, delay, kwargs, on_unsent))


#: Tasks this context could not hand to the broker: (name, reason).
_unsent: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("mmc_unsent", default=())


@contextmanager
def unsent_tasks() -> Iterator[list[tuple[str, str]]]:
    """Collect (name, reason) of the tasks the block enqueued that the broker refused, so a
    request can say so in its answer."""
    token = _unsent.set(())
    collected: list[tuple[str, str]] = []
    try:
        yield collected
    finally:
        collected.extend(_unsent.get())
        _unsent.reset(token)


def _send(declared: Task, delay: float, kwargs: dict,
          on_unsent: Callable[[], None] | None = None) -> None:
    if settings.CLUSTERED:
        try:
            declared.celery.apply_async(kwargs=kwargs, countdown=delay or None)
        except Exception as exc:  # kombu/redis raise many types; all mean "not queued"
            reason = f"{exc.__class__.__name__}: {exc}"[:300]
            log.warning("task %s not queued (%s); the periodic tick queues it again",
                        declared.name, reason)
            _unsent.set((*_unsent.get(), (declared.name, reason)))
            if on_unsent is not None:
                on_unsent()
    elif delay > 0:
        timer = threading.Timer(delay, _submit, (declared, kwargs))
        timer.daemon = True
        timer.start()
    else:
        _submit(declared, kwargs)


def _pool(lane: str) -> ThreadPoolExecutor:
    with _pools_lock:
        if lane not in _pools:
            _pools[lane] = ThreadPoolExecutor(max_workers=LANES[lane],
                                              thread_name_prefix=f"mmc-{lane}")
        return _pools[lane]


def _submit(declared: Task, kwargs: dict) -> None:
    # in the context that queued it: its log lines keep the request id, its outbound calls the
    # request's trace (serving.core.logs, console.telemetry)
    fut = _pool(declared.lane).submit(contextvars.copy_context().run, _run, declared, kwargs)
    if declared.lane == "default":
        _pending.add(fut)
        fut.add_done_callback(_pending.discard)


def _run(declared: Task, kwargs: dict) -> None:
    close_old_connections()
    try:
        declared.fn(**kwargs)
    except Exception:
        log.exception("background task %s failed", declared.name)
    finally:
        close_old_connections()


@contextmanager
def every(seconds: float, fn: Callable, *args) -> Iterator[None]:
    """Call fn(*args) every `seconds` on a thread while the block runs (a lease's heartbeat);
    a failed call is logged and tried again on the next beat; fn returning False ends the beat
    (the lease is no longer ours)."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(seconds):
                try:
                    if fn(*args) is False:
                        return
                except Exception:
                    log.exception("heartbeat %s failed", getattr(fn, "__name__", fn))
        finally:
            connections.close_all()  # this thread's own connections end with it

    thread = threading.Thread(target=beat, name="mmc-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def wait_in_process(timeout: float = 30.0) -> None:
    """Block until queued in-process default-lane tasks (validations) finish: for the start
    command and tests."""
    for fut in list(_pending):
        fut.result(timeout=timeout)


def start_scheduler(schedule: dict[str, float] | None = None) -> threading.Thread | None:
    """Embedded mode: one daemon thread runs every periodic task at start, then every interval
    seconds (an interval <= 0 turns that task off). Once per process."""
    global _scheduler
    schedule = {name: s for name, s in (schedule or settings.PERIODIC_TASKS).items() if s > 0}
    if not schedule or _scheduler is not None:
        return _scheduler

    def loop() -> None:
        due = dict.fromkeys(schedule, time.monotonic())
        while True:
            name = min(due, key=due.get)
            time.sleep(max(0.0, due[name] - time.monotonic()))
            _run(_tasks[name], {})
            due[name] = time.monotonic() + schedule[name]

    _scheduler = threading.Thread(target=loop, name="mmc-scheduler", daemon=True)
    _scheduler.start()
    return _scheduler
