"""What a client can send never costs the server a 500 or memory it keeps: bytes that are not
text, answers larger than the version's output budget (or than memory), and the details of a
model that has predict keys. The v2 health and ready answers say what the protocol says."""

from __future__ import annotations

import json
import struct
import time

import httpx
import pytest
from onnx import TensorProto, helper

from registry import samples
from tests.conftest import CLUSTERED
from tests.replicas import replicas, wait_until
from tests.serving.test_app import Server, write_model

MiB = 1 << 20
DEFAULT_BUDGET = 4 * MiB  # the replica's MMC_MAX_OUTPUT_BYTES here
BIG_BUDGET = 512 * MiB  # config.json of the model that may answer 400 MB


def expand_by_input() -> bytes:
    """y = x broadcast to the shape in input s: the request chooses the size of the answer."""
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "s"], ["y"])], "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile") / "models"
    write_model(root, "text", "1", samples.identity(TensorProto.STRING, ["batch", 2]))
    write_model(root, "grow", "1", expand_by_input(), {"max_batch_size": 0})
    write_model(root, "big", "1", expand_by_input(),
                {"max_batch_size": 0, "max_output_bytes": BIG_BUDGET})
    srv = Server(root, MMC_MAX_OUTPUT_BYTES=str(DEFAULT_BUDGET))
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def expand(server: Server, model: str, rows: int, cols: int, *, binary: bool = False):
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.5]},
                       {"name": "s", "shape": [2], "datatype": "INT64", "data": [rows, cols]}]}
    if binary:
        body["parameters"] = {"binary_data_output": True}
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=60)


