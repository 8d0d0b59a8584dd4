"""Models from today's exporters (onnx 1.23 writes IR 14 / opset 28 by default; the installed
onnxruntime loads less): the upload is refused naming both numbers, and "convert" makes the next
version at the highest IR and opset the runtime loads, kept only when its outputs (onnxruntime)
match the original's (onnx's reference evaluator) on generated inputs, with its lineage on the
new version and in the audit log; refused, with the reason, when it cannot be converted."""

from __future__ import annotations

import json
import re
import resource
import time

import numpy as np
import onnx
import pytest
import tritonclient.http as triton
from onnx.reference import ReferenceEvaluator

from registry.signatures import runtime_limits
from tests import onnx_cases
from tests.conftest import CLUSTERED, upload, wait_validated
from tests.replicas import replicas

pytestmark = pytest.mark.django_db(transaction=True)
MAX_IR, MAX_OPSET = runtime_limits()
CONVERT = "/api/v1/models/{}/versions/{}/convert/"


@pytest.fixture
def refused(engineer):
    """upload_refused("name", bytes) -> the version JSON, failed because it is too new."""

    def make(name: str, data: bytes) -> dict:
        assert engineer.post("/api/v1/models/", {"name": name}, format="json").status_code == 201
        r = upload(engineer, name, data, filename="today.onnx", metadata={"commit": "c0ffee"})
        assert r.status_code == 201, r.content
        return wait_validated(engineer, name, r.json()["number"])

    return make


def test_the_installed_runtime_loads_less_than_onnx_writes():
    assert (onnx.IR_VERSION, onnx.defs.onnx_opset_version()) == (14, 28)
    assert (MAX_IR, MAX_OPSET) == (13, 26)  # onnxruntime 1.31.1


def test_todays_model_is_refused_then_converted_validated_and_served_like_the_original(
        engineer, admin, refused, tmp_path):
    original = onnx_cases.todays_mlp()
    v1 = refused("today", original)
    assert v1["status"] == "failed"
    assert "IR version 14" in v1["failure_reason"] and f"max IR version {MAX_IR}" in v1[
        "failure_reason"]
    assert "opset 28" in v1["failure_reason"] and f"max opset {MAX_OPSET}" in v1["failure_reason"]
    assert v1["validation_report"]["runtime_too_new"] == {
        "ir_version": 14, "opset": 28, "max_ir_version": MAX_IR, "max_opset": MAX_OPSET,
        "runtime": "onnxruntime 1.31.1"}

    r = engineer.post(CONVERT.format("today", 1))
    assert r.status_code == 201, r.content
    v2 = r.json()
    assert v2["number"] == 2 and v2["created"] is True
    assert v2["original_filename"] == f"today-ir{MAX_IR}-opset{MAX_OPSET}.onnx"
    meta = v2["metadata"]
    assert meta["commit"] == "c0ffee"  # the original's lineage carries over
    assert meta["converted_from"] == 1 and meta["converted_by"] == "engineer"
    conversion = meta["conversion"]
    assert conversion["from"] == {"ir_version": 14, "opset": 28}
    assert conversion["to"] == {"ir_version": MAX_IR, "opset": MAX_OPSET}
    assert conversion["tolerance"] == {"rtol": 1e-4, "atol": 1e-5}
    assert 0 <= conversion["max_abs_diff"] <= 1e-5 and conversion["inputs"] == {"x": [2, 8]}

    done = wait_validated(engineer, "today", 2)
    assert done["status"] == "ready", done["failure_reason"]
    assert done["signature"]["ir_version"] == MAX_IR
    assert done["signature"]["opsets"] == {"": MAX_OPSET}
    events = admin.get("/api/v1/audit/?action=version.convert").json()["results"]
    assert len(events) == 1 and events[0]["actor_name"] == "engineer"
    assert events[0]["target"] == "today:2"
    assert events[0]["before"] == {"version": 1, "ir_version": 14, "opset": 28}
    assert events[0]["after"]["max_abs_diff"] == conversion["max_abs_diff"]

    again = engineer.post(CONVERT.format("today", 1))  # the same bytes: the same version
    assert again.status_code == 200 and again.json()["number"] == 2, again.content
    assert again.json()["created"] is False

    x = np.random.default_rng(7).standard_normal((5, 8)).astype(np.float32)
    expected = ReferenceEvaluator(onnx.load_from_string(original)).run(None, {"x": x})[0]
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path) as (rep,):
        r = engineer.post("/api/v1/models/today/endpoint/deploy/?wait=15", {"version": 2},
                          format="json")
        assert r.status_code == 200 and r.json()["convergence"]["converged"], r.content
        client = triton.InferenceServerClient(rep.url.removeprefix("http://"))
        inp = triton.InferInput("x", [5, 8], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = client.infer("today", [inp])
        assert result.get_response()["model_version"] == "2"
        np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-4, atol=1e-5)


