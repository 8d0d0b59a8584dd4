"""Triton model-repository export: the archive's layout, its config.pbtxt parsed back with
Triton's own protobuf schema (tritonclient's model_config_pb2), and the model bytes."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest
from google.protobuf import text_format
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from registry import samples
from registry.cli.main import main as mmc

pytestmark = pytest.mark.django_db(transaction=True)


def archive(response) -> tarfile.TarFile:
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/gzip"
    data = b"".join(response.streaming_content)
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


def parse_config(tar: tarfile.TarFile, model: str) -> mc.ModelConfig:
    text = tar.extractfile(f"{model}/config.pbtxt").read().decode()
    return text_format.Parse(text, mc.ModelConfig())


def files(tar: tarfile.TarFile) -> list[str]:
    return sorted(m.name for m in tar.getmembers() if m.isfile())


@pytest.fixture
def fraud(ready_model, engineer):
    """Model `fraud` with two ready versions (same signature) and tuned batching on v2."""
    v1 = ready_model("fraud", samples.mlp(seed=1))
    v2 = ready_model("fraud", samples.mlp(seed=2))
    r = engineer.patch("/api/v1/models/fraud/versions/2/", {
        "max_batch_size": 16, "preferred_batch_sizes": [4, 8], "max_queue_delay_us": 500,
        "instance_count": 2}, format="json")
    assert r.status_code == 200, r.content
    return v1, v2


def test_export_lays_out_a_triton_repository_with_every_ready_version(backend, client_for,
                                                                      fraud):
    assert backend.names() == sorted(f"sha256/{v['sha256'][:2]}/{v['sha256']}" for v in fraud)
    viewer = client_for("viewer")
    tar = archive(viewer.get("/api/v1/models/fraud/export?format=triton"))
    assert files(tar) == ["fraud/1/model.onnx", "fraud/2/model.onnx", "fraud/config.pbtxt"]
    for version in fraud:
        member = tar.extractfile(f"fraud/{version['number']}/model.onnx").read()
        assert hashlib.sha256(member).hexdigest() == version["sha256"]
        assert len(member) == version["size_bytes"]

    cfg = parse_config(tar, "fraud")
    assert cfg.name == "fraud"
    assert cfg.platform == "onnxruntime_onnx"
    assert cfg.max_batch_size == 16  # the newest chosen version's settings
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.input] == [
        ("x", mc.TYPE_FP32, [64])]  # batch dimension excluded
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.output] == [
        ("y", mc.TYPE_FP32, [10])]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 500
    assert cfg.dynamic_batching.default_queue_policy.max_queue_size == 256
    assert [(g.kind, g.count) for g in cfg.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU,
                                                                2)]
    assert list(cfg.version_policy.specific.versions) == [1, 2]
    assert cfg.default_model_filename == "model.onnx"


def test_export_of_chosen_versions_and_of_the_stable_one(engineer, fraud):
    tar = archive(engineer.get("/api/v1/models/fraud/export/?format=triton&versions=1"))
    assert files(tar) == ["fraud/1/model.onnx", "fraud/config.pbtxt"]
    cfg = parse_config(tar, "fraud")
    assert list(cfg.version_policy.specific.versions) == [1]
    assert cfg.max_batch_size == 32  # version 1 keeps the default
    assert list(cfg.dynamic_batching.preferred_batch_size) == []

    r = engineer.get("/api/v1/models/fraud/export?format=triton&versions=stable")
    assert r.status_code == 409 and "no stable version" in r.json()["error"]
    assert engineer.post("/api/v1/models/fraud/endpoint/deploy/", {"version": 2},
                         format="json").status_code == 200
    tar = archive(engineer.get("/api/v1/models/fraud/export?format=triton&versions=stable"))
    assert files(tar) == ["fraud/2/model.onnx", "fraud/config.pbtxt"]


def test_unbatched_and_string_models_export_full_dims_and_triton_types(ready_model, engineer):
    ready_model("flags", samples.identity(TensorProto.BOOL, [2, 2]))
    cfg = parse_config(archive(engineer.get("/api/v1/models/flags/export?format=triton")), "flags")
    assert cfg.max_batch_size == 0
    assert not cfg.HasField("dynamic_batching")
    assert [(t.data_type, list(t.dims)) for t in cfg.input] == [(mc.TYPE_BOOL, [2, 2])]

    ready_model("words", samples.identity(TensorProto.STRING, ["batch"]))
    cfg = parse_config(archive(engineer.get("/api/v1/models/words/export?format=triton")), "words")
    assert cfg.max_batch_size == 32
    # Only a batch dimension: Triton wants dims [1] reshaped to a scalar per row.
    assert [(t.data_type, list(t.dims), list(t.reshape.shape), t.HasField("reshape"))
            for t in cfg.input] == [(mc.TYPE_STRING, [1], [], True)]


def test_export_refusals_name_what_is_wrong(client_for, engineer, fraud):
    assert client_for(None).get("/api/v1/models/fraud/export?format=triton").status_code == 401
    assert client_for("nobody").get("/api/v1/models/fraud/export?format=triton"
                                    ).status_code == 403
    r = engineer.get("/api/v1/models/fraud/export?format=savedmodel")
    assert r.status_code == 400 and "format must be one of triton" in r.json()["error"]
    r = engineer.get("/api/v1/models/fraud/export?format=triton&versions=7")
    assert r.status_code == 404 and "no version 7" in r.json()["error"]
    r = engineer.get("/api/v1/models/fraud/export?format=triton&versions=two")
    assert r.status_code == 400 and r.json()["field"] == "versions"
    assert engineer.get("/api/v1/models/nope/export?format=triton").status_code == 404


def test_versions_with_different_signatures_cannot_share_a_config(ready_model, engineer):
    ready_model("mixed", samples.mlp(n_in=8))
    ready_model("mixed", samples.mlp(n_in=16))
    r = engineer.get("/api/v1/models/mixed/export?format=triton")
    assert r.status_code == 409 and "different signatures" in r.json()["error"]
    assert archive(engineer.get("/api/v1/models/mixed/export?format=triton&versions=2"))


def test_cli_export_writes_the_archive(live_server, client_for, fraud, tmp_path, users):
    from registry.audit import Actor
    from registry.services import token_create

    _, token = token_create(username="viewer", name="cli", actor=Actor.system("test"))
    out = tmp_path / "repo.tar.gz"
    assert mmc(["--url", live_server.url, "--token", token, "export", "fraud", "--versions",
                "2", "-o", str(out)]) == 0
    with tarfile.open(out, "r:gz") as tar:
        assert files(tar) == ["fraud/2/model.onnx", "fraud/config.pbtxt"]
        member = tar.extractfile("fraud/2/model.onnx").read()
        assert hashlib.sha256(member).hexdigest() == fraud[1]["sha256"]
    assert mmc(["--url", live_server.url, "--token", token, "export", "fraud", "--versions",
                "9", "-o", str(tmp_path / "x.tar.gz")]) == 1
    assert not (tmp_path / "x.tar.gz").exists()
