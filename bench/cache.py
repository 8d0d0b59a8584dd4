"""Response cache: what a hit saves, as ratios measured in one run against peers on one server.

    .venv/bin/python bench/cache.py [--requests 1000] [--pin]

Each model is served twice: `<m>-cached` with `"response_cache": true` and `<m>-plain` without.
One request at a time (c=1), interleaved round after round:
  hit   the same inputs to <m>-cached (answered from the cache after the first);
  miss  new inputs every time to <m>-cached (hashing, lookup, model run, insertion);
  plain the same inputs to <m>-plain (no cache at all: the peer).
Reported: p50 (and p99) of each, and the ratios hit/plain (what a hit costs against running the
model) and miss/plain (what the cache adds to a request it cannot answer), twice:
  in process  DataPlane.infer on a decoded request (the server's own work, no HTTP, no client);
  over HTTP   a keep-alive httpx client against one `mmc-serve --model-repository` process;
and, in process, the mean CPU time per request (every thread): on a shared machine wall-clock
medians move with the neighbours, CPU time much less.
Models: the MLP (1x64, JSON; the model is ~25 us, so everything else dominates), `busy` (1x64,
JSON; ~2 ms of compute) and the conv net (1x3x224x224, binary tensors; 600 KB of input to
hash). With --pin the server runs on CPU 0 and the client on CPU 1.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from registry import samples  # noqa: E402

MODELS = [("mlp", samples.mlp(seed=0), 8), ("busy", samples.busy(seed=0), 8),
          ("conv", samples.conv_net(seed=0), 8)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def repository(root: Path) -> None:
    for name, data, batch in MODELS:
        for suffix, cached in (("cached", True), ("plain", False)):
            folder = root / f"{name}-{suffix}"
            (folder / "1").mkdir(parents=True)
            (folder / "1" / "model.onnx").write_bytes(data)
            (folder / "config.json").write_text(json.dumps(
                {"max_batch_size": batch, "response_cache": cached}))


def start(root: Path, pin: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "MMC_ORT_INTRA_OP_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MMC_RESPONSE_CACHE_BYTES": str(256 << 20), "LOG_LEVEL": "WARNING"}
    cmd = [str(Path(sys.executable).with_name("mmc-serve")), "--model-repository", str(root),
           "--host", "127.0.0.1", "--port", str(port), "--replica", "bench-cache"]
    if pin:
        cmd = ["taskset", "-c", "0", *cmd]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("mmc-serve did not become ready")


def json_body(x: np.ndarray) -> tuple[bytes, dict]:
    return orjson.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                     "data": x.ravel().tolist()}]}), {
        "Content-Type": "application/json"}


def binary_body(x: np.ndarray) -> tuple[bytes, dict]:
    raw = x.astype("<f4").tobytes()
    header = orjson.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "parameters": {"binary_data_size": len(raw)}}],
                           "parameters": {"binary_data_output": True}})
    return header + raw, {"Inference-Header-Content-Length": str(len(header)),
                          "Content-Type": "application/octet-stream"}


class InProcess:
    """The same repository served by a DataPlane in this process; `post` mimics httpx's."""

    def __init__(self, root: Path) -> None:
        import asyncio

        from registry.signatures import read_signature
        from serving.core.dataplane import DataPlane
        from serving.core.reconciler import Reconciler
        from serving.sources.repository import RepositorySource

        self.loop = asyncio.new_event_loop()
        self.dataplane = DataPlane(replica="bench", response_cache_bytes=256 << 20)
        self.reconciler = Reconciler(RepositorySource(root, read_signature=read_signature),
                                     self.dataplane, intra_op_threads=1)
        self.loop.run_until_complete(self.reconciler.reconcile())

    def post(self, path: str, content: bytes, headers: dict):
        from serving.http.codec import decode_infer_request

        model = path.split("/")[-2]
        hlen = headers.get("Inference-Header-Content-Length")
        request = decode_infer_request(content, header_length=int(hlen) if hlen else None)
        self.loop.run_until_complete(self.dataplane.predict(model, None, request))
        return httpx.Response(200)

    def get(self, path: str):
        model = path.split("/")[-2]
        return httpx.Response(200, json=self.dataplane.model_stats(model, None))

    def close(self) -> None:
        self.loop.run_until_complete(self.reconciler.stop())
        self.loop.close()


