"""Data capture's cost on one `mmc-serve` replica, against capture off in the same run.

    .venv/bin/python bench/capture.py [--seconds 15] [--rounds 2] [--conc 32] [--control]

An MLP (64 -> 256 -> 256 -> 10, the serving bench's) served by three replicas, up together, each in
its own model repository: capture off, capture of 10 % and of 100 % of requests (inputs and outputs,
MMC_CAPTURE_DIR a fresh folder each); with --control a fourth, capture off as well, whose ratio to
the first is the noise of the run (two identical replicas differed by up to 6 % in throughput and 10
% in p99 over three rounds, 2026-12-07). After a warm-up of each, every round loads them in turn
(off, 10 %, 100 %) with wrk -t1 -c<conc> for --seconds on v2 JSON: a drift in the machine's speed
reaches all alike (replicas started one after another, as before 2026-12-07 evening, swung
4,600-8,700 req/s between rounds of the same setting). Then each replica's resident memory (VmRSS,
its capture encoder's included) against before the first round, its captured/dropped counters and
the bytes its capture folder holds. Reports medians per setting, ratios to off, and bytes stored per
million requests; writes the table to stdout and to a new file in bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.scale_to_zero import free_port, rss, wait_ready  # noqa: E402  one copy of the bench's helpers

BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
SETTINGS = {"off": 0, "10 %": 10, "100 %": 100}
CONTROL = "off (control)"  # a second replica with capture off: the bench's own noise
MB = 1024 * 1024


def folder_bytes(root: Path) -> tuple[int, int]:
    """(bytes, files) of the capture files under `root`."""
    files = [f for f in root.rglob("*") if f.is_file() and not f.name.startswith(".")]
    return sum(f.stat().st_size for f in files), len(files)


def counter(metrics: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(name + "{"))


def wrk(url: str, body: Path, conc: int, seconds: int) -> dict:
    env = {**os.environ, "BENCH_BODY": str(body)}
    p = subprocess.run(["wrk", "-t1", f"-c{conc}", f"-d{seconds}s", "--timeout", "10s", "-s",
                        str(REPO / "bench" / "wrk" / "json.lua"), url],
                       env=env, capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"^BENCH_RESULT (\{.*\})$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed: {p.stdout[-500:]} {p.stderr[-500:]}")
    return json.loads(m.group(1))


class Replica:
    """One `mmc-serve` replica serving the MLP with one capture setting, in its own model
    repository and capture folder."""

    def __init__(self, percent: float, root: Path, name: str) -> None:
        self.percent = percent
        self.root = root / f"replica-{name.replace(' ', '-')}"
        (self.root / "repo" / "mlp" / "1").mkdir(parents=True)
        (self.root / "repo" / "mlp" / "1" / "model.onnx").write_bytes((root / "mlp.onnx")
                                                                     .read_bytes())
        (self.root / "repo" / "mlp" / "config.json").write_text(json.dumps(
            {"max_batch_size": 8, "max_queue_delay_us": 0,
             "capture": {"percent": percent, "mode": "both"}}))
        self.capture = self.root / "capture"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(REPO / ".venv/bin/mmc-serve"), "--model-repository", str(self.root / "repo"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            env={**os.environ, "MMC_CAPTURE_DIR": str(self.capture)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready(self, body: Path, conc: int) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=30) as http:
            wait_ready(http)
            r = http.post("/v2/models/mlp/infer", json=BODY)
            assert r.status_code == 200 and len(r.json()["outputs"][0]["data"]) == 10, r.text
        wrk(f"{self.url}/v2/models/mlp/infer", body, conc, 3)  # warm-up

    def counters(self) -> dict:
        import httpx

        metrics = httpx.get(f"{self.url}/metrics", timeout=30).text
        return {"captured": counter(metrics, "mmc_capture_records_total"),
                "dropped": counter(metrics, "mmc_capture_dropped_total")}

    def rss(self) -> int:
        """The replica's resident memory, with its capture encoder's where it has one."""
        return rss(self.proc.pid) + sum(rss(pid) for pid in children(self.proc.pid))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def children(pid: int) -> list[int]:
    """The processes `pid` started (a replica's capture encoder)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=int, default=15)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--conc", type=int, default=32)
    p.add_argument("--control", action="store_true",
                   help="a fourth replica, capture off too, loaded in turn with the others: "
                   "how far two identical replicas differ in the same run")
    p.add_argument("--out", help="the table's file (default: a new file in bench/results/, "
                   "never one that is there: a day's lab note keeps its name)")
    args = p.parse_args()
    from registry import samples

    settings = {**SETTINGS, CONTROL: 0} if args.control else dict(SETTINGS)
    runs: dict[str, list[dict]] = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "mlp.onnx").write_bytes(samples.mlp())
        body = root / "body.json"
        body.write_text(json.dumps(BODY))
        # all replicas run the whole time, idle but for the one under load: each round
        # loads them in turn, so a drift in the machine's speed reaches every setting alike
        replicas = {name: Replica(percent, root, name) for name, percent in settings.items()}
        try:
            for replica in replicas.values():
                replica.ready(body, args.conc)
            before = {name: replica.rss() for name, replica in replicas.items()}
            for rnd in range(args.rounds):
                for name, replica in replicas.items():
                    res = wrk(f"{replica.url}/v2/models/mlp/infer", body, args.conc,
                              args.seconds)
                    runs[name].append(res)
                    print(f"round {rnd + 1} {name:>13}: {res['rps']:8.0f} req/s  p99 "
                          f"{res['p99_us'] / 1000:6.2f} ms  non2xx {res['non2xx']}",
                          file=sys.stderr, flush=True)
            time.sleep(3)  # the flushers' last batches
            totals = {name: {"rss_growth": replica.rss() - before[name], **replica.counters()}
                      for name, replica in replicas.items()}
        finally:
            for replica in replicas.values():
                replica.stop()
        for name, replica in replicas.items():
            found = folder_bytes(replica.capture) if replica.capture.exists() else (0, 0)
            totals[name]["bytes"], totals[name]["files"] = found
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("rps", "p99_us")}
           for k, v in runs.items()}
    base = med["off"]
    lines = [
        f"# Data capture: cost against capture off ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"`bench/capture.py --seconds {args.seconds} --rounds {args.rounds} --conc "
        f"{args.conc}{' --control' if args.control else ''}`: one `mmc-serve --workers 1` "
        f"replica, MLP 64→256→256→10, v2 JSON, wrk -t1 -c{args.conc}, the {len(settings)} "
        "replicas up together and loaded in turn, medians of "
        f"{args.rounds} rounds (RSS: the replica and its capture encoder, before the first "
        "round and after the last; captured and stored: warm-ups included); "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), shared with "
        "other work while it ran (ratios, not absolute figures, are the result).",
        "",
        "| capture | req/s | × off | p99 ms | × off | RSS growth MB | captured | dropped | "
        "bytes stored / 1 M requests |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in runs:
        m, total = med[name], totals[name]
        captured, stored = total["captured"], total["bytes"]
        per_million = f"{stored / captured * 1e6 / MB:,.0f} MB" if captured else "—"
        if 0 < settings[name] < 100 and captured:
            per_million += f" ({stored / captured * 1e6 * settings[name] / 100 / MB:,.0f} MB " \
                           "at this sampling)"
        lines.append(
            f"| {name} | {m['rps']:,.0f} | {m['rps'] / base['rps']:.2f} | "
            f"{m['p99_us'] / 1000:.2f} | {m['p99_us'] / base['p99_us']:.2f} | "
            f"{total['rss_growth'] / MB:+.1f} | {captured:,.0f} | {total['dropped']:,.0f} | "
            f"{per_million} |")
    lines += ["", "Non-2xx answers in all runs: "
              f"{sum(r['non2xx'] for v in runs.values() for r in v)}.", ""]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out) if args.out else new_result_file("capture-server")
    out.write_text(text)
    print(f"written to {out}", file=sys.stderr)


def new_result_file(stem: str) -> Path:
    """bench/results/<stem>-<day>.md, or -2, -3 ... after it: a new file, never one there."""
    base = REPO / "bench" / "results" / f"{stem}-{datetime.now(UTC):%Y-%m-%d}"
    path, n = base.with_suffix(".md"), 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}.md")
    return path


if __name__ == "__main__":
    main()
