"""The Python client (`mmc.Client`) against a live embedded console (`manage.py start`): every
public method does what its API call does and answers typed results with the whole payload; a
refusal is a typed error carrying the server's message; an upload reports its progress up to the
file's size; `Client()` finds its server and token as the CLI does; and docs/guide/client.md runs
as written."""

from __future__ import annotations

import http.server
import inspect
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

import mmc
from mmc import Client, config
from registry import samples
from tests.conftest import REPO
from tests.embedded import embedded_start
from tests.replicas import free_port

DOCS_PAGE = REPO / "docs" / "guide" / "client.md"
MARKER = "<!-- runnable -->"


def server_env(home: Path) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"), "MMC_TOKEN_LOGIN_RATE": "1000/hour",
            "MMC_OUTBOUND_ALLOW": "127.0.0.1/32",
            **{k: os.environ[k] for k in ("LANG", "TZ", "TMPDIR") if k in os.environ}}


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """One `manage.py start` for the module: (url, the first admin's password)."""
    where = tmp_path_factory.mktemp("console")
    with embedded_start(where, server_env(where / "home")) as server:
        yield server.url, server.password


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch, tmp_path):
    """No MMC_URL/MMC_TOKEN from the machine running the specs, and a config folder of its own."""
    for name in ("MMC_URL", "MMC_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


@pytest.fixture(scope="module")
def admin(console):
    url, password = console
    with Client(url) as client:
        client.login("admin", password, client="spec-admin")
        yield client


@pytest.fixture(scope="module")
def reviewer(admin):
    """An engineer other than the uploader (the admin), for approvals."""
    admin.create_user("reviewer", "engineer")
    token = admin.create_token("spec-review", user="reviewer")
    with Client(admin.url, token.token) as client:
        yield client


def ready(client: Client, model: str, data: bytes, **kwargs) -> mmc.Version:
    """Upload `data` as the next version of `model` (created if new) and wait until ready."""
    try:
        client.get_model(model)
    except mmc.NotFound:
        client.create_model(model)
    version = client.upload(model, data, filename=f"{model}.onnx", **kwargs)
    version = client.wait_validated(model, version.number, timeout=60)
    assert version.status == "ready", version.failure_reason
    return version


# -- where the client finds its server and token ------------------------------------------------


def test_client_resolves_server_and_token_from_the_environment(admin, monkeypatch):
    token = admin.create_token("spec-env", expires_in_days=1)
    monkeypatch.setenv("MMC_URL", admin.url)
    monkeypatch.setenv("MMC_TOKEN", token.token)
    with Client() as client:
        assert client.url == admin.url
        me = client.whoami()
    assert (me.username, me.role, me.token.name) == ("admin", "admin", "spec-env")


def test_the_saved_login_is_used_and_only_for_its_own_server(admin):
    token = admin.create_token("spec-saved", expires_in_days=1)
    config.save({"url": admin.url, "token": token.token, "token_key": token.token_key,
                 "name": token.name, "username": "admin", "expiry": token.expiry})
    with Client() as client:
        assert client.whoami().token.name == "spec-saved"
    with Client(f"http://127.0.0.1:{free_port()}") as elsewhere:
        assert "authorization" not in elsewhere.http.headers


def test_login_sends_no_token_and_logout_revokes_the_one_in_use(admin, console):
    url, password = console
    with Client(url, "mmc_a-token-meant-for-someone-else") as client:
        sent = []
        client.http.event_hooks["request"].append(sent.append)
        token = client.login("admin", password, client="spec-login")
        assert "authorization" not in sent[0].headers
        assert (token.user, token.name) == ("admin", "spec-login") and token.token
        assert client.whoami().token.token_key == token.token_key
        client.logout()
        with pytest.raises(mmc.Unauthorized) as refused:
            client.whoami()
    assert refused.value.status == 401 and refused.value.message
    with Client(url, token.token) as again, pytest.raises(mmc.Unauthorized):
        again.whoami()


# -- models and versions --------------------------------------------------------------------


def test_models_are_created_listed_changed_archived_and_deleted(admin):
    made = admin.create_model("spec-models", description="first", tags=["team:risk"])
    assert (made.name, made.description, made.tags, made.version_count) == (
        "spec-models", "first", ["team:risk"], 0)
    assert made.raw["name"] == "spec-models"  # the whole payload is kept
    assert [m.name for m in admin.list_models(search="spec-models")] == ["spec-models"]
    assert [m.name for m in admin.list_models(tag="team:risk")] == ["spec-models"]
    changed = admin.update_model("spec-models", description="second", tags=["x"],
                                 requires_approval=True)
    assert (changed.description, changed.tags, changed.requires_approval) == (
        "second", ["x"], True)
    assert admin.get_model("spec-models").description == "second"
    assert admin.archive_model("spec-models", reason="spec").archived
    assert not admin.archive_model("spec-models", archived=False).archived
    admin.delete_model("spec-models", reason="spec done")
    with pytest.raises(mmc.NotFound):
        admin.get_model("spec-models")


def test_an_upload_streams_with_progress_up_to_the_file_size(admin, tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(samples.mlp(n_in=64, hidden=(2048, 1024), n_out=4, seed=3))  # > 1 chunk
    size = path.stat().st_size
    admin.create_model("spec-upload")
    calls = []
    version = admin.upload("spec-upload", path, metadata={"team": "ml"},
                           metrics={"auc": 0.91}, lineage={"git_commit": "abc1234"},
                           progress=lambda sent, total: calls.append((sent, total)))
    assert len(calls) >= 2 and all(total == size for _, total in calls)
    sent = [s for s, _ in calls]
    assert sent == sorted(set(sent)) and sent[-1] == size
    assert (version.number, version.created, version.original_filename) == (1, True,
                                                                            "model.onnx")
    version = admin.wait_validated("spec-upload", 1, timeout=60)
    assert version.status == "ready" and not version.pending
    assert (version.metadata, version.metrics, version.lineage) == (
        {"team": "ml"}, {"auc": 0.91}, {"git_commit": "abc1234"})

    with path.open("rb") as f:  # the same bytes again, from a file object: nothing new
        again = admin.upload("spec-upload", f)
    assert (again.number, again.created) == (1, False) and "already version 1" in again.detail


def test_versions_are_filtered_described_downloaded_and_deleted(admin, tmp_path):
    one = ready(admin, "spec-versions", samples.scale(2.0), metrics={"auc": 0.91},
                metadata={"team": "ml"})
    two = ready(admin, "spec-versions", samples.scale(3.0), metrics={"auc": 0.80})
    assert [v.number for v in admin.list_versions("spec-versions")] == [2, 1]
    assert [v.number for v in admin.list_versions("spec-versions", metric="auc>0.9")] == [1]
    assert [v.number for v in admin.list_versions("spec-versions",
                                                  metadata=["team:ml"])] == [1]
    assert [v.number for v in admin.list_versions("spec-versions", status="ready")] == [2, 1]
    described = admin.update_version("spec-versions", two.number, metrics={"auc": 0.95},
                                     max_batch_size=8)
    assert described.metrics == {"auc": 0.95} and described.raw["max_batch_size"] == 8
    got = admin.get_version("spec-versions", one.number)
    assert (got.number, got.sha256, got.signature["inputs"][0]["name"]) == (1, one.sha256, "x")

    artifact = admin.download_artifact("spec-versions", 1, tmp_path / "v1.onnx")
    assert artifact.path.read_bytes() == samples.scale(2.0)
    assert artifact.size_bytes == one.size_bytes
    assert artifact.headers["x-checksum-sha256"] == one.sha256

    admin.delete_version("spec-versions", 2, reason="superseded")
    assert [v.number for v in admin.list_versions("spec-versions")] == [1]


def test_a_version_too_new_for_the_runtime_is_converted(admin):
    from tests import onnx_cases

    admin.create_model("spec-convert")
    version = admin.upload("spec-convert", onnx_cases.todays_mlp(seed=4))
    version = admin.wait_validated("spec-convert", version.number, timeout=60)
    assert version.status == "failed" and version.validation_report.get("runtime_too_new")
    new = admin.convert("spec-convert", version.number)
    assert new.number == 2 and new.metadata["converted_from"] == 1
    assert admin.wait_validated("spec-convert", 2, timeout=60).status == "ready"


def test_approvals_and_aliases(admin, reviewer):
    ready(admin, "spec-approve", samples.scale(2.0))
    ready(admin, "spec-approve", samples.scale(3.0))
    admin.update_model("spec-approve", requires_approval=True)
    with pytest.raises(mmc.Forbidden) as own:
        admin.approve("spec-approve", 1)
    assert own.value.status == 403
    assert "you uploaded version 1; another engineer or admin must" in own.value.message
    assert reviewer.approve("spec-approve", 1, comment="ok").approval == "approved"
    rejected = reviewer.reject("spec-approve", 2, comment="worse")
    assert rejected.approval == "rejected" and rejected.raw["approvals"][0]["comment"] == "worse"

    alias = admin.set_alias("spec-approve", "candidate", 1)
    assert (alias.name, alias.version) == ("candidate", 1)
    assert [(a.name, a.version) for a in admin.list_aliases("spec-approve")] == [
        ("candidate", 1)]
    admin.delete_alias("spec-approve", "candidate")
    assert admin.list_aliases("spec-approve") == []


def test_a_pipeline_version_is_created_from_a_spec(admin):
    ready(admin, "spec-step", samples.scale(2.0))
    admin.create_model("spec-pipe")
    spec = {"steps": [{"name": "double", "model": "spec-step", "version": 1}],
            "edges": [{"from": "x", "to": "double.x"}, {"from": "double.y", "to": "y"}]}
    made = admin.create_pipeline("spec-pipe", spec)
    assert (made.number, made.status, made.format) == (1, "ready", "pipeline")
    assert made.pipeline["steps"][0]["model"] == "spec-step"


# -- the endpoint ---------------------------------------------------------------------------


def test_deploy_canary_promote_and_rollback_wait_for_the_replicas(admin):
    for factor in (2.0, 3.0, 4.0):
        ready(admin, "spec-rollout", samples.scale(factor))
    assert admin.get_endpoint("spec-rollout").stable is None
    ep = admin.deploy("spec-rollout", 1, reason="first", wait=30)
    assert ep.stable == 1 and ep.converged and ep.convergence.converged
    assert ep.convergence.revision == ep.revision and ep.convergence.replicas >= 1
    ep = admin.canary("spec-rollout", 2, weight=10, reason="try", wait=30)
    assert (ep.candidate, ep.candidate_weight, ep.converged) == (2, 10, True)
    assert admin.set_weight("spec-rollout", 50).candidate_weight == 50
    ep = admin.promote("spec-rollout", reason="ok", wait=30)
    assert (ep.stable, ep.candidate, ep.converged) == (2, None, True)
    assert admin.get_endpoint("spec-rollout").stable == 2
    assert admin.canary("spec-rollout", 3, weight=5).candidate == 3
    assert admin.abort("spec-rollout").candidate is None
    ep = admin.rollback("spec-rollout", 1, unload_first=True, reason="back", wait=30)
    assert ep.stable == 1 and ep.converged
    with pytest.raises(mmc.Conflict) as refused:
        admin.promote("spec-rollout")
    assert refused.value.status == 409 and refused.value.message


def test_an_analysed_canary_pauses_and_resumes(admin):
    ready(admin, "spec-analysis", samples.scale(2.0))
    ready(admin, "spec-analysis", samples.scale(3.0))
    admin.deploy("spec-analysis", 1)
    ep = admin.canary("spec-analysis", 2, plan={"steps": [5, 50, 100], "bake_seconds": 300})
    assert ep.candidate == 2 and ep.rollout
    assert admin.pause_analysis("spec-analysis", reason="look").candidate == 2
    assert admin.resume_analysis("spec-analysis").candidate == 2
    admin.abort("spec-analysis")


def test_blue_green_and_shadow(admin):
    ready(admin, "spec-bg", samples.scale(2.0))
    ready(admin, "spec-bg", samples.scale(3.0))
    admin.deploy("spec-bg", 1, wait=30)
    ep = admin.bluegreen_deploy("spec-bg", 2, wait=30)
    assert {ep.blue, ep.green} == {1, 2} and ep.live == 1
    assert admin.switch("spec-bg", wait=30).live == 2
    assert admin.switch_back("spec-bg").live == 1
    assert admin.switch("spec-bg").live == 2
    ep = admin.bluegreen_finish("spec-bg", wait=30)
    assert ep.stable == 2 and ep.state != "blue-green"
    assert admin.start_shadow("spec-bg", 1, reason="compare", wait=30).shadow == 1
    report = admin.get_shadow("spec-bg")
    assert (report.model, report.shadow) == ("spec-bg", 1)
    assert admin.stop_shadow("spec-bg", reason="seen enough", wait=30).shadow is None


def test_feedback_quality_and_a_versions_task(admin):
    ready(admin, "spec-quality", samples.mlp(seed=1, n_out=3))
    sent = admin.send_feedback("spec-quality", {"req-1": 0, "req-2": 2})
    assert sent == {"accepted": 2, "duplicate": 0}
    assert admin.send_feedback("spec-quality", [("req-1", 1)]) == {"accepted": 0,
                                                                   "duplicate": 1}
    with pytest.raises(mmc.BadRequest) as refused:
        admin.send_feedback("spec-quality", {"req-3": {"not": "a label"}})
    assert refused.value.field == "feedback[0].label"
    body = b'{"feedback": [{"request_id": "req-3", "label": 1}]}'
    assert admin.send_feedback("spec-quality", body) == {"accepted": 1, "duplicate": 0}
    assert admin.set_task("spec-quality", 1, "regressor")["effective"] == "regressor"
    assert admin.set_task("spec-quality", 1, "")["effective"] == "classifier"
    report = admin.quality("spec-quality", seconds=3600)
    assert report["feedback"]["received"] == 3 and report["feedback"]["duplicates"] == 1


def test_keys_limits_and_scale_to_zero(admin):
    ready(admin, "spec-keys", samples.scale(2.0))
    admin.deploy("spec-keys", 1)
    assert admin.protect_endpoint("spec-keys", reason="spec").protected
    key = admin.create_api_key("spec-keys", "ci")
    assert key.key and key.prefix and key.name == "ci"
    assert [k.prefix for k in admin.list_api_keys("spec-keys")] == [key.prefix]
    revoked = admin.revoke_api_key("spec-keys", key.prefix)
    assert revoked.remaining_keys == 0 and revoked.refusing_all and revoked.detail
    assert not admin.open_endpoint("spec-keys").protected
    ep = admin.set_limits("spec-keys", rps=50, burst=10, daily_quota=1000, reason="spec")
    assert (ep.limits["rps"], ep.limits["burst"], ep.limits["daily_quota"]) == (50, 10, 1000)
    ep = admin.set_scale_to_zero("spec-keys", 600, wait=30)
    assert ep.scale_to_zero["after_seconds"] == 600 and ep.converged


def test_data_capture_settings(admin):
    ready(admin, "spec-capture", samples.scale(2.0))
    admin.deploy("spec-capture", 1)
    assert admin.get_capture("spec-capture")["percent"] == 0
    body = admin.set_capture("spec-capture", percent=2.5, mode="inputs", retention_days=3)
    assert (body["percent"], body["mode"], body["retention_days"], body["enabled"]) == (
        2.5, "inputs", 3, True)
    with pytest.raises(mmc.BadRequest, match="max_bytes"):
        admin.set_capture("spec-capture", max_bytes=-1)
    assert admin.get_capture("spec-capture")["max_bytes"] == 65536


def test_baseline_and_drift_thresholds(admin, tmp_path):
    ready(admin, "spec-drift", samples.mlp(n_in=3, hidden=(4,), n_out=2, seed=1))
    admin.deploy("spec-drift", 1)
    np.save(tmp_path / "base.npy", np.random.default_rng(2).standard_normal((500, 3))
            .astype(np.float32))
    dataset = admin.upload_dataset(tmp_path / "base.npy")
    made = admin.set_baseline("spec-drift", 1, dataset=dataset.id)
    assert made["source"] == "dataset" and made["rows"] == 500
    assert list(admin.get_baseline("spec-drift", 1)["features"]["inputs"]) == [
        "x[0]", "x[1]", "x[2]"]
    with pytest.raises(mmc.BadRequest, match="no captured traffic"):
        admin.set_baseline("spec-drift", 1, since="2020-01-01T00:00:00Z",
                           until="2020-01-01T01:00:00Z")
    assert admin.set_drift("spec-drift", psi_threshold=0.25, window_minutes=30)[
        "window_minutes"] == 30
    with pytest.raises(mmc.BadRequest) as refused:
        admin.set_drift("spec-drift", p_value=2)
    assert refused.value.field == "p_value"
    drift = admin.get_drift("spec-drift")
    assert drift["psi_threshold"] == 0.25 and drift["episodes"] == []


# -- jobs -----------------------------------------------------------------------------------


def test_async_and_batch_jobs_run_and_their_results_download(admin, tmp_path):
    ready(admin, "spec-jobs", samples.mlp(n_in=4, hidden=(8,), n_out=2, seed=1))
    admin.deploy("spec-jobs", 1, wait=30)
    request = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                           "data": [0.1, 0.2, 0.3, 0.4]}]}
    job = admin.async_infer("spec-jobs", request)
    assert job.kind == "async" and job.status_url
    job = admin.wait_job(job.id, timeout=60)
    assert job.status == "succeeded" and job.finished
    answer = admin.download_result(job.id, tmp_path / "answer.json")
    assert json.loads(answer.path.read_text())["outputs"][0]["shape"] == [1, 2]
    (tmp_path / "request.json").write_text(json.dumps(request))
    from_file = admin.async_infer("spec-jobs", tmp_path / "request.json", version=1)
    assert admin.wait_job(from_file.id, timeout=60).status == "succeeded"

    rows = np.random.default_rng(1).standard_normal((200, 4)).astype(np.float32)
    np.save(tmp_path / "rows.npy", rows)
    calls = []
    dataset = admin.upload_dataset(tmp_path / "rows.npy",
                                   progress=lambda sent, total: calls.append(sent))
    assert dataset.format == "npy" and dataset.rows == 200
    assert calls[-1] == (tmp_path / "rows.npy").stat().st_size
    assert admin.get_dataset(dataset.id).sha256 == dataset.sha256
    assert dataset.id in [d.id for d in admin.list_datasets()]
    job = admin.batch("spec-jobs", dataset.id, batch_size=32, chunk_rows=100)
    job = admin.wait_job(job.id, timeout=120)
    assert job.status == "succeeded", job.failure_reason
    scores = admin.download_result(job.id, tmp_path / "scores.npy")
    assert np.load(scores.path).shape == (200, 2)
    assert {j.id for j in admin.list_jobs(model="spec-jobs", kind="batch")} == {job.id}
    assert admin.get_job(job.id).progress["rows_done"] == 200
    with pytest.raises(mmc.Conflict):  # a finished job has nothing left to cancel
        admin.cancel_job(job.id, reason="too late")


