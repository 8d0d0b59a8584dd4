#!/usr/bin/env python3
"""Edge benchmark: issue 23's attacks on a gRPC port, side by side on three servers.

One command, from the repository root (re-runs itself with .venv/bin/python):

    python3 bench/edge.py [--only ours-grpcio,ours-fast,grpcio-ref] [--attacks a,b] [--quick]

What it does:
- builds the sample MLP and a Tile model (a 256-byte input asks for a 1 MiB answer) with the
  repo's `registry.samples` / `onnx.helper`, and starts, one at a time, on free loopback ports:
  `ours-grpcio`: `.venv/bin/mmc-serve --model-repository DIR --grpc-port P` with its default
  limits (serving.edge_limits.EdgeLimits) and MMC_GRPC_TRANSPORT=grpcio (grpcio's asyncio server);
  `ours-fast`: the same with MMC_GRPC_TRANSPORT=fast (our own HTTP/2 transport, the default);
  `grpcio-ref`: grpcio's asyncio server with a trivial generic unary servicer (an empty
  ModelInferResponse; 1 MiB of output for model `tile`), max_receive_message_length 64 MiB and
  grpcio's default options otherwise. Ours run one worker (MMC_SERVE_WORKERS=1), HTTP and gRPC
  in one event loop, as the reference is one process; nothing is pinned.
- runs each attack of tests/edge_attacks.py against each server's gRPC port, sized as the issue
  reported them but bounded in time, while healthy clients call: tritonclient.grpc ModelInfer on
  the MLP, and (ours) httpx POST /v2/models/mlp/infer, each in a loop;
- prints one markdown table (per attack and server: what the attacker saw, healthy calls
  completed and failed, the longest healthy call = the loop's stall as a client sees it, the
  server's RSS growth and CPU) and writes it to bench/results/edge-latest.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUR_PY = REPO / ".venv" / "bin" / "python"
OUR_SERVE = REPO / ".venv" / "bin" / "mmc-serve"
RESULTS = REPO / "bench" / "results" / "edge-latest.md"
SERVERS = ("ours-grpcio", "ours-fast", "grpcio-ref")

if Path(sys.prefix).resolve() != (REPO / ".venv").resolve() and OUR_PY.exists():
    os.execv(OUR_PY, [str(OUR_PY), __file__, *sys.argv[1:]])
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from tests import edge_attacks as ea  # noqa: E402

MIB = ea.MIB
REFERENCE = textwrap.dedent('''
    import asyncio, sys
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    EMPTY = pb.ModelInferResponse().SerializeToString()
    BIG = pb.ModelInferResponse(model_name="tile", raw_output_contents=[bytes(1 << 20)])
    BIG = BIG.SerializeToString()

    async def infer(request, context):
        return BIG if pb.ModelInferRequest.FromString(request).model_name == "tile" else EMPTY

    class Generic(grpc.GenericRpcHandler):
        def service(self, details):
            return grpc.unary_unary_rpc_method_handler(infer)

    async def main():
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        server.add_generic_rpc_handlers([Generic()])
        server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())
''')


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_repository(work: Path) -> Path:
    from registry import samples

    root = work / "models"
    for name, data in (("mlp", samples.mlp()), ("tile", ea.tile_model())):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(data)
        (root / name / "config.json").write_text(json.dumps({"max_batch_size": 8}))
    return root


class Server:
    """One server process on free loopback ports: `grpc_port`, and `http_url` for ours."""

    def __init__(self, name: str, repository: Path, work: Path) -> None:
        self.name = name
        self.grpc_port = free_port()
        self.http_url = None
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MMC_ORT_INTRA_OP_THREADS": "1",
               "MMC_SERVE_WORKERS": "1"}
        env = {k: v for k, v in env.items() if not k.startswith("MMC_") or k in (
            "MMC_SERVE_WORKERS", "MMC_ORT_INTRA_OP_THREADS")}  # default limits, not the shell's
        if name == "grpcio-ref":
            cmd = [str(OUR_PY), "-c", REFERENCE, str(self.grpc_port)]
        else:
            port = free_port()
            self.http_url = f"http://127.0.0.1:{port}"
            env["MMC_GRPC_TRANSPORT"] = "fast" if name == "ours-fast" else "grpcio"
            cmd = [str(OUR_SERVE), "--model-repository", str(repository), "--host", "127.0.0.1",
                   "--port", str(port), "--grpc-port", str(self.grpc_port)]
        self.logfile = work / f"{name}.log"
        self.fh = open(self.logfile, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=work)
        deadline = time.monotonic() + 60
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"{name} did not start: {self.logfile.read_text()[-2000:]}")
            time.sleep(0.25)

    def ready(self) -> bool:
        try:
            if self.http_url:
                return httpx.get(f"{self.http_url}/v2/health/ready", timeout=1).status_code == 200
            return b"ready" in self.logfile.read_bytes()
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.fh.close()


def attacks(quick: bool) -> dict:
    """name -> (what it is, attack(server)); sized as issue 23 reported them, time-bounded."""
    q = 0.25 if quick else 1.0
    crowd = 300
    # past each port's share of the default budget of 2,048 (HTTP 1,536, gRPC 512) by 200
    grpc_flood, http_flood = 512 + 200, 1536 + 200
    return {
        "declared-length": ("32 streams declaring 64 MiB each, 26 bytes sent, held 3 s",
                            lambda s: ea.declared_length_streams(s.grpc_port, streams=32,
                                                                 declared=64 * MIB, hold_s=3)),
        "gzip-bomb": ("one 1 MiB gzip message inflating to 1 GiB",
                      lambda s: ea.compression_bomb(s.grpc_port, inflated=1 << 30, wait_s=15)),
        "idle-crowd": (f"{crowd} silent + {crowd} preface-only connections, held 12 s",
                       lambda s: _crowd(s, crowd, 12 * q)),
        "fd-flood": (f"{grpc_flood} silent connections to the gRPC port + {http_flood} to the "
                     "HTTP port (ours), held 5 s",
                     lambda s: ea.connection_crowd(_ports(s, grpc_flood, http_flood),
                                                   count=grpc_flood + http_flood * bool(
                                                       s.http_url), hold_s=5 * q)),
        "big-settings": ("1,000 open streams, then one 1 MiB SETTINGS frame",
                         lambda s: ea.big_settings(s.grpc_port, open_streams=1000,
                                                   settings_bytes=MIB, wait_s=5)),
        "hpack-size-updates": ("a 10 MiB header block of HPACK size updates",
                               lambda s: ea.hpack_size_updates(s.grpc_port,
                                                               block_bytes=10 * MIB)),
        "big-header-block": ("one 10 MiB metadata value (HEADERS + CONTINUATION)",
                             lambda s: ea.oversized_header_block(s.grpc_port,
                                                                 block_bytes=10 * MIB)),
        "continuation-flood": ("1 M empty CONTINUATION frames (≤ 8 s)",
                               lambda s: ea.continuation_flood(s.grpc_port, frames=1_000_000,
                                                               time_s=8 * q)),
        "rapid-reset": ("400 k HEADERS + RST_STREAM (≤ 8 s)",
                        lambda s: ea.rapid_reset(s.grpc_port, streams=400_000, time_s=8 * q)),
        "ping-flood": ("255 MB of PINGs from a client that never reads (≤ 8 s)",
                       lambda s: ea.ping_flood(s.grpc_port, max_bytes=255 * 10**6,
                                               time_s=8 * q)),
        "window-zero": ("4 connections × 64 calls for 1 MiB answers, window 0, held 4 s",
                        lambda s: ea.window_zero(s.grpc_port, model="tile", calls=64,
                                                 connections=4, hold_s=4)),
        "oversend": ("a call declaring a 10-byte message, then up to 512 MiB (≤ 8 s)",
                     lambda s: ea.oversend(s.grpc_port, declared=10, max_bytes=512 * MIB,
                                           time_s=8 * q)),
        "bad-bin-metadata": ("`x-token-bin` not base64, then a good call on the connection",
                             lambda s: ea.bad_binary_metadata(s.grpc_port, model="mlp")),
    }


def _ports(server: Server, grpc_n: int, http_n: int) -> list[int]:
    """Ports to connect to, one entry per connection (connection_crowd takes them in turn)."""
    http = [int(server.http_url.rpartition(":")[2])] * http_n if server.http_url else []
    return [server.grpc_port] * grpc_n + http


def _crowd(server: Server, n: int, hold_s: float) -> ea.Seen:
    """Silent and preface-only connections at once (two threads), one Seen."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        silent = pool.submit(ea.connection_crowd, [server.grpc_port], count=n, hold_s=hold_s)
        preface = pool.submit(ea.connection_crowd, [server.grpc_port], count=n, preface=True,
                              hold_s=hold_s)
        a, b = silent.result(), preface.result()
    seen = ea.Seen(closed=a.closed and b.closed)
    seen.notes["closed by the server"] = (f"silent {a.notes['closed_by_server']}/{n}, preface-"
                                          f"only {b.notes['closed_by_server']}/{n} in {hold_s:g} s")
    return seen


