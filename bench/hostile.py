#!/usr/bin/env python3
"""Hostile-clients benchmark: normal clients beside a slow-loris crowd and stalled uploads.

One command, from the repository root (any Python >= 3.11, standard library only):

    python3 bench/hostile.py [--duration 10] [--slow-headers 200] [--stalled 5] [--before DIR]

What it does:
- builds the sample MLP with the repo's own `registry.samples` (via .venv) and starts
  `.venv/bin/mmc-serve --model-repository DIR` on a free loopback port (default limits; pinned to
  CPU 0, wrk to CPU 1, like bench/serving.py);
- quiet: Debian `wrk -t1 -c16` posts the v2 JSON MLP request for --duration seconds;
- attack: --slow-headers connections send a request's headers one byte a second and reconnect
  when the server closes them, --stalled connections each send 60 MiB of a 64 MiB body and stall
  (again after any answer); once the uploads are in, the same wrk run again;
- after: the attackers stop starting anything new but keep what they hold open; after the
  header and body timeouts (+3 s) it reads the server's RSS and counts the attackers'
  connections the server still keeps open;
- prints one markdown table and writes it to bench/results/hostile-latest.md.

`--before DIR` runs the same sequence against mmc-serve from another checkout of this repo (e.g.
`git worktree add /tmp/before <rev>`), after ours, so the defect and the fix show in one report.
Exit status 1 when wrk sees a non-2xx answer or a socket error in any phase of ours.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
OUR_PY = REPO / ".venv" / "bin" / "python"
OUR_SERVE = REPO / ".venv" / "bin" / "mmc-serve"
RESULTS = BENCH / "results" / "hostile-latest.md"
MIB = 1 << 20
# what the server's default limits are (serving.edge_limits.EdgeLimits); read from the environment
# like the server does, so a run with other MMC_* settings waits long enough
HEADER_TIMEOUT_S = float(os.environ.get("MMC_HEADER_TIMEOUT_S", 10))
BODY_IDLE_TIMEOUT_S = float(os.environ.get("MMC_BODY_IDLE_TIMEOUT_S", 10))


def log(msg: str) -> None:
    print(msg, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# The server under test and its memory
# --------------------------------------------------------------------------------------------

def build_repository(work: Path) -> Path:
    root = work / "models"
    (root / "mlp" / "1").mkdir(parents=True)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from registry.samples import mlp; "
            "open(sys.argv[2], 'wb').write(mlp())")
    subprocess.run([OUR_PY, "-c", code, REPO, root / "mlp" / "1" / "model.onnx"], check=True)
    (root / "mlp" / "config.json").write_text(
        json.dumps({"max_batch_size": 32, "max_queue_delay_us": 0}))
    rng = random.Random(0)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                                   "data": [round(rng.uniform(-1, 1), 3) for _ in range(64)]}]},
                      separators=(",", ":"))
    (work / "mlp.json.body").write_text(body)
    return root


class Server:
    def __init__(self, name: str, repository: Path, work: Path, cpus: str | None,
                 checkout: Path | None = None):
        self.name, self.port = name, free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MMC_ORT_INTRA_OP_THREADS": "1"}
        cmd = [str(OUR_SERVE)]
        if checkout:
            cmd = [str(OUR_PY), "-c", "from serving.cli import main; main()"]
            env["PYTHONPATH"] = str(checkout)
        cmd = (["taskset", "-c", cpus] if cpus else []) + cmd + [
            "--model-repository", str(repository), "--host", "127.0.0.1", "--port",
            str(self.port)]
        self.logfile = work / f"{name}.log"
        self.fh = open(self.logfile, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=work)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{name} exited: {self.logfile.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url("/v2/health/ready"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        sys.exit(f"{name} not ready: {self.logfile.read_text()[-2000:]}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.fh.close()


class PeakRss:
    """The server's RSS sampled every 50 ms on a thread, while a phase runs."""

    def __init__(self, server: Server):
        self.server, self.peak, self._stop = server, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.rss_mb())
            self._stop.wait(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_wrk(url: str, body: Path, seconds: float, conc: int, cpus: str | None) -> dict:
    env = {**os.environ, "BENCH_BODY": str(body)}
    cmd = (["taskset", "-c", cpus] if cpus else []) + [
        "wrk", "-t1", f"-c{conc}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
        "-s", str(BENCH / "wrk" / "json.lua"), url]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"^BENCH_RESULT (\{.*\})$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        sys.exit(f"wrk failed ({p.returncode}): {p.stdout[-800:]} {p.stderr[-800:]}")
    return json.loads(m.group(1))


# --------------------------------------------------------------------------------------------
# The attackers (asyncio, raw sockets, on a thread of their own)
# --------------------------------------------------------------------------------------------

class Attack:
    """Slow-header senders and stalled uploaders; `calm()` stops them starting anything new."""

    def __init__(self, port: int, slow_headers: int, stalled: int):
        self.port, self.n_slow, self.n_stalled = port, slow_headers, stalled
        self.active = True
        self.slow_closed: list[float] = []  # lifetimes of slow-header connections the server ended
        self.answers: dict[str, int] = {}  # stalled uploads: first word of what came back
        self.uploads_in = 0  # stalled uploads that got their 60 MiB in
        self.open: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._run(), self.loop)

    async def _run(self) -> None:
        await asyncio.gather(*[self._slow_header(i) for i in range(self.n_slow)],
                             *[self._stalled_upload() for _ in range(self.n_stalled)])

    async def _slow_header(self, i: int) -> None:
        await asyncio.sleep(i * 0.005)
        while self.active:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(1)
                continue
            self.open.add(writer)
            began = time.monotonic()
            head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
            try:
                for pos in range(1 << 30):
                    writer.write(head[pos:pos + 1] if pos < len(head) else b"a")
                    try:  # the one-second pause doubles as a watch for the server's answer
                        await asyncio.wait_for(reader.read(4096), 1.0)
                        break  # it answered or closed
                    except TimeoutError:
                        continue
            except OSError:
                pass
            self.slow_closed.append(time.monotonic() - began)
            self.open.discard(writer)
            writer.close()

    async def _stalled_upload(self) -> None:
        chunk = b" " * MIB
        while self.active:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(1)
                continue
            self.open.add(writer)
            writer.write(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % (64 * MIB))
            first = asyncio.ensure_future(reader.read(64))  # an answer may come mid-upload
            try:
                for _ in range(60):
                    if first.done():
                        break
                    writer.write(chunk)
                    await writer.drain()
                else:
                    self.uploads_in += 1
            except OSError:
                pass
            try:  # stalled: wait for whatever the server does
                data = await first
                answer = data.split(b" ")[1].decode() if data else "closed"
            except OSError:
                answer = "reset"
            self.answers[answer] = self.answers.get(answer, 0) + 1
            self.open.discard(writer)
            writer.close()
            if answer != "408":
                await asyncio.sleep(1)  # a 503's Retry-After; a reset: back off the same

    def calm(self) -> None:
        self.active = False

    def still_open(self) -> int:
        return len(self.open)

    def stop(self) -> None:
        self.active = False

        async def shutdown() -> None:
            for w in list(self.open):
                w.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


