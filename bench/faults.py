"""Control-plane faults, measured on a whole clustered product with default settings: its own
PostgreSQL and Redis (never the machine's), console, Celery worker and beat.

    .venv/bin/python bench/faults.py [--before DIR] [--hang 40] [--skip-job] [--only 5,6,7,8]

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

Data-plane faults, each on a cluster with two `mmc-serve --registry` replicas (r1, r2) of the same
product, default settings (no MMC_* override), and a deployed ready model (samples.mlp):

5. Replica kill -9 (r2 of two): after the stale window (MMC_REPLICA_STALE_SECONDS, 10 s), what
   /api/v1/replicas/ says about r2 (lost, or gone from the list) and the health Serving line
   (/healthz, or the /health/ bar where there is none); then a deploy with ?wait=20: converged
   or not, and the laggards it names. Columns: failed = the ?wait answer, recovered = the health
   line, lost = what the list says about r2.
6. Replica start: three cold starts of a third replica, each hammered with infer from the moment
   its port accepts until 30 answers of 200: 404s (the model called unknown) and 503s with
   Retry-After before the first 200.
7. 10 SIGTERM restarts of r1 (same port) under 4 keep-alive clients (httpx, one pool each)
   posting infer: a refused connect or a 503 with Retry-After is retried; a read/write error, a
   disconnect, another 5xx or a 404 is a dropped request. The default MMC_DRAIN_SECONDS (5 s).
8. Console kill -9 mid-upload: a 200 MiB streamed PUT, the console's process group killed once the
   store's temp file holds half the body (under ASGI the body is spooled to an unnamed file
   first; at once if the temp file is gone before that; 120 s at most),
   the bytes left in artifacts/tmp and jobs/tmp, the console started again, the product's
   collection (`manage.py gc_artifacts --grace-minutes 0`) run: swept or not; the Store line of
   /healthz where there is one.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
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


# -- data plane: replicas ------------------------------------------------------------------------

INFER = faults.INFER
MODEL = "scorer"
replicas_started: list[faults.Process] = []  # stopped before the cluster goes down


def start_replica(c: faults.Cluster, name: str, port: int | None = None) -> faults.Process:
    replica = c.start_replica(name, port=port)
    replicas_started.append(replica)
    return replica


def answers_infer(replica: faults.Process, cap: float = 90) -> float | None:
    def ok() -> bool:
        if replica.proc.poll() is not None:
            raise RuntimeError(f"{replica.name} exited: {replica.tail()}")
        return httpx.post(replica.url + f"/v2/models/{MODEL}/infer", json=INFER,
                          timeout=5).status_code == 200
    return until(ok, cap)


def deployed(c: faults.Cluster, versions: int = 1) -> None:
    """`versions` ready versions of MODEL (samples.mlp, seeds 1..), version 1 deployed."""
    for seed in range(1, versions + 1):
        r = upload(c, MODEL, samples.mlp(seed=seed))
        assert r.status_code in (200, 201), r.text
    ready = until(lambda: all(c.get(f"/api/v1/models/{MODEL}/versions/{v}/").json()
                              .get("status") == "ready" for v in range(1, versions + 1)), 120)
    assert ready is not None, "versions not ready in 120 s"
    r = c.post(f"/api/v1/models/{MODEL}/endpoint/deploy/", json={"version": 1})
    assert r.status_code == 200, r.text


def two_replicas(c: faults.Cluster) -> tuple[faults.Process, faults.Process]:
    r1, r2 = start_replica(c, "r1"), start_replica(c, "r2")
    for replica in (r1, r2):
        if answers_infer(replica) is None:
            raise RuntimeError(f"{replica.name} does not answer infer: {replica.tail()}")
    return r1, r2


def listed(c: faults.Cluster) -> dict:
    return {r["replica"]: r for r in c.get("/api/v1/replicas/").json()["replicas"]}


def health_line(c: faults.Cluster, name: str, tab: httpx.Client | None = None) -> str:
    """`name`'s check from /healthz, or from the signed-in health bar where there is none."""
    r = c.get("/healthz", timeout=15)
    if r.status_code in (200, 503) and r.headers.get("content-type", "").startswith(
            "application/json"):
        check = r.json().get("checks", {}).get(name.lower())
        return (f"/healthz {name} {check['state']} ({check['detail']})" if check
                else f"/healthz has no {name} check")
    if tab is None:
        return f"no /healthz ({r.status_code})"
    bar = tab.get("/health/", timeout=15)
    found = re.search(rf"{name}: <strong>(\w+)</strong>\s*<span[^>]*>\((.*?)\)</span>", bar.text)
    return (f"no /healthz; /health/ bar {name} {found[1]} ({found[2]})" if found
            else f"no /healthz; /health/ bar ({bar.status_code}) has no {name} check")