def test_a_load_test_runs_as_a_job_with_its_figures_in_the_summary(admin):
    ready(admin, "spec-load", samples.scale(2.0))
    admin.deploy("spec-load", 1, wait=30)
    job = admin.loadtest("spec-load", 1, requests=20, concurrency=2, confirm=True)
    job = admin.wait_job(job.id, timeout=120)
    assert (job.kind, job.status) == ("loadtest", "succeeded"), job.failure_reason
    assert job.summary


def test_a_wait_that_runs_out_raises_wait_timeout_with_what_it_saw_last():
    def validating(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"model": "m", "number": 1, "status": "validating"})

    with Client("http://mock", "t", transport=httpx.MockTransport(validating)) as client:
        with pytest.raises(mmc.WaitTimeout) as timed_out:
            client.wait_validated("m", 1, timeout=0.2, interval=0.05)
    assert str(timed_out.value) == "m:1 still validating after 0s"
    assert isinstance(timed_out.value, TimeoutError) and timed_out.value.last.number == 1


# -- integrations ---------------------------------------------------------------------------


def test_exports_are_written_whole_or_not_at_all(admin, tmp_path):
    ready(admin, "spec-export", samples.scale(2.0))
    ready(admin, "spec-export", samples.scale(3.0))
    admin.deploy("spec-export", 2)
    archive = admin.export("spec-export", tmp_path / "repo.tar.gz", versions=[1, 2])
    assert archive.versions == (1, 2) and archive.size_bytes == archive.path.stat().st_size
    with tarfile.open(archive.path, "r:gz") as tar:
        assert "spec-export/config.pbtxt" in tar.getnames()
    kserve = admin.export("spec-export", tmp_path / "kserve", format="kserve",
                          storage_uri="pvc://models")
    assert sorted(p.name for p in kserve.files) == ["inferenceservice.yaml",
                                                    "servingruntime.yaml"]
    assert kserve.versions == (2,)
    with pytest.raises(mmc.MmcError) as refused:
        admin.export("spec-export", tmp_path / "none.tar.gz", versions="9")
    assert refused.value.status in (400, 404, 409) and refused.value.message
    with pytest.raises(mmc.BadRequest):
        admin.export("spec-export", tmp_path / "bad", format="kserve", storage_uri="/data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kserve", "repo.tar.gz"]


