"""The serving process as clients see it: a real `mmc-serve --model-repository` subprocess driven
by Triton's own `tritonclient.http`, and by raw httpx for what that client cannot send."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper

from registry import samples

API_KEY = "s3cret-key"
MAX_BODY = 1_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_model(root: Path, model: str, version: str, data: bytes,
                config: dict | None = None) -> None:
    """Add a version the way an operator would: build it aside, then rename into place."""
    staging = root / model / f".staging-{version}"
    staging.mkdir(parents=True, exist_ok=True)
    (staging / "model.onnx").write_bytes(data)
    os.rename(staging, root / model / version)
    if config is not None:
        (root / model / "config.json").write_text(json.dumps(config))


def serve_command() -> list[str]:
    script = Path(sys.executable).with_name("mmc-serve")
    return [str(script)] if script.exists() else [sys.executable, "-m", "serving.cli"]


class Server:
    """One mmc-serve subprocess on a free loopback port (and, with `grpc`, its gRPC front on
    another: `grpc_address`)."""

    def __init__(self, repository: Path, *, grpc: bool = False, own_session: bool = False,
                 **env: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = repository.parent / f"serve-{self.port}.log"
        full_env = {**os.environ, "MMC_POLL_SECONDS": "0.2", "MMC_HEARTBEAT_SECONDS": "0.5",
                    "MMC_ORT_INTRA_OP_THREADS": "1", "OMP_NUM_THREADS": "1", **env}
        extra = []
        if grpc:
            self.grpc_port = _free_port()
            self.grpc_address = f"127.0.0.1:{self.grpc_port}"
            extra = ["--grpc-port", str(self.grpc_port)]
        self.proc = subprocess.Popen(
            [*serve_command(), "--model-repository", str(repository), "--host", "127.0.0.1",
             "--port", str(self.port), "--replica", "test-r1", *extra],
            env=full_env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
            start_new_session=own_session)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mmc-serve exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"mmc-serve not ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def reshape_by_input(allowzero: int = 1) -> bytes:
    """x [batch, 4] reshaped to the shape in input s. With allowzero the zeros of warm-up ask
    for [0, 0] and fail; without, they mean "keep that dimension" and warm-up passes."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=allowzero)], "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
    )
    return helper.make_model(graph, ir_version=samples.IR_VERSION, opset_imports=[
        helper.make_opsetid("", samples.OPSET)]).SerializeToString()


