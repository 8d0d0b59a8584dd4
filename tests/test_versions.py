"""Uploading and validating versions, as CI sees it through the API."""

import hashlib
import json
import threading

import pytest
from onnx import TensorProto

from registry import samples
from tests import onnx_cases
from tests.conftest import upload, wait_validated

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def model(engineer):
    assert engineer.post("/api/v1/models/", {"name": "fraud", "tags": ["team:risk"]},
                         format="json").status_code == 201
    return "fraud"


def test_valid_upload_answers_at_once_then_becomes_ready_with_its_signature(engineer, model):
    data = samples.mlp()
    r = upload(engineer, model, data, metadata={"git_commit": "abc123", "dataset": "v7"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["number"] == 1 and body["created"] is True
    assert body["status"] == "validating"
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["size_bytes"] == len(data)
    done = wait_validated(engineer, model, 1)
    assert done["status"] == "ready", done["failure_reason"]
    sig = done["signature"]
    assert sig["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    assert sig["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 10]}]
    assert done["metadata"] == {"git_commit": "abc123", "dataset": "v7"}
    report = done["validation_report"]
    assert report["providers"] == ["CPUExecutionProvider"] or "CPUExecutionProvider" in report[
        "providers"]
    assert report["load_ms"] > 0 and report["warmup_ms"] > 0
    assert done["max_batch_size"] == 32  # dynamic first dim -> batching on by default


@pytest.mark.parametrize(("elem", "shape", "datatype", "expect_shape", "batch"), [
    (TensorProto.INT64, ["batch", 3], "INT64", [-1, 3], 32),
    (TensorProto.STRING, ["batch"], "BYTES", [-1], 32),
    (TensorProto.BOOL, [2, 2], "BOOL", [2, 2], 0),
    (TensorProto.FLOAT16, ["n", 8], "FP16", [-1, 8], 32),
])
def test_signature_is_extracted_for_each_datatype(engineer, model, elem, shape, datatype,
                                                  expect_shape, batch):
    upload(engineer, model, samples.identity(elem, shape))
    done = wait_validated(engineer, model, 1)
    assert done["status"] == "ready", done["failure_reason"]
    assert done["signature"]["inputs"][0] == {"name": "x", "datatype": datatype,
                                              "shape": expect_shape}
    assert done["max_batch_size"] == batch


@pytest.mark.parametrize(("data", "reason"), [
    (b"this is not a model at all, just text" * 10, "not an ONNX model"),
    (onnx_cases.truncated(), "not an ONNX model"),
    (onnx_cases.checker_failure(), "checker"),
    (b"", "empty"),
    (onnx_cases.too_new_ir(), "IR version 14"),
])
def test_bad_artifacts_fail_validation_with_a_reason(engineer, model, data, reason):
    r = upload(engineer, model, data)
    assert r.status_code == 201, r.content
    done = wait_validated(engineer, model, r.json()["number"])
    assert done["status"] == "failed"
    assert reason in done["failure_reason"], done["failure_reason"]


def test_reupload_of_identical_bytes_returns_the_existing_version(engineer, model):
    data = samples.mlp(seed=3)
    first = upload(engineer, model, data)
    again = upload(engineer, model, data, filename="retry.onnx")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["number"] == first.json()["number"] == 1
    assert again.json()["created"] is False and "already version 1" in again.json()["detail"]
    assert len(engineer.get(f"/api/v1/models/{model}/versions/").json()["results"]) == 1