# --------------------------------------------------------------------------------------------

def measure(name: str, server: Server, body: Path, args) -> dict:
    url = server.url("/v2/models/mlp/infer")
    run_wrk(url, body, 2, args.conc, args.wrk_cpus or None)  # warm-up
    time.sleep(1)
    out = {"rss_start": server.rss_mb()}
    log(f"[{name}] quiet: wrk c={args.conc} for {args.duration:g} s "
        f"(RSS {out['rss_start']:.0f} MB)")
    out["quiet"] = run_wrk(url, body, args.duration, args.conc, args.wrk_cpus or None)
    peak = PeakRss(server)
    attack = Attack(server.port, args.slow_headers, args.stalled)
    deadline = time.monotonic() + 30
    while attack.uploads_in < min(args.stalled, 1) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    log(f"[{name}] attack: {args.slow_headers} slow-header connections, {args.stalled} stalled "
        f"64 MiB uploads ({attack.uploads_in} in); wrk c={args.conc} for {args.duration:g} s")
    out["attack"] = run_wrk(url, body, args.duration, args.conc, args.wrk_cpus or None)
    attack.calm()
    settle = HEADER_TIMEOUT_S + BODY_IDLE_TIMEOUT_S + 3
    log(f"[{name}] after: attackers hold what they have; waiting {settle:g} s")
    time.sleep(settle)
    out["rss_peak"] = peak.stop()
    out["rss_after"] = server.rss_mb()
    out["still_open"] = attack.still_open()
    out["slow_closed"] = sorted(attack.slow_closed)
    out["answers"] = dict(attack.answers)
    attack.stop()
    return out


def row(name: str, phase: str, w: dict | None, rss: str, note: str = "") -> str:
    if w is None:
        return f"| {name} | {phase} | | | | | {rss} | {note} |"
    bad = w["non2xx"] + w["connect_err"] + w["read_err"] + w["write_err"] + w["timeout_err"]
    return (f"| {name} | {phase} | {w['rps']:,.0f} | {w['p50_us'] / 1e3:.2f} | "
            f"{w['p99_us'] / 1e3:.2f} | {bad} | {rss} | {note} |")