MODELS = {
    "mlp": [samples.mlp(seed=0), samples.mlp(seed=1)],
    "mlpb": [samples.mlp(hidden=(512, 512), seed=2)],
    "i64": [samples.identity(TensorProto.INT64, ["batch", 3])],
    "text": [samples.identity(TensorProto.STRING, ["batch", 2])],
    "flags": [samples.identity(TensorProto.BOOL, ["batch", 4])],
    "half": [samples.identity(TensorProto.FLOAT16, ["batch", 4])],
    "fixed": [samples.identity(TensorProto.FLOAT, [2, 3])],
    "slow": [samples.mlp(hidden=(512, 512), extra_layers=8, seed=3)],
    "shadowed": [samples.mlp(seed=4), samples.mlp(seed=5)],
    "secret": [samples.identity(TensorProto.FLOAT, ["batch", 4])],
    "reshape": [reshape_by_input(allowzero=0)],
}
CONFIGS = {
    "mlp": {"max_batch_size": 32, "stable": "1"},
    "mlpb": {"max_batch_size": 16, "max_queue_delay_us": 5000},
    "slow": {"max_batch_size": 0, "max_queue_size": 2},
    "shadowed": {"stable": "1", "shadow": "2"},
    "reshape": {"max_batch_size": 0},
    "secret": {"api_key_sha256": [hashlib.sha256(API_KEY.encode()).hexdigest()]},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo") / "models"
    for name, versions in MODELS.items():
        for i, data in enumerate(versions, start=1):
            write_model(root, name, str(i), data, CONFIGS.get(name))
    srv = Server(root, MMC_MAX_BODY_BYTES=str(MAX_BODY))
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    c = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    yield c
    c.close()


def reference(model: str, version: int, feeds: dict) -> dict:
    sess = ort.InferenceSession(MODELS[model][version - 1], providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def healthy(server) -> None:
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


# -- tritonclient: health, metadata, config ----------------------------------------------------


def test_tritonclient_sees_a_live_ready_server_and_its_extensions(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "mmc"
    assert {"binary_tensor_data", "statistics", "model_repository",
            "model_configuration", "sagemaker"} <= set(meta["extensions"])
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("nope")


def test_model_metadata_lists_versions_and_shapes_with_the_batch_dimension(client):
    meta = client.get_model_metadata("mlp")
    assert meta["name"] == "mlp" and meta["versions"] == ["1", "2"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 10]}]


def test_model_config_is_triton_style_with_dims_excluding_the_batch(client):
    cfg = client.get_model_config("mlp")
    assert cfg["max_batch_size"] == 32
    assert cfg["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [64]}]
    assert cfg["output"][0]["dims"] == [10]
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    assert cfg["instance_group"][0]["count"] == 1
    fixed = client.get_model_config("fixed")
    assert fixed["max_batch_size"] == 0 and fixed["input"][0]["dims"] == [2, 3]
    assert "dynamic_batching" not in fixed
    assert client.get_model_config("text")["input"][0]["data_type"] == "TYPE_STRING"


# -- tritonclient: inference ---------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False])
def test_mlp_infer_json_and_binary_routed_to_the_stable(client, binary):
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    inp = triton.InferInput("x", [3, 64], "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = triton.InferRequestedOutput("y", binary_data=binary)
    result = client.infer("mlp", [inp], outputs=[out], request_id="req-7")
    np.testing.assert_allclose(result.as_numpy("y"), reference("mlp", 1, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    response = result.get_response()
    assert response["model_version"] == "1" and response["id"] == "req-7"


def test_pinned_version_answers_from_that_version(client, server):
    x = np.ones((1, 64), np.float32)
    inp = triton.InferInput("x", [1, 64], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp], model_version="2")
    assert result.get_response()["model_version"] == "2"
    np.testing.assert_allclose(result.as_numpy("y"), reference("mlp", 2, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    r = httpx.post(f"{server.url}/v2/models/mlp/versions/2/infer", json={
        "inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]})
    assert r.status_code == 200 and r.headers["x-model-version"] == "2"
    r = httpx.post(f"{server.url}/v2/models/mlp/infer", json={
        "inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]})
    assert r.headers["x-model-version"] == "1" and r.json()["model_version"] == "1"


@pytest.mark.parametrize("model,datatype,array", [
    ("i64", "INT64", np.array([[1, -2, 3], [2**40, 0, -(2**40)]], np.int64)),
    ("text", "BYTES", np.array([[b"hello", "wörld".encode()], [b"", b"x y"]], dtype=object)),
    ("flags", "BOOL", np.array([[True, False, True, True]])),
    ("half", "FP16", np.array([[0.5, -1.25, 1000.0, 0.0]], np.float16)),
])
@pytest.mark.parametrize("binary", [True, False])
def test_identity_models_round_trip_every_datatype(client, model, datatype, array, binary):
    inp = triton.InferInput("x", list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary)
    out = triton.InferRequestedOutput("y", binary_data=binary)
    got = client.infer(model, [inp], outputs=[out]).as_numpy("y")
    if datatype == "BYTES":
        assert [bytes(v) if not isinstance(v, str) else v.encode() for v in got.ravel()] == \
            list(array.ravel())
    else:
        np.testing.assert_array_equal(got, array)


def test_statistics_and_repository_index_through_tritonclient(client):
    x = np.zeros((2, 64), np.float32)
    inp = triton.InferInput("x", [2, 64], "FP32")
    inp.set_data_from_numpy(x)
    client.infer("mlp", [inp])
    stats = client.get_inference_statistics("mlp")["model_stats"]
    by_version = {s["version"]: s for s in stats}
    assert set(by_version) == {"1", "2"}
    v1 = by_version["1"]
    assert v1["inference_count"] >= 2 and v1["execution_count"] >= 1
    assert v1["inference_stats"]["success"]["count"] >= 1
    assert {"queue", "compute_infer", "fail"} <= set(v1["inference_stats"])
    index = client.get_model_repository_index()
    assert {"name": "mlp", "version": "2", "state": "READY", "reason": ""} in index
    assert len(index) == sum(len(v) for v in MODELS.values())


def test_load_and_unload_explain_they_go_through_the_registry(server, client):
    r = httpx.post(f"{server.url}/v2/repository/models/mlp/load")
    assert r.status_code == 501 and "registry" in r.json()["error"]
    with pytest.raises(Exception, match="registry"):
        client.unload_model("mlp")
    assert client.is_model_ready("mlp")


# -- raw HTTP: what the client cannot send ---------------------------------------------------


def _mlp_request(**changes) -> dict:
    tensor = {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}
    tensor.update(changes)
    return {"inputs": [tensor]}


@pytest.mark.parametrize("path,body,status,needle", [
    ("mlp", b"{not json", 400, "JSON"),
    ("mlp", orjson.dumps(_mlp_request(name="z")), 400, "'z'"),
    ("mlp", orjson.dumps(_mlp_request(datatype="INT32", data=[0] * 64)), 400, "INT32"),
    ("mlp", orjson.dumps(_mlp_request(data=[0.0] * 63)), 400, "63"),
    ("mlp", orjson.dumps(_mlp_request(shape=[64], data=[0.0] * 64)), 400, "rank"),
    ("mlp", orjson.dumps(_mlp_request(shape=[2, 32], data=[0.0] * 64)), 400, "dimension 1"),
    ("mlp", orjson.dumps(_mlp_request(shape=[33, 64], data=[0.0] * 64 * 33)), 400,
     "max_batch_size"),
    ("fixed", orjson.dumps({"inputs": [{"name": "x", "shape": [3, 3], "datatype": "FP32",
                                        "data": [0.0] * 9}]}), 400, "dimension 0"),
    ("mlp", orjson.dumps({"inputs": []}), 400, "inputs"),
    ("nope", orjson.dumps(_mlp_request()), 404, "nope"),
    ("mlp/versions/9", orjson.dumps(_mlp_request()), 404, "'9'"),
])
def test_malformed_requests_get_a_4xx_naming_the_problem(server, path, body, status, needle):
    r = httpx.post(f"{server.url}/v2/models/{path}/infer", content=body,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]
    healthy(server)


def _binary_request(declared: int, payload: bytes) -> tuple[bytes, dict]:
    header = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                                       "parameters": {"binary_data_size": declared}}]})
    return header + payload, {"Inference-Header-Content-Length": str(len(header)),
                              "Content-Type": "application/octet-stream"}


@pytest.mark.parametrize("declared,payload,needle", [
    (100, b"\0" * 100, "binary_data_size"),       # disagrees with shape x width
    (256, b"\0" * 200, "remain"),                 # body truncated
    (256, b"\0" * 300, "left over"),              # bytes left over
])
def test_bad_binary_payloads_are_400s(server, declared, payload, needle):
    body, headers = _binary_request(declared, payload)
    r = httpx.post(f"{server.url}/v2/models/mlp/infer", content=body, headers=headers)
    assert r.status_code == 400 and needle in r.json()["error"]
    healthy(server)


def test_binary_request_with_binary_output_and_the_unknown_model_readiness(server):
    x = np.arange(64, dtype=np.float32).reshape(1, 64) / 64
    body, headers = _binary_request(256, x.tobytes())
    r = httpx.post(f"{server.url}/v2/models/mlp/infer", content=body, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    np.testing.assert_allclose(np.array(r.json()["outputs"][0]["data"], np.float32),
                               reference("mlp", 1, {"x": x})["y"].ravel(), rtol=1e-5, atol=1e-5)
    r = httpx.get(f"{server.url}/v2/models/nope/ready")
    assert r.status_code == 404 and "nope" in r.json()["error"]
    r = httpx.get(f"{server.url}/v2/models/mlp/versions/7/ready")
    assert r.status_code == 404 and "'7'" in r.json()["error"]


def test_gzip_bodies_are_accepted_and_oversized_bodies_refused(server):
    body = gzip.compress(orjson.dumps(_mlp_request()))
    r = httpx.post(f"{server.url}/v2/models/mlp/infer", content=body,
                   headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    big = orjson.dumps(_mlp_request(shape=[20000, 64], data=[0.0] * 64 * 20000))
    assert len(big) > MAX_BODY
    r = httpx.post(f"{server.url}/v2/models/mlp/infer", content=big)
    assert r.status_code == 413 and "limit" in r.json()["error"]
    r = httpx.post(f"{server.url}/v2/models/mlp/infer", content=gzip.compress(big),
                   headers={"Content-Encoding": "gzip"})
    assert r.status_code == 413
    healthy(server)


def test_api_keys_protect_a_model_without_any_database(server):
    url = f"{server.url}/v2/models/secret/infer"
    req = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    r = httpx.post(url, json=req)
    assert r.status_code == 401 and "API key" in r.json()["error"]
    assert httpx.post(url, json=req, headers={"X-Api-Key": "wrong"}).status_code == 401
    assert httpx.post(url, json=req, headers={"X-Api-Key": API_KEY}).status_code == 200
    r = httpx.post(url, json=req, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 2, 3, 4]


# -- batching, overload ----------------------------------------------------------------------


async def _fire(url: str, bodies: list[bytes], headers: dict | None = None) -> list:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(limits=limits, timeout=30) as c:
        return await asyncio.gather(*(c.post(url, content=b, headers=headers) for b in bodies))


def test_concurrent_requests_are_batched_and_each_caller_gets_its_own_rows(server, client):
    before = client.get_inference_statistics("mlpb")["model_stats"][0]
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1 + i % 2, 64)).astype(np.float32) for i in range(40)]
    bodies = [orjson.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                        "data": x.ravel().tolist()}]}) for x in xs]
    answers = asyncio.run(_fire(f"{server.url}/v2/models/mlpb/infer", bodies))
    for x, r in zip(xs, answers, strict=True):
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert out["shape"] == [len(x), 10]
        np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(len(x), 10),
                                   reference("mlpb", 1, {"x": x})["y"], rtol=1e-4, atol=1e-5)
    after = client.get_inference_statistics("mlpb")["model_stats"][0]
    rows = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert rows == sum(len(x) for x in xs)
    assert executions < len(xs)


