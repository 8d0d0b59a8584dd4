#!/usr/bin/env python3
"""What tracing costs a replica: MLP 1×64 v2 JSON at c=32 (wrk), interleaved rounds against
`mmc-serve --workers 1` with tracing off, with tracing on at its default rate (one inference in
1000) and at 100 % (MMC_TRACE_RATE=1), spans going to an OTLP/HTTP sink in another process that
answers 200 and keeps nothing, and, with --before DIR, the same command from another checkout (the
tree before a change).

    .venv/bin/python bench/tracing.py [--before DIR] [--duration 5] [--rounds 3]

Servers on --server-cpus (default CPU 0), wrk and the sink on --wrk-cpus (CPU 1). Each row: the
best round's req/s, and the server's CPU per request (user + system of its process over the
answers, median of the rounds; the figure neighbours disturb least), with ratios to `off`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
PY = REPO / ".venv" / "bin" / "python"
WRK_SCRIPT = REPO / "bench" / "wrk" / "json.lua"
TICK = os.sysconf("SC_CLK_TCK")
SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts += 1
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def do_GET(self):
        body = str(self.server.posts).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H); s.posts = 0; s.serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def pinned(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


class Server:
    def __init__(self, name: str, checkout: Path, repo: Path, cpus: str, env: dict) -> None:
        self.name, self.port = name, free_port()
        full = {**os.environ, "PYTHONPATH": str(checkout), "MMC_ORT_INTRA_OP_THREADS": "1",
                "OMP_NUM_THREADS": "1", **env}
        self.log = repo.parent / f"{name}.log"
        self.proc = subprocess.Popen(
            [*pinned(cpus), str(PY), "-m", "serving.cli", "--model-repository", str(repo),
             "--port", str(self.port), "--workers", "1"],
            cwd=checkout, env=full, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        for _ in range(600):
            try:
                if httpx.get(f"{self.url}/v2/health/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        sys.exit(f"{self.name} never ready:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def wrk(url: str, body: Path, seconds: float, connections: int, cpus: str) -> dict:
    out = subprocess.run(
        [*pinned(cpus), "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
         "--latency", "-s", str(WRK_SCRIPT), f"{url}/v2/models/mlp/infer"],
        env={**os.environ, "BENCH_BODY": str(body)}, capture_output=True, text=True, check=True)
    return json.loads(re.search(r"BENCH_RESULT (\{.*\})", out.stdout)[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="", help="another checkout to run as server 'before'")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--wrk-cpus", default="1")
    args = p.parse_args()

    sys.path.insert(0, str(REPO))
    from registry import samples

    work = Path(tempfile.mkdtemp(prefix="mmc-bench-tracing-"))
    repo = work / "models"
    (repo / "mlp" / "1").mkdir(parents=True)
    (repo / "mlp" / "1" / "model.onnx").write_bytes(samples.mlp())
    (repo / "mlp" / "config.json").write_text('{"max_batch_size": 32, "max_queue_delay_us": 0}')
    body = work / "mlp.json"
    body.write_text(json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                                            "data": [round(0.01 * i, 3) for i in range(64)]}],
                                "outputs": [{"name": "y"}]}))
    sink_port = free_port()
    sink = subprocess.Popen([*pinned(args.wrk_cpus), sys.executable, "-c", SINK, str(sink_port)])
    servers = []
    if args.before:
        servers.append(Server("before", Path(args.before).resolve(), repo, args.server_cpus, {}))
    servers.append(Server("off", REPO, repo, args.server_cpus, {}))
    for name, rate in (("on-0.1%", "1000"), ("on-100%", "1")):
        servers.append(Server(name, REPO, repo, args.server_cpus, {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
            "MMC_TRACE_RATE": rate, "OTEL_SERVICE_NAME": "bench"}))
    results: dict[str, list[tuple[float, float, float]]] = {s.name: [] for s in servers}
    try:
        for s in servers:
            s.wait_ready()
            wrk(s.url, body, 2, args.connections, args.wrk_cpus)  # warm-up
        for _ in range(args.rounds):
            for s in servers:
                before = cpu_seconds(s.proc.pid)
                r = wrk(s.url, body, args.duration, args.connections, args.wrk_cpus)
                used = cpu_seconds(s.proc.pid) - before
                assert r["non2xx"] == 0 and r["read_err"] == 0, (s.name, r)
                results[s.name].append((r["rps"], used / r["requests"] * 1e6, r["p99_us"]))
        exported = httpx.get(f"http://127.0.0.1:{sink_port}/").text
    finally:
        for s in servers:
            s.stop()
        sink.terminate()
    base = results["off"]
    best_off = max(r[0] for r in base)
    cpu_off = statistics.median(r[1] for r in base)
    print(f"MLP 1×64 JSON c={args.connections}, {args.rounds} rounds of {args.duration:g} s, "
          f"servers on CPU {args.server_cpus or 'any'}, wrk on CPU {args.wrk_cpus or 'any'}")
    print("| server | req/s (best) | vs off | CPU µs/request (median) | vs off | p99 µs |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        rps = max(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        p99 = statistics.median(r[2] for r in rows)
        print(f"| {name} | {rps:,.0f} | {rps / best_off:.3f} | {cpu:.1f} | {cpu / cpu_off:.3f} "
              f"| {p99:,.0f} |")
    print(f"\nOTLP exports the sink took: {exported}")
    print("rounds:", json.dumps({k: [[round(x, 1) for x in r] for r in v]
                                 for k, v in results.items()}))


if __name__ == "__main__":
    main()