def run_one(server: Server, attack) -> dict:
    with ea.HealthyClients(model="mlp", grpc_address=f"127.0.0.1:{server.grpc_port}",
                           http_url=server.http_url) as healthy:
        watch = ea.ProcessWatch(server.proc.pid)
        began = time.monotonic()
        try:
            seen = attack(server)
        except Exception as exc:  # noqa: BLE001 - the attacker's own failure is a result too
            seen = ea.Seen(notes={"attacker failed": f"{type(exc).__name__}: {exc}"[:80]})
        took = time.monotonic() - began
        time.sleep(max(0.0, 2.0 - took))  # healthy calls for at least 2 s
    watch.stop()
    rss, fds = watch.settles(rss_within_mb=20, fds_within=4, timeout=5)
    return {"seen": seen, "grpc": healthy.grpc, "http": healthy.http if server.http_url else None,
            "took": took, "growth": watch.growth_mb, "cpu": watch.cpu_s,
            "after": rss - watch.start_rss, "fds": (watch.start_fds, watch.peak_fds, fds),
            "alive": server.proc.poll() is None}


def saw(seen: ea.Seen) -> str:
    seen.notes.pop("goaway_debug", None)
    if "grpc-message" in seen.notes:
        seen.notes["grpc-message"] = f"“{seen.notes['grpc-message'][:48]}”"
    return seen.summary()