def test_a_full_queue_answers_503_with_retry_after_and_the_server_recovers(server):
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [64, 64], "datatype": "FP32",
                                     "data": [0.1] * 64 * 64}]})
    answers = asyncio.run(_fire(f"{server.url}/v2/models/slow/infer", [body] * 24))
    statuses = [r.status_code for r in answers]
    assert 200 in statuses and 503 in statuses, statuses
    refused = next(r for r in answers if r.status_code == 503)
    assert refused.headers["retry-after"] and "queue" in refused.json()["error"]
    assert set(statuses) <= {200, 503}
    assert httpx.post(f"{server.url}/v2/models/slow/infer", content=body).status_code == 200


# -- shadow, SageMaker, metrics --------------------------------------------------------------


def test_shadow_traffic_is_recorded_and_never_answers(server):
    url = f"{server.url}/v2/models/shadowed/infer"
    for _ in range(5):
        r = httpx.post(url, json=_mlp_request(data=[0.3] * 64))
        assert r.headers["x-model-version"] == "1"
    deadline = time.time() + 5
    while time.time() < deadline:
        shadow = httpx.get(f"{server.url}/v2/models/shadowed/stats").json().get("shadow")
        if shadow and shadow["compared_rows"] >= 5:
            break
        time.sleep(0.05)
    assert shadow["version"] == "2" and shadow["errors"] == 0
    assert shadow["max_abs_diff"] > 0  # different seeds: the answers differ
    assert 0.0 <= shadow["argmax_agreement"] <= 1.0


