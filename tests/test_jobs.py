"""Jobs: async inference and batch transforms, specified by what a user sees through the API, in
both modes (embedded: the job thread; clustered: the Celery worker). The kill -9 spec runs the
worker as a `manage.py run_jobs` process it can kill."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import onnxruntime as ort
import pytest

from registry import samples
from tests.conftest import REPO, child_env

MLP = samples.mlp()
ROWS = 100_000
FINISHED = ("succeeded", "failed", "cancelled")


@pytest.fixture
def mlp(ready_model, engineer):
    """The MLP, ready and deployed as the endpoint's stable version."""
    version = ready_model("mlp", MLP)
    r = engineer.post("/api/v1/models/mlp/endpoint/deploy/", {"version": version["number"]},
                      format="json")
    assert r.status_code == 200, r.content
    return version


@pytest.fixture(scope="module")
def dataset_100k():
    return np.random.default_rng(7).standard_normal((ROWS, 64)).astype(np.float32)


def reference(x: np.ndarray, batch: int) -> np.ndarray:
    sess = ort.InferenceSession(MLP, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"x": x[i:i + batch]})[0]
                           for i in range(0, len(x), batch)])


def wait_job(client, job_id: str, until=FINISHED, timeout: float = 60, what=None) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = client.get(f"/api/v1/jobs/{job_id}/").json()
        if (what(body) if what else body["status"] in until):
            return body
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} is {body['status']} {body['progress']} after {timeout}s")