def test_raw_body_put_upload_works_like_multipart(engineer, model):
    data = samples.mlp(seed=5)
    r = engineer.generic("PUT", f"/api/v1/models/{model}/versions/upload/?filename=m.onnx"
                         f"&metadata=%7B%22run%22%3A%201%7D", data,
                         content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    assert r.json()["metadata"] == {"run": 1}
    assert wait_validated(engineer, model, 1)["status"] == "ready"


def test_oversized_upload_is_413_and_leaves_no_file(engineer, model, settings):
    settings.MAX_UPLOAD_BYTES = 1000
    store_tmp = settings.ARTIFACT_ROOT / "tmp"
    before = set(store_tmp.iterdir())
    blobs_before = set((settings.ARTIFACT_ROOT / "sha256").glob("*/*"))
    r = upload(engineer, model, b"\0" * 5000)
    assert r.status_code == 413
    assert "limit of 1000 bytes" in r.json()["error"]
    assert set(store_tmp.iterdir()) == before
    assert set((settings.ARTIFACT_ROOT / "sha256").glob("*/*")) == blobs_before
    assert engineer.get(f"/api/v1/models/{model}/versions/").json()["count"] == 0


def test_declared_oversized_body_is_refused_before_reading(engineer, model, settings):
    settings.MAX_UPLOAD_BYTES = 1000
    r = engineer.generic("PUT", f"/api/v1/models/{model}/versions/upload/", b"x" * 10,
                         content_type="application/octet-stream",
                         CONTENT_LENGTH=str(50 * 1024 * 1024))
    assert r.status_code == 413


def test_client_file_name_never_becomes_a_path(engineer, model, settings, tmp_path):
    data = samples.mlp(seed=9)
    r = upload(engineer, model, data, filename="../../../../tmp/evil.onnx")
    assert r.status_code == 201
    sha = r.json()["sha256"]
    assert (settings.ARTIFACT_ROOT / "sha256" / sha[:2] / sha).read_bytes() == data
    assert not (settings.ARTIFACT_ROOT.parent / "evil.onnx").exists()
    assert "/" not in r.json()["original_filename"] or r.json()["original_filename"].endswith(
        "evil.onnx")


def test_artifact_download_returns_the_exact_bytes(engineer, model):
    data = samples.mlp(seed=11)
    upload(engineer, model, data)
    r = engineer.get(f"/api/v1/models/{model}/versions/1/artifact/")
    assert r.status_code == 200
    assert b"".join(r.streaming_content) == data
    assert r["X-Checksum-Sha256"] == hashlib.sha256(data).hexdigest()


def test_concurrent_uploads_get_gapless_unique_numbers(engineer, model):
    results, errors = [], []

    def one(i):
        from django.db import connection

        try:
            r = upload(engineer, model, samples.mlp(seed=100 + i))
            results.append((r.status_code, r.json().get("number")))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(n for _, n in results) == list(range(1, 11))
    assert {code for code, _ in results} == {201}


def test_versions_are_immutable_but_serving_settings_change_and_are_audited(engineer, admin,
                                                                             model):
    upload(engineer, model, samples.mlp())
    wait_validated(engineer, model, 1)
    r = engineer.patch(f"/api/v1/models/{model}/versions/1/", {"sha256": "0" * 64},
                       format="json")
    assert r.status_code == 400 and "immutable" in r.json()["error"]
    r = engineer.patch(f"/api/v1/models/{model}/versions/1/",
                       {"max_batch_size": 8, "max_queue_delay_us": 500}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["max_batch_size"] == 8 and r.json()["max_queue_delay_us"] == 500
    r = engineer.patch(f"/api/v1/models/{model}/versions/1/", {"instance_count": 0},
                       format="json")
    assert r.status_code == 400 and r.json()["field"] == "instance_count"
    events = admin.get("/api/v1/audit/?action=version.configure").json()["results"]
    assert events[0]["after"] == {"max_batch_size": 8, "max_queue_delay_us": 500}


def test_archived_model_refuses_uploads(engineer, model):
    r = engineer.post(f"/api/v1/models/{model}/archive/", {"reason": "retired"}, format="json")
    assert r.status_code == 200 and r.json()["archived"] is True
    r = upload(engineer, model, samples.mlp())
    assert r.status_code == 409 and "archived" in r.json()["error"]


def test_metadata_must_be_a_json_object(engineer, model):
    from django.core.files.uploadedfile import SimpleUploadedFile

    r = engineer.post(f"/api/v1/models/{model}/versions/",
                      {"file": SimpleUploadedFile("m.onnx", samples.mlp()),
                       "metadata": json.dumps([1, 2])}, format="multipart")
    assert r.status_code == 400 and r.json()["field"] == "metadata"


def test_multipart_upload_works_with_a_browser_session_and_csrf(users, engineer, model):
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    assert browser.login(username="engineer", password="engineer-password-1")
    token = "a" * 32  # a CSRF secret the browser holds as its cookie and echoes in the header
    browser.cookies["csrftoken"] = token
    r = browser.post(f"/api/v1/models/{model}/versions/",
                     {"file": SimpleUploadedFile("m.onnx", samples.mlp(seed=21))},
                     HTTP_X_CSRFTOKEN=token)
    assert r.status_code == 201, r.content
    r = browser.post(f"/api/v1/models/{model}/versions/",
                     {"file": SimpleUploadedFile("m.onnx", samples.mlp(seed=22))})
    assert r.status_code == 403 and "CSRF" in r.json()["error"]
