"""What the workers of one `mmc-serve --workers N` know of each other: their statistics.

A request lands on whichever worker the kernel gave its connection, so /metrics, the v2 / Triton
statistics and gRPC ModelStatistics would each show one worker's share. Instead every worker
writes its counters to `<MMC_SERVE_WORKER_DIR>/w<index>.json` (a tmpfs folder the supervisor
made) every `PUBLISH_SECONDS` and just before it answers a statistics request, and answers with
its own live counters plus the others' latest files:

- /metrics: every worker's series under its own `replica` label (`<id>-w<i>`), as Prometheus
  expects of separate processes;
- statistics: one version's counters summed over the workers.

Before it answers, a worker asks the others for a fresh file (SIGUSR1, handled on their event
loops) and waits for it up to REFRESH_SECONDS, so the figures are those of the moment asked, as
a single process's would be; a worker too busy to answer in time is read as last published. A
worker writes its own file before reading the others', so a figure never goes backwards from
one answer to the next, whichever worker gives it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson

from serving.core.stats import VersionStats

log = logging.getLogger(__name__)

PUBLISH_SECONDS = 1.0
#: How long an answer waits for the other workers' fresh counters.
REFRESH_SECONDS = 0.25


class Siblings:
    """This worker's view of the other workers of the same server."""

    def __init__(self, folder: str | os.PathLike, index: int, replica: str,
                 stats: Callable[[], Iterable[VersionStats]],
                 counters: Callable[[], dict] = dict) -> None:
        self.folder = Path(folder)
        self.index = index
        self.replica = replica
        self._stats = stats
        self._counters = counters  # other per-replica counters (the admission's), JSON-able
        self._own = self.folder / f"w{index}.json"
        self._task: asyncio.Task | None = None
        self._seq = 0  # publications so far: a reader waits for it to move

    # -- writing ---------------------------------------------------------------------------

    def publish(self) -> None:
        """Write this worker's counters (atomically: readers see the old file or the new)."""
        self._seq += 1
        state = {"replica": self.replica, "pid": os.getpid(), "seq": self._seq,
                 "stats": [s.to_state() for s in self._stats()], "counters": self._counters()}
        tmp = self._own.with_suffix(".tmp")
        try:
            tmp.write_bytes(orjson.dumps(state))
            os.replace(tmp, self._own)
        except OSError as exc:  # the folder went away: the supervisor is stopping
            log.debug("cannot publish worker statistics: %s", exc)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        # Before the first file names this pid: a worker that reads it may signal at once, and
        # SIGUSR1's default action would end this process.
        loop.add_signal_handler(signal.SIGUSR1, self.publish)  # another worker asks
        self.publish()
        self._task = loop.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_SECONDS)
            self.publish()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
        self.publish()  # what it answered since the last tick stays counted

    # -- reading ---------------------------------------------------------------------------

    def _read(self) -> list[dict]:
        found = []
        for path in sorted(self.folder.glob("w*.json")):
            if path == self._own:
                continue
            try:
                found.append(orjson.loads(path.read_bytes()))
            except (OSError, orjson.JSONDecodeError):
                continue  # replaced or removed while read: the next answer has it
        return found

    async def refresh(self, timeout: float = REFRESH_SECONDS) -> None:
        """Ask every other worker for its counters now and wait (up to `timeout`) for them."""
        asked = {}
        for state in self._read():
            if not _is_sibling(state["pid"]):
                continue  # gone (its last file stands for what it answered), the pid reused
            try:
                os.kill(state["pid"], signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                continue
            asked[state["replica"]] = state.get("seq", 0)
        deadline = time.monotonic() + timeout
        while asked and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
            for state in self._read():
                if state.get("seq", 0) > asked.get(state["replica"], 1 << 62):
                    del asked[state["replica"]]

    def others(self) -> list[dict]:
        """The other workers' latest files, read after writing this one's."""
        self.publish()
        return self._read()

    def merge(self, own: list[VersionStats]) -> list[VersionStats]:
        """`own` (this worker's stats of some versions), each summed with the other workers'
        counters of the same version."""
        theirs: dict[tuple[str, str], list[VersionStats]] = {}
        for o in self.others():
            for state in o["stats"]:
                theirs.setdefault((state["model"], state["version"]), []).append(
                    VersionStats.from_state(state))
        return [VersionStats.merged([s, *theirs.get((s.model, s.version), ())]) for s in own]


def stats_of(others: list[dict]) -> list[tuple[str, list[VersionStats]]]:
    """(replica, its VersionStats) of each worker file read by Siblings.others()."""
    return [(o["replica"], [VersionStats.from_state(s) for s in o["stats"]]) for o in others]


def _is_sibling(pid: int) -> bool:
    """Whether `pid` is a live process of the same supervisor (never signal a stranger that
    got a dead worker's pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return fields[0] != "Z" and int(fields[1]) == os.getppid()


def shared_folder() -> str:
    """The folder the workers of this server share ('' for a lone process)."""
    folder = os.environ.get("MMC_SERVE_WORKER_DIR", "")
    return folder if folder and os.path.isdir(folder) else ""


def from_environment(replica: str, stats: Callable[[], Iterable[VersionStats]],
                     counters: Callable[[], dict] = dict) -> Siblings | None:
    """The Siblings of a worker started by serving.process.supervisor; None for a lone process."""
    folder, index = shared_folder(), os.environ.get("MMC_SERVE_WORKER_INDEX")
    if not folder or index is None:
        return None
    return Siblings(folder, int(index), replica, stats, counters)
