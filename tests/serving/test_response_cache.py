"""The response cache (Triton's per-model response cache): a version that turns it on answers
a repeated request from the replica's cache without touching its batcher; a different input,
another version, or the same version reloaded never answers from an entry that is not its own;
the cache is bounded by bytes, least recently used first, and off unless a version asks."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import orjson
import pytest
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families

from registry import samples
from registry.signatures import extract_signature
from serving.core.dataplane import DataPlane
from serving.core.desired_state import BatchingConfig, DesiredState, ModelRoute, VersionSpec
from serving.core.reconciler import Reconciler
from serving.core.response_cache import ENTRY_OVERHEAD_BYTES, ResponseCache, request_key
from serving.http.app import ServingApp, ServingSettings
from serving.sources.repository import RepositorySource
from tests.inprocess_replica import StaticSource


def two_outputs() -> bytes:
    """x [batch, 4] -> pos = Relu(x), neg = Neg(x): two outputs, one request may ask for either."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["pos"]), helper.make_node("Neg", ["x"], ["neg"])],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("pos", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("neg", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, ir_version=samples.IR_VERSION, opset_imports=[
        helper.make_opsetid("", samples.OPSET)]).SerializeToString()


def spec(tmp_path, model: str, version: str, data: bytes, *, cache: bool = True) -> VersionSpec:
    path = tmp_path / f"{model}-{version}-{hashlib.sha256(data).hexdigest()[:8]}.onnx"
    path.write_bytes(data)
    return VersionSpec(
        model=model, version=version, artifact_path=str(path),
        sha256=hashlib.sha256(data).hexdigest(),
        signature=extract_signature(onnx.load_from_string(data)),
        batching=BatchingConfig(max_batch_size=8), intra_op_threads=1, response_cache=cache)



def state(revision: int, routes: dict[str, ModelRoute], *specs: VersionSpec) -> DesiredState:
    return DesiredState(revision, routes, {s.key: s for s in specs})