def test_sagemaker_ping_and_invocations_json_and_binary(server):
    assert httpx.get(f"{server.url}/ping").status_code == 200
    url = f"{server.url}/invocations"
    req = _mlp_request(data=[0.5] * 64)
    r = httpx.post(url, json=req)
    assert r.status_code == 400 and "X-Amzn-SageMaker-Target-Model" in r.json()["error"]
    r = httpx.post(url, json=req, headers={"X-Amzn-SageMaker-Target-Model": "mlp"})
    assert r.status_code == 200 and r.json()["model_name"] == "mlp"
    expected = r.json()["outputs"][0]["data"]
    body, _ = _binary_request(256, np.full((1, 64), 0.5, np.float32).tobytes())
    header_len = body.index(b"}]}") + 3
    content_type = f"application/vnd.sagemaker-triton.binary+json;json-header-size={header_len}"
    r = httpx.post(url, content=body, headers={
        "X-Amzn-SageMaker-Target-Model": "mlp", "Content-Type": content_type})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == expected


def test_metrics_use_triton_names_labelled_by_model_version_and_replica(server):
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("nv_inference_request_success", "nv_inference_request_failure",
                 "nv_inference_count", "nv_inference_exec_count",
                 "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us", "nv_inference_pending_request_count",
                 "mmc_inference_request_duration_seconds_bucket", "mmc_serving_degraded"):
        assert name in text, name
    assert 'nv_inference_request_success{model="mlp",replica="test-r1",version="1"}' in text


