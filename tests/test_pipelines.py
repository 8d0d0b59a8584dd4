"""Pipelines: a registered model whose version is a graph of other models' versions. Creation
checks the graph against the registry (a 400 names the bad step or edge, and nothing is written);
a replica serves the composed answer at /v2/models/<pipeline>/infer; canary and rollback between
pipeline versions work as for any model; each step and the pipeline have statistics; the Triton
export writes an ensemble; the version page draws the steps."""

from __future__ import annotations

import io
import json
import tarfile

import httpx
import numpy as np
import pytest
from django.test import Client
from google.protobuf import text_format
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from registry import samples, services
from registry.audit import Actor
from registry.models import AuditEvent, ModelVersion
from registry.store.artifacts import default_store
from tests import onnx_cases
from tests.conftest import CLUSTERED, upload, wait_validated
from tests.replicas import replicas, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
SYSTEM = Actor.system("test")
X = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.0, 10.0]]


def spec(scaler: dict | None = None, *, edges=None) -> dict:
    """double = scaler (x → y), sum = adder (a + b): y = scaler(x) + x."""
    return {"steps": [{"name": "double", "model": "scaler", **(scaler or {"version": 1})},
                      {"name": "sum", "model": "adder", "version": 1}],
            "edges": edges or [{"from": "x", "to": "double.x"}, {"from": "double.y", "to": "sum.a"},
                               {"from": "x", "to": "sum.b"}, {"from": "sum.sum", "to": "y"}]}


def create(client, body: dict, model: str = "pipe"):
    return client.post(f"/api/v1/models/{model}/versions/pipeline/", body, format="json")


@pytest.fixture
def steps(engineer, ready_model):
    """scaler v1 (×2), scaler v2 (×10, alias production), adder v1; model `pipe`, empty."""
    ready_model("scaler", samples.scale(2.0))
    ready_model("scaler", samples.scale(10.0))
    ready_model("adder", samples.add())
    services.alias_set(model_name="scaler", alias="production", version_number=2, actor=SYSTEM)
    assert engineer.post("/api/v1/models/", {"name": "pipe"}, format="json").status_code == 201


def test_a_pipeline_version_is_ready_at_once_with_its_own_signature_and_pinned_steps(engineer,
                                                                                   steps):
    r = create(engineer, spec({"alias": "production"}))
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["number"], body["status"], body["format"]) == (1, "ready", "pipeline")
    assert body["signature"] == {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}
    assert body["pipeline"]["steps"][0] == {"name": "double", "model": "scaler", "version": 2,
                                            "alias": "production"}
    assert body["max_batch_size"] == 32  # the smallest of its steps'
    # The alias moves on; the pipeline version does not.
    services.alias_set(model_name="scaler", alias="production", version_number=1, actor=SYSTEM)
    again = engineer.get("/api/v1/models/pipe/versions/1/").json()
    assert again["pipeline"]["steps"][0]["version"] == 2
    # Its artifact is the spec itself, stored by sha256 like any artifact.
    stored = json.loads(default_store().path_for(body["sha256"]).read_bytes())
    assert stored == again["pipeline"]
    # The alias now names scaler v1: the same request is a new pipeline; sent again, nothing.
    moved = create(engineer, spec({"alias": "production"}))
    assert moved.status_code == 201 and moved.json()["number"] == 2
    repeat = create(engineer, spec({"alias": "production"}))
    assert repeat.status_code == 200 and repeat.json()["created"] is False
    assert repeat.json()["number"] == 2
    assert [e.action for e in AuditEvent.objects.filter(model_name="pipe").order_by("id")] == [
        "model.create", "version.pipeline", "version.ready", "version.pipeline", "version.ready"]
    # Serving settings are the steps' own; jobs and engines take model files.
    refused = engineer.patch("/api/v1/models/pipe/versions/1/", {"max_batch_size": 4},
                             format="json")
    assert refused.status_code == 400 and "configure the step versions" in refused.json()["error"]
    job = engineer.post("/api/v1/models/pipe/async-infer/?version=1", {"inputs": []},
                        format="json")
    assert job.status_code == 409 and "is a pipeline" in job.json()["error"]
    engine = engineer.post("/api/v1/models/pipe/versions/1/tensorrt/", {"precision": "fp16"},
                           format="json")
    assert engine.status_code == 409 and "build engines for its steps" in engine.json()["error"]