class Replica:
    """DataPlane + Reconciler + the ASGI app in-process, driven through httpx."""

    def __init__(self, source: StaticSource, *, cache_bytes: int = 1 << 20) -> None:
        self.dataplane = DataPlane(replica="c1", response_cache_bytes=cache_bytes)
        self.reconciler = Reconciler(source, self.dataplane, poll_seconds=60,
                                     heartbeat_seconds=60, intra_op_threads=1)
        self.app = ServingApp(self.dataplane, self.reconciler, ServingSettings())
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                      base_url="http://replica")

    def loaded(self, model: str, version: str):
        return self.dataplane.table.loaded[(model, version)]

    async def infer(self, model: str, x: np.ndarray, *, version: str | None = None,
                    outputs: list[dict] | None = None) -> httpx.Response:
        doc: dict = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                 "data": x.ravel().tolist()}]}
        if outputs is not None:
            doc["outputs"] = outputs
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        r = await self.http.post(path, json=doc)
        assert r.status_code == 200, r.text
        return r

    async def infer_binary(self, model: str, x: np.ndarray) -> tuple[httpx.Response, dict]:
        """The binary tensor extension both ways, as tritonclient sends it by default."""
        raw = x.astype("<f4").tobytes()
        header = orjson.dumps({
            "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw)}}],
            "parameters": {"binary_data_output": True}})
        r = await self.http.post(f"/v2/models/{model}/infer", content=header + raw, headers={
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream"})
        assert r.status_code == 200, r.text
        hlen = int(r.headers["inference-header-content-length"])
        doc = orjson.loads(r.content[:hlen])
        arrays, offset = {}, hlen
        for out in doc["outputs"]:
            size = out["parameters"]["binary_data_size"]
            arrays[out["name"]] = np.frombuffer(
                r.content[offset:offset + size], "<f4").reshape(out["shape"])
            offset += size
        return r, arrays

    async def stats(self, model: str, version: str) -> dict:
        r = await self.http.get(f"/v2/models/{model}/versions/{version}/stats")
        return r.json()["model_stats"][0]

    async def metrics(self) -> dict[tuple[str, str], float]:
        """(sample name, "model:version") -> value; replica-wide samples under "". (The parser
        reads a counter as name_total; Triton's bare names are what the text carries.)"""
        text = (await self.http.get("/metrics")).text
        return {(s.name.removesuffix("_total"), f"{s.labels['model']}:{s.labels['version']}"
                 if "version" in s.labels else ""): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def answer(r: httpx.Response, name: str = "y") -> np.ndarray:
    out = next(o for o in r.json()["outputs"] if o["name"] == name)
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def direct(data: bytes, x: np.ndarray, name: str = "y") -> np.ndarray:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run([name], {"x": x})[0]


X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)


def test_an_identical_request_is_answered_from_the_cache_without_touching_the_batcher(tmp_path):
    v1 = spec(tmp_path, "m", "1", samples.mlp(seed=0))
    replica = Replica(StaticSource(state(1, {"m": ModelRoute("m", stable="1")}, v1)))

    async def main():
        await replica.reconciler.reconcile()
        lv = replica.loaded("m", "1")
        first = await replica.infer("m", X)
        assert lv.batcher.requests == 1
        second = await replica.infer("m", X)
        assert lv.batcher.requests == 1  # the hit never reached the batcher
        assert second.headers["x-model-version"] == "1"
        assert second.json()["outputs"] == first.json()["outputs"]
        np.testing.assert_allclose(answer(second), direct(samples.mlp(seed=0), X), rtol=1e-5)
        st = await replica.stats("m", "1")
        assert st["inference_stats"]["cache_hit"]["count"] == 1
        assert st["inference_stats"]["cache_miss"]["count"] == 1
        assert st["inference_stats"]["success"]["count"] == 2  # a hit is a success
        assert st["execution_count"] == 1  # ... but not an execution
        metrics = await replica.metrics()
        assert metrics[("nv_cache_num_hits_per_model", "m:1")] == 1
        assert metrics[("nv_cache_num_misses_per_model", "m:1")] == 1
        assert metrics[("nv_inference_request_success", "m:1")] == 2
        assert metrics[("mmc_inference_request_duration_seconds_count", "m:1")] == 2
        assert metrics[("mmc_response_cache_entries", "")] == 1
        config = (await replica.http.get("/v2/models/m/config")).json()
        assert config["response_cache"] == {"enable": True}
        await replica.reconciler.stop()

    run(main())


def test_a_different_input_misses_and_gets_its_own_answer(tmp_path):
    v1 = spec(tmp_path, "m", "1", samples.mlp(seed=0))
    replica = Replica(StaticSource(state(1, {"m": ModelRoute("m", stable="1")}, v1)))

    async def main():
        await replica.reconciler.reconcile()
        lv = replica.loaded("m", "1")
        await replica.infer("m", X)
        other = X.copy()
        other[0, 7] += 0.5  # one element differs
        r = await replica.infer("m", other)
        assert lv.batcher.requests == 2
        np.testing.assert_allclose(answer(r), direct(samples.mlp(seed=0), other), rtol=1e-5)
        two_rows = np.vstack([X, X])  # the same values in another shape is another request
        r = await replica.infer("m", two_rows)
        assert lv.batcher.requests == 3 and answer(r).shape[0] == 2
        st = await replica.stats("m", "1")
        assert (st["inference_stats"]["cache_hit"]["count"],
                st["inference_stats"]["cache_miss"]["count"]) == (0, 3)
        await replica.reconciler.stop()

    run(main())


def test_json_binary_and_a_different_requested_output_share_one_entry_and_answer_alike(tmp_path):
    data = two_outputs()
    v1 = spec(tmp_path, "two", "1", data)
    replica = Replica(StaticSource(state(1, {"two": ModelRoute("two", stable="1")}, v1)))
    x = np.array([[-2.0, -0.5, 0.25, 3.0]], np.float32)

    async def main():
        await replica.reconciler.reconcile()
        lv = replica.loaded("two", "1")
        as_json = await replica.infer("two", x, outputs=[{"name": "pos"}])
        assert [o["name"] for o in as_json.json()["outputs"]] == ["pos"]
        _, as_binary = await replica.infer_binary("two", x)  # every output, binary
        neg = await replica.infer("two", x, outputs=[{"name": "neg"}])
        ranked = await replica.infer(
            "two", x, outputs=[{"name": "pos", "parameters": {"classification": 2}}])
        assert lv.batcher.requests == 1  # the first request ran; the other three hit
        np.testing.assert_array_equal(as_binary["pos"], answer(as_json, "pos"))
        np.testing.assert_array_equal(as_binary["pos"], np.maximum(x, 0))
        np.testing.assert_array_equal(as_binary["neg"], -x)
        np.testing.assert_array_equal(answer(neg, "neg"), -x)
        top = ranked.json()["outputs"][0]["data"]
        assert [s.split(":")[1] for s in top] == ["3", "2"]  # indices of 3.0 and 0.25
        st = await replica.stats("two", "1")
        assert st["inference_stats"]["cache_hit"]["count"] == 3
        await replica.reconciler.stop()

    run(main())


def test_text_inputs_and_outputs_are_cached_by_their_bytes(tmp_path):
    v1 = spec(tmp_path, "text", "1", samples.identity(TensorProto.STRING, ["batch", 2]))
    replica = Replica(StaticSource(state(1, {"text": ModelRoute("text", stable="1")}, v1)))

    def request(words: list[str]) -> dict:
        return {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "BYTES", "data": words}]}

    async def main():
        await replica.reconciler.reconcile()
        lv = replica.loaded("text", "1")
        answers = []
        for words in (["héllo", "b"], ["héllo", "b"], ["héllob", ""]):
            r = await replica.http.post("/v2/models/text/infer", json=request(words))
            assert r.status_code == 200, r.text
            answers.append(r.json()["outputs"][0]["data"])
        assert answers == [["héllo", "b"], ["héllo", "b"], ["héllob", ""]]
        assert lv.batcher.requests == 2  # the same words hit; the same bytes split apart miss
        await replica.reconciler.stop()

    run(main())