def test_a_process_whose_only_model_fails_warm_up_is_live_but_never_ready(tmp_path):
    root = tmp_path / "models"
    write_model(root, "reshape", "1", reshape_by_input(), {"max_batch_size": 0})
    # Warm-up feeds zeros, which this model refuses: a repository holding only it never serves.
    lone = Server(root)
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                r = httpx.post(f"{lone.url}/v2/repository/index")
                # a 503 "starting" (its table not loaded yet) is an error object, not the index
                index = r.json() if r.status_code == 200 else []
                if index and index[0]["state"] != "LOADING":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert index[0]["state"] == "UNAVAILABLE" and "warm-up" in index[0]["reason"]
        assert httpx.get(f"{lone.url}/v2/health/ready").status_code == 503
        req = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4},
                          {"name": "s", "shape": [2], "datatype": "INT64", "data": [2, 2]}]}
        r = httpx.post(f"{lone.url}/v2/models/reshape/infer", json=req)
        assert r.status_code == 503 and "reshape" in r.json()["error"]
        assert httpx.get(f"{lone.url}/v2/health/live").status_code == 200
    finally:
        lone.stop()


def test_a_run_time_model_error_fails_that_request_only_as_json(server):
    def req(shape):
        return {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4},
                           {"name": "s", "shape": [2], "datatype": "INT64", "data": shape}]}

    url = f"{server.url}/v2/models/reshape/infer"
    r = httpx.post(url, json=req([3, 3]))  # 4 elements cannot become 3 x 3
    assert r.status_code in (400, 500) and "reshape" in r.json()["error"]
    r = httpx.post(url, json=req([2, 2]))
    assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [2, 2]
    r = httpx.post(f"{server.url}/v2/models/secret/infer", headers={"X-Api-Key": API_KEY},
                   json={**req([2, 2]), "outputs": [{"name": "nope"}]})
    assert r.status_code == 400
    healthy(server)


def test_unknown_paths_and_methods_are_json_errors(server):
    r = httpx.get(f"{server.url}/v2/models/mlp/infer")
    assert r.status_code == 405 and "POST" in r.json()["error"]
    r = httpx.get(f"{server.url}/nowhere")
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200

