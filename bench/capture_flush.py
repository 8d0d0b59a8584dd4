"""Data capture's cost per record inside one process: the request path and the flusher.

    .venv/bin/python bench/capture_flush.py [--records 20000] [--repeats 5] [--constant]

Offers --records requests of the capture bench's MLP (a 1x64 FP32 input, a 1x10 FP32 output;
random normal values, or the bench's constant 0.5 body with --constant) to a CaptureQueue whose
sink is a FolderCaptureSink, as a replica serving a model repository has, then flushes them in
the queue's batches, with the encoder a replica has (a child process) or, with
--encoder thread, in the flushing thread. Reports, per record: the time `offer` takes (the
request path), the flusher's wall and CPU time (thread CPU: what it takes from the serving
process), the encoder process's CPU, the bytes stored; and how late a thread that sleeps 200 us
at a time wakes while the flusher runs (how long an event loop would wait for the GIL: p50, p99,
max, and waits over 2 ms per batch), against the same probe with nothing else running. Medians
of --repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class WakeProbe(threading.Thread):
    """Sleeps 200 us at a time and records how late it wakes (GIL waits show up here)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.late: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t = time.perf_counter()
            time.sleep(0.0002)
            self.late.append(time.perf_counter() - t - 0.0002)

    def stop(self) -> dict:
        self.done.set()
        self.join()
        late = sorted(self.late)
        return {"p50": late[len(late) // 2] * 1e6, "p99": late[int(len(late) * 0.99)] * 1e6,
                "max": late[-1] * 1e6, "over_2ms": sum(x > 0.002 for x in late)}


def process_cpu(pid: int | None) -> float:
    """Seconds of CPU `pid` has used (0 where there is none)."""
    if pid is None:
        return 0.0
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(n: int, constant: bool, encoder: str) -> dict:
    from serving.core.capture import CaptureQueue, CaptureSettings, FolderCaptureSink

    rng = np.random.default_rng(0)
    if constant:
        xs = [np.full((1, 64), 0.5, np.float32)] * n
    else:
        xs = list(rng.standard_normal((n, 1, 64)).astype(np.float32))
    ys = list(rng.standard_normal((n, 1, 10)).astype(np.float32))
    settings = CaptureSettings(100, "both")
    with tempfile.TemporaryDirectory() as tmp:
        queue = CaptureQueue(FolderCaptureSink(tmp), max_records=n, max_bytes=1 << 34,
                             flush_s=3600, batch=2000, encoder=encoder)
        queue.start = lambda: None  # flushed by hand below, on a thread of its own
        offer = queue.offer
        t = time.perf_counter()
        for i in range(n):
            offer(request_id=f"req-{i}", model="mlp", version="1", role="stable",
                  latency_ms=1.25, inputs={"x": xs[i]}, outputs={"y": ys[i]},
                  settings=settings)
        offer_s = time.perf_counter() - t
        cpu: list[float] = []

        def flush() -> None:
            c = time.thread_time()
            queue.flush()
            cpu.append(time.thread_time() - c)

        if encoder == "process":  # started and warm before the clock (pyarrow loaded), as a
            warm = CaptureQueue(lambda f: None, encoder=encoder)  # replica's is after its
            warm.start = lambda: None  # first batch
            warm.offer(request_id=None, model="mlp", version="1", role="stable",
                       latency_ms=1.0, inputs={"x": xs[0]}, outputs=None, settings=settings)
            assert warm.flush() == 1
            queue._process = warm._process
        encoder_cpu = process_cpu(queue._process and queue._process.pid)
        probe = WakeProbe()
        probe.start()
        flusher = threading.Thread(target=flush)
        t = time.perf_counter()
        flusher.start()
        flusher.join()
        flush_s = time.perf_counter() - t
        late = probe.stop()
        encoder_cpu = process_cpu(queue._process and queue._process.pid) - encoder_cpu
        assert queue.snapshot("mlp", "1")["written"] == n, queue.snapshot("mlp", "1")
        queue.stop()
        stored = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
    return {"offer_us": offer_s / n * 1e6, "flush_us": flush_s / n * 1e6,
            "flush_cpu_us": cpu[0] / n * 1e6, "encoder_cpu_us": encoder_cpu / n * 1e6,
            "bytes": stored / n,
            "over_2ms_per_batch": late.pop("over_2ms") / (n / queue.batch), **{
                f"late_{k}": v for k, v in late.items()}}


def idle_probe(seconds: float) -> dict:
    probe = WakeProbe()
    probe.start()
    time.sleep(seconds)
    return probe.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--constant", action="store_true", help="the bench's 0.5 body, not random")
    p.add_argument("--encoder", choices=("process", "thread"), default="process")
    args = p.parse_args()
    one_run(2000, args.constant, args.encoder)  # imports, first-call costs
    runs = [one_run(args.records, args.constant, args.encoder) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    idle = idle_probe(1.0)
    print(f"{args.records} records x {args.repeats}, {'constant' if args.constant else 'random'}"
          f" values, encoder {args.encoder}, medians per record:")
    print(f"  request path (offer)   {med['offer_us']:6.2f} us")
    print(f"  flusher wall           {med['flush_us']:6.2f} us")
    print(f"  flusher CPU            {med['flush_cpu_us']:6.2f} us")
    print(f"  encoder process CPU    {med['encoder_cpu_us']:6.2f} us")
    print(f"  stored                 {med['bytes']:6.0f} B")
    print(f"  probe wake lateness while flushing: p50 {med['late_p50']:.0f} us, p99 "
          f"{med['late_p99']:.0f} us, max {med['late_max']:.0f} us (idle: p50 "
          f"{idle['p50']:.0f}, p99 {idle['p99']:.0f}, max {idle['max']:.0f} us); waits over 2 ms "
          f"per 2,000-record batch: {med['over_2ms_per_batch']:.2f}")


if __name__ == "__main__":
    main()