def async_json(client, model: str, x: np.ndarray, **headers):
    body = {"id": "req-1", "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}
    return client.post(f"/api/v1/models/{model}/async-infer/", json.dumps(body),
                       content_type="application/json", **headers)


def upload_dataset(client, data: bytes, filename: str) -> dict:
    r = client.put(f"/api/v1/datasets/upload/?filename={filename}", data,
                   content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    return r.json()


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def download(client, job: dict) -> bytes:
    r = client.get(job["result_url"])
    assert r.status_code == 200, r.content
    return b"".join(r.streaming_content)


# --------------------------------------------------------------------------- async inference


def test_async_infer_answers_202_and_stores_the_v2_response(engineer, mlp):
    x = np.random.default_rng(1).standard_normal((100, 64)).astype(np.float32)  # > max batch
    r = async_json(engineer, "mlp", x)
    assert r.status_code == 202, r.content
    job = r.json()
    assert job["status"] in ("queued", "running", "succeeded") and job["kind"] == "async"
    assert r["Location"] == f"/api/v1/jobs/{job['id']}/"
    done = wait_job(engineer, job["id"])
    assert done["status"] == "succeeded", done["failure_reason"]
    assert done["version"] == mlp["number"] and done["result_url"]
    out = json.loads(download(engineer, done))
    assert out["model_name"] == "mlp" and out["id"] == "req-1"
    assert out["outputs"][0]["shape"] == [100, 10]
    y = np.array(out["outputs"][0]["data"], dtype=np.float32).reshape(100, 10)
    np.testing.assert_allclose(y, reference(x, 100), rtol=1e-5, atol=1e-5)


def test_async_infer_takes_binary_tensors_and_answers_binary(engineer, mlp):
    x = np.arange(2 * 64, dtype=np.float32).reshape(2, 64) / 100
    header = json.dumps({"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
                        ).encode()
    r = engineer.post(f"/api/v1/models/mlp/async-infer/?version={mlp['number']}",
                      header + x.tobytes(), content_type="application/octet-stream",
                      HTTP_INFERENCE_HEADER_CONTENT_LENGTH=str(len(header)))
    assert r.status_code == 202, r.content
    done = wait_job(engineer, r.json()["id"])
    assert done["status"] == "succeeded", done["failure_reason"]
    resp = engineer.get(done["result_url"])
    body = b"".join(resp.streaming_content)
    n = int(resp["Inference-Header-Content-Length"])
    meta = json.loads(body[:n])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 2 * 10 * 4
    y = np.frombuffer(body[n:], dtype=np.float32).reshape(2, 10)
    np.testing.assert_allclose(y, reference(x, 2), rtol=1e-5, atol=1e-6)


def test_async_infer_with_bad_input_fails_with_the_reason(engineer, mlp):
    r = async_json(engineer, "mlp", np.zeros((2, 63), dtype=np.float32))
    assert r.status_code == 202
    done = wait_job(engineer, r.json()["id"])
    assert done["status"] == "failed"
    assert "dimension 1" in done["failure_reason"] and "64" in done["failure_reason"]
    assert done["result_url"] is None
    assert engineer.get(f"/api/v1/jobs/{done['id']}/result/").status_code == 409
    r = engineer.post("/api/v1/models/mlp/async-infer/", b"{not json",
                      content_type="application/json")
    assert wait_job(engineer, r.json()["id"])["failure_reason"].startswith(
        "request body is not valid JSON")


def test_async_infer_refusals_are_immediate(engineer, client_for, mlp, ready_model, settings):
    x = np.zeros((1, 64), dtype=np.float32)
    assert async_json(engineer, "nope", x).status_code == 404
    assert async_json(client_for("viewer"), "mlp", x).status_code == 403
    r = engineer.post("/api/v1/models/mlp/async-infer/?version=9", b"{}",
                      content_type="application/json")
    assert r.status_code == 404 and "version 9" in r.json()["error"]
    ready_model("undeployed", samples.mlp(seed=1))
    r = async_json(engineer, "undeployed", x)  # nothing deployed and no ?version=
    assert r.status_code == 409 and "no stable version" in r.json()["error"]
    settings.ASYNC_MAX_BYTES = 1000
    r = async_json(engineer, "mlp", np.zeros((10, 64), dtype=np.float32))
    assert r.status_code == 413 and "1000" in r.json()["error"]


class Receiver:
    """A local HTTP receiver: the first call answers 503 (to prove the retry), the next 200."""

    def __init__(self):
        self.calls: list[tuple[dict, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.calls.append((dict(self.headers), body))
                self.send_response(503 if len(outer.calls) == 1 else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_callback_is_signed_with_hmac_sha256_and_retried(engineer, mlp):
    receiver = Receiver()
    try:
        r = async_json(engineer, "mlp", np.ones((1, 64), dtype=np.float32),
                       HTTP_X_MMC_CALLBACK_URL=receiver.url,
                       HTTP_X_MMC_CALLBACK_SECRET="s3cret")
        done = wait_job(engineer, r.json()["id"], what=lambda b: b["callback_status"])
    finally:
        receiver.close()
    assert done["status"] == "succeeded"
    assert done["callback_status"].startswith("delivered: HTTP 200 on attempt 2")
    assert "callback_secret" not in done
    assert len(receiver.calls) == 2
    headers, body = receiver.calls[-1]
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-MMC-Signature"], expected)
    assert not hmac.compare_digest(
        headers["X-MMC-Signature"],
        "sha256=" + hmac.new(b"wrong", body, hashlib.sha256).hexdigest())
    notice = json.loads(body)
    assert notice["id"] == done["id"] and notice["status"] == "succeeded"
    assert notice["result_path"] == done["result_url"]


def test_results_expire_after_the_ttl(engineer, mlp, settings):
    from django.utils import timezone

    from registry.jobs.housekeeping import expire_results
    from registry.store.files import job_dir

    r = async_json(engineer, "mlp", np.ones((1, 64), dtype=np.float32))
    done = wait_job(engineer, r.json()["id"])
    assert done["expires_at"] and job_dir(done["id"]).exists()
    assert expire_results() == []  # not yet
    later = timezone.now() + timedelta(seconds=settings.ASYNC_RESULT_TTL + 1)
    assert expire_results(now=later) == [done["id"]]
    assert not job_dir(done["id"]).exists()
    job = engineer.get(f"/api/v1/jobs/{done['id']}/").json()
    assert job["expired"] and job["result_url"] is None
    r = engineer.get(f"/api/v1/jobs/{done['id']}/result/")
    assert r.status_code == 410 and "expired" in r.json()["error"]


# --------------------------------------------------------------------------- batch transform


def test_batch_transform_of_100k_rows_keeps_order_and_count(engineer, mlp, dataset_100k):
    ds = upload_dataset(engineer, npy_bytes(dataset_100k), "rows.npy")
    assert ds["rows"] == ROWS and ds["format"] == "npy"
    assert ds["columns"][""]["shape"] == [64]
    r = engineer.post("/api/v1/models/mlp/batch/",
                      {"dataset": ds["id"], "version": mlp["number"]}, format="json")
    assert r.status_code == 202, r.content
    done = wait_job(engineer, r.json()["id"], timeout=120)
    assert done["status"] == "succeeded", done["failure_reason"]
    assert done["progress"]["rows_done"] == done["progress"]["rows_total"] == ROWS
    assert done["progress"]["rows_per_second"] > 0
    assert done["params"]["batch_size"] == mlp["max_batch_size"]
    y = np.load(io.BytesIO(download(engineer, done)))
    assert y.shape == (ROWS, 10)
    np.testing.assert_allclose(y, reference(dataset_100k, mlp["max_batch_size"]),
                               rtol=1e-5, atol=1e-5)


def test_batch_transform_of_npz_and_json_lines(engineer, mlp):
    x = np.random.default_rng(3).standard_normal((250, 64)).astype(np.float32)
    buf = io.BytesIO()
    np.savez_compressed(buf, x=x, label=np.arange(250))  # extra arrays are ignored
    ds = upload_dataset(engineer, buf.getvalue(), "rows.npz")
    r = engineer.post("/api/v1/models/mlp/batch/",
                      {"dataset": ds["id"], "version": mlp["number"], "chunk_rows": 64,
                       "batch_size": 16}, format="json")
    done = wait_job(engineer, r.json()["id"])
    assert done["status"] == "succeeded", done["failure_reason"]
    with np.load(io.BytesIO(download(engineer, done))) as z:
        np.testing.assert_allclose(z["y"], reference(x, 16), rtol=1e-5, atol=1e-5)
    lines = []
    for i, row in enumerate(x[:40]):
        if i % 2:
            lines.append(json.dumps({"x": row.tolist()}))
        else:
            lines.append(json.dumps({"id": f"r{i}", "inputs": [
                {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": row.tolist()}]}))
    ds = upload_dataset(engineer, ("\n".join(lines) + "\n\n").encode(), "rows.jsonl")
    r = engineer.post("/api/v1/models/mlp/batch/",
                      {"dataset": ds["id"], "version": mlp["number"], "chunk_rows": 16,
                       "batch_size": 8}, format="json")
    done = wait_job(engineer, r.json()["id"])
    assert done["status"] == "succeeded", done["failure_reason"]
    out = download(engineer, done).decode().splitlines()
    assert len(out) == 40 and done["progress"]["rows_total"] == 40
    want = reference(x[:40], 8)
    for i, line in enumerate(out):
        doc = json.loads(line)
        y = doc["y"] if i % 2 else doc["outputs"][0]["data"]
        if not i % 2:
            assert doc["id"] == f"r{i}"
        np.testing.assert_allclose(np.array(y, np.float32).ravel(), want[i], rtol=1e-5,
                                   atol=1e-5)


def test_batch_refuses_a_dataset_that_does_not_fit_the_signature(engineer, mlp):
    ds = upload_dataset(engineer, npy_bytes(np.zeros((5, 63), np.float32)), "bad.npy")
    r = engineer.post("/api/v1/models/mlp/batch/", {"dataset": ds["id"],
                                                    "version": mlp["number"]}, format="json")
    assert r.status_code == 400 and "[63]" in r.json()["error"]
    r = engineer.put("/api/v1/datasets/upload/?filename=x.npy", b"not numpy",
                     content_type="application/octet-stream")
    assert r.status_code == 400 and "not a valid .npy" in r.json()["error"]
    ds = upload_dataset(engineer, b'{"x": [1, 2]}\n', "short.jsonl")
    r = engineer.post("/api/v1/models/mlp/batch/", {"dataset": ds["id"],
                                                    "version": mlp["number"]}, format="json")
    done = wait_job(engineer, r.json()["id"])
    assert done["status"] == "failed" and done["failure_reason"].startswith("record 1:")


def test_batch_can_be_cancelled_while_running(engineer, mlp, dataset_100k):
    from registry.store.files import job_dir

    ds = upload_dataset(engineer, npy_bytes(dataset_100k), "rows.npy")
    r = engineer.post("/api/v1/models/mlp/batch/",
                      {"dataset": ds["id"], "version": mlp["number"], "chunk_rows": 2000,
                       "max_rows_per_second": 10000}, format="json")
    job_id = r.json()["id"]
    wait_job(engineer, job_id, what=lambda b: b["progress"]["rows_done"] > 0)
    r = engineer.post(f"/api/v1/jobs/{job_id}/cancel/", {"reason": "wrong model"},
                      format="json")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert "wrong model" in r.json()["failure_reason"]
    deadline = time.time() + 20
    while job_dir(job_id).exists() and time.time() < deadline:  # the worker stops and cleans up
        time.sleep(0.05)
    assert not job_dir(job_id).exists()
    job = engineer.get(f"/api/v1/jobs/{job_id}/").json()
    assert job["status"] == "cancelled" and job["progress"]["rows_done"] < ROWS
    assert engineer.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 409
    assert engineer.get(f"/api/v1/jobs/{job_id}/result/").status_code == 409


def test_an_unused_dataset_expires_and_a_new_batch_on_it_is_refused_with_410(engineer, mlp):
    from django.utils import timezone

    from registry.jobs import housekeeping as jobs
    from registry.models import AuditEvent, Dataset
    from registry.store.files import dataset_path

    x = np.zeros((10, 64), np.float32)
    old = upload_dataset(engineer, npy_bytes(x), "old.npy")
    fresh = upload_dataset(engineer, npy_bytes(x + 1), "fresh.npy")
    Dataset.objects.filter(pk=old["id"]).update(expires_at=timezone.now())  # TTL spent
    path = dataset_path(Dataset.objects.get(pk=old["id"]))
    assert path.exists()
    assert jobs.expire_datasets() == [old["id"]]
    assert not path.exists()
    assert dataset_path(Dataset.objects.get(pk=fresh["id"])).exists()  # not due yet
    body = engineer.get(f"/api/v1/datasets/{old['id']}/").json()
    assert body["expired"] is True
    r = engineer.post("/api/v1/models/mlp/batch/", {"dataset": old["id"]}, format="json")
    assert r.status_code == 410 and "upload it again" in r.json()["error"]
    event = AuditEvent.objects.get(action="datasets.expire")
    assert event.after["datasets"] == [old["id"]] and event.after["bytes"] == old["size_bytes"]
    assert jobs.expire_datasets() == []  # once


def test_a_dataset_a_job_reads_is_kept_and_each_new_job_extends_its_life(engineer, mlp,
                                                                         dataset_100k):
    from datetime import timedelta

    from django.utils import timezone

    from registry.jobs import housekeeping as jobs
    from registry.models import Dataset
    from registry.store.files import dataset_path

    ds = upload_dataset(engineer, npy_bytes(dataset_100k), "rows.npy")
    uploaded = Dataset.objects.get(pk=ds["id"]).expires_at
    r = engineer.post("/api/v1/models/mlp/batch/",
                      {"dataset": ds["id"], "chunk_rows": 2000, "max_rows_per_second": 10000},
                      format="json")
    job_id = r.json()["id"]
    assert Dataset.objects.get(pk=ds["id"]).expires_at > uploaded  # the job renewed it
    wait_job(engineer, job_id, what=lambda b: b["status"] == "running")
    later = timezone.now() + timedelta(days=365)
    assert jobs.expire_datasets(now=later) == []  # in use: kept
    assert dataset_path(Dataset.objects.get(pk=ds["id"])).exists()
    engineer.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert jobs.expire_datasets(now=later) == [ds["id"]]


def test_batch_resumes_after_kill_9_without_losing_or_duplicating_rows(
        engineer, mlp, dataset_100k, monkeypatch, tmp_path):
    from registry.models import Job
    from registry.services import jobs as job_services

    monkeypatch.setattr(job_services, "enqueue_job", lambda job_id: None)  # our worker runs it
    ds = upload_dataset(engineer, npy_bytes(dataset_100k), "rows.npy")
    r = engineer.post("/api/v1/models/mlp/batch/",
                      {"dataset": ds["id"], "version": mlp["number"], "batch_size": 50,
                       "chunk_rows": 5000, "max_rows_per_second": 25000}, format="json")
    job_id = r.json()["id"]
    lease = 1.5
    env = child_env(MMC_JOB_LEASE_SECONDS=lease)

    def worker(name: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "manage.py", "run_jobs", "--once"], cwd=REPO,
                                env=env, stdout=(tmp_path / f"{name}.log").open("wb"),
                                stderr=subprocess.STDOUT)

    first = worker("first")
    try:
        wait_job(engineer, job_id, timeout=60,
                 what=lambda b: b["progress"]["rows_done"] >= 30_000)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    killed = engineer.get(f"/api/v1/jobs/{job_id}/").json()
    assert killed["status"] == "running" and killed["progress"]["rows_done"] < ROWS
    before = Job.objects.get(pk=job_id).chunks_done
    time.sleep(lease + 0.2)  # the dead worker's lease runs out
    second = worker("second")
    try:
        done = wait_job(engineer, job_id, timeout=60)
        second.wait(20)
    finally:
        if second.poll() is None:
            second.kill()
    assert done["status"] == "succeeded", (done, (tmp_path / "second.log").read_text())
    assert done["attempts"] == 2
    assert done["progress"]["chunks_resumed"] >= before > 0
    y = np.load(io.BytesIO(download(engineer, done)))
    assert y.shape == (ROWS, 10)
    np.testing.assert_array_equal(y, reference(dataset_100k, 50))


def test_job_list_filters_and_audit(engineer, admin, mlp):
    r = async_json(engineer, "mlp", np.ones((1, 64), dtype=np.float32))
    wait_job(engineer, r.json()["id"])
    jobs = engineer.get("/api/v1/jobs/?kind=async&model=mlp").json()["results"]
    assert [j["id"] for j in jobs] == [r.json()["id"]]
    assert engineer.get("/api/v1/jobs/?kind=batch").json()["results"] == []
    actions = [e["action"] for e in admin.get("/api/v1/audit/?target_type=job").json()["results"]]
    assert "job.create" in actions and "job.succeeded" in actions



def test_cli_runs_async_and_batch_jobs_against_a_live_console(users, mlp, tmp_path, capsys):
    from registry.audit import Actor
    from registry.cli.main import main
    from registry.services import token_create
    from tests.replicas import Replica

    _, token = token_create(username="engineer", name="cli", actor=Actor.system("test"))
    console = Replica("console", embedded=True, log_dir=tmp_path)
    try:
        console.wait_live()
        base = ["--url", console.url, "--token", token]
        x = np.random.default_rng(5).standard_normal((3000, 64)).astype(np.float32)
        np.save(tmp_path / "rows.npy", x)
        out = tmp_path / "scores.npy"
        assert main([*base, "batch", "run", "mlp", str(tmp_path / "rows.npy"), "--batch-size",
                     "32", "--chunk-rows", "1000", "--wait", "60", "--out", str(out)]) == 0
        job = json.loads(capsys.readouterr().out)
        assert job["status"] == "succeeded" and job["progress"]["chunks_total"] == 3
        np.testing.assert_allclose(np.load(out), reference(x, 32), rtol=1e-5, atol=1e-5)
        request = tmp_path / "request.json"
        request.write_text(json.dumps({"inputs": [{"name": "x", "shape": [1, 64],
                                                   "datatype": "FP32", "data": [0.5] * 64}]}))
        assert main([*base, "async-infer", "mlp", str(request)]) == 0
        queued = json.loads(capsys.readouterr().out)
        assert main([*base, "job", queued["id"], "--wait", "30", "--result",
                     str(tmp_path / "r.json")]) == 0
        answer = json.loads((tmp_path / "r.json").read_text())
        assert answer["outputs"][0]["shape"] == [1, 10]
    finally:
        console.stop()