def test_a_new_version_never_answers_from_an_old_versions_entry(tmp_path):
    old, new = samples.mlp(seed=0), samples.mlp(seed=1)
    v1, v2 = spec(tmp_path, "m", "1", old), spec(tmp_path, "m", "2", new)
    source = StaticSource(state(1, {"m": ModelRoute("m", stable="1")}, v1))
    replica = Replica(source)

    async def main():
        await replica.reconciler.reconcile()
        await replica.infer("m", X)
        await replica.infer("m", X)  # v1's entry is in use
        first = replica.loaded("m", "1")
        # Both loaded (a canary): the same inputs pinned to v2 get v2's answer.
        source.state = state(2, {"m": ModelRoute("m", stable="1", candidate="2",
                                                 candidate_weight=10)}, v1, v2)
        await replica.reconciler.reconcile()
        r = await replica.infer("m", X, version="2")
        np.testing.assert_allclose(answer(r), direct(new, X), rtol=1e-5)
        assert replica.loaded("m", "2").batcher.requests == 1
        r = await replica.infer("m", X, version="1")
        np.testing.assert_allclose(answer(r), direct(old, X), rtol=1e-5)
        assert first.batcher.requests == 1  # v1 still answers from its own entry
        # v2 promoted, v1 unloaded: its entries go with it.
        source.state = state(3, {"m": ModelRoute("m", stable="2")}, v2)
        await replica.reconciler.reconcile()
        r = await replica.infer("m", X)
        assert r.headers["x-model-version"] == "2"
        np.testing.assert_allclose(answer(r), direct(new, X), rtol=1e-5)
        assert not np.allclose(answer(r), direct(old, X))
        assert replica.loaded("m", "2").batcher.requests == 1  # answered from v2's entry
        cache = replica.dataplane.response_cache
        assert cache.held(first) == (0, 0)  # the unloaded version took its entries along
        # The same version number with another artifact (a replaced file) is a reload: no
        # entry of the earlier load answers it.
        source.state = state(4, {"m": ModelRoute("m", stable="2")},
                             spec(tmp_path, "m", "2", old))
        await replica.reconciler.reconcile()
        r = await replica.infer("m", X)
        np.testing.assert_allclose(answer(r), direct(old, X), rtol=1e-5)
        assert replica.loaded("m", "2").batcher.requests == 1
        assert len(cache) == 1
        await replica.reconciler.stop()

    run(main())