def measure(client, url: str, model: str, shape: tuple, encode, n: int) -> dict:
    rng = np.random.default_rng(1)
    same = rng.standard_normal(shape, dtype=np.float32)
    same_body = encode(same)
    times: dict[str, list[float]] = {"hit": [], "miss": [], "plain": []}
    cpu_times: dict[str, list[float]] = {"hit": [], "miss": [], "plain": []}
    for i in range(n + 20):  # 20 rounds of warm-up, not counted
        for kind in ("hit", "miss", "plain"):
            target = f"{model}-plain" if kind == "plain" else f"{model}-cached"
            body, headers = same_body
            if kind == "miss":  # inputs never sent before (encoded before the clock starts)
                body, headers = encode(rng.standard_normal(shape, dtype=np.float32))
            started, cpu = time.perf_counter(), time.process_time()
            r = client.post(f"{url}/v2/models/{target}/infer", content=body, headers=headers)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            if r.status_code != 200:
                raise SystemExit(f"{target}: {r.status_code} {r.text[:300]}")
            if i >= 20:
                times[kind].append(elapsed)
                cpu_times[kind].append(cpu)
    stats = client.get(f"{url}/v2/models/{model}-cached/stats").json()["model_stats"][0]
    counts = stats["inference_stats"]
    out = {k: {"p50_ms": float(np.percentile(v, 50)) * 1e3,
               "p99_ms": float(np.percentile(v, 99)) * 1e3} for k, v in times.items()}
    for k, v in cpu_times.items():  # this process's CPU, all threads: in process, the server's
        out[k]["cpu_ms"] = float(np.mean(v)) * 1e3
    out["hits"], out["misses"] = counts["cache_hit"]["count"], counts["cache_miss"]["count"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000, help="per kind and model")
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, client on CPU 1")
    args = parser.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {1})
    cases = [("mlp", "mlp (JSON)", (1, 64), json_body, args.requests),
             ("busy", "busy (JSON)", (1, 64), json_body, max(50, args.requests // 4)),
             ("conv", "conv (binary)", (1, 3, 224, 224), binary_body,
              max(50, args.requests // 4))]
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        repository(root)
        local = InProcess(root)
        try:
            tables["in process"] = {label: measure(local, "", m, shape, enc, n)
                                    for m, label, shape, enc, n in cases}
        finally:
            local.close()
        proc, url = start(root, args.pin)
        try:
            with httpx.Client(timeout=30) as client:
                tables["over HTTP"] = {label: measure(client, url, m, shape, enc, n)
                                       for m, label, shape, enc, n in cases}
        finally:
            proc.terminate()
            proc.wait(10)
    print(f"response cache, c=1, {'pinned' if args.pin else 'unpinned'}, "
          f"{time.strftime('%Y-%m-%d')}")
    print("| path | model | hit p50 (p99) | miss p50 (p99) | no cache p50 (p99) "
          "| hit / no cache | miss / no cache | hits, misses |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for path, results in tables.items():
        for name, r in results.items():
            def cell(k: str, r: dict = r) -> str:
                return f"{r[k]['p50_ms']:.3f} ms ({r[k]['p99_ms']:.2f})"

            print(f"| {path} | {name} | {cell('hit')} | {cell('miss')} | {cell('plain')} | "
                  f"{r['hit']['p50_ms'] / r['plain']['p50_ms']:.2f}× | "
                  f"{r['miss']['p50_ms'] / r['plain']['p50_ms']:.2f}× | "
                  f"{r['hits']}, {r['misses']} |")
    local_cpu = tables["in process"]
    print("\nin process, CPU time per request (mean, every thread of the process: the server's "
          "work, whatever else the machine runs)")
    print("| model | hit | miss | no cache | hit / no cache | miss / no cache |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in local_cpu.items():
        hit, miss, plain = (r[k]["cpu_ms"] for k in ("hit", "miss", "plain"))
        print(f"| {name} | {hit:.3f} ms | {miss:.3f} ms | {plain:.3f} ms | "
              f"{hit / plain:.2f}× | {miss / plain:.2f}× |")


if __name__ == "__main__":
    main()