def test_an_operator_with_no_adapter_down_to_the_runtimes_opset_is_refused_with_the_reason(
        engineer, refused):
    assert refused("gated", onnx_cases.todays_swiglu())["status"] == "failed"
    r = engineer.post(CONVERT.format("gated", 1))
    assert r.status_code == 422, r.content
    assert "operator SwiGLU cannot be converted down to opset 26" in r.json()["error"]
    assert engineer.get("/api/v1/models/gated/versions/").json()["count"] == 1


def test_outputs_that_differ_beyond_the_tolerance_are_refused_and_nothing_is_kept(
        engineer, refused, monkeypatch):
    from onnx import numpy_helper, version_converter

    convert = version_converter.convert_version

    def off_by_a_bit(model, opset):  # a converter that changed a weight: a forced mismatch
        converted = convert(model, opset)
        w = numpy_helper.to_array(converted.graph.initializer[0])
        converted.graph.initializer[0].CopyFrom(numpy_helper.from_array(w * 1.01, "w1"))
        return converted

    monkeypatch.setattr(version_converter, "convert_version", off_by_a_bit)
    refused("drift", onnx_cases.todays_mlp())
    r = engineer.post(CONVERT.format("drift", 1))
    assert r.status_code == 422, r.content
    error = r.json()["error"]
    assert "output 'y' of the converted model differs from the original's" in error
    assert "rtol=0.0001, atol=1e-05" in error and "not kept" in error
    assert engineer.get("/api/v1/models/drift/versions/").json()["count"] == 1


def test_only_a_version_too_new_for_the_runtime_is_converted_and_only_by_an_engineer(
        engineer, client_for, ready_model, refused):
    from registry import samples

    ready_model("fine", samples.mlp())
    r = engineer.post(CONVERT.format("fine", 1))
    assert r.status_code == 409 and "nothing to convert" in r.json()["error"], r.content
    assert engineer.post(CONVERT.format("fine", 9)).status_code == 404
    refused("today", onnx_cases.todays_mlp())
    r = client_for("viewer").post(CONVERT.format("today", 1))
    assert r.status_code == 403


def test_mmc_upload_convert_uploads_converts_and_reports_the_new_version(users, tmp_path,
                                                                         capsys):
    from registry.audit import Actor
    from registry.cli.main import main
    from registry.services import token_create
    from tests.replicas import Replica

    _, token = token_create(username="engineer", name="cli", actor=Actor.system("test"))
    (tmp_path / "today.onnx").write_bytes(onnx_cases.todays_mlp(seed=3))
    (tmp_path / "gated.onnx").write_bytes(onnx_cases.todays_swiglu())
    console = Replica("console", embedded=True, log_dir=tmp_path)
    try:
        console.wait_live()
        base = ["--url", console.url, "--token", token]
        assert main([*base, "create-model", "cli-today"]) == 0
        capsys.readouterr()
        assert main([*base, "upload", "cli-today", str(tmp_path / "today.onnx"), "--convert",
                     "--wait", "60"]) == 0
        out, err = capsys.readouterr()
        version = json.loads(out)
        assert version["number"] == 2 and version["status"] == "ready"
        assert version["metadata"]["converted_from"] == 1
        assert "cli-today:1 failed validation: model IR version 14" in err
        assert (f"converted cli-today:1 (IR 14, opset 28) to cli-today:2 (IR {MAX_IR}, opset "
                f"{MAX_OPSET}): outputs match") in err
        assert "(rtol 0.0001, atol 1e-05)" in err
        assert main([*base, "upload", "cli-today", str(tmp_path / "gated.onnx"),
                     "--convert"]) == 1
        err = capsys.readouterr().err
        assert "422: operator SwiGLU cannot be converted" in err
    finally:
        console.stop()


