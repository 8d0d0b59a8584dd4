"""Scale to zero: what a cold start costs and what sleeping frees, on one `mmc-serve` replica.

    .venv/bin/python bench/scale_to_zero.py [--cycles 5] [--out 2048 4096] [--idle 1]

For each model size (an MLP 64 -> 4096 -> OUT, weights ~ 16 * OUT KiB), a model repository with
`scale_to_zero_after_seconds` = --idle; per cycle: wait until the replica reports the model
scaled to zero, read its resident memory (VmRSS), time the first request (the cold start, as a
client sees it) and the one after (warm), and read the replica's own `mmc_cold_start_last_seconds`.
Writes the table to stdout and bench/results/scale-to-zero-latest.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
MB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def wait_ready(http, timeout: float = 60) -> None:
    """Until the replica behind `http` (an httpx.Client) says ready; RuntimeError after
    `timeout` s."""
    import httpx

    deadline = time.time() + timeout
    while True:
        try:
            if http.get("/v2/health/ready").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            raise RuntimeError("mmc-serve did not become ready")
        time.sleep(0.1)


def asleep(http) -> bool:
    index = http.post("/v2/repository/index").json()
    return any("scaled to zero" in (e.get("reason") or "") for e in index)


def cold_start_metric(http) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("mmc_cold_start_last_seconds{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def run_size(out: int, cycles: int, idle: float) -> dict:
    import httpx

    from registry import samples

    with tempfile.TemporaryDirectory() as root:
        folder = Path(root) / "big" / "1"
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(samples.mlp(hidden=(4096,), n_out=out))
        (Path(root) / "big" / "config.json").write_text(json.dumps(
            {"max_batch_size": 8, "scale_to_zero_after_seconds": idle}))
        port = free_port()
        env = {**os.environ, "MMC_ORT_INTRA_OP_THREADS": "1"}
        proc = subprocess.Popen([str(REPO / ".venv/bin/mmc-serve"), "--model-repository", root,
                                 "--host", "127.0.0.1", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = []
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                wait_ready(http)
                http.post("/v2/models/big/infer", json=BODY).raise_for_status()
                loaded = rss(proc.pid)
                for _ in range(cycles):
                    while not asleep(http):
                        time.sleep(0.1)
                    time.sleep(0.3)  # the drained sessions are released in the background
                    sleeping = rss(proc.pid)
                    t = time.perf_counter()
                    http.post("/v2/models/big/infer", json=BODY).raise_for_status()
                    cold = time.perf_counter() - t
                    t = time.perf_counter()
                    http.post("/v2/models/big/infer", json=BODY).raise_for_status()
                    warm = time.perf_counter() - t
                    rows.append({"loaded": rss(proc.pid), "asleep": sleeping, "cold": cold,
                                 "warm": warm, "replica_cold": cold_start_metric(http)})
        finally:
            proc.terminate()
            proc.wait(10)
    return {"out": out, "weights_mb": (64 * 4096 + 4096 * out) * 4 / MB, "first_loaded": loaded,
            "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--out", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--idle", type=float, default=1.0)
    args = parser.parse_args()
    lines = [f"# Scale to zero ({time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
             f"{os.cpu_count()} CPUs, {args.cycles} cycles each, idle timeout {args.idle} s)",
             "", "| weights | RSS loaded | RSS scaled to zero | freed | cold start, client "
             "(median / max) | cold start, replica (median) | warm request (median) |",
             "|---|---|---|---|---|---|---|"]
    for out in args.out:
        r = run_size(out, args.cycles, args.idle)
        rows = r["rows"]

        def med(k, rows=rows):
            return statistics.median(row[k] for row in rows)

        lines.append(
            f"| {r['weights_mb']:.0f} MB | {med('loaded') / MB:.0f} MB | "
            f"{med('asleep') / MB:.0f} MB | {(med('loaded') - med('asleep')) / MB:.0f} MB | "
            f"{med('cold') * 1000:.0f} / {max(x['cold'] for x in rows) * 1000:.0f} ms | "
            f"{med('replica_cold') * 1000:.0f} ms | {med('warm') * 1000:.1f} ms |")
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results" / "scale-to-zero-latest.md").write_text(text)


if __name__ == "__main__":
    main()
