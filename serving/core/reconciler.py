"""Desired → observed: follow a DesiredStateSource, load and warm what it names (off the event
loop), swap one route-table reference, drain and unload what no route uses any more.

Everything that can block (the source's database or folder, hashing, onnxruntime session
creation and warm-up) runs in worker threads; the event loop only swaps references. If the
source raises, the replica keeps serving its last table and says why (degraded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from time import monotonic

from serving.core.batching import DynamicBatcher
from serving.core.dataplane import DataPlane, LoadedVersion, RouteTable
from serving.core.desired_state import (
    SCALED_TO_ZERO,
    DesiredState,
    DesiredStateSource,
    ModelRoute,
    ObservedState,
    VersionSpec,
)
from serving.core.hashing import file_sha256
from serving.core.pipeline import PipelineBatcher, PipelineRuntime
from serving.core.runtime import TENSORRT, OnnxRuntime, select_providers
from serving.core.scale_to_zero import ScaleToZero, release_free_memory
from serving.core.stats import VersionStats
from serving.core.tensor_signature import batch_dimension
from serving.core.trt_cache import engine_dir

log = logging.getLogger(__name__)


class LoadFailed(Exception):
    """A version could not be verified, loaded or warmed up; the message is the reason."""


class FetchFailed(Exception):
    """The source could not fetch a version's artifact (an object store not answering): tried
    again at every poll, unlike a LoadFailed, which waits for a new spec."""


def load_version(spec: VersionSpec, *, intra_op_threads: int = 0,
                 providers: list[str] | None = None,
                 stats: VersionStats | None = None, tracing=None) -> LoadedVersion:
    """Verify, load and warm one version (blocking; call from a worker thread). `stats`: the
    counters it had before it was scaled to zero, to go on with; `tracing`: the data plane's
    serving.core.tracing.Tracing, for its batcher."""
    if spec.signature.get("error"):
        raise LoadFailed(spec.signature["error"])
    if not os.path.isfile(spec.artifact_path):
        raise LoadFailed(f"artifact {spec.artifact_path} does not exist")
    if spec.sha256:
        actual = file_sha256(spec.artifact_path)
        if actual != spec.sha256:
            raise LoadFailed(f"artifact sha256 mismatch: expected {spec.sha256}, "
                             f"file has {actual}")
    batched = spec.batching.max_batch_size > 0 and batch_dimension(spec.signature)
    config = spec.batching if batched else dataclasses.replace(spec.batching, max_batch_size=0)
    chosen = select_providers(providers)
    trt: dict = {}
    if TENSORRT in chosen and spec.trt_cache_root:
        folder, _, profile = engine_dir(
            spec.trt_cache_root, sha256=spec.sha256 or file_sha256(spec.artifact_path),
            precision=spec.trt_precision, signature=spec.signature,
            max_batch_size=config.max_batch_size)
        trt = {"trt_cache_dir": folder, "trt_fp16": spec.trt_precision == "fp16",
               "trt_profile": profile}
    try:
        runtime = OnnxRuntime(
            spec.artifact_path, providers=chosen,
            intra_op_threads=spec.intra_op_threads or intra_op_threads,
            graph_optimization_level=spec.graph_optimization_level,
            instance_count=config.instance_count, **trt,
        ).load()
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise LoadFailed(f"onnxruntime could not load it: {exc}") from None
    sizes = (1, config.max_batch_size) if config.max_batch_size > 1 else (1,)
    try:
        runtime.warmup(spec.signature, batch_sizes=sizes)
    except Exception as exc:  # noqa: BLE001
        runtime.unload()
        raise LoadFailed(f"warm-up failed: {exc}") from None
    stats = stats or VersionStats(spec.model, spec.version)
    batcher = DynamicBatcher(runtime.predict, config, stats, tracing=tracing)
    return LoadedVersion(spec=spec, runtime=runtime, batcher=batcher, stats=stats,
                         max_batch_size=config.max_batch_size)


def load_pipeline(spec: VersionSpec, dataplane: DataPlane) -> LoadedVersion:
    """A pipeline version: nothing to load of its own; its steps are versions in the same
    desired state, found in the table the replica serves at request time."""
    runtime = PipelineRuntime(spec.pipeline, spec.signature,
                              lambda key: dataplane.table.loaded.get(key),
                              max_output_bytes=dataplane.max_output_bytes).load()
    stats = VersionStats(spec.model, spec.version)
    return LoadedVersion(spec=spec, runtime=runtime, batcher=PipelineBatcher(runtime, stats),
                         stats=stats, max_batch_size=spec.batching.max_batch_size)


class Reconciler(ScaleToZero):
    """Keeps a DataPlane's route table following one source (and, per route, scales idle
    models to zero: serving.core.scale_to_zero)."""

    def __init__(
        self, source: DesiredStateSource, dataplane: DataPlane, *, poll_seconds: float = 1.0,
        heartbeat_seconds: float = 2.0, intra_op_threads: int = 0,
        providers: list[str] | None = None, load_workers: int = 2,
        idle_check_seconds: float = 0.5, cold_start_wait_seconds: float = 30.0,
    ) -> None:
        self.source = source
        self.dataplane = dataplane
        self.poll_seconds = poll_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.intra_op_threads = intra_op_threads
        self.providers = providers or None
        self._io = ThreadPoolExecutor(1, thread_name_prefix="mmc-source")
        self._loader = ThreadPoolExecutor(load_workers, thread_name_prefix="mmc-load")
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._draining: set[asyncio.Task] = set()
        self._loading: dict[tuple[str, str], VersionSpec] = {}
        self._failed: dict[tuple[str, str], tuple[VersionSpec, str]] = {}
        # Pipeline versions held back because a step is not loaded: key -> why.
        self._waiting: dict[tuple[str, str], str] = {}
        self._unfetched: dict[tuple[str, str], str] = {}  # artifact fetch failed: retrying
        self._seen_revision: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Scale to zero: versions unloaded for want of requests (key -> spec; their stats are
        # in dataplane.asleep), and the one load per model that requests wait for.
        self.idle_check_seconds = idle_check_seconds
        self._asleep: dict[tuple[str, str], VersionSpec] = {}
        self._waking: dict[str, asyncio.Task] = {}
        self._background: set[asyncio.Task] = set()
        dataplane.source = source
        dataplane.on_repository_change = self.reconcile
        dataplane.loading = self._loading
        dataplane.wake = self.wake
        dataplane.cold_start_wait_s = cold_start_wait_seconds

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe and start the loops; the first reconcile runs at once in the poll loop,
        in the background, so the process is live while its models load."""
        self._loop = asyncio.get_running_loop()
        try:
            await self._call(self.source.subscribe, self._notify)
        except Exception as exc:  # noqa: BLE001 - polling still works without push
            log.warning("could not subscribe to route revisions: %s", exc)
        self._tasks = [asyncio.create_task(self._poll_loop()),
                       asyncio.create_task(self._heartbeat_loop()),
                       asyncio.create_task(self._idle_loop())]

    async def stop(self, *, leave_seconds: float = 5.0) -> None:
        """Stop the loops, release every session, then leave the source: the last word, so no
        heartbeat re-registers the replica after it (the source's one thread runs in order)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        table = self.dataplane.table
        for lv in table.loaded.values():
            self.dataplane.retire(lv)
            lv.batcher.close()
            lv.runtime.unload()
        await self._leave(leave_seconds)
        self._io.shutdown(wait=False, cancel_futures=True)
        self._loader.shutdown(wait=False, cancel_futures=True)

    async def _leave(self, seconds: float) -> None:
        """`source.leave(replica)` where the source offers it; a failure is logged, not raised
        (the registry then shows the replica as lost, as if it had been killed)."""
        leave = getattr(self.source, "leave", None)
        if leave is None:
            return
        try:
            await asyncio.wait_for(self._call(leave, self.dataplane.replica), seconds)
        except Exception as exc:  # noqa: BLE001 - shutting down: say so and go on
            log.warning("could not leave the route source: %s: %s", type(exc).__name__, exc)

    def _notify(self, revision: int | None = None) -> None:
        """Source push (any thread): wake the poll loop now."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    async def _poll_loop(self) -> None:
        while True:
            await self.reconcile()
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
            except TimeoutError:
                pass
            self._wake.clear()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            await self.heartbeat()

    # -- one reconcile -----------------------------------------------------------------------

    async def reconcile(self, *, force: bool = False) -> bool:
        """Converge on the source's newest revision; True when a new table was installed.
        Never raises for a source failure: that marks the replica degraded instead."""
        async with self._lock:
            try:
                revision = await self._call(self.source.revision)
                if not force and revision == self._seen_revision:
                    self._set_degraded(None)
                    return False
                desired: DesiredState = await self._call(self.source.fetch)
            except Exception as exc:  # noqa: BLE001 - DB/Redis/folder down: keep serving
                self._set_degraded(f"route source unavailable: {type(exc).__name__}: {exc}")
                return False
            self._set_degraded(None)
            await self._apply(desired)
            # an artifact that could not be fetched is tried again at the next poll
            self._seen_revision = None if self._unfetched else revision
        await self.heartbeat()
        return True

    async def _apply(self, desired: DesiredState) -> None:
        """Load what is missing, build the new table, swap it in, retire what it no longer uses."""
        old = self.dataplane.table
        self._follow_asleep(desired)
        fresh = await self._load_missing(desired, old)
        for key in set(self.dataplane.asleep) - set(self._asleep):
            del self.dataplane.asleep[key]  # loaded again (or failed): counted there now
        loaded = self._keep_loaded(desired, fresh, old)
        self._hold_back_pipelines(desired, loaded)
        routes = self._build_routes(desired, loaded, old)
        status = self._version_status(desired, loaded)
        self.dataplane.table = RouteTable(desired.revision, routes, loaded, status,
                                          desired.step_routes)  # the swap
        self.dataplane.started = True
        self._retire_unused(old, loaded)
        now = monotonic()
        for model in {key[0] for key in fresh}:  # just loaded: the idle clock starts again
            self.dataplane.activity.setdefault(model, [0, now])[1] = now

    def _follow_asleep(self, desired: DesiredState) -> None:
        """A scaled-to-zero version stays asleep while its route still scales to zero (with its
        newest spec); one no longer desired is forgotten, one whose route stopped scaling to
        zero is loaded by this reconcile (its counters go on)."""
        for key in list(self._asleep):
            spec = desired.versions.get(key)
            route = desired.routes.get(key[0])
            if spec is None or route is None:
                del self._asleep[key]
                self.dataplane.asleep.pop(key, None)
            elif route.scale_to_zero_after_s > 0:
                self._asleep[key] = spec
            else:
                del self._asleep[key]  # loaded below, with the stats kept in dataplane.asleep

    async def _load_missing(self, desired: DesiredState,
                            old: RouteTable) -> dict[tuple[str, str], LoadedVersion]:
        """Load (in parallel, off the loop) every version the old table lacks or has with other
        settings; a failure is remembered so the same spec is not retried every poll."""
        to_load = []
        for key, spec in desired.versions.items():
            if key in self._asleep:
                continue
            have = old.loaded.get(key)
            if have is not None and have.spec == spec:
                continue
            failed = self._failed.get(key)
            if failed is not None and failed[0] == spec:
                continue  # the same artifact and settings failed before: do not retry
            to_load.append(spec)
        results = await asyncio.gather(*(self._load(s) for s in to_load))
        fresh: dict[tuple[str, str], LoadedVersion] = {}
        self._unfetched = {}
        for spec, outcome in results:
            if isinstance(outcome, FetchFailed):
                self._unfetched[spec.key] = f"{outcome}; retrying"
                log.warning("model %s version %s: %s; retrying", spec.model, spec.version,
                            outcome)
            elif isinstance(outcome, str):
                self._failed[spec.key] = (spec, outcome)
                log.warning("model %s version %s FAILED: %s", spec.model, spec.version, outcome)
            else:
                self._failed.pop(spec.key, None)
                self.dataplane.admit(outcome)
                fresh[spec.key] = outcome
        return fresh

    async def _load(self, spec: VersionSpec
                    ) -> tuple[VersionSpec, LoadedVersion | str | FetchFailed]:
        """One version fetched (where the source fetches artifacts) and loaded in the loader
        pool: the LoadedVersion, why it failed, or the FetchFailed to try again."""
        if spec.pipeline is not None:
            return spec, load_pipeline(spec, self.dataplane)
        self._loading[spec.key] = spec
        fetch = getattr(self.source, "fetch_artifact", None)
        stats = self.dataplane.asleep.get(spec.key)  # scaled to zero: its counters go on

        def fetch_and_load() -> LoadedVersion:
            if fetch is not None:
                try:
                    fetch(spec)
                except LoadFailed:
                    raise  # the artifact is there but wrong, or gone: that version fails
                except Exception as exc:  # noqa: BLE001 - an object store raises many types
                    raise FetchFailed(f"could not fetch the artifact: {type(exc).__name__}: "
                                      f"{exc}") from None
            return load_version(spec, intra_op_threads=self.intra_op_threads,
                                providers=self.providers, stats=stats,
                                tracing=self.dataplane.tracing)

        try:
            return spec, await asyncio.get_running_loop().run_in_executor(
                self._loader, fetch_and_load)
        except LoadFailed as exc:
            return spec, str(exc)
        except FetchFailed as exc:
            return spec, exc
        except Exception as exc:  # noqa: BLE001 - any failure is that version's alone
            return spec, f"{type(exc).__name__}: {exc}"
        finally:
            self._loading.pop(spec.key, None)

    @staticmethod
    def _keep_loaded(desired: DesiredState, fresh: dict[tuple[str, str], LoadedVersion],
                     old: RouteTable) -> dict[tuple[str, str], LoadedVersion]:
        """Desired versions that are loaded: freshly, or already with the same spec."""
        loaded: dict[tuple[str, str], LoadedVersion] = {}
        for key, spec in desired.versions.items():
            if key in fresh:
                loaded[key] = fresh[key]
            elif key in old.loaded and old.loaded[key].spec == spec:
                loaded[key] = old.loaded[key]
        return loaded

    def _hold_back_pipelines(self, desired: DesiredState,
                             loaded: dict[tuple[str, str], LoadedVersion]) -> None:
        """A pipeline version serves only while every step version is loaded here: one whose
        step failed is reported with the step's reason and never routed to."""
        self._waiting = {}
        for key, spec in desired.versions.items():
            if spec.pipeline is None or key not in loaded:
                continue
            for step in spec.pipeline.steps:
                if step.key not in loaded:
                    failed = self._failed.get(step.key)
                    why = failed[1] if failed else "not loaded"
                    self._waiting[key] = (f"step '{step.name}' ({step.model}:{step.version}) "
                                          f"is not loaded: {why}")
                    del loaded[key]
                    break

    def _build_routes(self, desired: DesiredState, loaded: dict[tuple[str, str], LoadedVersion],
                      old: RouteTable) -> dict[str, ModelRoute]:
        """Every desired route, made routable; a kept old route keeps its versions in `loaded`."""
        routes: dict[str, ModelRoute] = {}
        # a scaled-to-zero version counts as routable: a request wakes it
        available = set(loaded) | set(self._asleep)
        before = set(old.loaded) | {k for k, (state, _) in old.status.items()
                                    if state == SCALED_TO_ZERO and k in self._asleep}
        for name, route in desired.routes.items():
            routes[name] = self._routable(route, available, old, name, before)
            for v in routes[name].versions():
                if (name, v) not in loaded and (name, v) in old.loaded:
                    loaded[(name, v)] = old.loaded[(name, v)]
        return routes

    def _version_status(self, desired: DesiredState, loaded: dict[tuple[str, str], LoadedVersion],
                        ) -> dict[tuple[str, str], tuple[str, str | None]]:
        """READY / FAILED (why) / UNAVAILABLE per desired version; forgets failures of versions
        no longer desired."""
        status: dict[tuple[str, str], tuple[str, str | None]] = {}
        for key in desired.versions:
            if key in loaded:
                status[key] = ("READY", None)
            elif key in self._asleep:
                status[key] = (SCALED_TO_ZERO, None)
            elif key in self._failed:
                status[key] = ("FAILED", self._failed[key][1])
            elif key in self._waiting:
                status[key] = ("UNAVAILABLE", self._waiting[key])
            elif key in self._unfetched:
                status[key] = ("UNAVAILABLE", self._unfetched[key])
            else:
                status[key] = ("UNAVAILABLE", "not loaded")
        for key in set(self._failed) - set(desired.versions):
            del self._failed[key]
        return status

    def _retire_unused(self, old: RouteTable,
                       loaded: dict[tuple[str, str], LoadedVersion]) -> None:
        """Drain and unload, in the background, every old version the new table dropped."""
        keep = {id(lv) for lv in loaded.values()}
        loop = asyncio.get_running_loop()
        for lv in old.loaded.values():
            if id(lv) not in keep:
                self.dataplane.retire(lv)  # its cached answers go now, not after the drain
                task = loop.create_task(self._retire(lv))
                self._draining.add(task)
                task.add_done_callback(self._draining.discard)

    @staticmethod
    def _routable(route: ModelRoute, loaded: set, old: RouteTable, name: str,
                  before: set) -> ModelRoute:
        """Never route to a version that is not loaded (or scaled to zero): keep the previous
        route if it still works, else drop the failed side (a failed candidate gets no
        traffic). `loaded` / `before`: the keys servable in the new / the old table."""
        if all((name, v) in loaded for v in route.serving_versions()):
            return route
        previous = old.routes.get(name)
        if previous is not None and all(
                (name, v) in before for v in previous.serving_versions()
        ) and previous.serving_versions():
            return previous
        changes: dict = {}
        if route.candidate and (name, route.candidate) not in loaded:
            changes.update(candidate=None, candidate_weight=0)
        return dataclasses.replace(route, **changes) if changes else route

    async def _retire(self, lv: LoadedVersion, *, trim: bool = False) -> None:
        """Let in-flight requests finish, then release the session; `trim`: then hand the
        freed heap back to the system (scale to zero is about that memory)."""
        try:
            await lv.batcher.drain()
        finally:
            lv.batcher.close()
            lv.runtime.unload()
            if trim:
                release_free_memory()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- observed state ----------------------------------------------------------------------

    def _set_degraded(self, reason: str | None) -> None:
        if reason != self.dataplane.degraded:
            if reason:
                log.warning("serving degraded: %s", reason)
            else:
                log.info("route source reachable again")
        self.dataplane.degraded = reason

    def observed(self) -> ObservedState:
        table = self.dataplane.table
        versions: dict[str, dict] = {}
        for (model, version), lv in table.loaded.items():
            versions[f"{model}:{version}"] = {
                "state": "READY", "reason": None, "providers": list(lv.runtime.providers),
                "queue_depth": lv.batcher.queue_depth, "stats": lv.stats.snapshot()}
            captured = self.dataplane.capture.snapshot(model, version)
            if captured is not None:
                versions[f"{model}:{version}"]["capture"] = captured
        for model, shadow in self.dataplane.shadow.items():
            key = f"{model}:{shadow.version}"
            if key in versions:
                versions[key]["shadow"] = shadow.to_json()
        for model, mirror in self.dataplane.mirror.items():
            key = f"{model}:{mirror.version}"
            if key in versions:
                versions[key]["mirror"] = mirror.to_json()
        for (model, version), (_spec, reason) in self._failed.items():
            versions.setdefault(f"{model}:{version}", {
                "state": "FAILED", "reason": reason, "providers": [], "queue_depth": 0})
        for (model, version), reason in self._waiting.items():
            versions.setdefault(f"{model}:{version}", {
                "state": "FAILED", "reason": reason, "providers": [], "queue_depth": 0})
        for (model, version), reason in self._unfetched.items():
            versions.setdefault(f"{model}:{version}", {
                "state": "LOADING", "reason": reason, "providers": [], "queue_depth": 0})
        for (model, version) in self._loading:
            versions.setdefault(f"{model}:{version}", {
                "state": "LOADING", "reason": None, "providers": [], "queue_depth": 0})
        for (model, version), stats in list(self.dataplane.asleep.items()):
            versions.setdefault(f"{model}:{version}", {
                "state": SCALED_TO_ZERO, "reason": None, "providers": [], "queue_depth": 0,
                "stats": stats.snapshot()})
        return ObservedState(replica=self.dataplane.replica, revision=table.revision,
                             versions=versions, degraded=self.dataplane.degraded)

    async def heartbeat(self) -> None:
        try:
            await self._call(self.source.report, self.observed())
        except Exception as exc:  # noqa: BLE001
            self._set_degraded(f"cannot report to route source: {type(exc).__name__}: {exc}")

