"""Desired → observed: a replica follows its source, switches versions without failing a request,
never routes to a version that failed warm-up, and keeps serving when the source goes away."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import threading
import time
from pathlib import Path

import httpx
import onnx
import pytest
from test_app import Server, reshape_by_input, write_model

from registry import samples
from registry.signatures import extract_signature
from serving.core.dataplane import DataPlane
from serving.core.desired_state import (
    BatchingConfig,
    DesiredState,
    ModelRoute,
    ObservedState,
    VersionSpec,
)
from serving.core.reconciler import LoadFailed, Reconciler
from serving.http.app import ServingApp, ServingSettings

ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.25] * 64}]}


# -- a real process following a model repository ---------------------------------------------


def test_a_new_stable_version_takes_over_with_zero_failed_requests(tmp_path):
    root = tmp_path / "models"
    write_model(root, "mlp", "1", samples.mlp(seed=0), {"max_batch_size": 8})
    server = Server(root)
    try:
        server.wait_ready()
        answers: list[tuple[int, str | None]] = []
        stop = threading.Event()

        def loop() -> None:
            with httpx.Client(timeout=10) as c:
                while not stop.is_set():
                    r = c.post(f"{server.url}/v2/models/mlp/infer", json=ROW)
                    answers.append((r.status_code, r.headers.get("x-model-version")))

        worker = threading.Thread(target=loop)
        worker.start()
        try:
            while len(answers) < 20:
                time.sleep(0.01)
            write_model(root, "mlp", "2", samples.mlp(seed=1),
                        {"max_batch_size": 8, "stable": "2"})
            deadline = time.time() + 20
            while time.time() < deadline and (not answers or answers[-1][1] != "2"):
                time.sleep(0.02)
            seen = len(answers)
            while len(answers) < seen + 20:
                time.sleep(0.01)
        finally:
            stop.set()
            worker.join()
        assert [a for a in answers if a[0] != 200] == []
        versions = [v for _, v in answers]
        switch = versions.index("2")
        assert set(versions[:switch]) == {"1"} and set(versions[switch:]) == {"2"}
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert [(e["version"], e["state"]) for e in index] == [("1", "READY"), ("2", "READY")]
    finally:
        server.stop()


# -- in process, with a source we control ----------------------------------------------------


class FakeSource:
    """A DesiredStateSource whose desired state, failures and pushes the test sets."""

    def __init__(self, state: DesiredState) -> None:
        self.state = state
        self.broken: str | None = None
        self.reports: list[ObservedState] = []
        self.callbacks: list = []

    def revision(self) -> int:
        if self.broken:
            raise ConnectionError(self.broken)
        return self.state.revision

    def fetch(self) -> DesiredState:
        if self.broken:
            raise ConnectionError(self.broken)
        return self.state

    def report(self, observed: ObservedState) -> None:
        if self.broken:
            raise ConnectionError(self.broken)
        self.reports.append(observed)

    def subscribe(self, callback) -> None:
        self.callbacks.append(callback)

    def publish(self, state: DesiredState) -> None:
        self.state = state
        for cb in self.callbacks:
            threading.Thread(target=cb, args=(state.revision,)).start()


def spec(tmp: Path, version: str, data: bytes, *, sha256: str | None = None,
         max_batch_size: int = 8) -> VersionSpec:
    path = tmp / f"m-{version}.onnx"
    path.write_bytes(data)
    return VersionSpec(
        model="m", version=version, artifact_path=str(path),
        sha256=sha256 if sha256 is not None else hashlib.sha256(data).hexdigest(),
        signature=extract_signature(onnx.load_from_string(data)),
        batching=BatchingConfig(max_batch_size=max_batch_size), intra_op_threads=1)


def desired(revision: int, route: ModelRoute, *specs: VersionSpec) -> DesiredState:
    return DesiredState(revision, {"m": route}, {s.key: s for s in specs})


@pytest.fixture
def good(tmp_path) -> tuple[VersionSpec, VersionSpec]:
    return spec(tmp_path, "1", samples.mlp(seed=0)), spec(tmp_path, "2", samples.mlp(seed=1))


class Replica:
    """DataPlane + Reconciler + the ASGI app, driven in-process through httpx."""

    def __init__(self, source: FakeSource, poll_seconds: float = 60.0) -> None:
        self.dataplane = DataPlane(replica="t1")
        self.reconciler = Reconciler(source, self.dataplane, poll_seconds=poll_seconds,
                                     heartbeat_seconds=60, intra_op_threads=1)
        self.app = ServingApp(self.dataplane, self.reconciler, ServingSettings())
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                      base_url="http://replica")

    async def infer(self, version: str | None = None) -> httpx.Response:
        path = f"/v2/models/m/versions/{version}/infer" if version else "/v2/models/m/infer"
        return await self.http.post(path, json=ROW)

    def states(self) -> dict[str, tuple[str, str]]:
        return {e["version"]: (e["state"], e["reason"])
                for e in self.dataplane.repository_index()}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_version_that_fails_warm_up_is_reported_and_never_routed_to(tmp_path, good):
    broken = spec(tmp_path, "3", reshape_by_input())
    source = FakeSource(desired(1, ModelRoute("m", stable="1"), good[0]))

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        source.state = desired(2, ModelRoute("m", stable="1", candidate="3", candidate_weight=50),
                               good[0], broken)
        await replica.reconciler.reconcile()
        answered = {(await replica.infer()).headers["x-model-version"] for _ in range(30)}
        assert answered == {"1"}
        state, reason = replica.states()["3"]
        assert state == "UNAVAILABLE" and "warm-up failed" in reason
        pinned = await replica.infer("3")
        assert pinned.status_code == 503 and "warm-up failed" in pinned.json()["error"]
        observed = replica.reconciler.observed()
        assert observed.versions["m:3"]["state"] == "FAILED"
        assert observed.revision == 2 and source.reports[-1].revision == 2
        # Promoting the broken version does not take traffic away from the working one.
        source.state = desired(3, ModelRoute("m", stable="3"), good[0], broken)
        await replica.reconciler.reconcile()
        r = await replica.infer()
        assert r.status_code == 200 and r.headers["x-model-version"] == "1"
        await replica.reconciler.stop()

    run(main())


def test_an_artifact_whose_sha256_differs_is_not_loaded(tmp_path, good):
    tampered = dataclasses.replace(good[1], sha256="0" * 64)
    source = FakeSource(desired(1, ModelRoute("m", stable="1", warm=("2",)), good[0], tampered))

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        state, reason = replica.states()["2"]
        assert state == "UNAVAILABLE" and "sha256 mismatch" in reason
        assert (await replica.infer()).status_code == 200
        await replica.reconciler.stop()

    run(main())


class FetchingSource(FakeSource):
    """Like the registry on an object store: a version's file is there only once fetched."""

    def __init__(self, state: DesiredState, blobs: dict[str, bytes]) -> None:
        super().__init__(state)
        self.blobs = blobs
        self.store_down: str | None = None

    def fetch_artifact(self, spec: VersionSpec) -> None:
        if self.store_down:
            raise ConnectionError(self.store_down)
        if spec.sha256 not in self.blobs:
            raise LoadFailed(f"blob {spec.sha256} is not in the store")
        Path(spec.artifact_path).write_bytes(self.blobs[spec.sha256])


