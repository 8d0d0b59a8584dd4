"""`mmc-serve --workers N`: N serving processes on one port, each with the drain.

One event loop is one core at most: on a host shared with other busy processes the scheduler
gives a single-threaded server less than a multi-threaded peer (bench/README.md). Several
worker processes, each a whole `mmc-serve` with its own copy of every model, take the cores.

Each worker listens on the port itself with SO_REUSEPORT (HTTP and gRPC), so the kernel spreads
connections over the workers by their addresses: about evenly. (One socket shared by every
worker spread them as the accept race fell: 27 of 32 keep-alive connections on one worker, 5 on
the other, and the crowded worker's answers waited.) On SIGTERM or SIGINT the supervisor passes
the signal on and waits: every worker runs its own drain (not ready, `Connection: close`, until
quiet or MMC_DRAIN_SECONDS), then closes its socket and exits; a second signal is passed on
too (the workers stop at once). A worker that dies unexpectedly is started again; it opens its
socket only once its models are loaded, so until then the kernel gives new connections to the
others. One that keeps dying within seconds of its start stops the whole server (bad flags, a
broken model repository: a loop of restarts would only hide it). A worker whose supervisor is
gone (even by SIGKILL) drains and exits: it checks its parent once a second, as gunicorn's
workers do.

The workers share a folder (MMC_SERVE_WORKER_DIR) where each publishes its statistics, so
/metrics and the statistics APIs answer for all of them (serving/process/siblings.py).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: SIGTERM: a serving process answers (not ready, `Connection: close`) this long at most before
#: its listener closes (MMC_DRAIN_SECONDS; serving.http.server.DrainingServer).
DEFAULT_DRAIN_SECONDS = 5.0

log = logging.getLogger("uvicorn.error")

ENV_WORKER_INDEX = "MMC_SERVE_WORKER_INDEX"
ENV_WORKER_DIR = "MMC_SERVE_WORKER_DIR"
ENV_WORKERS = "MMC_SERVE_WORKERS"
ENV_RESTART = "MMC_SERVE_WORKER_RESTART"  # "1": a worker started again while the others serve
ENV_SUPERVISOR_PID = "MMC_SERVE_SUPERVISOR_PID"
#: `--workers auto` takes at most this many processes: each holds a copy of every model.
AUTO_MAX_WORKERS = 4
#: A worker that exits within this many seconds of its start counts as failing to start ...
EARLY_EXIT_SECONDS = 10.0
#: ... and this many such exits in a row stop the server.
EARLY_EXITS_TO_GIVE_UP = 3
#: Seconds between a worker's death and its restart (doubles while it keeps dying early).
RESTART_BACKOFF_SECONDS = 0.5


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, bounded by a cgroup v2 CPU quota
    (a container or pod limit), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def resolve_workers(value: str) -> int:
    """`--workers`: a number, or `auto` = one per usable CPU, at most AUTO_MAX_WORKERS, and one
    where a GPU does the compute (one process per GPU, as Triton places one instance per GPU)."""
    if value.strip().lower() == "auto":
        from serving.core.gpu import gpu_available  # no numpy or onnxruntime for this

        return 1 if gpu_available() else min(usable_cpus(), AUTO_MAX_WORKERS)
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"--workers {value!r}: a number of processes or 'auto'") from None
    if n < 1:
        raise ValueError(f"--workers {value!r}: at least 1")
    return n


def supervisor_gone() -> bool:
    """In a worker: whether the supervisor that started it has died (the worker was handed to
    another parent); then the worker drains and exits, so none is left holding the port."""
    return is_worker() and str(os.getppid()) != os.environ.get(ENV_SUPERVISOR_PID)


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen | None = None
    started: float = 0.0
    early_exits: int = 0
    restart_at: float | None = None


@dataclass
class Supervisor:
    """Runs `command` (an mmc-serve command line with --workers 1) `count` times."""

    command: list[str]
    count: int
    address: str = ""  # host:port, for the log
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    stop_timeout: float = 60.0
    workers: list[_Worker] = field(default_factory=list)
    folder: str = ""
    _signals: list[int] = field(default_factory=list)
    _exit_code: int = 0

    def run(self) -> int:
        self.folder = tempfile.mkdtemp(prefix="mmc-serve-",
                                       dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: self._signals.append(s))
        try:
            self.workers = [_Worker(i) for i in range(self.count)]
            for w in self.workers:
                self._start(w)
            log.warning("mmc-serve: %d workers on %s (pids %s)", self.count, self.address,
                        ", ".join(str(w.process.pid) for w in self.workers if w.process))
            self._watch()
            return self._stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _start(self, w: _Worker) -> None:
        env = {**self.env, ENV_WORKER_INDEX: str(w.index), ENV_WORKER_DIR: self.folder,
               ENV_WORKERS: str(self.count), ENV_RESTART: "1" if w.process else "0",
               ENV_SUPERVISOR_PID: str(os.getpid())}
        # In the supervisor's process group (a terminal's Ctrl-C, systemd or `kill -- -PGID`
        # reach the workers too; a worker takes the copy passed on within a second for the same
        # signal, serving.http.server.DrainingServer.handle_exit).
        w.process = subprocess.Popen(self.command, env=env)
        w.started = time.monotonic()
        w.restart_at = None

    def _watch(self) -> None:
        """Until a signal: restart workers that died, give up on one that keeps dying early."""
        while not self._signals:
            now = time.monotonic()
            for w in self.workers:
                if w.restart_at is not None:
                    if now >= w.restart_at:
                        self._start(w)
                    continue
                code = w.process.poll() if w.process else None
                if code is None:
                    if now - w.started > EARLY_EXIT_SECONDS:
                        w.early_exits = 0
                    continue
                early = now - w.started < EARLY_EXIT_SECONDS
                w.early_exits = w.early_exits + 1 if early else 0
                if w.early_exits >= EARLY_EXITS_TO_GIVE_UP:
                    log.error("mmc-serve: worker %d exited with status %s %d times within %g s "
                              "of its start; stopping", w.index, code, w.early_exits,
                              EARLY_EXIT_SECONDS)
                    self._exit_code = code if code and code > 0 else 1
                    return
                delay = RESTART_BACKOFF_SECONDS * 2 ** max(0, w.early_exits - 1)
                log.warning("mmc-serve: worker %d (pid %d) exited with status %s; starting it "
                            "again in %g s", w.index, w.process.pid, code, delay)
                w.restart_at = now + delay
            time.sleep(0.1)

    def _stop(self) -> int:
        """Pass the signal(s) on and wait for every worker's drain; kill what outlives it."""
        passed = 0
        deadline = time.monotonic() + self.stop_timeout
        while True:
            live = [w.process for w in self.workers
                    if w.process and w.restart_at is None and w.process.poll() is None]
            if not live:
                break
            while passed < len(self._signals) or (not self._signals and passed == 0):
                sig = self._signals[passed] if self._signals else signal.SIGTERM
                passed += 1
                for p in live:
                    _signal(p, sig)
            if time.monotonic() >= deadline:
                log.error("mmc-serve: workers still running %g s after the signal; killing "
                          "them", self.stop_timeout)
                for p in live:
                    _signal(p, signal.SIGKILL)
                for p in live:
                    p.wait()
                return self._exit_code or 1
            time.sleep(0.05)
        return self._exit_code


def _signal(process: subprocess.Popen, sig: int) -> None:
    try:
        process.send_signal(sig)
    except ProcessLookupError:
        pass


def is_worker() -> bool:
    """Whether this process is one of a supervisor's workers."""
    return os.environ.get(ENV_WORKER_INDEX) is not None


def is_restart() -> bool:
    """Whether this worker replaces one that died (the others are serving meanwhile)."""
    return is_worker() and os.environ.get(ENV_RESTART) == "1"


def reuse_port_listener(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening socket on host:port that other workers of this server share (SO_REUSEPORT);
    OSError when the port is taken by anything else."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def run_workers(command: list[str], count: int, *, host: str, port: int,
                stop_timeout: float) -> int:
    """Supervise `count` workers on host:port; 1 at once if the port is taken."""
    try:
        reuse_port_listener(host, port).close()  # taken by another program: say so now
    except OSError as exc:
        log.error("mmc-serve: cannot listen on %s:%d: %s", host, port, exc)
        return 1
    return Supervisor(command, count, address=f"{host}:{port}", stop_timeout=stop_timeout).run()
