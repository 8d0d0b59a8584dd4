"""Rollout convergence under load: time from a rollout call to the last replica reporting the new
route revision, over N flips, and failed requests meanwhile (BENCH.md, Rollouts).

    REDIS_URL=redis://127.0.0.1:6379/0 PG_URL=postgres://postgres@127.0.0.1:5432 \\
        .venv/bin/python bench/rollout.py [--flips 100] [--replicas 2]

Clustered (PG_URL + REDIS_URL): a fresh `mmc_bench` database, two `mmc-serve --registry` replicas
notified over Redis. Without them: a temporary SQLite file, and replicas only poll (the embedded
product runs serving in the console process; separate replicas need Redis to hear at once).
The flips cycle canary 10 % -> weight 50 % -> promote, through the same services the API calls;
a separate load process keeps 8 clients posting unpinned /infer to both replicas throughout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(urls: list[str], seconds: float, threads: int) -> None:
    """Child mode: post unpinned requests until told to stop; print counts as JSON."""
    import httpx

    ok, failed, errors = [0], [0], []
    stop = threading.Event()

    def loop(url: str) -> None:
        with httpx.Client(base_url=url, timeout=10) as http:
            while not stop.is_set():
                try:
                    r = http.post("/v2/models/bench/infer", json=BODY)
                    if r.status_code == 200:
                        ok[0] += 1
                        continue
                    errors.append(f"{r.status_code} {r.text[:100]}")
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))
                failed[0] += 1

    workers = [threading.Thread(target=loop, args=(urls[i % len(urls)],))
               for i in range(threads)]
    for w in workers:
        w.start()
    try:
        sys.stdin.read()  # the parent closes stdin to stop us
    finally:
        stop.set()
        for w in workers:
            w.join()
    print(json.dumps({"ok": ok[0], "failed": failed[0], "errors": errors[:5]}))


def setup_environment(data_dir: str) -> str:
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key")
    os.environ["MMC_DATA_DIR"] = data_dir
    os.environ["MMC_WARM_GRACE_SECONDS"] = "3600"
    os.environ["MMC_ROLLOUT_TICK_SECONDS"] = "0"
    pg = os.environ.get("PG_URL")
    if pg and os.environ.get("REDIS_URL"):
        import psycopg

        with psycopg.connect(pg.rstrip("/") + "/postgres", autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS mmc_bench WITH (FORCE)")
            conn.execute("CREATE DATABASE mmc_bench")
        os.environ["DATABASE_URL"] = pg.rstrip("/") + "/mmc_bench"
        return "clustered (PostgreSQL + Redis pub/sub)"
    os.environ.pop("REDIS_URL", None)
    os.environ["DATABASE_URL"] = f"sqlite:///{data_dir}/bench.sqlite3"
    return "SQLite, replicas polling"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--flips", type=int, default=100)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--load", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.load:
        load(a.load.split(","), 0, a.clients)
        return 0

    data_dir = tempfile.mkdtemp(prefix="mmc-bench-rollout-")
    mode = setup_environment(data_dir)
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from django.core.management import call_command

    from registry import samples, services
    from registry.audit import Actor
    from registry.models import ReplicaHeartbeat
    from registry.store.artifacts import default_store
    from registry.validation import validate_version

    call_command("migrate", verbosity=0)
    me = Actor.system("bench")
    services.model_create(name="bench", actor=me)
    for seed in (1, 2):
        writer = default_store().writer()
        writer.write(samples.mlp(seed=seed))
        version, _ = services.version_upload(model_name="bench", blob=writer.finish(), actor=me)
        assert validate_version(version.pk) == "ready"
    services.endpoint_deploy(model_name="bench", version_number=1, actor=me)

    env = {**os.environ, "PYTHONPATH": str(REPO), "MMC_HEARTBEAT_SECONDS": "2"}
    procs, urls = [], []
    for i in range(a.replicas):
        port = free_port()
        urls.append(f"http://127.0.0.1:{port}")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "--registry", "--port", str(port),
             "--replica", f"bench-{i + 1}"], cwd=REPO, env=env,
            stdout=open(Path(data_dir) / f"replica-{i + 1}.log", "wb"), stderr=subprocess.STDOUT))
    loader = None
    try:
        for url in urls:
            deadline = time.time() + 60
            while True:
                try:
                    if httpx.post(f"{url}/v2/models/bench/infer", json=BODY).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"{url} never served; see {data_dir}")
                time.sleep(0.1)
        loader = subprocess.Popen([sys.executable, __file__, "--load", ",".join(urls),
                                   "--clients", str(a.clients)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        names = [f"bench-{i + 1}" for i in range(a.replicas)]
        stable, times = 1, []
        for flip in range(a.flips):
            other = 2 if stable == 1 else 1
            step = flip % 3
            t0 = time.perf_counter()
            if step == 0:
                ep = services.canary_start(model_name="bench", version_number=other, weight=10,
                                           actor=me)
            elif step == 1:
                ep = services.canary_weight(model_name="bench", weight=50, actor=me)
            else:
                ep = services.canary_promote(model_name="bench", actor=me)
                stable = other
            while ReplicaHeartbeat.objects.filter(replica__in=names,
                                                  revision__gte=ep.revision).count() < len(names):
                time.sleep(0.002)
            times.append(time.perf_counter() - t0)
        time.sleep(0.5)
        out, _ = loader.communicate("", timeout=60)
        counts = json.loads(out)
    finally:
        if loader and loader.poll() is None:
            loader.kill()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)

    times_ms = sorted(t * 1000 for t in times)
    p99 = times_ms[min(len(times_ms) - 1, int(0.99 * len(times_ms)))]
    print(f"\nRollout convergence, {a.replicas} replicas, {mode}, {a.clients} clients of load\n")
    print("| flips | p50 ms | p99 ms | max ms | requests ok | failed (target 0) |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {len(times_ms)} | {statistics.median(times_ms):.1f} | {p99:.1f} | "
          f"{times_ms[-1]:.1f} | {counts['ok']} | {counts['failed']} |")
    if counts["errors"]:
        print("\nfirst failures:", *counts["errors"], sep="\n  ")
    print(f"\ntarget p99 < 1000 ms: {'met' if p99 < 1000 else 'NOT met'}")
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
