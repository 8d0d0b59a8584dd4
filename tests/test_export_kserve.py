"""KServe export: `GET /api/v1/models/{m}/export?format=kserve` (and `mmc export --format kserve`)
writes a ServingRuntime and an InferenceService that mirror the endpoint: a canary's weight is the
InferenceService's canaryTrafficPercent, storage URIs point at the artifact store. Every document
is read back into the `kserve` SDK's models, refusing unknown fields, and must round-trip; the
mmc-serve runtime's own command serves the exported artifact."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from registry import samples
from registry.cli.main import main as mmc
from tests import kube
from tests.serving.test_app import _free_port

pytestmark = pytest.mark.django_db(transaction=True)


def archive(response) -> dict[str, bytes]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/gzip"
    data = b"".join(response.streaming_content)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def documents(files: dict[str, bytes], name: str) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(files[name]) if d]
    for doc in docs:
        kube.kserve_round_trip(doc)  # the SDK's models, no unknown field, the same JSON back
    return docs


def export(client, model="fraud", **params) -> dict[str, bytes]:
    query = "&".join(f"{k}={v}" for k, v in {"format": "kserve", **params}.items())
    return archive(client.get(f"/api/v1/models/{model}/export?{query}"))


@pytest.fixture
def fraud(ready_model, engineer):
    """Model `fraud`: version 1 stable, version 2 ready."""
    v1 = ready_model("fraud", samples.mlp(seed=1))
    v2 = ready_model("fraud", samples.mlp(seed=2))
    r = engineer.post("/api/v1/models/fraud/endpoint/deploy/", {"version": 1}, format="json")
    assert r.status_code == 200, r.content
    return v1, v2


def canary(engineer, version: int, weight: int) -> None:
    r = engineer.post("/api/v1/models/fraud/endpoint/canary/",
                      {"version": version, "weight": weight}, format="json")
    assert r.status_code == 200, r.content


def test_a_stable_endpoint_exports_one_revision_without_a_canary(client_for, fraud):
    v1, _ = fraud
    files = export(client_for("viewer"))
    assert sorted(files) == ["fraud-kserve/inferenceservice.yaml",
                             "fraud-kserve/servingruntime.yaml"]
    (isvc,) = documents(files, "fraud-kserve/inferenceservice.yaml")
    predictor = isvc["spec"]["predictor"]
    assert "canaryTrafficPercent" not in predictor
    assert isvc["metadata"]["name"] == "fraud"
    assert isvc["metadata"]["annotations"]["mmc-stable-version"] == "1"
    # the mmc-serve runtime reads the blob where the artifact store keeps it
    sha = v1["sha256"]
    assert predictor["model"]["storageUri"] == f"pvc://mmc-artifacts/sha256/{sha[:2]}/{sha}"
    assert predictor["model"]["runtime"] == "mmc-serve"
    assert predictor["model"]["protocolVersion"] == "v2"
    assert {e["name"]: e["value"] for e in predictor["model"]["env"]} == {
        "MMC_MODEL_NAME": "fraud", "MMC_MODEL_VERSION": "1"}
    (runtime,) = documents(files, "fraud-kserve/servingruntime.yaml")
    assert runtime["kind"] == "ServingRuntime" and runtime["metadata"]["name"] == "mmc-serve"
    assert runtime["spec"]["supportedModelFormats"][0]["name"] == "onnx"


def test_a_canary_exports_its_weight_as_canary_traffic_percent(engineer, fraud):
    _, v2 = fraud
    canary(engineer, 2, 10)
    files = export(engineer)
    (isvc,) = documents(files, "fraud-kserve/inferenceservice.yaml")
    predictor = isvc["spec"]["predictor"]
    assert predictor["canaryTrafficPercent"] == 10
    assert predictor["model"]["storageUri"].endswith(v2["sha256"])  # the latest revision
    assert isvc["metadata"]["annotations"]["mmc-candidate-version"] == "2"
    # KServe sends the rest to the revision before: on a fresh cluster, the stable one first
    (first,) = documents(files, "fraud-kserve/inferenceservice-stable.yaml")
    assert "canaryTrafficPercent" not in first["spec"]["predictor"]
    assert first["spec"]["predictor"]["model"]["storageUri"].endswith(fraud[0]["sha256"])

    r = engineer.post("/api/v1/models/fraud/endpoint/weight/", {"weight": 35}, format="json")
    assert r.status_code == 200, r.content
    (isvc,) = documents(export(engineer), "fraud-kserve/inferenceservice.yaml")
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 35

    assert engineer.post("/api/v1/models/fraud/endpoint/promote/", {},
                         format="json").status_code == 200
    files = export(engineer)
    assert "fraud-kserve/inferenceservice-stable.yaml" not in files
    (isvc,) = documents(files, "fraud-kserve/inferenceservice.yaml")
    assert "canaryTrafficPercent" not in isvc["spec"]["predictor"]
    assert isvc["metadata"]["annotations"]["mmc-stable-version"] == "2"


def test_the_triton_runtime_carries_a_triton_repository_per_version(engineer, fraud):
    v1, v2 = fraud
    canary(engineer, 2, 20)
    files = export(engineer, runtime="triton", storage_uri="s3://models/mmc/")
    (runtime,) = documents(files, "fraud-kserve/servingruntime.yaml")
    assert runtime["metadata"]["name"] == "mmc-triton"
    (container,) = runtime["spec"]["containers"]
    assert container["args"][0] == "tritonserver"
    assert "--model-store=/mnt/models" in container["args"]
    (isvc,) = documents(files, "fraud-kserve/inferenceservice.yaml")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == "mmc-triton" and "env" not in model
    assert model["storageUri"] == "s3://models/mmc/kserve/triton/fraud/2"
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 20
    # what to copy into the store at that URI: the Triton export's layout, one version each
    for v in (v1, v2):
        n = v["number"]
        repo = f"fraud-kserve/artifacts/kserve/triton/fraud/{n}/fraud"
        assert hashlib.sha256(files[f"{repo}/{n}/model.onnx"]).hexdigest() == v["sha256"]
        assert b"onnxruntime_onnx" in files[f"{repo}/config.pbtxt"]


def test_the_sdk_check_refuses_unknown_fields_and_missing_ones(engineer, fraud):
    """The round trip above can fail: a field KServe does not define, anywhere."""
    (isvc,) = documents(export(engineer), "fraud-kserve/inferenceservice.yaml")
    isvc["spec"]["predictor"]["canaryTraficPercent"] = 5
    with pytest.raises(kube.SchemaError, match="canaryTraficPercent"):
        kube.kserve_round_trip(isvc)
    del isvc["spec"]["predictor"]["canaryTraficPercent"]
    isvc["spec"]["predictor"]["model"]["env"][0]["valu"] = "x"
    with pytest.raises(kube.SchemaError, match="valu"):
        kube.kserve_round_trip(isvc)
    del isvc["spec"]["predictor"]["model"]["env"][0]["valu"]
    del isvc["spec"]["predictor"]["model"]["env"][0]["name"]  # required
    with pytest.raises(kube.SchemaError, match=r"(?s)env\[0\].*name.*Field required"):
        kube.kserve_round_trip(isvc)
    isvc["spec"]["predictor"]["model"]["env"][0]["name"] = "X"
    isvc["spec"]["predictor"]["canaryTrafficPercent"] = "10"  # a number, not a string
    with pytest.raises(kube.SchemaError, match="canaryTrafficPercent"):
        kube.kserve_round_trip(isvc)


def test_export_refusals_name_what_is_wrong(engineer, ready_model):
    ready_model("fraud", samples.mlp(seed=1))
    r = engineer.get("/api/v1/models/fraud/export?format=kfserving")
    assert r.status_code == 400 and r.json()["field"] == "format"
    assert "triton, kserve" in r.json()["error"]
    r = engineer.get("/api/v1/models/fraud/export?format=kserve")
    assert r.status_code == 409 and "no stable version" in r.json()["error"]
    engineer.post("/api/v1/models/fraud/endpoint/deploy/", {"version": 1}, format="json")
    for query, field in (("runtime=torchserve", "runtime"), ("storage_uri=/data", "storage_uri"),
                         ("storage_uri=ftp://x/y", "storage_uri"), ("versions=1", "versions"),
                         ("name=Fraud_Model", "name")):
        r = engineer.get(f"/api/v1/models/fraud/export?format=kserve&{query}")
        assert r.status_code == 400 and r.json()["field"] == field, (query, r.content)
    assert engineer.get("/api/v1/models/nope/export?format=kserve").status_code == 404


def test_a_model_name_becomes_a_dns_label(engineer, ready_model):
    ready_model("churn_v2.model", samples.mlp(seed=1))
    engineer.post("/api/v1/models/churn_v2.model/endpoint/deploy/", {"version": 1},
                  format="json")
    files = export(engineer, model="churn_v2.model")
    (isvc,) = documents(files, "churn_v2.model-kserve/inferenceservice.yaml")
    assert isvc["metadata"]["name"] == "churn-v2-model"
    model_env = {e["name"]: e["value"] for e in isvc["spec"]["predictor"]["model"]["env"]}
    assert model_env["MMC_MODEL_NAME"] == "churn_v2.model"  # clients keep the model's name
    files = export(engineer, model="churn_v2.model", name="churn")
    (isvc,) = documents(files, "churn_v2.model-kserve/inferenceservice.yaml")
    assert isvc["metadata"]["name"] == "churn"


def test_cli_writes_the_files(live_server, fraud, tmp_path, users):
    from registry.audit import Actor
    from registry.services import token_create

    _, token = token_create(username="viewer", name="cli", actor=Actor.system("test"))
    out = tmp_path / "kserve" / "fraud"
    base = ["--url", live_server.url, "--token", token, "export", "fraud"]
    assert mmc([*base, "--format", "kserve", "--storage-uri", "pvc://models", "-o",
                str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["inferenceservice.yaml",
                                                     "servingruntime.yaml"]
    (isvc,) = yaml.safe_load_all((out / "inferenceservice.yaml").read_text())
    kube.kserve_round_trip(isvc)
    assert isvc["spec"]["predictor"]["model"]["storageUri"].startswith("pvc://models/sha256/")
    assert mmc([*base, "--format", "kserve", "--runtime", "triton", "-o", str(out)]) == 0
    assert (out / "artifacts/kserve/triton/fraud/1/fraud/1/model.onnx").read_bytes() == (
        samples.mlp(seed=1))
    bad = tmp_path / "bad"
    assert mmc([*base, "--format", "kserve", "--storage-uri", "/data", "-o", str(bad)]) == 1
    assert not bad.exists()


@pytest.mark.parametrize("layout", ["folder", "file"])
def test_the_mmc_serve_runtime_serves_the_exported_artifact(engineer, fraud, tmp_path, layout):
    """The ServingRuntime's command, run as KServe runs it, with the InferenceService's
    environment and the artifact at /mnt/models: inside that folder (the storage initializer
    downloaded it) or that path itself (a claim mounted directly). Only the paths and the port
    are moved to this machine's."""
    from registry.store.artifacts import default_store

    files = export(engineer)
    (runtime,) = documents(files, "fraud-kserve/servingruntime.yaml")
    (isvc,) = documents(files, "fraud-kserve/inferenceservice.yaml")
    (container,) = runtime["spec"]["containers"]
    models = tmp_path / "mnt-models"
    sha = fraud[0]["sha256"]
    blob = default_store().path_for(sha).read_bytes()
    if layout == "folder":
        models.mkdir()
        (models / sha).write_bytes(blob)
    else:
        models.write_bytes(blob)
    port = _free_port()
    script = (container["args"][0].replace("/mnt/models", str(models))
              .replace("/tmp/mmc-repository", str(tmp_path / "repository"))
              .replace("--host 0.0.0.0 --port 8080", f"--host 127.0.0.1 --port {port}"))
    # what a KServe pod has: the image's PATH and the InferenceService's variables, no
    # Django settings, no database
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "MMC_ORT_INTRA_OP_THREADS": "1",
           **{e["name"]: e["value"] for e in isvc["spec"]["predictor"]["model"]["env"]}}
    proc = subprocess.Popen([*container["command"], script], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the runtime's command exited"
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "not ready in 60 s"
            time.sleep(0.1)
        body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                            "data": [0.5] * 64}]}
        r = httpx.post(f"{url}/v2/models/fraud/infer", json=body, timeout=10)
        assert r.status_code == 200, r.text
        assert r.headers["X-Model-Version"] == "1"
        assert r.json()["outputs"][0]["shape"] == [1, 10]
    finally:
        proc.terminate()
        proc.wait(15)