# -- the equivalence check runs in a box: a model cannot take the console's memory or time ----


def _shown_to_users(error: str, settings) -> str:
    """The reason as a user reads it: no path of this host in it."""
    assert str(settings.ARTIFACT_ROOT) not in error
    assert not re.search(r"(^|[\s('\"])/[\w.-]", error), error
    return error


def test_an_input_declaring_2_to_the_40_elements_is_refused_before_anything_is_allocated(
        engineer, refused, settings):
    refused("huge", onnx_cases.todays_huge_input())
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    r = engineer.post(CONVERT.format("huge", 1))
    assert r.status_code == 422, r.content
    error = _shown_to_users(r.json()["error"], settings)
    assert "input 'x' declares shape [1048576, 1048576] (1099511627776 elements, 4 TiB)" in error
    assert "the conversion check's 1 GiB memory limit (MMC_CONVERT_MEMORY_BYTES)" in error
    assert "nothing was allocated" in error
    assert time.monotonic() - started < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100 * 1024  # KiB
    assert engineer.get("/api/v1/models/huge/versions/").json()["count"] == 1


def test_a_model_that_fills_memory_is_refused_naming_the_memory_limit(engineer, refused,
                                                                       settings):
    settings.CONVERT_MEMORY_BYTES = 256 * 1024**2
    refused("filler", onnx_cases.todays_constant_of_shape(1024**3))  # 1 GiB of ones
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = engineer.post(CONVERT.format("filler", 1))
    assert r.status_code == 422, r.content
    error = _shown_to_users(r.json()["error"], settings)
    assert error.startswith("the conversion check ran out of its 256 MiB memory limit "
                            "(MMC_CONVERT_MEMORY_BYTES)"), error
    assert "not kept" in error
    # the gigabyte was asked for in the child: this process did not grow
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100 * 1024  # KiB
    assert engineer.get("/api/v1/models/filler/versions/").json()["count"] == 1


def test_a_model_that_runs_too_long_is_refused_within_the_time_limit(engineer, refused,
                                                                      settings):
    settings.CONVERT_TIMEOUT_S = 2
    refused("looper", onnx_cases.todays_long_loop(300_000))
    started = time.monotonic()
    r = engineer.post(CONVERT.format("looper", 1))
    took = time.monotonic() - started
    assert r.status_code == 422, r.content
    error = _shown_to_users(r.json()["error"], settings)
    assert error.startswith("the conversion check ran past its 2 s time limit "
                            "(MMC_CONVERT_TIMEOUT_S)"), error
    assert 2 <= took < 4
    assert engineer.get("/api/v1/models/looper/versions/").json()["count"] == 1


def test_a_refusal_that_would_name_a_path_on_this_host_names_none(engineer, refused, settings):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones(4, np.float32), "w")  # weights "next to" the store
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=str(settings.ARTIFACT_ROOT / "weights.bin"))
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    model = helper.make_model(graph, ir_version=14, opset_imports=[helper.make_opsetid("", 28)])
    v1 = refused("elsewhere", model.SerializeToString())
    assert v1["status"] == "failed"
    _shown_to_users(v1["failure_reason"], settings)
    r = engineer.post(CONVERT.format("elsewhere", 1))
    assert r.status_code == 422, r.content
    error = _shown_to_users(r.json()["error"], settings)
    assert "should be a relative path, but it is an absolute path: <store>/weights.bin" in error