def test_the_cache_is_off_unless_a_version_asks_and_the_replica_has_a_budget(tmp_path):
    plain = spec(tmp_path, "m", "1", samples.mlp(seed=0), cache=False)
    asking = spec(tmp_path, "k", "1", samples.mlp(seed=0))
    routes = {"m": ModelRoute("m", stable="1"), "k": ModelRoute("k", stable="1")}
    assert VersionSpec.__dataclass_fields__["response_cache"].default is False

    async def twice(replica: Replica, model: str) -> int:
        await replica.infer(model, X)
        await replica.infer(model, X)
        return replica.loaded(model, "1").batcher.requests

    async def main():
        replica = Replica(StaticSource(state(1, routes, plain, asking)))
        await replica.reconciler.reconcile()
        assert await twice(replica, "m") == 2  # a version that did not ask runs every time
        assert await twice(replica, "k") == 1
        metrics = await replica.metrics()
        assert ("nv_inference_request_success", "m:1") in metrics
        assert ("nv_cache_num_hits_per_model", "m:1") not in metrics  # m does not use it
        assert metrics[("nv_cache_num_hits_per_model", "k:1")] == 1
        assert "response_cache" not in (await replica.http.get("/v2/models/m/config")).json()
        st = await replica.stats("m", "1")
        assert st["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
        await replica.reconciler.stop()
        # A replica with no budget (MMC_RESPONSE_CACHE_BYTES=0) runs every request.
        replica = Replica(StaticSource(state(1, routes, plain, asking)), cache_bytes=0)
        await replica.reconciler.reconcile()
        assert await twice(replica, "k") == 2
        assert ("nv_cache_num_hits_per_model", "k:1") not in await replica.metrics()
        await replica.reconciler.stop()

    run(main())
    assert ServingSettings.from_env({"MMC_RESPONSE_CACHE_BYTES": "0"}).response_cache_bytes == 0
    assert ServingSettings.from_env({}).response_cache_bytes > 0


def entry(value: float, floats: int = 250) -> dict[str, np.ndarray]:
    return {"y": np.full(floats, value, np.float32)}  # 1000 bytes of payload


def key(value: float) -> bytes:
    return request_key(b"m\0001", {"x": np.full((1, 4), value, np.float32)})


def test_the_least_recently_used_entries_go_first_once_the_bytes_are_spent():
    one = 1000 + ENTRY_OVERHEAD_BYTES
    cache = ResponseCache(3 * one)
    owner = object()
    for v in (1.0, 2.0, 3.0):
        assert cache.put(key(v), owner, entry(v))
    assert cache.get(key(1.0))["y"][0] == 1.0  # 1 is now more recent than 2
    cache.put(key(4.0), owner, entry(4.0))
    assert cache.get(key(2.0)) is None
    assert [cache.get(key(v)) is not None for v in (1.0, 3.0, 4.0)] == [True] * 3
    assert cache.used_bytes == 3 * one <= cache.capacity_bytes and cache.evictions == 1
    # A bigger answer pushes out as many as it needs; one larger than the budget is not kept.
    cache.put(key(5.0), owner, entry(5.0, floats=500))
    assert len(cache) == 2 and cache.used_bytes <= cache.capacity_bytes
    assert not cache.put(key(6.0), owner, entry(6.0, floats=1000))
    assert cache.get(key(6.0)) is None and cache.held(owner) == (2, cache.used_bytes)


def test_a_caller_cannot_corrupt_a_cached_answer():
    cache = ResponseCache(1 << 20)
    batch = np.arange(16, dtype=np.float32).reshape(4, 4)
    cache.put(key(1.0), "v1", {"y": batch[1:2]})  # a row view of a batch's output
    batch[:] = -1  # the batch buffer is reused: the entry kept its own copy
    got = cache.get(key(1.0))
    np.testing.assert_array_equal(got["y"], [[4, 5, 6, 7]])
    with pytest.raises(ValueError):
        got["y"][0, 0] = 99
    got["y"] = np.zeros(1)
    np.testing.assert_array_equal(cache.get(key(1.0))["y"], [[4, 5, 6, 7]])


def test_the_key_covers_each_inputs_name_datatype_shape_and_bytes():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    base = request_key(b"id", {"x": x})
    assert request_key(b"id", {"x": x.copy()}) == base
    assert request_key(b"id", {"x": np.asfortranarray(x)}) == base  # layout is not content
    others = [
        request_key(b"other", {"x": x}),
        request_key(b"id", {"z": x}),
        request_key(b"id", {"x": x.reshape(3, 2)}),
        request_key(b"id", {"x": x.view(np.int32)}),
        request_key(b"id", {"x": x, "w": x}),
        request_key(b"id", {"x": np.array([b"ab", b"c"], dtype=object)}),
        request_key(b"id", {"x": np.array([b"a", b"bc"], dtype=object)}),
    ]
    assert len({base, *others}) == len(others) + 1


def test_a_model_repository_turns_the_cache_on_per_model_in_config_json(tmp_path):
    root = tmp_path / "models"
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.onnx").write_bytes(samples.mlp(seed=0))

    def read(data: bytes) -> dict:
        return extract_signature(onnx.load_from_string(data))

    source = RepositorySource(root, read_signature=read)
    assert source.fetch().versions[("m", "1")].response_cache is False
    (root / "m" / "config.json").write_bytes(orjson.dumps({"response_cache": True}))
    assert source.fetch().versions[("m", "1")].response_cache is True
    (root / "m" / "config.json").write_bytes(orjson.dumps({"response_cache": "yes"}))
    with pytest.raises(ValueError, match="response_cache must be true or false"):
        source.fetch()
    cached = spec(tmp_path, "m", "1", samples.mlp())
    assert dataclasses.replace(cached, response_cache=False) != cached  # a change reloads it
