"""Control-plane faults, measured on a whole clustered product with default settings: its own
PostgreSQL and Redis (never the machine's), console, Celery worker and beat.

    .venv/bin/python bench/faults.py [--before DIR] [--hang 40] [--skip-job]

For each fault: requests that failed on the healthy path, time until the product worked again by
itself (no restart of the console), and data lost. --before DIR runs the product from another
checkout (e.g. a git worktree of an older commit) for a before/after table.

1. Redis hung (SIGSTOP) for --hang s while 10 signed-in tabs poll the health bar and one opens a
   page: answers slower than 10 s or not 200 count as failed; recovery = the bar saying Redis ok
   and a page answering in under 2 s after SIGCONT; leaked console threads / PostgreSQL
   connections after recovery.
2. Upload while Redis is down (killed) / hung: the answer, and the time from Redis back to the
   version being ready.
3. PostgreSQL stopped: what the API, the schema and the health bar answer; traceback lines
   logged; the time from PostgreSQL back to the API answering.
4. Worker kill -9 (the whole worker) during a validation, a new worker started at once: time to
   ready. And during a batch job: time until it runs again (rows advance), and rows lost or
   duplicated (the result checked against onnxruntime).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from registry import samples  # noqa: E402
from tests.faults import cluster as faults  # noqa: E402
from tests.faults.models import slow_warmup  # noqa: E402

PASSWORD = "x" * 12
rows: list[tuple[str, str, str, str]] = []


def row(fault: str, failed: str, recovered: str, lost: str) -> None:
    rows.append((fault, failed, recovered, lost))
    print(f"  {fault}: failed {failed}; recovered {recovered}; lost {lost}", flush=True)


def signed_in(c: faults.Cluster) -> httpx.Client:
    client = httpx.Client(base_url=c.url, timeout=10, follow_redirects=False)
    client.get("/login/")
    r = client.post("/login/", data={"username": "eng", "password": PASSWORD,
                                     "csrfmiddlewaretoken": client.cookies["csrftoken"]},
                    headers={"Referer": c.url + "/login/"})
    assert r.status_code == 302, r.text[:500]
    return client


def until(predicate, cap: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < cap:
        try:
            if predicate():
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return None


def secs(value: float | None, cap: float) -> str:
    return f"{value:.1f} s" if value is not None else f"not within {cap:.0f} s"


def upload(c: faults.Cluster, model: str, data: bytes, timeout: float = 60) -> httpx.Response:
    c.post("/api/v1/models/", json={"name": model})
    return c.put(f"/api/v1/models/{model}/versions/upload/", content=data, timeout=timeout)


def status_of(c: faults.Cluster, model: str) -> str:
    return c.get(f"/api/v1/models/{model}/versions/1/").json().get("status", "?")


def hung_redis(c: faults.Cluster, hang: float) -> None:
    tabs = [signed_in(c) for _ in range(11)]
    base_threads, base_conns = c.console.threads(), c.pg.connections()
    results: list[tuple[float, int]] = []
    stop = threading.Event()

    def poll(client: httpx.Client, path: str) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                code = client.get(path).status_code
            except httpx.HTTPError:
                code = 599
            results.append((time.monotonic() - t0, code))
            time.sleep(0.5)

    threads = [threading.Thread(target=poll, args=(t, "/health/" if i < 10 else "/models/"),
                                daemon=True) for i, t in enumerate(tabs)]
    for t in threads:
        t.start()
    c.redis.pause()
    time.sleep(hang)
    c.redis.resume()
    probe = signed_in(c) if c.get("/api/v1/models/", timeout=10).status_code == 200 else None

    def back() -> bool:
        t0 = time.monotonic()
        ok = (probe is not None and "Redis: <strong>ok" in probe.get("/health/").text
              and probe.get("/models/").status_code == 200)
        return ok and time.monotonic() - t0 < 2

    recovered = until(back, 60)
    stop.set()
    failed = sum(1 for dt, code in results if code != 200 or dt > 10)
    time.sleep(5)
    leaked = (f"+{c.console.threads() - base_threads} threads, "
              f"+{c.pg.connections() - base_conns} db connections")
    row(f"Redis hung {hang:.0f} s (10 tabs)", f"{failed}/{len(results)}",
        secs(recovered, 60) + " after SIGCONT", leaked)


def redis_down_upload(c: faults.Cluster) -> None:
    c.redis.kill()
    r = upload(c, "while-down", samples.mlp(seed=7))
    kind = r.headers.get("content-type", "").split(";")[0]
    c.redis.start()
    ready = until(lambda: status_of(c, "while-down") == "ready", 120)
    row("upload, Redis down", f"answer {r.status_code} {kind}", secs(ready, 120) +
        " after Redis back", "0" if ready else "version stuck validating")


def redis_hung_upload(c: faults.Cluster) -> None:
    c.redis.pause()
    t0 = time.monotonic()
    r = upload(c, "while-hung", samples.mlp(seed=8), timeout=30)
    took = time.monotonic() - t0
    c.redis.resume()
    ready = until(lambda: status_of(c, "while-hung") == "ready", 120)
    answer = f"{r.status_code} after {took:.1f} s" if r.status_code != 599 else (
        f"no answer in {took:.0f} s")
    row("upload, Redis hung", answer, secs(ready, 120) + " after SIGCONT",
        "0" if ready else "version stuck validating")


def postgres_down(c: faults.Cluster) -> None:
    size = c.console.log.stat().st_size
    tab = signed_in(c)
    c.pg.stop()
    answers = []
    for path in ("/api/v1/models/", "/api/schema/"):
        r = c.get(path, timeout=15)
        answers.append(f"{path} {r.status_code} {r.headers.get('content-type', '').split(';')[0]}")
    try:
        bar = tab.get("/health/", timeout=15)
        answers.append(f"/health/ {bar.status_code}"
                       + (" names the database" if "Database" in bar.text else ""))
    except httpx.HTTPError as exc:
        answers.append(f"/health/ {exc.__class__.__name__}")
    time.sleep(2)
    c.pg.start()
    back = until(lambda: c.get("/api/v1/models/", timeout=5).status_code == 200, 60)
    tracebacks = c.console.log.read_bytes()[size:].count(b"Traceback")
    row("PostgreSQL stopped", "; ".join(answers), secs(back, 60) + " after start",
        f"0 ({tracebacks} tracebacks logged)")


def worker_kill_validation(c: faults.Cluster) -> None:
    r = upload(c, "slow", slow_warmup(seconds=8))
    assert r.status_code == 201, r.text
    time.sleep(3)  # the worker is in the warm-up inference
    assert status_of(c, "slow") == "validating"
    c.worker.kill9()
    killed = time.monotonic()
    c.worker = c.start_worker("worker-2")
    ready = until(lambda: status_of(c, "slow") == "ready", 180)
    took = time.monotonic() - killed if ready is not None else None
    row("worker kill -9 during validation", "0 requests",
        secs(took, 180) + " from the kill to ready", "0" if ready else "stuck validating")


def worker_kill_job(c: faults.Cluster) -> None:
    n = 200_000
    x = np.random.default_rng(0).standard_normal((n, 64), dtype=np.float32)
    path = c.root / "rows.npy"
    np.save(path, x)
    assert upload(c, "mlp", samples.mlp()).status_code == 201
    until(lambda: status_of(c, "mlp") == "ready", 60)
    ds = c.put("/api/v1/datasets/upload/?filename=rows.npy", content=path.read_bytes()).json()
    job = c.post("/api/v1/models/mlp/batch/", json={
        "dataset": ds["id"], "version": 1, "batch_size": 50, "chunk_rows": 5000,
        "max_rows_per_second": 8000}).json()

    def progress() -> dict:
        return c.get(f"/api/v1/jobs/{job['id']}/").json()

    until(lambda: progress()["progress"]["rows_done"] >= 20_000, 60)
    c.worker.kill9()
    killed = time.monotonic()
    at_kill = progress()["progress"]["rows_done"]
    c.worker = c.start_worker("worker-3")
    resumed = until(lambda: progress()["attempts"] >= 2 and progress()["progress"]["rows_done"]
                    > at_kill, 180)
    took = time.monotonic() - killed if resumed is not None else None
    done = until(lambda: progress()["status"] in ("succeeded", "failed"), 240)
    lost = "job unfinished"
    if done is not None:
        body = progress()
        y = np.load(_download(c, body)) if body["status"] == "succeeded" else np.zeros((0,))
        lost = "0 rows lost or duplicated" if y.shape[0] == n else f"{y.shape[0]} of {n} rows"
    row("worker kill -9 during a batch job", "0 requests",
        secs(took, 180) + " from the kill to rows advancing", lost)


def _download(c: faults.Cluster, body: dict):
    import io

    r = httpx.get(body["result_url"] if body["result_url"].startswith("http")
                  else c.url + body["result_url"], headers=c.headers(), timeout=60)
    return io.BytesIO(r.raise_for_status().content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="run the product from this checkout")
    parser.add_argument("--hang", type=float, default=40.0)
    parser.add_argument("--skip-job", action="store_true")
    args = parser.parse_args()
    if reason := faults.missing():
        sys.exit(f"cannot run: {reason}")
    repo = (args.before or REPO).resolve()
    print(f"product from {repo}", flush=True)
    groups = [lambda c: hung_redis(c, args.hang), lambda c: (redis_down_upload(c),
              redis_hung_upload(c)), postgres_down, worker_kill_validation]
    if not args.skip_job:
        groups.append(worker_kill_job)
    for run in groups:  # a fresh cluster each: a wedged product must not spoil the next figure
        c = faults.Cluster(Path(tempfile.mkdtemp(prefix="mmc-faults-")), repo=repo,
                           MMC_GC_SECONDS=0)
        try:
            c.up()
            c.manage(code="import django; django.setup()\n"
                          "from django.contrib.auth.models import User\n"
                          f"u = User.objects.get(username='eng'); u.set_password('{PASSWORD}')\n"
                          "u.save()\n")
            run(c)
        finally:
            c.down()
    print("\n| fault | failed on the healthy path | recovered | lost |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(re.sub(r"\s+", " ", v) for v in r) + " |")


if __name__ == "__main__":
    main()