def test_an_artifact_the_store_cannot_hand_over_yet_is_fetched_at_a_later_poll(tmp_path, good):
    blobs = {s.sha256: Path(s.artifact_path).read_bytes() for s in good}
    for s in good:
        Path(s.artifact_path).unlink()  # a replica on another host: nothing local yet
    gone = dataclasses.replace(good[1], version="3", sha256="f" * 64,
                               artifact_path=str(tmp_path / "m-3.onnx"))
    source = FetchingSource(desired(1, ModelRoute("m", stable="1"), good[0]), blobs)

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        assert (await replica.infer()).headers["x-model-version"] == "1"
        source.store_down = "object store not answering"
        source.state = desired(2, ModelRoute("m", stable="2"), *good)
        await replica.reconciler.reconcile()
        state, reason = replica.states()["2"]
        assert state == "UNAVAILABLE" and "object store not answering; retrying" in reason
        assert replica.reconciler.observed().versions["m:2"]["state"] == "LOADING"
        assert (await replica.infer()).headers["x-model-version"] == "1"  # still serving
        source.store_down = None
        assert await replica.reconciler.reconcile()  # a poll, same revision: fetched now
        assert (await replica.infer()).headers["x-model-version"] == "2"
        # a blob missing from the store fails that version, and is not fetched again and again
        source.state = desired(3, ModelRoute("m", stable="2", warm=("3",)), good[1], gone)
        await replica.reconciler.reconcile()
        assert replica.reconciler.observed().versions["m:3"]["state"] == "FAILED"
        assert not await replica.reconciler.reconcile()
        await replica.reconciler.stop()

    run(main())


def test_when_the_source_fails_the_replica_keeps_serving_and_says_it_is_degraded(good):
    source = FakeSource(desired(1, ModelRoute("m", stable="1"), *good))

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        source.broken = "database is down"
        await replica.reconciler.reconcile()
        ready = await replica.http.get("/v2/health/ready")
        assert ready.status_code == 200
        assert "database is down" in ready.json()["degraded"]
        r = await replica.infer()
        assert r.status_code == 200 and r.headers["x-model-version"] == "1"
        metrics = (await replica.http.get("/metrics")).text
        assert 'mmc_serving_degraded{reason="route source unavailable' in metrics
        assert "database is down" in metrics
        # It comes back with a newer revision: the replica catches up and is no longer degraded.
        source.broken = None
        source.state = desired(2, ModelRoute("m", stable="2"), *good)
        await replica.reconciler.reconcile()
        assert replica.dataplane.degraded is None
        assert (await replica.infer()).headers["x-model-version"] == "2"
        await replica.reconciler.stop()

    run(main())


def test_a_pushed_revision_is_applied_without_waiting_for_the_poll(good):
    source = FakeSource(desired(1, ModelRoute("m", stable="1"), good[0]))

    async def main():
        replica = Replica(source, poll_seconds=60)
        await replica.app.startup()
        while not replica.dataplane.ready()[0]:
            await asyncio.sleep(0.01)
        source.publish(desired(2, ModelRoute("m", stable="2"), *good))
        deadline = time.monotonic() + 20
        while replica.dataplane.table.revision != 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert (await replica.infer()).headers["x-model-version"] == "2"
        await replica.app.shutdown()

    run(main())


def test_a_version_no_route_uses_is_unloaded_after_its_requests_finish(good):
    source = FakeSource(desired(1, ModelRoute("m", stable="1"), good[0]))

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        old = replica.dataplane.table.loaded[("m", "1")]
        in_flight = [asyncio.create_task(replica.infer()) for _ in range(8)]
        await asyncio.sleep(0)
        source.state = desired(2, ModelRoute("m", stable="2"), good[1])
        await replica.reconciler.reconcile()
        assert all(r.status_code == 200 for r in await asyncio.gather(*in_flight))
        for _ in range(200):
            if not old.runtime.loaded:
                break
            await asyncio.sleep(0.01)
        assert not old.runtime.loaded
        assert ("m", "1") not in replica.dataplane.table.loaded
        assert (await replica.infer("1")).status_code == 404
        await replica.reconciler.stop()

    run(main())