def test_non_utf8_bytes_element_is_a_400(server):
    blocks = b"".join(struct.pack("<I", len(b)) + b for b in (b"ok", b"\xff\xfe", b"a", b"b"))
    header = json.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(blocks)}}]}).encode()
    r = httpx.post(f"{server.url}/v2/models/text/infer", content=header + blocks,
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400, r.text
    assert "input 'x'" in r.json()["error"] and "element 1" in r.json()["error"]
    assert "UTF-8" in r.json()["error"]
    ok = b"".join(struct.pack("<I", len(b)) + b for b in (b"ok", "é".encode(), b"a", b"b"))
    header = header.replace(b'"binary_data_size": %d' % len(blocks),
                            b'"binary_data_size": %d' % len(ok))
    r = httpx.post(f"{server.url}/v2/models/text/infer", content=header + ok,
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == ["ok", "é", "a", "b"]


def test_an_output_over_the_version_budget_is_a_400_naming_it(server):
    assert expand(server, "grow", 1024, 1024).status_code == 200  # 4 MiB: the budget, exactly
    r = expand(server, "grow", 1025, 1024)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "max_output_bytes" in error and str(DEFAULT_BUDGET) in error
    assert str(1025 * 1024 * 4) in error and "'grow'" in error
    # 2**43 floats (32 TiB) cannot even be allocated; 2**80 bytes overflow a size: still 400s.
    for rows, cols in ((2**21, 2**22), (2**40, 2**40)):
        r = expand(server, "grow", rows, cols)
        assert r.status_code == 400, r.text
        assert "max_output_bytes" in r.json()["error"] and str(DEFAULT_BUDGET) in r.json()["error"]
    # A version's own budget (config.json here; the registry's ModelVersion.max_output_bytes)
    # wins over the replica's default.
    assert expand(server, "big", 1025, 1024, binary=True).status_code == 200
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_a_model_refusing_the_values_sent_is_a_400_not_a_500(server):
    r = expand(server, "grow", -1, 3)  # a negative dimension: the Expand node refuses it
    assert r.status_code == 400, r.text
    assert "'grow'" in r.json()["error"] and "Expand" in r.json()["error"]
    assert expand(server, "grow", 2, 3).json()["outputs"][0]["data"] == [1.5] * 6


def _status(pid: int, field: str) -> int:
    """VmRSS or VmHWM (peak RSS) of a process, in bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")


def test_memory_returns_after_a_large_answer(server):
    pid = server.proc.pid
    expand(server, "big", 256, 1024, binary=True)  # a first 1 MiB answer: steady state
    before = _status(pid, "VmRSS")
    r = expand(server, "big", 100 * 1024, 1024, binary=True)  # 400 MiB of FP32
    assert r.status_code == 200 and len(r.content) > 400 * MiB
    del r
    r = expand(server, "big", 150 * 1024, 1024, binary=True)  # 600 MiB: over the budget
    assert r.status_code == 400 and "max_output_bytes" in r.json()["error"]
    # It was really held (peak RSS), and then really given back; onnxruntime's CPU arena or a
    # reference kept to the last batch would keep 400 MB and more for good.
    assert _status(pid, "VmHWM") > before + 400 * MiB
    deadline = time.time() + 15
    while _status(pid, "VmRSS") > before + 100 * MiB and time.time() < deadline:
        time.sleep(0.1)
    assert _status(pid, "VmRSS") - before < 100 * MiB, (before, _status(pid, "VmRSS"))


def test_live_answers_live_true(server):
    r = httpx.get(f"{server.url}/v2/health/live")
    assert r.status_code == 200 and r.json() == {"live": True}
    assert r.headers["content-type"] == "application/json"


def test_model_ready_names_the_model(server):
    r = httpx.get(f"{server.url}/v2/models/text/ready")
    assert r.status_code == 200 and r.json() == {"name": "text", "ready": True}
    r = httpx.get(f"{server.url}/v2/models/text/versions/1/ready")
    assert r.status_code == 200 and r.json() == {"name": "text", "ready": True}


@pytest.mark.django_db(transaction=True)
def test_metadata_config_and_stats_of_a_keyed_endpoint_need_its_key(engineer, ready_model,
                                                                    tmp_path):
    ready_model("guarded", samples.mlp())
    ready_model("open", samples.mlp(seed=1))
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path) as (rep,):
        for model in ("guarded", "open"):
            r = engineer.post(f"/api/v1/models/{model}/endpoint/deploy/?wait=15",
                              {"version": 1}, format="json")
            assert r.status_code == 200, r.content
        details = [f"{rep.url}/v2/models/guarded", f"{rep.url}/v2/models/guarded/config",
                   f"{rep.url}/v2/models/guarded/stats",
                   f"{rep.url}/v2/models/guarded/versions/1",
                   f"{rep.url}/v2/models/guarded/versions/1/config",
                   f"{rep.url}/v2/models/guarded/versions/1/stats"]
        assert all(httpx.get(url).status_code == 200 for url in details)
        key = engineer.post("/api/v1/models/guarded/endpoint/keys/", {"name": "app"},
                            format="json").json()["key"]
        wait_until(lambda: httpx.get(details[0]).status_code == 401, what="key required")
        for url in details:
            r = httpx.get(url)
            assert r.status_code == 401 and "API key" in r.json()["error"], url
            assert httpx.get(url, headers={"X-Api-Key": key + "x"}).status_code == 401, url
            assert httpx.get(url, headers={"X-Api-Key": key}).status_code == 200, url
            r = httpx.get(url, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, url
        # Every model's statistics leave out those whose key the caller did not show.
        names = {s["name"] for s in httpx.get(f"{rep.url}/v2/models/stats").json()["model_stats"]}
        assert names == {"open"}
        r = httpx.get(f"{rep.url}/v2/models/stats", headers={"X-Api-Key": key})
        assert {s["name"] for s in r.json()["model_stats"]} == {"open", "guarded"}
        # Readiness stays a probe: it says no more than whether the model can answer.
        r = httpx.get(f"{rep.url}/v2/models/guarded/ready")
        assert r.status_code == 200 and r.json() == {"name": "guarded", "ready": True}


@pytest.mark.django_db(transaction=True)
def test_a_version_budget_set_through_the_api_reaches_the_replicas(engineer, ready_model):
    from registry.serving_source import build_desired_state

    ready_model("sized", samples.mlp())
    r = engineer.patch("/api/v1/models/sized/versions/1/", {"max_output_bytes": 123456},
                       format="json")
    assert r.status_code == 200 and r.json()["max_output_bytes"] == 123456, r.content
    r = engineer.patch("/api/v1/models/sized/versions/1/", {"max_output_bytes": -1},
                       format="json")
    assert r.status_code == 400 and r.json()["field"] == "max_output_bytes"
    assert engineer.post("/api/v1/models/sized/endpoint/deploy/", {"version": 1},
                         format="json").status_code == 200
    assert build_desired_state().versions[("sized", "1")].max_output_bytes == 123456