def render(args, results: dict[str, dict], background: str) -> str:
    lines = [
        "# Hostile clients benchmark (bench/hostile.py)", "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}; {background}",
        f"- normal clients: wrk -t1 -c{args.conc}, v2 JSON MLP 1×64, {args.duration:g} s per "
        f"phase; server on CPU {args.server_cpus or '(any)'}, wrk on CPU "
        f"{args.wrk_cpus or '(any)'}, attackers unpinned",
        f"- attack: {args.slow_headers} connections sending headers one byte a second "
        f"(reconnecting when closed) + {args.stalled} uploads each sending 60 MiB of a 64 MiB "
        "body then stalling (again after any answer); server limits at their defaults",
        "", "| server | phase | req/s | p50 ms | p99 ms | errors | RSS MB | attackers |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        closed = r["slow_closed"]
        median = f"{closed[len(closed) // 2]:.1f} s" if closed else "–"
        answers = ", ".join(f"{k} ×{v}" for k, v in sorted(r["answers"].items())) or "none"
        lines += [
            row(name, "quiet", r["quiet"], f"{r['rss_start']:.0f} (start)"),
            row(name, "under attack", r["attack"], f"{r['rss_peak']:.0f} (peak)",
                f"slow-header connections closed by the server: {len(closed)} (median life "
                f"{median}); uploads answered: {answers}"),
            row(name, "after", None, f"{r['rss_after']:.0f} (after)",
                f"attacker connections still open: {r['still_open']}"),
        ]
    lines += ["", "| server | p99 under attack / quiet (target ≤ 2×) | RSS after − start "
              "(target ≤ 50 MB) |", "|---|---:|---:|"]
    for name, r in results.items():
        ratio = r["attack"]["p99_us"] / max(r["quiet"]["p99_us"], 1)
        grow = r["rss_after"] - r["rss_start"]
        lines.append(f"| {name} | {ratio:.2f}× {'✓' if ratio <= 2 else '✗'} | "
                     f"{grow:+.0f} MB {'✓' if grow <= 50 else '✗'} |")
    lines += ["", "errors = non-2xx answers + socket errors seen by wrk. \"after\" = "
              f"{HEADER_TIMEOUT_S + BODY_IDLE_TIMEOUT_S + 3:g} s after the attackers stopped "
              "starting new connections, with what they had still held open.", ""]
    return "\n".join(lines)


def background_cpu(t0: tuple[float, float], own0: float) -> str:
    f = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
    hz = os.sysconf("SC_CLK_TCK")
    total, busy = sum(f) / hz - t0[0], (sum(f) - f[3] - f[4]) / hz - t0[1]
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system - own0
    return f"other processes used {max(0.0, busy - own) / max(total, 1e-9):.0%} of the CPU"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=10.0, help="seconds of wrk per phase")
    p.add_argument("--conc", type=int, default=16, help="normal clients (wrk connections)")
    p.add_argument("--slow-headers", type=int, default=200)
    p.add_argument("--stalled", type=int, default=5)
    p.add_argument("--before", default="", help="another checkout of this repo to run after ours")
    p.add_argument("--server-cpus", default="0", help="taskset CPU list for the server")
    p.add_argument("--wrk-cpus", default="1", help="taskset CPU list for wrk")
    p.add_argument("--output", default=str(RESULTS), help="markdown file to write")
    args = p.parse_args()
    if not OUR_SERVE.exists():
        sys.exit(f"{OUR_SERVE} is missing")
    f = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
    hz = os.sysconf("SC_CLK_TCK")
    t0 = (sum(f) / hz, (sum(f) - f[3] - f[4]) / hz)
    t = os.times()
    own0 = t.user + t.system + t.children_user + t.children_system
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mmc-hostile-") as tmp:
        work = Path(tmp)
        repository = build_repository(work)
        body = work / "mlp.json.body"
        runs = [("ours", None)] + ([("before", Path(args.before))] if args.before else [])
        for name, checkout in runs:
            server = Server(name, repository, work, args.server_cpus or None, checkout)
            try:
                results[name] = measure(name, server, body, args)
            finally:
                server.stop()
    report = render(args, results, background_cpu(t0, own0))
    print()
    print(report)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    log(f"[bench] written to {out}")
    ours = results["ours"]
    return 1 if any(ours[ph]["non2xx"] + ours[ph]["connect_err"] + ours[ph]["read_err"]
                    + ours[ph]["write_err"] + ours[ph]["timeout_err"]
                    for ph in ("quiet", "attack")) else 0


if __name__ == "__main__":
    sys.exit(main())
