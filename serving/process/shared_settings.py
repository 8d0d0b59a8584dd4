"""The run-time settings the workers of one `mmc-serve --workers N` share: the log and trace
settings an operator changes through one of them (serving.core.operator_settings).

A change is written to `<MMC_SERVE_WORKER_DIR>/settings.json` (the supervisor's tmpfs folder,
atomically); every worker takes it before it answers a settings call and, for its inferences,
within FOLLOW_SECONDS.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

FOLLOW_SECONDS = 1.0


class SettingsBoard:
    """One file of shared settings, and which version of it this worker has taken."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = Path(folder) / "settings.json"
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) last read or written
        self._task: asyncio.Task | None = None

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def publish(self, state: dict) -> None:
        tmp = self.path.with_name(f"settings.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(orjson.dumps(state))
            os.replace(tmp, self.path)
        except OSError as exc:  # the folder went away: the supervisor is stopping
            log.warning("cannot share the settings with the other workers: %s", exc)
            return
        self._seen = self._stamp()

    def changed(self) -> dict | None:
        """The shared settings when they changed since this worker last took them."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return None
        try:
            state = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        self._seen = stamp
        return state

    def follow(self, adopt: Callable[[dict], None]) -> None:
        """Take the others' changes every FOLLOW_SECONDS (on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._follow(adopt))

    async def _follow(self, adopt: Callable[[dict], None]) -> None:
        while True:
            await asyncio.sleep(FOLLOW_SECONDS)
            try:
                state = self.changed()
                if state is not None:
                    adopt(state)
            except Exception:  # noqa: BLE001 - a bad file is skipped; the next one is taken
                log.exception("cannot take the shared settings")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