def test_a_bad_spec_is_a_400_that_names_the_problem_and_writes_nothing(engineer, steps,
                                                                       ready_model):
    ready_model("iadder", samples.add(elem_type=TensorProto.INT64))
    ready_model("adder3", samples.add(n=3))
    r = upload(engineer, "adder", onnx_cases.checker_failure())
    assert wait_validated(engineer, "adder", r.json()["number"])["status"] == "failed"  # v2
    fed = [{"from": "x", "to": "double.x"}, {"from": "double.y", "to": "sum.a"},
           {"from": "x", "to": "sum.b"}, {"from": "sum.sum", "to": "y"}]

    def with_adder(model: str, version: int = 1) -> dict:
        body = spec()
        body["steps"][1] = {"name": "sum", "model": model, "version": version}
        return body

    cases = [
        (spec({"version": 1}) | {"steps": [{"name": "double", "model": "nope", "version": 1}]},
         "step 'double': unknown model 'nope'"),
        (spec({"version": 7}), "step 'double': model 'scaler' has no version 7"),
        (spec({"alias": "staging"}), "step 'double': model 'scaler' has no alias 'staging'"),
        (with_adder("adder", 2), "step 'sum': adder:2 is failed, not ready"),
        (with_adder("iadder"), "edge double.y → sum.a: datatype mismatch: step 'double' "
                               "(scaler:1) output 'y' is FP32 but sum.a takes INT64"),
        (with_adder("adder3"), "edge double.y → sum.a: shape mismatch: step 'double' (scaler:1) "
                               "output 'y' has shape [-1, 4] but sum.a takes [-1, 3]"),
        (spec(edges=fed[:2] + fed[3:]), "step 'sum' (adder:1) input 'b' is not fed by any edge"),
        (spec(edges=[*fed, {"from": "double.y", "to": "sum.b"}]),
         "sum.b is fed twice: by x → sum.b and by double.y → sum.b"),
        (spec(edges=[{"from": "sum.sum", "to": "double.x"}, fed[1], fed[2], fed[3]]),
         "the steps form a cycle: "),
        (spec(edges=[*fed, {"from": "double.z", "to": "z"}]),
         "edge double.z → z: step 'double' (scaler:1) has no output 'z' (its outputs: y)"),
        (spec(edges=[*fed, {"from": "x", "to": "other.a"}]), "edge x → other.a: unknown step "
                                                             "'other' (steps: double, sum)"),
        (spec() | {"extra": 1}, "unknown key(s) extra"),
    ]
    blobs = set(default_store().blobs())
    for body, message in cases:
        r = create(engineer, body)
        assert r.status_code == 400, (message, r.content)
        assert message in r.json()["error"], (message, r.json())
    assert not ModelVersion.objects.filter(model__name="pipe").exists()
    assert not AuditEvent.objects.filter(model_name="pipe").exclude(
        action="model.create").exists()
    assert set(default_store().blobs()) == blobs
    nested = create(engineer, spec())
    assert nested.status_code == 201
    r = create(engineer, spec() | {"steps": [{"name": "inner", "model": "pipe", "version": 1}]},
               model="adder")
    assert r.status_code == 400 and "pipelines do not nest" in r.json()["error"]


