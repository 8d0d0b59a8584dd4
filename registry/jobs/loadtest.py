"""A load test of one version (perf_analyzer in the console): N requests or T seconds at
concurrency C against the pinned version's v2 infer URL on one replica, with inputs generated
from the signature (the same request every time, so two versions compare on equal terms).

The requests run on one asyncio loop in a thread of their own (C coroutines sharing an
httpx.AsyncClient); the job's thread stays synchronous Django and writes progress (requests
done, req/s so far) through the lease every half second. `measure` is that generator alone, which
a serving-config search (registry.services.config_search) runs once per point."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx
import numpy as np
import orjson
from django.conf import settings

from registry.jobs.lease import JobFailed, Lease
from registry.models import Job, ReplicaHeartbeat
from serving.core.desired_state import SCALED_TO_ZERO
from serving.core.tensor_signature import example_data, example_shape

PROGRESS_EVERY = 0.5
REQUEST_TIMEOUT = 30.0


def request_body(signature: dict) -> bytes:
    """One v2 JSON request from the signature: dynamic dimensions are 1, data deterministic."""
    inputs = []
    for tensor in signature.get("inputs") or []:
        shape = example_shape(tensor.get("shape"))
        inputs.append({"name": tensor["name"], "shape": shape, "datatype": tensor["datatype"],
                       "data": example_data(tensor["datatype"], math.prod(shape))})
    return orjson.dumps({"inputs": inputs})


def infer_url(base: str, model: str, number: int) -> str:
    return f"{base.rstrip('/')}/v2/models/{model}/versions/{number}/infer"


class Recorder:
    """What the coroutines measured, read by the job thread: latencies (s) and statuses."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, seconds: float, status: str) -> None:
        with self.lock:
            self.latencies.append(seconds)
            self.statuses[status] += 1

    @property
    def done(self) -> int:
        return len(self.latencies)


async def _drive(url: str, body: bytes, headers: dict, *, requests: int | None, deadline: float,
                 concurrency: int, stop: threading.Event, recorder: Recorder) -> None:
    issued = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal issued
        while not stop.is_set() and time.monotonic() < deadline:
            if requests is not None:
                if issued >= requests:
                    return
                issued += 1  # one loop thread: no lock needed between coroutines
            start = time.perf_counter()
            try:
                r = await client.post(url, content=body, headers=headers)
                status = str(r.status_code)
            except httpx.TimeoutException:
                status = "timeout"
            except httpx.HTTPError as exc:
                status = exc.__class__.__name__
            recorder.add(time.perf_counter() - start, status)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))


def summarize(recorder: Recorder, elapsed: float, *, stopped: str = "") -> dict:
    """The stored result: req/s, latency percentiles (ms), errors by status."""
    lat = np.asarray(recorder.latencies) * 1000.0
    ok = recorder.statuses.get("200", 0)
    pct = (lambda q: round(float(np.percentile(lat, q)), 2)) if len(lat) else (lambda q: None)
    return {"requests": int(len(lat)), "ok": int(ok),
            "errors": {k: v for k, v in sorted(recorder.statuses.items()) if k != "200"},
            "seconds": round(elapsed, 3),
            "rps": round(len(lat) / elapsed, 1) if elapsed > 0 else None,
            "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99),
            "mean_ms": round(float(lat.mean()), 2) if len(lat) else None,
            "stopped": stopped}


def wait_loaded(version, replica: str, lease: Lease) -> None:
    """A version no slot referenced: wait until the replica reports it loaded (the test's job
    put it in the desired state), within MMC_LOADTEST_LOAD_SECONDS."""
    key = f"{version.model.name}:{version.number}"
    deadline = time.monotonic() + settings.LOADTEST_LOAD_SECONDS
    while True:
        seen = ReplicaHeartbeat.objects.filter(replica=replica).values_list(
            "versions", flat=True).first()
        state = ((seen or {}).get(key) or {}).get("state")
        if state in ("READY", SCALED_TO_ZERO):  # scaled to zero: the first request loads it
            return
        if state == "FAILED" or time.monotonic() > deadline:
            raise JobFailed(f"replica {replica!r} did not load v{version.number} for the test "
                            f"within {settings.LOADTEST_LOAD_SECONDS} s (its state: "
                            f"{state or 'not loading'})")
        lease.update(rows_done=0)
        time.sleep(PROGRESS_EVERY)


def measure(url: str, body: bytes, headers: dict, *, concurrency: int, seconds: float,
            requests: int | None = None,
            on_progress: Callable[[int, float], None] | None = None) -> dict:
    """Send `requests` (or as many as fit in `seconds`) at `concurrency` and summarize them. The
    requests run on a loop thread of their own; this thread calls on_progress(done, elapsed)
    every half second, and what it raises stops the requests and is raised here."""
    recorder, stop, failure = Recorder(), threading.Event(), []
    start = time.monotonic()
    deadline = start + seconds

    def drive() -> None:
        try:
            asyncio.run(_drive(url, body, headers, requests=requests, deadline=deadline,
                               concurrency=concurrency, stop=stop, recorder=recorder))
        except Exception as exc:  # reported as the job's failure by the job thread
            failure.append(exc)

    thread = threading.Thread(target=drive, name="mmc-loadtest", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(PROGRESS_EVERY)
            if on_progress is not None:
                on_progress(recorder.done, time.monotonic() - start)
    except BaseException:
        stop.set()
        thread.join()
        raise
    if failure:
        raise JobFailed(f"the load generator failed: {failure[0]!r}")
    elapsed = time.monotonic() - start
    stopped = ("time limit" if requests is not None and recorder.done < requests else "")
    return summarize(recorder, elapsed, stopped=stopped)


def run_loadtest(job: Job, lease: Lease, *, key: str | None = None) -> dict:
    version, params = job.version, job.params
    if not version.signature:
        raise JobFailed(f"version {version.number} has no signature (is it ready?)")
    if params.get("key_required") and not key:
        raise JobFailed("the endpoint needs a predict key and keys are never stored: the run "
                        "was interrupted and cannot resume; start the load test again")
    url = infer_url(params["url"], version.model.name, version.number)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if params.get("load_first"):
        wait_loaded(version, params["replica"], lease)
    requests, seconds = params.get("requests"), params.get("seconds")

    def progress(done: int, elapsed: float) -> None:
        lease.update(rows_done=done, rows_per_second=done / elapsed if elapsed > 0 else None)

    summary = measure(url, request_body(version.signature), headers,
                      concurrency=params["concurrency"], requests=requests,
                      seconds=float(seconds or settings.LOADTEST_MAX_SECONDS),
                      on_progress=progress)
    if summary["requests"] and not summary["ok"]:
        first = next(iter(summary["errors"]))
        raise JobFailed(f"every request failed ({first}: {summary['errors'][first]} of "
                        f"{summary['requests']}) against {url}")
    return {"summary": summary, "rows_done": summary["requests"],
            "rows_per_second": summary["rps"]}