def replica_kill(c: faults.Cluster) -> None:
    deployed(c, versions=2)
    tab = signed_in(c)
    r1, r2 = two_replicas(c)
    stale = float(c.env().get("MMC_REPLICA_STALE_SECONDS", 10))
    both = until(lambda: {"r1", "r2"} <= set(listed(c)), 30)
    assert both is not None, listed(c)
    r2.kill9()
    settled = until(lambda: "r2" not in (rows := listed(c)) or rows["r2"].get("state") == "lost",
                    stale + 30)
    rows = listed(c)
    if settled is None:
        said = f"r2 still listed as live {stale + 30:.0f} s after the kill"
    elif "r2" in rows:
        said = (f"r2 listed as lost after {settled:.1f} s (lost_since {rows['r2']['lost_since']}; "
                f"{len(rows)} listed)")
    else:
        said = f"r2 gone from the list after {settled:.1f} s ({', '.join(rows) or 'none'} listed)"
    health = health_line(c, "Serving", tab)
    t0 = time.monotonic()
    r = c.post(f"/api/v1/models/{MODEL}/endpoint/deploy/?wait=20", json={"version": 2},
               timeout=40)
    took = time.monotonic() - t0
    conv = r.json().get("convergence", {}) if r.status_code == 200 else {}
    if conv:
        laggards = ", ".join(f"{b['replica']} ({b.get('reason') or b.get('state', 'behind')})"
                             for b in conv.get("laggards", [])) or "none"
        answer = (f"deploy ?wait=20: converged {str(conv['converged']).lower()} in {took:.1f} s, "
                  f"{conv.get('replicas')} replica(s), laggards {laggards}")
    else:
        answer = f"deploy ?wait=20: {r.status_code} {r.text[:200]}"
    served = httpx.post(r1.url + f"/v2/models/{MODEL}/infer", json=INFER, timeout=10).status_code
    row(f"replica kill -9 (r2 of 2), {stale:.0f} s stale window", answer,
        f"{health}; r1 infer {served}", said)


def hammer_from_first_connect(replica: faults.Process, after_ok: int = 30,
                              cap: float = 60) -> tuple[list[tuple[int, bool]], float | None]:
    """Infer from the moment the port accepts until `after_ok` 200s (`cap` s at most): every
    answer as (status, has Retry-After), and the seconds from the first connect to the first
    200."""
    answers: list[tuple[int, bool]] = []
    first_connect = first_ok = None
    deadline = time.monotonic() + cap
    with httpx.Client(base_url=replica.url, timeout=10) as http:
        while sum(s == 200 for s, _ in answers) < after_ok and time.monotonic() < deadline:
            if replica.proc.poll() is not None:
                raise RuntimeError(f"{replica.name} exited while starting: {replica.tail()}")
            try:
                r = http.post(f"/v2/models/{MODEL}/infer", json=INFER)
            except httpx.ConnectError:
                time.sleep(0.002)  # not listening yet
                continue
            except httpx.HTTPError:
                answers.append((599, False))
                continue
            first_connect = first_connect or time.monotonic()
            answers.append((r.status_code, "retry-after" in r.headers))
            if r.status_code == 200 and first_ok is None:
                first_ok = time.monotonic() - first_connect
    return answers, first_ok


def replica_start(c: faults.Cluster, starts: int = 3) -> None:
    deployed(c)
    two_replicas(c)
    counts, firsts = [], []
    for i in range(starts):
        replica = start_replica(c, f"start{i}")
        try:
            answers, first_ok = hammer_from_first_connect(replica)
        finally:
            replica.stop()
        n = answers.index(next(a for a in answers if a[0] == 200)) if first_ok else len(answers)
        before = answers[:n]
        counts.append((sum(s == 404 for s, _ in before),
                       sum(s == 503 and ra for s, ra in before),
                       sum(s not in (404, 200) and not (s == 503 and ra) for s, ra in before),
                       sum(s != 200 for s, _ in answers[n:])))
        firsts.append(first_ok)
    n404, n503, other, after = (sum(x[k] for x in counts) for k in range(4))
    per = "/".join(str(x[0]) for x in counts)
    per503 = "/".join(str(x[1]) for x in counts)
    row(f"replica start ({starts} cold starts, infer from the first connect)",
        f"before the first 200: {n404} x 404 ({per}), {n503} x 503 + Retry-After ({per503}), "
        f"{other} other; {after} not 200 after it",
        "first 200 " + "/".join(f"{f:.2f}" if f is not None else "never" for f in firsts)
        + " s after the first connect",
        f"{n404} requests told the model is unknown")


