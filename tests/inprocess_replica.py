"""A serving replica in this process: DataPlane + Reconciler + the ASGI app over a fixed desired
state, driven through httpx, with wall and monotonic clocks the spec moves by hand and quota
syncs when the spec says (the sync loop's interval is an hour)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import onnx

from registry import samples
from registry.signatures import extract_signature
from serving.core.dataplane import DataPlane
from serving.core.desired_state import BatchingConfig, DesiredState, ModelRoute, VersionSpec
from serving.core.rate_limits import Admission
from serving.core.reconciler import Reconciler
from serving.http.app import ServingApp, ServingSettings

ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.25] * 64}]}


class Clock:
    """A clock the spec moves by hand."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class StaticSource:
    """A fixed desired state: what a registry (or a folder) would ship."""

    def __init__(self, state: DesiredState) -> None:
        self.state = state

    def revision(self) -> int:
        return self.state.revision

    def fetch(self) -> DesiredState:
        return self.state

    def report(self, observed) -> None:
        self.observed = observed  # the last heartbeat, for specs that read it

    def subscribe(self, callback) -> None:
        pass


def mlp_state(tmp: Path, route: ModelRoute) -> DesiredState:
    """`route` (model m) with its stable version 1: a small MLP."""
    data = samples.mlp(seed=0)
    path = tmp / "m-1.onnx"
    path.write_bytes(data)
    spec = VersionSpec(model=route.model, version="1", artifact_path=str(path),
                       sha256=hashlib.sha256(data).hexdigest(),
                       signature=extract_signature(onnx.load_from_string(data)),
                       batching=BatchingConfig(max_batch_size=8), intra_op_threads=1)
    return DesiredState(1, {route.model: route}, {spec.key: spec})


class InProcessReplica:
    def __init__(self, name: str, state: DesiredState, *, store=None, wall: Clock,
                 mono: Clock | None = None) -> None:
        self.wall, self.mono = wall, mono or Clock(1000.0)
        self.admission = Admission(store=store, clock=self.wall, monotonic=self.mono,
                                   sync_seconds=3600)
        self.dataplane = DataPlane(replica=name, admission=self.admission)
        self.reconciler = Reconciler(StaticSource(state), self.dataplane, poll_seconds=3600,
                                     heartbeat_seconds=3600, intra_op_threads=1)
        self.app = ServingApp(self.dataplane, self.reconciler, ServingSettings())
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                      base_url="http://replica")

    async def start(self) -> InProcessReplica:
        await self.reconciler.reconcile()
        return self

    async def infer(self, key: str | None = None, path: str | None = None,
                    **headers) -> httpx.Response:
        if key:
            headers["X-Api-Key"] = key
        model = next(iter(self.dataplane.table.routes))
        return await self.http.post(path or f"/v2/models/{model}/infer", json=ROW,
                                    headers=headers)

    async def sync(self) -> None:
        await self.admission.sync(self.dataplane.table.limited_routes())

    async def stop(self) -> None:
        await self.app.shutdown()
        await self.reconciler.stop()
