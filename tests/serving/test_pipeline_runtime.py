"""A pipeline on a replica: its steps run through their own versions' batchers, the composed
answer comes back under the pipeline's name and version, each step and the pipeline are counted
in the statistics, a step's error names the step, and a pipeline whose step cannot load is
reported with the step's reason and never routed to."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from registry import samples
from registry.signatures import extract_signature
from serving.core.dataplane import DataPlane
from serving.core.desired_state import BatchingConfig, DesiredState, ModelRoute, VersionSpec
from serving.core.pipeline_graph import (
    Edge,
    PipelineError,
    PipelineGraph,
    Step,
    check_graph,
    parse_end,
)
from serving.core.reconciler import Reconciler
from serving.http.app import ServingApp, ServingSettings
from tests.inprocess_replica import StaticSource

SPEC = {"steps": [{"name": "double", "model": "scaler", "version": 1},
                  {"name": "sum", "model": "adder", "version": 1}],
        "edges": [{"from": "x", "to": "double.x"}, {"from": "double.y", "to": "sum.a"},
                  {"from": "x", "to": "sum.b"}, {"from": "sum.sum", "to": "y"}]}
X = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.0, 10.0]]



def model_spec(tmp: Path, model: str, data: bytes, *, max_batch_size: int = 8,
               sha256: str | None = None) -> VersionSpec:
    path = tmp / f"{model}.onnx"
    path.write_bytes(data)
    return VersionSpec(model=model, version="1", artifact_path=str(path),
                       sha256=sha256 or hashlib.sha256(data).hexdigest(),
                       signature=extract_signature(onnx.load_from_string(data)),
                       batching=BatchingConfig(max_batch_size=max_batch_size),
                       intra_op_threads=1)


def pipeline_spec(steps: list[VersionSpec], spec: dict = SPEC, *, version: str = "1",
                  max_batch_size: int = 8) -> VersionSpec:
    graph = PipelineGraph.from_json(spec)
    signature = check_graph(list(graph.steps), list(graph.edges),
                            {s.name: next(v.signature for v in steps if v.model == s.model)
                             for s in graph.steps})
    return VersionSpec(model="p", version=version, artifact_path="", sha256="",
                       signature=signature,
                       batching=BatchingConfig(max_batch_size=max_batch_size), pipeline=graph)


def desired(route: ModelRoute, *specs: VersionSpec) -> DesiredState:
    return DesiredState(1, {route.model: route}, {s.key: s for s in specs})


async def replica(state: DesiredState):
    dataplane = DataPlane(replica="t1")
    reconciler = Reconciler(StaticSource(state), dataplane, poll_seconds=60, heartbeat_seconds=60,
                            intra_op_threads=1)
    await reconciler.reconcile()
    app = ServingApp(dataplane, reconciler, ServingSettings())
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica")
    return dataplane, reconciler, http


def body(x=X, name: str = "x") -> dict:
    return {"inputs": [{"name": name, "shape": [len(x), 4], "datatype": "FP32",
                        "data": [v for row in x for v in row]}]}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture
def steps(tmp_path) -> list[VersionSpec]:
    return [model_spec(tmp_path, "scaler", samples.scale(2.0)),
            model_spec(tmp_path, "adder", samples.add())]


def test_a_two_step_pipeline_answers_with_the_composed_numbers_and_counts_every_step(steps):
    async def main():
        dataplane, reconciler, http = await replica(
            desired(ModelRoute("p", stable="1"), *steps, pipeline_spec(steps)))
        r = await http.post("/v2/models/p/infer", json=body())
        assert r.status_code == 200, r.text
        assert r.headers["x-model-version"] == "1"
        out = r.json()["outputs"][0]
        assert out["name"] == "y" and out["shape"] == [2, 4]
        assert np.allclose(out["data"], (3 * np.array(X)).ravel())  # 2x + x
        meta = (await http.get("/v2/models/p")).json()
        assert meta["platform"] == "ensemble"
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
        for _ in range(4):
            assert (await http.post("/v2/models/p/versions/1/infer", json=body())
                    ).status_code == 200
        stats = {(s["name"], s["version"]): s
                 for s in (await http.get("/v2/models/stats")).json()["model_stats"]}
        assert set(stats) == {("p", "1"), ("scaler", "1"), ("adder", "1")}
        for key in stats:  # five pipeline requests: five through each step too
            assert stats[key]["inference_stats"]["success"]["count"] == 5, key
        assert stats[("p", "1")]["inference_count"] == 10  # rows
        # A step has no route of its own, and its statistics are still asked by name.
        step = (await http.get("/v2/models/adder/versions/1/stats")).json()["model_stats"]
        assert [s["inference_stats"]["success"]["count"] for s in step] == [5]
        # ...but it is not deployed: only the pipeline reaches it.
        direct = await http.post("/v2/models/adder/versions/1/infer", json=body(name="a"))
        assert direct.status_code == 404
        observed = reconciler.observed().versions
        assert {k: v["state"] for k, v in observed.items()} == {
            "p:1": "READY", "scaler:1": "READY", "adder:1": "READY"}
        assert observed["p:1"]["stats"]["count"] == 5
        await reconciler.stop()

    run(main())


def test_a_pipelines_answers_are_captured_under_its_own_name(steps):
    from registry.monitoring import capture_store
    from serving.core.capture import CaptureQueue, CaptureSettings

    async def main():
        dataplane, reconciler, http = await replica(desired(
            ModelRoute("p", stable="1", capture=CaptureSettings(100)), *steps,
            pipeline_spec(steps)))
        stored = []
        dataplane.capture = CaptureQueue(stored.append, flush_s=3600, encoder="thread")
        answers = [await http.post("/v2/models/p/infer", json=body([[float(i), 1, 2, 3]]),
                                   headers={"x-request-id": f"p-{i}"}) for i in range(3)]
        assert [r.status_code for r in answers] == [200] * 3
        assert dataplane.capture.flush() == 3
        dataplane.capture.stop()
        records = [r for f in stored for r in capture_store.decode(f.payload)]
        assert sorted(r["id"] for r in records) == ["p-0", "p-1", "p-2"]
        for r in records:
            i = int(r["id"][2:])
            assert (r["model"], r["version"], r["role"]) == ("p", 1, "stable")
            assert r["inputs"]["x"]["data"] == [i, 1, 2, 3]
            assert r["outputs"]["y"]["data"] == [3 * v for v in (i, 1, 2, 3)]
        await reconciler.stop()

    run(main())


def test_concurrent_pipeline_requests_are_batched_by_each_step(steps):
    async def main():
        dataplane, reconciler, http = await replica(
            desired(ModelRoute("p", stable="1"), *steps, pipeline_spec(steps)))
        rows = [[[float(i), 1.0, 2.0, 3.0]] for i in range(24)]
        answers = await asyncio.gather(*(http.post("/v2/models/p/infer", json=body(x))
                                         for x in rows))
        for x, r in zip(rows, answers, strict=True):  # every caller gets its own rows back
            assert r.status_code == 200, r.text
            assert np.allclose(r.json()["outputs"][0]["data"], 3 * np.array(x).ravel())
        scaler = dataplane.table.loaded[("scaler", "1")].stats
        assert scaler.success_count == 24
        assert scaler.execution_count < 24  # some model runs served several requests
        await reconciler.stop()

    run(main())


def test_a_step_failure_is_the_clients_error_and_names_the_step(tmp_path):
    unbatched = [model_spec(tmp_path, "scaler", samples.scale(2.0), max_batch_size=0),
                 model_spec(tmp_path, "adder", samples.add(), max_batch_size=0)]
    two_inputs = {"steps": SPEC["steps"],
                  "edges": [{"from": "x", "to": "double.x"}, {"from": "double.y", "to": "sum.a"},
                            {"from": "z", "to": "sum.b"}, {"from": "sum.sum", "to": "y"}]}

    async def main():
        dataplane, reconciler, http = await replica(desired(
            ModelRoute("p", stable="1"), *unbatched,
            pipeline_spec(unbatched, two_inputs, max_batch_size=0)))
        request = body()
        request["inputs"].append(body([[1.0] * 4] * 3, name="z")["inputs"][0])  # 2 rows vs 3
        r = await http.post("/v2/models/p/infer", json=request)
        assert r.status_code == 400, r.text
        assert r.json()["error"].startswith("pipeline step 'sum': model 'adder' version '1'")
        stats = dataplane.table.loaded[("p", "1")].stats
        assert (stats.success_count, stats.fail_count) == (0, 1)
        await reconciler.stop()

    run(main())


def test_a_pipeline_whose_step_cannot_load_is_reported_and_never_routed_to(tmp_path, steps):
    broken = model_spec(tmp_path, "adder", samples.add(), sha256="0" * 64)

    async def main():
        dataplane, reconciler, http = await replica(
            desired(ModelRoute("p", stable="1"), steps[0], broken,
                    pipeline_spec([steps[0], broken])))
        r = await http.post("/v2/models/p/infer", json=body())
        assert r.status_code == 503
        index = {(e["name"], e["version"]): e for e in dataplane.repository_index()}
        assert index[("p", "1")]["state"] == "UNAVAILABLE"
        assert "step 'sum' (adder:1) is not loaded: artifact sha256 mismatch" in \
            index[("p", "1")]["reason"]
        assert reconciler.observed().versions["p:1"]["state"] == "FAILED"
        await reconciler.stop()

    run(main())


# -- the graph checks, without a registry ----------------------------------------------------

SIG = {"scaler": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                  "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]},
       "adder": {"inputs": [{"name": "a", "datatype": "FP32", "shape": [-1, 4]},
                            {"name": "b", "datatype": "FP32", "shape": [-1, 4]}],
                 "outputs": [{"name": "sum", "datatype": "FP32", "shape": [-1, 4]}]}}


def check(edges: list[tuple[str, str]], steps=(("p1", "scaler"), ("p2", "adder"))) -> dict:
    graph = [Step(n, m, "1") for n, m in steps]
    return check_graph(graph, [Edge(parse_end(a, field="from"), parse_end(b, field="to"))
                               for a, b in edges],
                       {n: SIG[m] for n, m in steps})


def test_a_cycle_is_refused_and_named():
    with pytest.raises(PipelineError, match="cycle: (p1 → p2 → p1|p2 → p1 → p2)"):
        check([("p2.sum", "p1.x"), ("p1.y", "p2.a"), ("x", "p2.b"), ("p1.y", "out")])


def test_the_derived_signature_takes_the_narrower_shape_of_a_shared_input():
    sig = check([("x", "p1.x"), ("p1.y", "p2.a"), ("x", "p2.b"), ("p2.sum", "y")])
    assert sig == {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                   "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}
