#!/usr/bin/env python3
"""What the front door costs and what a second replica buys, in one run: wrk straight to one
replica, through HAProxy (deploy/haproxy.cfg, rendered for loopback by tests/frontdoor.py) to the
same replica, and through it to two replicas.

    .venv/bin/python bench/frontdoor.py [--duration 10] [--scenarios mlp-json-c32,conv-bin-c8]
                                        [--replica-cpus 0] [--wrk-cpus 1] [--proxy-cpus 1]

Replicas are `mmc-serve --model-repository` (bench/serving.py's "ours": max batch 32 / 8, queue
delay 0, onnxruntime intra-op threads --ort-threads); the models, request bodies, the by-hand
check of one answer per run and wrk (bench/wrk/*.lua) are bench/serving.py's. Runs are
interleaved round by round and the table keeps each row's best round. With the default pinning
(replicas on CPU 0, wrk and HAProxy on CPU 1) the direct row is one replica on one core: the
per-core figure docs/scaling.md quotes; the two-replica row then shares that core, so it shows
the proxy's cost, not scaling (give --replica-cpus '' to let them spread). Writes the table to
bench/results/frontdoor-latest.md; exit status 1 on any non-2xx answer or socket error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.frontdoor import missing, render  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_serving", REPO / "bench" / "serving.py")
bs = sys.modules["bench_serving"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs)

RESULTS = REPO / "bench" / "results" / "frontdoor-latest.md"
ROWS = ["direct, 1 replica", "HAProxy, 1 replica", "HAProxy, 2 replicas"]


class Proxy:
    """haproxy -db on a free port with the rendered config; `url(path)` as bench_serving wants."""

    def __init__(self, name: str, work: Path, servers: dict[str, str], cpus: str | None):
        self.name, self.port = name, bs.free_port()
        folder = work / name.replace(" ", "").replace(",", "-")
        folder.mkdir()
        config = folder / "haproxy.cfg"
        config.write_text(render(servers, port=self.port, stats_port=bs.free_port()))
        cmd = (["taskset", "-c", cpus] if cpus else []) + ["haproxy", "-db", "-f", str(config)]
        self.log = folder / "haproxy.log"
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        self.wait_ready()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, timeout: float = 30) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise bs.ServerFailed(f"haproxy exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url("/v2/health/ready"), timeout=2) as r:
                    if r.status == 200:
                        time.sleep(1.5)  # every server past `rise 2` checks, not just one
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise bs.ServerFailed(f"haproxy not ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default="mlp-json-c32",
                   help=f"comma list of {','.join(bs.SCENARIOS)} (default: mlp-json-c32)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; best kept")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of wrk before each run")
    p.add_argument("--replica-cpus", default="0", help="taskset CPUs for replicas ('' = none)")
    p.add_argument("--proxy-cpus", default="1", help="taskset CPUs for HAProxy ('' = none)")
    p.add_argument("--wrk-cpus", default="1", help="taskset CPUs for wrk ('' = none)")
    p.add_argument("--ort-threads", type=int, default=1)
    p.add_argument("--output", default=str(RESULTS))
    a = p.parse_args(argv)
    a.scenarios = [bs.SCENARIOS[s.strip()] for s in a.scenarios.split(",") if s.strip()]
    return a


def fmt(res: dict | str, base: dict | str | None) -> str:
    if isinstance(res, str):
        return f"| {res} | | | | |"
    ratio = (f"{res['rps'] / base['rps']:.2f}×" if isinstance(base, dict) and base["rps"]
             else "")
    bad = res["non2xx"] + res["connect_err"] + res["read_err"] + res["write_err"] + \
        res["timeout_err"]
    return (f"| {res['rps']:,.0f} | {ratio} | {res['p50_us'] / 1000:.2f} | "
            f"{res['p99_us'] / 1000:.2f} | {bad} |")


def main() -> int:
    args = parse_args(sys.argv[1:])
    if missing():
        sys.exit(missing())
    watch = bs.CpuWatch()
    results: dict[tuple[str, str], dict | str] = {}
    rounds: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="mmc-frontdoor-") as tmp:
        work = Path(tmp)
        models = bs.build_models(work)
        reqs = bs.make_requests(work, models)
        replicas, proxies = [], []
        try:
            for name in ("a", "b"):
                (work / name).mkdir()
                port = bs.free_port()
                launch = bs.setup_ours(work / name, models, port, args.ort_threads)
                replicas.append(bs.Running(f"replica-{name}", launch, port, work / name,
                                           args.replica_cpus or None))
            addr = [f"127.0.0.1:{r.port}" for r in replicas]
            proxies = [Proxy(ROWS[1], work, {"a": addr[0]}, args.proxy_cpus or None),
                       Proxy(ROWS[2], work, {"a": addr[0], "b": addr[1]},
                             args.proxy_cpus or None)]
            targets = dict(zip(ROWS, [replicas[0], *proxies], strict=True))
            for rnd in range(args.rounds):
                for sc in args.scenarios:
                    req = reqs[(sc.model, sc.binary)]
                    for row, target in targets.items():
                        bs.check_by_hand(target, sc, req)
                        url = target.url(f"/v2/models/{sc.model}/infer")
                        if args.warmup:
                            bs.run_wrk(url, sc, req, args.warmup, args.wrk_cpus or None)
                        res = bs.run_wrk(url, sc, req, args.duration, args.wrk_cpus or None)
                        print(f"[round {rnd + 1}] {sc.name} {row}: {res['rps']:,.0f} req/s, "
                              f"p99 {res['p99_us'] / 1000:.2f} ms", flush=True)
                        rounds.setdefault((sc.name, row), []).append(res["rps"])
                        best = results.get((sc.name, row))
                        if not isinstance(best, dict) or res["rps"] > best["rps"]:
                            results[(sc.name, row)] = res
        finally:
            for p in proxies:
                p.stop()
            for r in replicas:
                r.stop()
    haproxy = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout
    lines = [
        f"# Front door: HAProxy in front of serving replicas ({dt.date.today()})", "",
        f"Machine: {bs.machine()}. {watch.report()}.", "",
        f"HAProxy {haproxy.split()[2]} (Debian), deploy/haproxy.cfg; replicas `mmc-serve "
        f"--model-repository` pinned to CPUs `{args.replica_cpus or 'none'}`, HAProxy to "
        f"`{args.proxy_cpus or 'none'}`, wrk (-t1) to `{args.wrk_cpus or 'none'}`; onnxruntime "
        f"intra-op threads {args.ort_threads}; {args.duration:g} s per run after "
        f"{args.warmup:g} s warm-up, best of {args.rounds} interleaved rounds.", "",
        "| scenario | path | req/s (best) | vs direct | p50 ms | p99 ms | failed | "
        "req/s, every round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    failed = False
    for sc in args.scenarios:
        base = results.get((sc.name, ROWS[0]))
        for row in ROWS:
            res = results.get((sc.name, row), "not run")
            if isinstance(res, dict) and (res["non2xx"] or res["connect_err"] or res["read_err"]
                                          or res["write_err"] or res["timeout_err"]):
                failed = True
            every = ", ".join(f"{v:,.0f}" for v in rounds.get((sc.name, row), []))
            lines.append(f"| {sc.title} | {row} " + fmt(res, base) + f" {every} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    Path(args.output).write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
