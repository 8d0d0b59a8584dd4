"""Scale to zero on a replica: a model whose route sets an idle timeout is unloaded once no
request came for that long and none is in flight (the route stays; its versions are reported
SCALED_TO_ZERO), and loaded again by the next request, which waits for it (a cold start).

A mixin of the Reconciler: sleeping and waking swap the route table under the reconciler's lock,
so they interleave with a rollout's reconcile one whole step at a time, never half-way.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from dataclasses import replace
from time import monotonic

from serving.core.dataplane import DataPlane, RouteTable
from serving.core.desired_state import SCALED_TO_ZERO, VersionSpec

log = logging.getLogger(__name__)


class ScaleToZero:
    """The Reconciler's scale-to-zero half (it provides the attributes declared here)."""

    dataplane: DataPlane
    idle_check_seconds: float
    _lock: asyncio.Lock
    _asleep: dict[tuple[str, str], VersionSpec]
    _waking: dict[str, asyncio.Task]
    _failed: dict[tuple[str, str], tuple[VersionSpec, str]]

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(self.idle_check_seconds)
            try:
                await self.scale_idle()
            except Exception:  # noqa: BLE001 - never let the idle check stop serving
                log.exception("scale to zero check failed")

    def _sleepable(self, model: str, table: RouteTable) -> list[tuple[str, str]]:
        """The model's loaded versions that may be unloaded: not pipelines (nothing of their
        own to free) and not a step of a loaded pipeline (that would fail it)."""
        steps = {step.key for lv in table.loaded.values() if lv.spec.pipeline is not None
                 for step in lv.spec.pipeline.steps}
        return [key for key, lv in table.loaded.items()
                if key[0] == model and lv.spec.pipeline is None and key not in steps]

    def _idle_models(self, table: RouteTable, now: float) -> list[str]:
        """Models whose route scales to zero, with nothing in flight and no request for longer
        than its timeout, that still have versions to unload here."""
        due = []
        for name, route in table.routes.items():
            after = route.scale_to_zero_after_s
            if after <= 0:
                continue
            activity = self.dataplane.activity.get(name)
            if activity is None:  # first seen: the idle clock starts now
                self.dataplane.activity[name] = [0, now]
                continue
            if activity[0] == 0 and now - activity[1] >= after \
                    and self._sleepable(name, table) and name not in self._waking:
                due.append(name)
        return due

    async def scale_idle(self) -> list[str]:
        """Unload the versions of every model idle past its route's timeout (the route stays:
        the next request loads them again); the models scaled to zero."""
        if not self._idle_models(self.dataplane.table, monotonic()):
            return []
        async with self._lock:
            table = self.dataplane.table
            due = self._idle_models(table, monotonic())  # again: no await since this check
            if not due:
                return []
            loaded, status = dict(table.loaded), dict(table.status)
            for name in due:
                for key in self._sleepable(name, table):
                    lv = loaded.pop(key)
                    self._asleep[key] = lv.spec
                    self.dataplane.asleep[key] = lv.stats
                    status[key] = (SCALED_TO_ZERO, None)
            self.dataplane.table = replace(table, loaded=loaded, status=status)
            keep = {id(lv) for lv in loaded.values()}
            for lv in table.loaded.values():
                if id(lv) not in keep:
                    self._spawn(self._retire(lv, trim=True))
        log.info("scaled to zero (idle): %s", ", ".join(due))
        await self.heartbeat()
        return due

    def wake(self, model: str) -> asyncio.Task:
        """The load of `model`'s scaled-to-zero versions: one task that every request waiting
        for them shares (await it shielded)."""
        task = self._waking.get(model)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._cold_load(model, monotonic()))
            self._waking[model] = task
            task.add_done_callback(lambda _t: self._waking.pop(model, None))
        return task

    async def _cold_load(self, model: str, started: float) -> None:
        """Load the model's scaled-to-zero versions and swap them into the table, recording
        each one's cold start (from the first request's arrival). Waits for a reconcile in
        progress (a rollout), and wakes whatever versions are asleep once it has finished."""
        async with self._lock:
            specs = [spec for key, spec in self._asleep.items() if key[0] == model]
            if not specs:
                return
            results = await asyncio.gather(*(self._load(spec) for spec in specs))
            seconds = monotonic() - started
            table = self.dataplane.table
            loaded, status = dict(table.loaded), dict(table.status)
            for spec, outcome in results:
                self._asleep.pop(spec.key, None)
                self.dataplane.asleep.pop(spec.key, None)
                if isinstance(outcome, str):
                    self._failed[spec.key] = (spec, outcome)
                    status[spec.key] = ("FAILED", outcome)
                    log.warning("model %s version %s FAILED to wake: %s", spec.model,
                                spec.version, outcome)
                else:
                    outcome.stats.record_cold_start(seconds)
                    loaded[spec.key] = outcome
                    status[spec.key] = ("READY", None)
            self.dataplane.activity.setdefault(model, [0, 0.0])[1] = monotonic()
            self.dataplane.table = replace(table, loaded=loaded, status=status)
        log.info("model %s woke from zero in %.2f s", model, seconds)
        self._spawn(self.heartbeat())  # the waiting requests need not wait for the report


def release_free_memory() -> None:
    """Return freed heap pages to the system (glibc's malloc_trim), so a model unloaded for
    scale to zero shows in the process's resident memory; a no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