def infer(http: httpx.Client, model: str, **headers) -> tuple[str, np.ndarray]:
    r = http.post(f"/v2/models/{model}/infer", headers=headers, json={"inputs": [
        {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": sum(X, [])}]})
    assert r.status_code == 200, r.text
    return r.headers["x-model-version"], np.array(r.json()["outputs"][0]["data"]).reshape(2, 4)


def post(client, model: str, path: str, body: dict | None = None) -> dict:
    r = client.post(f"/api/v1/models/{model}/endpoint/{path}/?wait=30", body or {},
                    format="json")
    assert r.status_code == 200, r.content
    assert r.json()["convergence"]["converged"], r.json()
    return r.json()


def test_a_replica_serves_pipeline_versions_with_canary_rollback_and_statistics(engineer, steps,
                                                                               tmp_path):
    assert create(engineer, spec({"version": 1})).status_code == 201  # y = 2x + x
    assert create(engineer, spec({"version": 2})).status_code == 201  # y = 10x + x
    want = {"1": 3 * np.array(X), "2": 11 * np.array(X)}
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path) as (rep,), \
            httpx.Client(base_url=rep.url, timeout=20) as http:
        post(engineer, "pipe", "deploy", {"version": 1})
        version, y = infer(http, "pipe")
        assert version == "1" and np.allclose(y, want["1"])
        meta = http.get("/v2/models/pipe").json()
        assert meta["platform"] == "ensemble" and meta["inputs"][0]["shape"] == [-1, 4]

        post(engineer, "pipe", "canary", {"version": 2, "weight": 50})
        seen = {}
        for i in range(60):
            version, y = infer(http, "pipe", **{"X-Routing-Key": f"k{i}"})
            assert np.allclose(y, want[version]), version
            seen[version] = seen.get(version, 0) + 1
        assert set(seen) == {"1", "2"}, seen

        post(engineer, "pipe", "promote")
        assert {infer(http, "pipe")[0] for _ in range(5)} == {"2"}
        post(engineer, "pipe", "rollback", {"version": 1})
        for _ in range(5):
            version, y = infer(http, "pipe")
            assert version == "1" and np.allclose(y, want["1"])

        stats = {(s["name"], s["version"]): s["inference_stats"]["success"]["count"]
                 for s in http.get("/v2/models/stats").json()["model_stats"]}
        assert stats[("pipe", "1")] >= 6 and stats[("adder", "1")] >= 66
        assert stats[("scaler", "1")] + stats.get(("scaler", "2"), 0) == stats[("adder", "1")]
        config = http.get("/v2/models/pipe/config").json()
        assert config["platform"] == "ensemble"
        assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
            "scaler", "adder"]


def test_a_replica_holds_calls_through_a_pipeline_to_its_steps_rules(engineer, steps, tmp_path):
    """adder's endpoint serves nothing but has a key and a rate limit; scaler serves v2 while
    the pipeline runs scaler v1, which only the pipeline may reach."""
    services.endpoint_deploy(model_name="scaler", version_number=2, actor=SYSTEM)
    _, key = services.api_key_create(model_name="adder", name="app", actor=SYSTEM)
    services.limits_set(model_name="adder", actor=SYSTEM, rps=0.01, burst=3)
    assert create(engineer, spec({"version": 1})).status_code == 201
    services.endpoint_deploy(model_name="pipe", version_number=1, actor=SYSTEM)
    x = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": sum(X, [])}]}
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path) as (rep,), \
            httpx.Client(base_url=rep.url, timeout=20) as http:
        # refused before any limit is counted: once the pipeline is loaded, for the step's key
        wait_until(lambda: http.post("/v2/models/pipe/infer", json=x).status_code == 401,
                   what="the pipeline loaded, asking for its step's key")
        refused = http.post("/v2/models/pipe/infer", json=x).json()["error"]
        assert refused.startswith("step 'sum' (model 'adder') of pipeline 'pipe' needs an API key")
        for _ in range(3):
            version, y = infer(http, "pipe", **{"X-Api-Key": key})
            assert version == "1" and np.allclose(y, 3 * np.array(X))
        limited = http.post("/v2/models/pipe/infer", json=x, headers={"X-Api-Key": key})
        assert limited.status_code == 429
        assert limited.json()["error"].startswith(
            "step 'sum' (model 'adder') of pipeline 'pipe': rate limit of model 'adder'")
        pinned = http.post("/v2/models/scaler/versions/1/infer", json=x)
        assert pinned.status_code == 404 and "only as a pipeline step" in pinned.json()["error"]
        version, y = infer(http, "scaler")
        assert version == "2" and np.allclose(y, 10 * np.array(X))


def test_the_triton_export_of_a_pipeline_is_an_ensemble_with_its_step_models(engineer, steps):
    assert create(engineer, spec({"alias": "production"})).status_code == 201
    r = engineer.get("/api/v1/models/pipe/export?format=triton")
    assert r.status_code == 200, r.content
    tar = tarfile.open(fileobj=io.BytesIO(b"".join(r.streaming_content)), mode="r:gz")
    assert sorted(m.name for m in tar.getmembers() if m.isfile()) == [
        "adder/1/model.onnx", "adder/config.pbtxt", "pipe/config.pbtxt",
        "scaler/2/model.onnx", "scaler/config.pbtxt"]
    assert tar.getmember("pipe/1").isdir()  # Triton wants the version folder, empty

    def config(model: str) -> mc.ModelConfig:
        text = tar.extractfile(f"{model}/config.pbtxt").read().decode()
        return text_format.Parse(text, mc.ModelConfig())

    pipe = config("pipe")
    assert (pipe.name, pipe.platform, pipe.max_batch_size) == ("pipe", "ensemble", 32)
    assert [(t.name, t.data_type, list(t.dims)) for t in pipe.input] == [
        ("x", mc.TYPE_FP32, [4])]
    assert [(t.name, list(t.dims)) for t in pipe.output] == [("y", [4])]
    scheduled = [(s.model_name, s.model_version, dict(s.input_map), dict(s.output_map))
                 for s in pipe.ensemble_scheduling.step]
    assert scheduled == [("scaler", 2, {"x": "x"}, {"y": "double.y"}),
                         ("adder", 1, {"a": "double.y", "b": "x"}, {"sum": "y"})]
    assert config("scaler").platform == "onnxruntime_onnx"
    assert list(config("scaler").version_policy.specific.versions) == [2]
    assert create(engineer, spec({"version": 1})).status_code == 201
    both = engineer.get("/api/v1/models/pipe/export?format=triton")
    assert both.status_code == 409 and "not the same pipeline" in both.json()["error"]


def test_the_version_page_draws_the_steps_each_linking_to_its_version(engineer, steps, users):
    assert create(engineer, spec({"alias": "production"})).status_code == 201
    client = Client()
    client.force_login(users["viewer"])
    html = client.get("/models/pipe/versions/1/").content.decode()
    assert 'id="pipeline"' in html and "<svg" in html
    for node in ("input:x", "step:double", "step:sum", "output:y"):
        assert f'data-node="{node}"' in html, node
    assert 'href="/models/scaler/versions/2/"' in html and 'href="/models/adder/versions/1/"' \
        in html
    assert "pinned from @production" in html
    assert 'id="tensorrt"' not in html  # nothing to build for a pipeline itself
    assert "pipeline · 2 steps" in client.get("/models/pipe/").content.decode()
    client.force_login(users["admin"])
    audit = client.get("/audit/").content.decode()
    assert "created pipeline v1 of pipe: double = scaler v2 · sum = adder v1" in audit


def test_the_cli_creates_a_pipeline_from_a_spec_file(live_server, steps, tmp_path, capsys):
    from registry.cli.main import main as mmc

    _, token = services.token_create(username="engineer", name="cli", actor=SYSTEM)
    cli = ["--url", live_server.url, "--token", token, "pipeline", "create"]
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(spec()))
    bad.write_text(json.dumps(spec() | {"steps": [{"name": "double", "model": "nope",
                                                   "version": 1}]}))
    assert mmc([*cli, "scores", "--spec", str(good), "--create-model"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert (made["model"], made["number"], made["status"]) == ("scores", 1, "ready")
    assert mmc([*cli, "scores", "--spec", str(bad)]) == 1
    assert "400: step 'double': unknown model 'nope'" in capsys.readouterr().err
