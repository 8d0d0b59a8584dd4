"""Workers park while the host has fewer cores to spare than workers listen.

Measured on a 2-core host with a CPU-bound neighbour (issue 15's busy bench): the server's two
workers got ~0.67 core between them, each waited 60 % of its time on the run queue behind the
other, and their p99 was twice one worker's taking every connection. So the supervisor samples,
once a second, the CPU its workers use plus the idle CPU they could have (`spare`), and while
they have work, keeps as many workers listening as `spare` rounds to, changing only after a few
samples agree (an idle server keeps its count: a neighbour busy meanwhile says nothing of how
our workers would share the cores under load). A
parked worker stops listening and lets each keep-alive connection go after its next answer
(gRPC: GOAWAY), so clients reconnect to the workers still listening; a worker unparked listens
again and the others let a share of their connections go, so the load spreads again.

`MMC_SERVE_PARKING=off` keeps every worker listening.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("uvicorn.error")  # the supervisor's log

ENV_PARKING = "MMC_SERVE_PARKING"
ACTIVE_FILE = "active"  # in the supervisor's folder: how many workers listen
SAMPLE_SECONDS = 1.0
#: A change needs `spare` this far past the current count, in this many samples in a row.
MARGIN = 0.6
AGREEING_SAMPLES = 3
#: Below this much demand (CPU used plus time spent runnable, waiting for a CPU) per listening
#: worker the server is idle: nothing to learn, keep as is (a neighbour busy while we are idle
#: says nothing of how our workers would share the cores). Waiting counts: on a crowded host a
#: loaded worker gets little CPU but waits for it most of the time.
LOADED_PER_WORKER = 0.1


def enabled() -> bool:
    return os.environ.get(ENV_PARKING, "auto").strip().lower() not in ("off", "0", "false", "no")


@dataclass
class ParkingPolicy:
    """How many of `workers` should listen, given `spare` (cores) once a second."""

    workers: int
    active: int = 0
    _streak: int = 0

    def __post_init__(self) -> None:
        self.active = self.active or self.workers

    def decide(self, spare: float, demand: float) -> int:
        """`spare`: cores used by the workers plus cores idle; `demand`: cores the workers used
        plus cores' worth of time they were runnable but waiting for a CPU."""
        if demand < LOADED_PER_WORKER * self.active:
            self._streak = 0
            return self.active
        wanted = min(self.workers, max(1, round(spare)))
        moved = (wanted < self.active and spare < self.active - MARGIN) or (
            wanted > self.active and spare > self.active + MARGIN)
        self._streak = self._streak + 1 if moved else 0
        if self._streak >= AGREEING_SAMPLES:
            self.active, self._streak = wanted, 0
        return self.active


def _idle_jiffies(cpus: set[int]) -> tuple[int, int]:
    """(idle, total) jiffies over the CPUs this process may use."""
    idle = total = 0
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line[3] == " ":
                continue
            name, *values = line.split()
            if int(name[3:]) in cpus:
                numbers = [int(v) for v in values[:8]]
                idle += numbers[3] + numbers[4]  # idle + iowait
                total += sum(numbers)
    return idle, total


def _cpu_and_wait(pid: int) -> tuple[float, float]:
    """Seconds the threads of `pid` have run on a CPU and waited on a run queue
    (/proc/PID/task/*/schedstat; a thread that ended takes its figures with it)."""
    ran = waited = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0, 0.0
    for tid in tasks:
        try:
            on_cpu, on_queue, _slices = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text(
            ).split()
        except (OSError, ValueError):
            continue
        ran += int(on_cpu)
        waited += int(on_queue)
    return ran / 1e9, waited / 1e9


@dataclass
class SpareCpu:
    """Between two samples (/proc): cores the workers used plus cores idle (`spare`), and cores
    the workers used plus cores' worth of time they waited runnable (`demand`)."""

    cpus: set[int] = field(default_factory=lambda: set(os.sched_getaffinity(0)))
    _last: tuple[float, int, int, dict[int, tuple[float, float]]] | None = None

    def sample(self, pids: list[int]) -> tuple[float, float] | None:
        """(spare, demand) since the previous sample; None on the first."""
        now = time.monotonic()
        idle, total = _idle_jiffies(self.cpus)
        times = {pid: _cpu_and_wait(pid) for pid in pids}
        last, self._last = self._last, (now, idle, total, times)
        if last is None or total <= last[2] or now <= last[0]:
            return None
        idle_cores = len(self.cpus) * (idle - last[1]) / (total - last[2])
        elapsed = now - last[0]
        used = waited = 0.0
        for pid, (ran, wait) in times.items():
            ran_before, wait_before = last[3].get(pid, (ran, wait))
            used += max(0.0, ran - ran_before) / elapsed  # a thread that ended: < 0
            waited += max(0.0, wait - wait_before) / elapsed
        return idle_cores + used, used + waited


@dataclass
class Parking:
    """The supervisor's side: sample, decide, tell the workers (a file in its folder)."""

    folder: str
    workers: int
    policy: ParkingPolicy = None  # type: ignore[assignment]
    spare: SpareCpu = field(default_factory=SpareCpu)
    _next: float = 0.0

    def __post_init__(self) -> None:
        self.policy = self.policy or ParkingPolicy(self.workers)
        write_active(self.folder, self.workers)

    def tick(self, pids: list[int]) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + SAMPLE_SECONDS
        sample = self.spare.sample(pids)
        if sample is None:
            return
        spare, demand = sample
        before = self.policy.active
        if self.policy.decide(spare, demand) != before:
            write_active(self.folder, self.policy.active)
            log.warning("mmc-serve: %d of %d workers listening (%.2f cores to spare)",
                        self.policy.active, self.workers, spare)


def share_of(items, share: float) -> list:
    """About `share` of `items`, picked at random (all of them at 1): the connections a
    listening worker lets go so that the load spreads again."""
    return [item for item in items if share >= 1 or random.random() < share]


def write_active(folder: str, count: int) -> None:
    path = Path(folder) / ACTIVE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(count))
    tmp.replace(path)


def read_active(folder: str) -> int | None:
    try:
        return int((Path(folder) / ACTIVE_FILE).read_text())
    except (OSError, ValueError):
        return None
