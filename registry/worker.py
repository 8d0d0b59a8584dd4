"""Where background work runs: a Celery worker in clustered mode, an in-process worker thread in
embedded mode. Either way the job starts only after the transaction that asked for it commits."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from django.conf import settings
from django.db import close_old_connections, transaction

log = logging.getLogger(__name__)
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
_pending: set[Future] = set()


def _in_process_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmc-worker")
        return _executor


def _run_in_process(fn, kwargs: dict) -> None:
    close_old_connections()
    try:
        fn(**kwargs)
    except Exception:
        log.exception("background job %s failed", fn.__name__)
    finally:
        close_old_connections()


def enqueue(task, **kwargs) -> None:
    """Run `task` (a Celery task) with kwargs after commit: on Celery when clustered, else on the
    in-process worker thread (never eagerly inside the request)."""

    def send() -> None:
        if settings.CLUSTERED:
            task.apply_async(kwargs=kwargs)
        else:
            fut = _in_process_executor().submit(_run_in_process, task.run, kwargs)
            _pending.add(fut)
            fut.add_done_callback(_pending.discard)

    transaction.on_commit(send)


def wait_in_process(timeout: float = 30.0) -> None:
    """Block until queued in-process jobs finish (used by the start command and tests)."""
    for fut in list(_pending):
        fut.result(timeout=timeout)