def replica_restarts(c: faults.Cluster, restarts: int = 10) -> None:
    deployed(c)
    replica, _ = two_replicas(c)
    port = replica.port
    exits, outages, note = [], [], ""
    with faults.Load(replica.url, model=MODEL) as load:
        since = time.monotonic()
        for i in range(restarts):
            if until(lambda s=since: load.oks_since(s) >= 20, 30) is None:
                note = f"; stalled before restart {i + 1}"
                break
            t0 = time.monotonic()
            replica.proc.send_signal(signal.SIGTERM)
            try:
                replica.proc.wait(20)
            except subprocess.TimeoutExpired:
                replica.kill9()
                note += f"; restart {i + 1}: no exit in 20 s, killed"
            exits.append(time.monotonic() - t0)
            replica = start_replica(c, "r1", port=port)
            since = time.monotonic()
            if until(lambda s=since: load.oks_since(s) >= 20, 60) is None:
                note += f"; r1 not answering 60 s after restart {i + 1}"
                break
            outages.append(load.first_ok_after(since) - t0)
        time.sleep(1)
    total = len(load.ok) + len(load.drops)
    drops = len(load.drops)
    kinds = ", ".join(f"{k} x{v}" for k, v in load.drop_kinds().most_common()) or "none"
    retried = ", ".join(f"{k} x{v}" for k, v in load.retried.most_common()) or "nothing"
    row(f"{len(exits)} SIGTERM restarts of r1 under 4 keep-alive clients",
        f"{drops} dropped of {total} requests ({kinds})",
        f"exit after {statistics.median(exits):.1f} s, first 200 {statistics.median(outages):.1f}"
        f" s after SIGTERM (medians); retried {retried}{note}" if exits and outages else
        f"no restart completed{note}", f"{drops} requests")


def tmp_files(c: faults.Cluster) -> dict[Path, int]:
    root = c.root / "data" / "artifacts"
    found = {}
    for folder in (root / "tmp", root / "jobs" / "tmp"):
        for path in (folder.iterdir() if folder.is_dir() else []):
            try:
                if path.is_file():
                    found[path] = path.stat().st_size
            except FileNotFoundError:
                pass
    return found


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def console_crash_upload(c: faults.Cluster, size: int = 200 * 1024 * 1024) -> None:
    assert c.post("/api/v1/models/", json={"name": "big"}).status_code == 201
    sent, answer = [0], []

    def body():
        chunk = os.urandom(1024 * 1024)
        for _ in range(size // len(chunk)):
            sent[0] += len(chunk)
            yield chunk

    def put() -> None:
        try:
            answer.append(str(httpx.put(
                c.url + "/api/v1/models/big/versions/upload/?filename=big.onnx", content=body(),
                timeout=120, headers={**c.headers(), "Content-Type": "application/octet-stream",
                                      "Content-Length": str(size)}).status_code))
        except httpx.HTTPError as exc:
            answer.append(type(exc).__name__)

    before = set(tmp_files(c))
    client = threading.Thread(target=put, daemon=True)
    client.start()
    deadline, seen, staged = time.monotonic() + 120, set(), 0
    while time.monotonic() < deadline and client.is_alive():
        new = {p: n for p, n in tmp_files(c).items() if p not in before and n > 0}
        if new and max(new.values()) >= size // 2 or seen - set(new):  # half written, or gone
            staged = max(new.values(), default=0)
            break
        seen |= set(new)
        time.sleep(0.002)
    at_kill = sent[0]
    c.console.kill9()
    client.join(30)
    left = {p: n for p, n in tmp_files(c).items() if p not in before}
    left_bytes = sum(left.values())
    t0 = time.monotonic()
    c.restart_console()
    back = time.monotonic() - t0
    gc = c.manage("gc_artifacts", "--grace-minutes", "0").strip()
    after = {p: n for p, n in tmp_files(c).items() if p in left}
    swept = ("swept" if left and not after else "nothing to sweep" if not left
             else f"{mib(sum(after.values()))} still there")
    where = (f"with the store's temp file at {mib(staged)}" if staged
             else "without a store temp file (120 s cap, the client ended, or it was gone)")
    row(f"console kill -9 mid-upload ({mib(size)} streamed)",
        f"upload answer {answer[0] if answer else 'none'}; killed {where}, {mib(at_kill)} sent",
        f"console back in {back:.1f} s; `gc_artifacts --grace-minutes 0`: {gc!r} -> {swept}; "
        + health_line(c, "Store"),
        f"{mib(left_bytes)} in {len(left)} temp file(s) left by the crash "
        + "(" + ", ".join(str(p.relative_to(c.root / 'data' / 'artifacts')) for p in left) + ")")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="run the product from this checkout")
    parser.add_argument("--hang", type=float, default=40.0)
    parser.add_argument("--skip-job", action="store_true")
    parser.add_argument("--only", default="1,2,3,4,5,6,7,8",
                        help="the faults to run, by number (e.g. 5,6,7,8)")
    args = parser.parse_args()
    if reason := faults.missing():
        sys.exit(f"cannot run: {reason}")
    only = {int(n) for n in args.only.split(",") if n.strip()}
    repo = (args.before or REPO).resolve()
    print(f"product from {repo}", flush=True)
    numbered = [(1, lambda c: hung_redis(c, args.hang)),
                (2, lambda c: (redis_down_upload(c), redis_hung_upload(c))),
                (3, postgres_down), (4, worker_kill_validation)]
    if not args.skip_job:
        numbered.append((4, worker_kill_job))
    numbered += [(5, replica_kill), (6, replica_start), (7, replica_restarts),
                 (8, console_crash_upload)]
    groups = [run for n, run in numbered if n in only]
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
            while replicas_started:
                replicas_started.pop().stop()
            c.down()
    print("\n| fault | failed on the healthy path | recovered | lost |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(re.sub(r"\s+", " ", v) for v in r) + " |")


if __name__ == "__main__":
    main()
