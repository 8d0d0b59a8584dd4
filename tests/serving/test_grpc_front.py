"""The gRPC front as clients see it: a real `mmc-serve --grpc-port` subprocess over real ONNX
models, driven by Triton's `tritonclient.grpc` unchanged, by the KServe SDK's
`InferenceGRPCClient` unchanged (in a child process: its generated messages and tritonclient's
both define the proto package `inference`, which one process cannot load twice), and by plain
grpc stubs for what those clients do not expose (metadata, typed contents, health, reflection)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import queue
import signal
import subprocess
import sys
import time

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from onnx import TensorProto
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from registry import samples
from serving.core.dataplane import DataPlane
from serving.grpc.front import GrpcFront
from tests.serving.test_app import Server, reference, write_model

API_KEY = "grpc-s3cret"
SERVICE = "inference.GRPCInferenceService"

#: One identity model per v2 datatype, with values at the edges of each type.
DATATYPES = {
    "BOOL": (TensorProto.BOOL, np.array([[True, False, True, True]])),
    "UINT8": (TensorProto.UINT8, np.array([[0, 1, 254, 255]], np.uint8)),
    "UINT16": (TensorProto.UINT16, np.array([[0, 1, 2**15, 2**16 - 1]], np.uint16)),
    "UINT32": (TensorProto.UINT32, np.array([[0, 7, 2**31, 2**32 - 1]], np.uint32)),
    "UINT64": (TensorProto.UINT64, np.array([[0, 9, 2**63 + 5, 2**64 - 1]], np.uint64)),
    "INT8": (TensorProto.INT8, np.array([[-128, -1, 0, 127]], np.int8)),
    "INT16": (TensorProto.INT16, np.array([[-(2**15), -1, 3, 2**15 - 1]], np.int16)),
    "INT32": (TensorProto.INT32, np.array([[-(2**31), -5, 0, 2**31 - 1]], np.int32)),
    "INT64": (TensorProto.INT64, np.array([[-(2**40), -1, 2**40, 2**62]], np.int64)),
    "FP16": (TensorProto.FLOAT16, np.array([[0.5, -1.25, 1000.0, 0.0]], np.float16)),
    "FP32": (TensorProto.FLOAT, np.array([[0.5, -1.25e-7, 3.4e38, 0.0]], np.float32)),
    "FP64": (TensorProto.DOUBLE, np.array([[0.5, -1e-300, 1.7e308, 0.0]], np.float64)),
    "BYTES": (TensorProto.STRING,
              np.array([[b"hello", "w\u00f6rld".encode(), b"", b"x y"]], dtype=object)),
}
MODELS = {
    "mlp": [samples.mlp(seed=0), samples.mlp(seed=1)],
    "fixed": [samples.identity(TensorProto.FLOAT, [2, 3])],
    "secret": [samples.identity(TensorProto.FLOAT, ["batch", 4])],
    "limited": [samples.identity(TensorProto.FLOAT, ["batch", 4])],
    "wide-fp32": [samples.identity(TensorProto.FLOAT, ["batch", "n"])],
    "wide-bytes": [samples.identity(TensorProto.STRING, ["batch", "n"])],
    **{f"id-{dt.lower()}": [samples.identity(proto, ["batch", 4])]
       for dt, (proto, _) in DATATYPES.items()},
}
CONFIGS = {
    "mlp": {"max_batch_size": 32, "stable": "1"},
    "secret": {"api_key_sha256": [hashlib.sha256(API_KEY.encode()).hexdigest()]},
    "limited": {"limits": {"rps": 0.01, "burst": 1}},  # one call, then 100 s to the next token
}


@pytest.fixture(scope="module", params=["grpcio", "fast"])
def server(request, tmp_path_factory):
    """One server per gRPC transport (MMC_GRPC_TRANSPORT): the default, grpcio's server, and
    our own HTTP/2 one; every spec here holds for both."""
    root = tmp_path_factory.mktemp("grpc-repo") / "models"
    for name, versions in MODELS.items():
        for i, data in enumerate(versions, start=1):
            write_model(root, name, str(i), data, CONFIGS.get(name))
    srv = Server(root, grpc=True, MMC_GRPC_TRANSPORT=request.param)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    c = tgrpc.InferenceServerClient(url=server.grpc_address)
    yield c
    c.close()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc_address) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _input(name: str, array: np.ndarray, datatype: str) -> tgrpc.InferInput:
    tensor = tgrpc.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _mlp_request(**changes) -> pb.ModelInferRequest:
    """A raw ModelInferRequest for the MLP; `changes` override its fields."""
    x = np.full((1, 64), 0.25, np.float32)
    fields = {"model_name": "mlp", "inputs": [pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 64])], "raw_input_contents": [x.tobytes()]}
    fields.update(changes)
    return pb.ModelInferRequest(**fields)


def _status(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


# -- health, metadata, config ------------------------------------------------------------------


def test_tritonclient_grpc_sees_a_live_ready_server_its_extensions_and_models(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "mmc"
    assert {"statistics", "model_repository", "model_configuration"} <= set(meta["extensions"])
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("nope") and not client.is_model_ready("mlp", "9")
    meta = client.get_model_metadata("mlp", as_json=True)
    assert meta["name"] == "mlp" and meta["versions"] == ["1", "2"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["-1", "10"]}]


def test_model_config_is_triton_style_with_dims_excluding_the_batch(client):
    cfg = client.get_model_config("mlp").config
    assert cfg.max_batch_size == 32 and cfg.platform == "onnxruntime_onnx"
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.input] == [
        ("x", tgrpc.model_config_pb2.TYPE_FP32, [64])]
    assert list(cfg.output[0].dims) == [10]
    assert cfg.HasField("dynamic_batching") and cfg.instance_group[0].count == 1
    assert list(cfg.version_policy.specific.versions) == [1, 2]
    fixed = client.get_model_config("fixed").config
    assert fixed.max_batch_size == 0 and list(fixed.input[0].dims) == [2, 3]
    assert not fixed.HasField("dynamic_batching")
    text = client.get_model_config("id-bytes").config
    assert text.input[0].data_type == tgrpc.model_config_pb2.TYPE_STRING


def test_health_checking_follows_readiness_and_reflection_lists_the_services(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    listed = next(reflect.ServerReflectionInfo(iter([ask])))
    names = {s.name for s in listed.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= names
    ask = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)
    files = next(reflect.ServerReflectionInfo(iter([ask])))
    assert files.file_descriptor_response.file_descriptor_proto  # grpcurl can describe it


# -- inference ---------------------------------------------------------------------------------


def test_mlp_infer_matches_onnxruntime_and_answers_from_the_stable(client):
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    result = client.infer("mlp", [_input("x", x, "FP32")], request_id="req-7",
                          outputs=[tgrpc.InferRequestedOutput("y")])
    np.testing.assert_allclose(result.as_numpy("y"), reference("mlp", 1, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    response = result.get_response()
    assert response.model_version == "1" and response.id == "req-7"
    assert len(response.raw_output_contents) == 1  # outputs travel raw, as Triton's do


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_round_trips_in_raw_contents(client, datatype):
    array = DATATYPES[datatype][1]
    got = client.infer(f"id-{datatype.lower()}", [_input("x", array, datatype)]).as_numpy("y")
    assert got.shape == array.shape
    if datatype == "BYTES":
        assert list(got.ravel()) == list(array.ravel())
    else:
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "FP16"])
def test_typed_contents_are_accepted_for_every_datatype_that_has_a_field(stub, datatype):
    array = DATATYPES[datatype][1]
    field = {"BOOL": "bool_contents", "INT64": "int64_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}.get(
        datatype, "int_contents" if datatype.startswith("INT") else "uint_contents")
    contents = pb.InferTensorContents(**{field: array.ravel().tolist()})
    request = pb.ModelInferRequest(model_name=f"id-{datatype.lower()}", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=array.shape,
                                              contents=contents)])
    response = stub.ModelInfer(request)
    result = tgrpc.InferResult(response)
    got = result.as_numpy("y")
    if datatype == "BYTES":
        assert list(got.ravel()) == list(array.ravel())
    else:
        np.testing.assert_array_equal(got, array)


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
def test_a_request_over_the_split_size_round_trips_raw_and_typed(client, stub, datatype):
    # past SPLIT_FROM_BYTES the raw tensors are read where they lie in the received buffer
    n = 80_000  # 320 KB of FP32; 800 KB of BYTES
    array = (np.arange(n, dtype=np.float32).reshape(1, n) if datatype == "FP32"
             else np.array([b"%06d" % i for i in range(n)], dtype=object).reshape(1, n))
    got = client.infer(f"wide-{datatype.lower()}", [_input("x", array, datatype)]).as_numpy("y")
    assert got.shape == array.shape
    assert (got == array).all()
    if datatype == "FP32":  # typed contents of that size: no raw part to leave in place
        contents = pb.InferTensorContents(fp32_contents=array.ravel().tolist())
        response = stub.ModelInfer(pb.ModelInferRequest(model_name="wide-fp32", inputs=[
            pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=array.shape,
                                                  contents=contents)]))
        np.testing.assert_array_equal(tgrpc.InferResult(response).as_numpy("y"), array)


def test_pinning_by_model_version_or_metadata_and_the_answer_names_the_version(client, stub):
    x = np.ones((1, 64), np.float32)
    result = client.infer("mlp", [_input("x", x, "FP32")], model_version="2")
    assert result.get_response().model_version == "2"
    np.testing.assert_allclose(result.as_numpy("y"), reference("mlp", 2, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    response, call = stub.ModelInfer.with_call(_mlp_request())
    assert ("x-model-version", "1") in call.trailing_metadata()
    assert response.model_version == "1"
    response, call = stub.ModelInfer.with_call(_mlp_request(),
                                               metadata=[("x-model-version", "2")])
    assert ("x-model-version", "2") in call.trailing_metadata()
    assert response.model_version == "2"
    error = _status(stub.ModelInfer, _mlp_request(model_version="1"),
                    metadata=[("x-model-version", "2")])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "disagree" in error.details()


def test_the_stream_answers_every_request_by_id_and_reports_a_bad_one_in_the_stream(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        xs = {f"s{i}": np.full((1 + i % 3, 64), i / 10, np.float32) for i in range(6)}
        for rid, x in xs.items():
            client.async_stream_infer("mlp", [_input("x", x, "FP32")], request_id=rid)
        client.async_stream_infer("mlp", [_input("z", xs["s0"], "FP32")], request_id="bad")
        got, errors = {}, []
        for _ in range(len(xs) + 1):
            result, error = answers.get(timeout=60)
            if error is not None:
                errors.append(error)
            else:
                got[result.get_response().id] = result.as_numpy("y")
    finally:
        client.stop_stream()
    assert set(got) == set(xs)
    for rid, x in xs.items():
        np.testing.assert_allclose(got[rid], reference("mlp", 1, {"x": x})["y"],
                                   rtol=1e-5, atol=1e-5)
    assert len(errors) == 1 and "'z'" in errors[0].message()


def test_statistics_count_rows_and_executions_per_version(client):
    before = client.get_inference_statistics("mlp", "1").model_stats[0].inference_count
    client.infer("mlp", [_input("x", np.zeros((4, 64), np.float32), "FP32")])
    stats = client.get_inference_statistics("mlp", as_json=True)["model_stats"]
    by_version = {s["version"]: s for s in stats}
    assert set(by_version) == {"1", "2"}
    v1 = by_version["1"]
    assert int(v1["inference_count"]) == before + 4 and int(v1["execution_count"]) >= 1
    assert int(v1["inference_stats"]["success"]["count"]) >= 1
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {"mlp", "id-fp16"} <= {s["name"] for s in everything}
    assert "secret" not in {s["name"] for s in everything}  # keyed: not without its key


def test_repository_index_lists_every_version_and_load_unload_point_at_the_registry(client):
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "mlp", "version": "2", "state": "READY"} in index
    assert len(index) == sum(len(v) for v in MODELS.values())
    for action in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException, match="registry") as info:
            action("mlp")
        assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert client.is_model_ready("mlp")


# -- errors as gRPC status codes -------------------------------------------------------------


@pytest.mark.parametrize("request_,metadata,code,needle", [
    (_mlp_request(model_name="nope"), (), "NOT_FOUND", "nope"),
    (_mlp_request(model_version="9"), (), "NOT_FOUND", "'9'"),
    (_mlp_request(inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 32])], raw_input_contents=[b"\0" * 128]),
     (), "INVALID_ARGUMENT", "dimension 1"),
    (_mlp_request(inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 64])], raw_input_contents=[b"\0" * 100]),
     (), "INVALID_ARGUMENT", "256 bytes"),
    (_mlp_request(inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="INT32", shape=[1, 64])]), (), "INVALID_ARGUMENT", "INT32"),
    (_mlp_request(raw_input_contents=[]), (), "INVALID_ARGUMENT", "fp32_contents"),
    (_mlp_request(inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP16", shape=[1, 64], contents=pb.InferTensorContents(
            fp32_contents=[0.0] * 64))], raw_input_contents=[]),
     (), "INVALID_ARGUMENT", "raw_input_contents"),
    (_mlp_request(inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[33, 64])], raw_input_contents=[b"\0" * 33 * 256]),
     (), "INVALID_ARGUMENT", "max_batch_size"),
    (_mlp_request(outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="nope")]),
     (), "INVALID_ARGUMENT", "nope"),
    (_mlp_request(model_name="secret", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 4])], raw_input_contents=[b"\0" * 16]),
     (), "UNAUTHENTICATED", "API key"),
    (_mlp_request(model_name="secret", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 4])], raw_input_contents=[b"\0" * 16]),
     (("x-api-key", "wrong"),), "UNAUTHENTICATED", "not accepted"),
], ids=["unknown model", "unknown version", "bad shape", "raw bytes disagree", "datatype",
        "no data", "FP16 has no typed field", "over max_batch_size", "unknown output",
        "no predict key", "wrong predict key"])
def test_errors_are_grpc_status_codes_naming_the_problem(stub, request_, metadata, code,
                                                         needle):
    error = _status(stub.ModelInfer, request_, metadata=metadata)
    assert error.code() == getattr(grpc.StatusCode, code), error.details()
    assert needle in error.details()


def test_a_predict_key_opens_its_model_over_metadata_as_over_headers(client, stub):
    x = np.array([[1, 2, 3, 4]], np.float32)
    for headers in ({"x-api-key": API_KEY}, {"authorization": f"Bearer {API_KEY}"}):
        got = client.infer("secret", [_input("x", x, "FP32")], headers=headers).as_numpy("y")
        np.testing.assert_array_equal(got, x)
    error = _status(stub.ModelMetadata, pb.ModelMetadataRequest(name="secret"))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ("www-authenticate", "Bearer") in error.trailing_metadata()
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="secret"),
                              metadata=[("x-api-key", API_KEY)])
    assert meta.name == "secret"


def test_a_message_that_is_not_a_model_infer_request_is_invalid_argument(channel):
    infer = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=None,
                                response_deserializer=None)
    error = _status(infer, b"\x0a\xff\xff\xff\xff\x0f")  # a length past the message's end
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert "cannot be parsed" in error.details()


def test_a_rate_limit_refusal_is_resource_exhausted_naming_the_limit(stub):
    request = pb.ModelInferRequest(
        model_name="limited", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=[1, 4])],
        raw_input_contents=[np.zeros((1, 4), np.float32).tobytes()])
    stub.ModelInfer(request)  # the burst's one call
    error = _status(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert "rate limit" in error.details()
    assert dict(error.trailing_metadata())["retry-after"] == "100"


def test_unknown_models_are_not_found_for_metadata_config_and_statistics(stub):
    for call, request in ((stub.ModelMetadata, pb.ModelMetadataRequest(name="nope")),
                          (stub.ModelConfig, pb.ModelConfigRequest(name="nope")),
                          (stub.ModelStatistics, pb.ModelStatisticsRequest(name="nope"))):
        error = _status(call, request)
        assert error.code() == grpc.StatusCode.NOT_FOUND and "nope" in error.details()
    error = _status(stub.SystemSharedMemoryStatus, pb.SystemSharedMemoryStatusRequest())
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED


# -- the KServe SDK, unchanged ----------------------------------------------------------------

KSERVE_SCRIPT = r"""
import asyncio, json, sys
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest

async def main(address):
    async with InferenceGRPCClient(address, retries=0) as client:
        answer = {"live": await client.is_server_live(), "ready": await client.is_server_ready(),
                  "model_ready": await client.is_model_ready("mlp")}
        x = np.full((2, 64), 0.5, np.float32)
        raw = InferInput("x", [2, 64], "FP32")
        raw.set_data_from_numpy(x, binary_data=True)
        result = await client.infer(InferRequest("mlp", [raw], request_id="k1"))
        answer["raw"] = [result.id, result.model_version, result.outputs[0].as_numpy().tolist()]
        typed = InferInput("x", [1, 4], "BYTES", data=["a", "bb", "", "dd"])
        result = await client.infer(InferRequest("id-bytes", [typed]))
        answer["bytes"] = [v.decode() for v in result.outputs[0].as_numpy().ravel()]
        ints = InferInput("x", [1, 4], "INT32", data=[1, -2, 3, -4])
        result = await client.infer(InferRequest("id-int32", [ints]))
        answer["int32"] = result.outputs[0].as_numpy().tolist()
        try:
            await client.infer(InferRequest("nope", [raw]))
        except Exception as exc:
            answer["unknown"] = exc.code().name
    print(json.dumps(answer))

asyncio.run(main(sys.argv[1]))
"""


def test_the_kserve_sdk_grpc_client_works_unchanged(server):
    run = subprocess.run([sys.executable, "-c", KSERVE_SCRIPT, server.grpc_address],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["live"] and answer["ready"] and answer["model_ready"]
    rid, version, rows = answer["raw"]
    assert rid == "k1" and version == "1"
    x = np.full((2, 64), 0.5, np.float32)
    np.testing.assert_allclose(np.array(rows, np.float32), reference("mlp", 1, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    assert answer["bytes"] == ["a", "bb", "", "dd"]
    assert answer["int32"] == [[1, -2, 3, -4]]
    assert answer["unknown"] == "NOT_FOUND"


# -- lifecycle: starting, draining ----------------------------------------------------------


def test_a_starting_replica_is_live_not_serving_and_answers_unavailable(tmp_path):
    root = tmp_path / "models"
    write_model(root, "mlp", "1", samples.mlp())
    (root / "mlp" / "config.json").write_text("{not json")  # the first table never comes
    starting = Server(root, grpc=True)
    try:
        client = tgrpc.InferenceServerClient(starting.grpc_address)
        deadline = time.time() + 60
        while True:
            try:
                assert client.is_server_live()
                break
            except InferenceServerException:
                if time.time() > deadline or starting.proc.poll() is not None:
                    raise
                time.sleep(0.1)
        assert not client.is_server_ready() and not client.is_model_ready("mlp")
        with grpc.insecure_channel(starting.grpc_address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(service=SERVICE)).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for call, request in ((stub.ModelInfer, _mlp_request()),
                                  (stub.RepositoryIndex, pb.RepositoryIndexRequest())):
                error = _status(call, request)
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                assert "starting" in error.details()
                assert ("retry-after", "1") in error.trailing_metadata()
    finally:
        starting.stop()


@pytest.mark.faults
def test_sigterm_lets_calls_in_flight_finish_then_stops_taking_calls(tmp_path):
    root = tmp_path / "models"
    write_model(root, "busy", "1", samples.busy(layers=16), {"max_batch_size": 0})
    srv = Server(root, grpc=True, MMC_DRAIN_SECONDS="60")
    try:
        srv.wait_ready()
        with grpc.insecure_channel(srv.grpc_address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            rows = np.zeros((128, 64), np.float32)  # ~2e10 multiply-adds: ~1 s a call
            request = _mlp_request(model_name="busy", raw_input_contents=[rows.tobytes()],
                                   inputs=[pb.ModelInferRequest.InferInputTensor(
                                       name="x", datatype="FP32", shape=[128, 64])])
            stub.ModelInfer(request)  # the channel is connected
            calls = [stub.ModelInfer.future(request) for _ in range(4)]
            deadline = time.time() + 60
            while _pending(srv, "busy") < 2:  # one or two run, the others wait in the queue
                assert time.time() < deadline, "calls never reached the queue"
                time.sleep(0.02)
            srv.proc.send_signal(signal.SIGTERM)
            answers = [call.result(timeout=120) for call in calls]
            assert all(a.model_version == "1" for a in answers)
            srv.proc.wait(60)  # it exits once they are answered
            error = _status(stub.ModelInfer, request, timeout=5)
            assert error.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        srv.stop()


def _pending(srv: Server, model: str) -> int:
    text = httpx.get(f"{srv.url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_grpc_is_off_unless_a_port_is_given():
    """Off by default: `--grpc-port` (or $MMC_GRPC_PORT) turns it on."""
    from serving.http.app import ServingSettings

    assert ServingSettings.from_env({}).grpc_port is None
    settings = ServingSettings.from_env({"MMC_GRPC_PORT": "9001", "MMC_GRPC_HOST": "0.0.0.0"})
    assert (settings.grpc_port, settings.grpc_host) == (9001, "0.0.0.0")


def test_health_says_not_serving_from_the_drain_on_while_calls_are_still_answered():
    async def scenario() -> list:
        dataplane = DataPlane(replica="r")
        dataplane.started = True  # an (empty) route table is in: ready
        front = GrpcFront(dataplane, host="127.0.0.1", port=0, max_message_bytes=1 << 20)
        await front.start()
        seen = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
                health = health_pb2_grpc.HealthStub(channel)
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                ask = health_pb2.HealthCheckRequest(service=SERVICE)
                seen.append((await health.Check(ask)).status)
                dataplane.draining = True  # what SIGTERM does (ServingApp.begin_drain)
                await front.begin_drain()
                seen.append((await health.Check(ask)).status)
                seen.append((await stub.ServerLive(pb.ServerLiveRequest())).live)
                seen.append((await stub.ServerReady(pb.ServerReadyRequest())).ready)
        finally:
            await front.stop(1)
        return seen

    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    assert asyncio.run(scenario()) == [serving, not_serving, True, False]