def render(args, results: dict, names: dict) -> str:
    lines = [
        "# Edge benchmark (bench/edge.py)", "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
        f"{platform.python_version()}, grpcio {_version('grpcio')}; nothing pinned",
        "- servers: `ours-grpcio` = mmc-serve, default limits, MMC_GRPC_TRANSPORT=grpcio (grpcio "
        "asyncio server); `ours-fast` = the same with MMC_GRPC_TRANSPORT=fast (the default); "
        "`grpcio-ref` = "
        "grpcio's asyncio server, trivial generic servicer, max_receive_message_length 64 MiB, "
        "default options. Ours with one worker (HTTP and gRPC in one loop).",
        "- healthy clients, during each attack (≥ 2 s): tritonclient.grpc ModelInfer on the MLP "
        "and (ours) httpx POST /v2/models/mlp/infer, each one call at a time in a loop. "
        "**stall** = the longest single healthy call.",
        "- RSS growth = peak during the attack − start; after = RSS 5 s after (or once back "
        "within 20 MB) − start; CPU = the server's user + system seconds during the attack.",
        "", "| attack | server | attacker saw | healthy gRPC | healthy HTTP | stall s | "
        "RSS growth MB | RSS after MB | CPU s |", "|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    for attack, per_server in results.items():
        for name, r in per_server.items():
            http = r["http"].summary() if r["http"] is not None else "–"
            stall = max(r["grpc"].longest_s, r["http"].longest_s if r["http"] else 0.0)
            dead = "" if r["alive"] else " **(server died)**"
            lines.append(f"| {attack} | {name} | {saw(r['seen'])}{dead} | {r['grpc'].summary()} "
                         f"| {http} | {stall:.2f} | {r['growth']:+.0f} | {r['after']:+.0f} | "
                         f"{r['cpu']:.1f} |")
    lines += ["", "Attacks:", ""]
    lines += [f"- **{name}**: {what}" for name, what in names.items()]
    lines.append("")
    return "\n".join(lines)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(SERVERS), help="servers, comma-separated")
    p.add_argument("--attacks", default="", help="attacks to run (default: all)")
    p.add_argument("--quick", action="store_true", help="shorter holds and floods (a smoke run)")
    p.add_argument("--output", default=str(RESULTS), help="markdown file to write")
    args = p.parse_args()
    table = attacks(args.quick)
    chosen = [a for a in args.attacks.split(",") if a] or list(table)
    servers = [s for s in args.only.split(",") if s]
    for name in [*chosen, *servers]:
        if name not in table and name not in SERVERS:
            sys.exit(f"unknown attack or server: {name}")
    results: dict[str, dict] = {a: {} for a in chosen}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mmc-edge-") as tmp:
        work = Path(tmp)
        repository = build_repository(work)
        ea.gzip_bomb(1 << 30)  # built once, before any server's clock runs
        for name in servers:
            server = Server(name, repository, work)
            try:
                for attack in chosen:
                    if server.proc.poll() is not None:  # an earlier attack took it down
                        server.stop()
                        server = Server(name, repository, work)
                    log(f"[{name}] {attack}")
                    results[attack][name] = run_one(server, table[attack][1])
                    time.sleep(0.5)
            finally:
                server.stop()
    report = render(args, results, {a: table[a][0] for a in chosen})
    report += f"\nWhole run: {time.monotonic() - began:.0f} s.\n"
    print(report)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    log(f"[bench] written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