def test_a_tensorrt_build_is_queued_and_reported(admin):
    ready(admin, "spec-trt", samples.scale(2.0))
    version = admin.build_tensorrt("spec-trt", 1, precision="fp16")
    assert "fp16" in version.validation_report["tensorrt"]
    assert "fp16" in admin.tensorrt_status("spec-trt", 1)


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that answers 200 and keeps what it was sent."""

    def __init__(self):
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                received.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_webhooks_are_managed_and_tested(admin):
    receiver = Receiver()
    try:
        hook = admin.create_webhook(receiver.url, events=["version.ready"], name="ci")
        assert hook.secret and hook.model is None and hook.events == ["version.ready"]
        assert [h.id for h in admin.list_webhooks()] == [hook.id]
        assert admin.update_webhook(hook.id, active=False).active is False
        assert admin.get_webhook(hook.id).active is False
        delivery = admin.test_webhook(hook.id)
        assert (delivery.event, delivery.status) == ("ping", "succeeded"), delivery.last_error
        assert receiver.received
        assert [d.id for d in admin.list_deliveries(hook.id, event="ping")] == [delivery.id]
        admin.delete_webhook(hook.id)
        assert admin.list_webhooks() == []
    finally:
        receiver.close()


# -- deployments as code -----------------------------------------------------------------------


def test_a_file_is_planned_applied_and_exported(admin):
    ready(admin, "spec-code", samples.mlp(n_in=4, hidden=(8,), n_out=2, seed=1))
    file = "models:\n  spec-code:\n    endpoint: {stable: 1}\n"
    plan = admin.plan(file)
    assert plan.changed and not plan.applied
    assert [c["resource"] for c in plan.changes] == ["endpoint spec-code"]
    done = admin.apply(file, source="abc123")
    assert done.applied and done.source == "abc123" and done.audit_event
    assert admin.get_endpoint("spec-code").stable == 1
    assert not admin.apply(file).changed  # a second apply changes nothing
    exported = admin.export_state()
    assert "spec-code:" in exported and not admin.plan(exported).changed
    assert admin.config_schema()["title"].startswith("mmc.yaml")
    with pytest.raises(mmc.BadRequest) as refused:
        admin.plan("models:\n  spec-code:\n    endpoint: {stable: 9}\n")
    assert refused.value.message == ("models.spec-code.endpoint.stable: model 'spec-code' has "
                                     "no version 9")


# -- access ---------------------------------------------------------------------------------


def test_users_tokens_and_the_audit_log(admin, console):
    url, _ = console
    user = admin.create_user("spec-viewer", "viewer", email="v@example.com")
    assert user.password and user.role == "viewer"
    assert "spec-viewer" in [u.username for u in admin.list_users()]
    assert admin.update_user("spec-viewer", role="engineer").role == "engineer"
    with Client(url) as viewer:
        viewer.login("spec-viewer", user.password)
        made = viewer.create_token("spec-readonly", read_only=True, expires_in_days=None)
        assert made.read_only and made.expiry is None and made.token
        assert "spec-readonly" in [t.name for t in viewer.list_tokens()]
        viewer.revoke_token(made.token_key)
        assert "spec-readonly" not in [t.name for t in viewer.list_tokens()]
    assert admin.update_user("spec-viewer", is_active=False).is_active is False
    events = admin.audit(action="user.", limit=10)
    assert events and all(e.action.startswith("user.") for e in events)
    assert any(e.target == "spec-viewer" for e in events)


# -- typed errors ---------------------------------------------------------------------------


def test_teams_their_members_and_a_model_moved_between_them(admin, reviewer):
    team = admin.create_team("spec-risk", description="risk models")
    assert (team.name, team.your_role, team.models) == ("spec-risk", "admin", [])
    member = admin.set_team_member("spec-risk", "reviewer", "approver")
    assert (member.username, member.role) == ("reviewer", "approver")
    model = admin.create_model("spec-owned", team="spec-risk")
    assert model.team == "spec-risk"
    shown = admin.get_team("spec-risk")
    assert shown.models == ["spec-owned"]
    assert [(m.username, m.role) for m in shown.members] == [("reviewer", "approver")]
    assert "spec-risk" in [t.name for t in admin.list_teams()]
    assert {"team": "spec-risk", "role": "approver"} in reviewer.whoami().teams
    with pytest.raises(mmc.Forbidden, match="admin role"):
        reviewer.set_team_member("spec-risk", "reviewer", "admin")
    with pytest.raises(mmc.Conflict, match="owns models"):
        admin.delete_team("spec-risk")
    assert admin.move_model("spec-owned", "default").team == "default"
    admin.remove_team_member("spec-risk", "reviewer")
    with pytest.raises(mmc.NotFound):
        reviewer.get_team("spec-risk")
    admin.delete_team("spec-risk")
    admin.delete_model("spec-owned")


def test_refusals_are_typed_errors_carrying_the_server_s_message(admin):
    with pytest.raises(mmc.NotFound) as missing:
        admin.get_model("spec-nope")
    assert missing.value.status == 404 and "spec-nope" in missing.value.message
    assert str(missing.value) == f"404: {missing.value.message}"

    admin.create_model("spec-errors")
    with pytest.raises(mmc.Conflict) as twice:
        admin.create_model("spec-errors")
    assert twice.value.status == 409 and "spec-errors" in twice.value.message

    with pytest.raises(mmc.BadRequest) as bad:
        admin.list_versions("spec-errors", metric="auc>>1")
    assert bad.value.status == 400 and "auc>>1" in bad.value.message
    assert bad.value.field == "metric" and bad.value.payload["error"] == bad.value.message

    with Client(admin.url, "mmc_not-a-token") as stranger, \
            pytest.raises(mmc.Unauthorized) as unknown:
        stranger.list_models()
    assert unknown.value.status == 401 and unknown.value.message

    with Client(f"http://127.0.0.1:{free_port()}", "t") as nobody, \
            pytest.raises(mmc.ConnectionFailed) as unreachable:
        nobody.list_models()
    assert unreachable.value.status is None and str(unreachable.value).startswith("cannot reach")


@pytest.mark.parametrize(("status", "kind"), [
    (413, mmc.PayloadTooLarge), (422, mmc.Unprocessable), (429, mmc.RateLimited),
    (410, mmc.Gone), (500, mmc.ServerError), (503, mmc.ServiceUnavailable),
    (507, mmc.InsufficientStorage), (418, mmc.MmcError)])
def test_each_status_has_its_error_class_and_keeps_retry_after(status, kind):
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": "no"}, headers={"Retry-After": "7"})

    with Client("http://mock", "t", transport=httpx.MockTransport(refuse)) as client, \
            pytest.raises(kind) as refused:
        client.get_model("m")
    assert type(refused.value) is kind
    assert (refused.value.status, refused.value.message, refused.value.retry_after) == (
        status, "no", 7.0)


def test_an_answer_that_is_not_json_is_the_message_as_it_came():
    with Client("http://mock", "t", transport=httpx.MockTransport(
            lambda r: httpx.Response(502, text="bad gateway"))) as client, \
            pytest.raises(mmc.ServerError) as refused:
        client.list_models()
    assert str(refused.value) == "502: bad gateway"


def test_an_upload_from_an_unsized_stream_is_sent_chunked_with_progress():
    seen = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen["headers"], seen["body"] = request.headers, request.read()
        return httpx.Response(201, json={"number": 1, "status": "uploaded"})

    class Pipe(io.RawIOBase):  # not seekable: its size is not known in advance
        def __init__(self, data: bytes):
            self.data = io.BytesIO(data)

        def readable(self):
            return True

        def read(self, n=-1):
            return self.data.read(n)

    calls = []
    with Client("http://mock", "t", transport=httpx.MockTransport(answer)) as client:
        client.upload("m", Pipe(b"x" * 10), filename="m.onnx",
                      progress=lambda sent, total: calls.append((sent, total)))
    assert seen["body"] == b"x" * 10 and "content-length" not in seen["headers"]
    assert calls == [(10, None)]


# -- the whole surface, and the page that shows it -----------------------------------------


def test_every_public_method_is_exercised_in_this_file():
    public = {name for name, member in inspect.getmembers(Client, inspect.isfunction)
              if not name.startswith("_")} - {"close"}
    source = Path(__file__).read_text()
    assert sorted(m for m in public if f".{m}(" not in source) == []


def test_mmc_is_importable_without_django_or_the_server(tmp_path):
    code = ("import sys, mmc; mmc.Client('http://x'); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'django', 'registry', 'serving', 'console', 'rest_framework', 'onnx'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def python_blocks(text: str) -> list[str]:
    """The ```python blocks marked runnable on the line before their fence."""
    return [m[1] for m in re.finditer(rf"{re.escape(MARKER)}\n```python\n(.*?)\n```", text,
                                      flags=re.S)]


def test_the_client_guide_runs_as_written(admin, tmp_path):
    blocks = python_blocks(DOCS_PAGE.read_text())
    assert len(blocks) >= 5
    script = tmp_path / "client_guide.py"
    script.write_text("\n\n".join(blocks) + "\n")
    token = admin.create_token("spec-docs", expires_in_days=1)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "MMC_URL": admin.url, "MMC_TOKEN": token.token}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}"
    assert "admin (admin) on" in r.stdout
    assert "refused (403): you uploaded version 1" in r.stdout
    assert "rolled back: stable 1, converged True" in r.stdout
    assert "404: " in r.stdout and "BadRequest on metric" in r.stdout
