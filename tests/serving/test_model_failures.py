"""A model that fails at run time on inputs its signature accepts is the version's fault, not
the caller's: HTTP 500 with the model's message as JSON, gRPC INTERNAL, counted against that
version (its failures and `mmc_inference_model_failures_total`), one log line and no traceback;
a caller's bad input stays a 400 (INVALID_ARGUMENT) the model is not blamed for."""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from registry import samples
from tests.serving.test_app import Server, write_model


def _model(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "failing", inputs, outputs, list(initializers))
    return helper.make_model(graph, ir_version=samples.IR_VERSION, opset_imports=[
        helper.make_opsetid("", samples.OPSET)]).SerializeToString()


def divider() -> bytes:
    """y = x / (x - 1) in INT32: fine on warm-up's zeros, a division by zero where x is 1."""
    one = helper.make_tensor("one", TensorProto.INT32, [], [1])
    return _model([helper.make_node("Sub", ["x", "one"], ["d"]),
                   helper.make_node("Div", ["x", "d"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.INT32, ["batch", 2])],
                  [helper.make_tensor_value_info("y", TensorProto.INT32, ["batch", 2])], [one])


def batch_of_one() -> bytes:
    """Declares a dynamic batch but reshapes to a constant [1, 4]: any batch but 1 fails."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 4])
    return _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [shape])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("failing") / "models"
    write_model(root, "divider", "1", divider(), {"max_batch_size": 0})
    write_model(root, "baked", "1", batch_of_one(), {"max_batch_size": 0})
    srv = Server(root, grpc=True)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _ints(rows: list[list[int]]) -> dict:
    return {"inputs": [{"name": "x", "shape": [len(rows), 2], "datatype": "INT32",
                        "data": [v for row in rows for v in row]}]}


def _failures(server, model: str) -> tuple[int, int]:
    """(the version's failed requests, of which the model's own) from stats and /metrics."""
    stats = httpx.get(f"{server.url}/v2/models/{model}/stats").json()["model_stats"][0]
    metrics = httpx.get(f"{server.url}/metrics").text
    found = re.search(rf'^mmc_inference_model_failures_total\{{model="{model}",replica="[^"]*",'
                      rf'version="1"\}} (\S+)$', metrics, re.M)
    return stats["inference_stats"]["fail"]["count"], int(float(found[1]))


def test_a_model_that_divides_by_zero_is_a_500_naming_the_models_error_not_the_callers(server):
    url = f"{server.url}/v2/models/divider/infer"
    ok = httpx.post(url, json=_ints([[3, 5]]))
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [1, 1]
    before = _failures(server, "divider")

    r = httpx.post(url, json=_ints([[2, 1]]))
    assert r.status_code == 500
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error.startswith("model 'divider' version '1' failed: ")
    assert "Integer division by zero" in error
    assert _failures(server, "divider") == (before[0] + 1, before[1] + 1)

    # a caller's bad input is refused before the model runs: a 400 the model is not blamed for
    bad = httpx.post(url, json={"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                            "data": [1.0, 2.0]}]})
    assert bad.status_code == 400 and "FP32" in bad.json()["error"]
    assert _failures(server, "divider") == (before[0] + 2, before[1] + 1)
    assert httpx.post(url, json=_ints([[0, 4]])).status_code == 200  # the next request is fine


def test_a_model_whose_own_constants_cannot_fit_the_batch_is_a_500(server):
    url = f"{server.url}/v2/models/baked/infer"
    one = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}]}
    two = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [1.0] * 8}]}
    assert httpx.post(url, json=one).status_code == 200
    r = httpx.post(url, json=two)
    assert r.status_code == 500 and "while running Reshape node" in r.json()["error"]


def test_grpc_answers_a_model_failure_internal_and_bad_input_invalid_argument(server):
    client = tgrpc.InferenceServerClient(url=server.grpc_address)
    x = tgrpc.InferInput("x", [1, 2], "INT32")
    x.set_data_from_numpy(np.array([[1, 7]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as failed:
        client.infer("divider", [x])
    assert failed.value.status() == "StatusCode.INTERNAL"
    assert "Integer division by zero" in failed.value.message()
    wrong = tgrpc.InferInput("x", [1, 2], "INT64")
    wrong.set_data_from_numpy(np.array([[1, 7]], dtype=np.int64))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("divider", [wrong])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_model_failure_is_one_log_line_without_a_traceback(server):
    httpx.post(f"{server.url}/v2/models/divider/infer", json=_ints([[1, 1]]))
    log = server.log.read_text()
    assert "Integer division by zero" in log
    assert "Traceback" not in log
