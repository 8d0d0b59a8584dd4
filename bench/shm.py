"""System shared memory against binary HTTP: the conv net's req/s both ways, same server, same run.

    .venv/bin/python bench/shm.py [--duration 5] [--rounds 3] [--concurrency 1,8]

One `mmc-serve --workers 1` (MMC_SHM=on) serves the conv net (registry.samples.conv_net:
1x3x224x224 FP32 in, 600 KB; 1x10 out). Clients are `tritonclient.http` processes, each with
its own connection, doing per request what a real client does:
  binary  set_data_from_numpy (binary tensor extension), infer, as_numpy;
  shm     write the input into its own registered region, infer with the input and the output
          in shared memory, copy the output out of its region.
For each round, each concurrency c and each mode (interleaved, so neighbours hit both alike):
c processes run for --duration seconds; req/s is what they answered together over that time.
Reported: the median req/s of the rounds with their spread (min-max), and shm / binary.
The table goes to stdout and bench/results/shm-latest.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from registry import samples  # noqa: E402

SHAPE = [1, 3, 224, 224]
OUT_BYTES = 1 * 10 * 4
MODES = ("binary", "shm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(root: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "MMC_SHM": "on", "MMC_ORT_INTRA_OP_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).with_name("mmc-serve")), "--model-repository", str(root),
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--replica", "bench-shm"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://{url}/v2/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("mmc-serve did not become ready")


def client(url: str, mode: str, index: int, duration: float, ready, go, results) -> None:
    """One client process: set up, wait for the start, infer for `duration`, report."""
    import tritonclient.http as thttp
    import tritonclient.utils.shared_memory as shm

    c = thttp.InferenceServerClient(url)
    x = np.random.default_rng(index).random(SHAPE, dtype=np.float32)
    tag = f"mmc-bench-{os.getpid()}"
    handles = []
    if mode == "shm":
        in_h = shm.create_shared_memory_region(f"{tag}-in", f"/{tag}-in", x.nbytes)
        out_h = shm.create_shared_memory_region(f"{tag}-out", f"/{tag}-out", OUT_BYTES)
        handles = [in_h, out_h]
        c.register_system_shared_memory(f"{tag}-in", f"/{tag}-in", x.nbytes)
        c.register_system_shared_memory(f"{tag}-out", f"/{tag}-out", OUT_BYTES)

    def once() -> np.ndarray:
        inp = thttp.InferInput("x", SHAPE, "FP32")
        out = thttp.InferRequestedOutput("y", binary_data=True)
        if mode == "binary":
            inp.set_data_from_numpy(x, binary_data=True)
            return c.infer("conv", [inp], outputs=[out]).as_numpy("y")
        shm.set_shared_memory_region(in_h, [x])
        inp.set_shared_memory(f"{tag}-in", x.nbytes)
        out.set_shared_memory(f"{tag}-out", OUT_BYTES)
        c.infer("conv", [inp], outputs=[out])
        return np.array(shm.get_contents_as_numpy(out_h, np.float32, [1, 10]))

    first = once()  # warm, and both modes answer the same
    ready.put((mode, index, first.tolist()))
    go.wait()
    count = 0
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        once()
        count += 1
    results.put(count)
    if handles:
        c.unregister_system_shared_memory(f"{tag}-in")
        c.unregister_system_shared_memory(f"{tag}-out")
        for h in handles:
            shm.destroy_shared_memory_region(h)
    c.close()


def run(url: str, mode: str, c: int, duration: float) -> tuple[float, list]:
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=client, args=(url, mode, i, duration, ready, go, results))
             for i in range(c)]
    for p in procs:
        p.start()
    firsts = [ready.get(timeout=120) for _ in procs]
    go.set()
    total = sum(results.get(timeout=duration + 120) for _ in procs)
    for p in procs:
        p.join(30)
    return total / duration, firsts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    levels = [int(v) for v in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        (root / "conv" / "1").mkdir(parents=True)
        (root / "conv" / "1" / "model.onnx").write_bytes(samples.conv_net(seed=0))
        (root / "conv" / "config.json").write_text(json.dumps({"max_batch_size": 8}))
        proc, url = start(root)
        rates: dict[tuple[str, int], list[float]] = {(m, c): [] for m in MODES for c in levels}
        loads = []
        try:
            answers = {}
            for r in range(args.rounds):
                for c in levels:
                    for mode in MODES:
                        rate, firsts = run(url, mode, c, args.duration)
                        rates[(mode, c)].append(rate)
                        answers.setdefault(mode, firsts[0][2])
                        print(f"round {r + 1} c={c} {mode}: {rate:.1f} req/s", flush=True)
                loads.append(os.getloadavg()[0])
            np.testing.assert_allclose(answers["shm"], answers["binary"], rtol=1e-5)
        finally:
            proc.terminate()
            proc.wait(10)
    lines = [
        f"# System shared memory vs binary HTTP: conv net ({dt.date.today()})", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, shared; load average after "
        f"each round: {', '.join(f'{v:.1f}' for v in loads)} (not quiet). One `mmc-serve "
        f"--workers 1`, tritonclient.http clients, {args.duration:g} s per run, "
        f"{args.rounds} rounds interleaved; median req/s (min-max).", "",
        "| c | binary HTTP req/s | shared memory req/s | shm / binary |",
        "|---|---|---|---|",
    ]
    for c in levels:
        b, s = rates[("binary", c)], rates[("shm", c)]
        ratios = [y / x for x, y in zip(b, s, strict=True)]
        lines.append(
            f"| {c} | {statistics.median(b):.1f} ({min(b):.1f}-{max(b):.1f}) "
            f"| {statistics.median(s):.1f} ({min(s):.1f}-{max(s):.1f}) "
            f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    table = "\n".join(lines) + "\n"
    print(table)
    out = REPO / "bench" / "results" / "shm-latest.md"
    out.write_text(table)


if __name__ == "__main__":
    main()
