"""Evaluation metrics and lineage of versions: set at upload (multipart, query, header), changed
by PATCH (audited), validated with a clear 400, filtered by metric and metadata; the weights
hash tells "same weights" from "weights changed"."""

import json

import pytest

from registry import samples
from registry.evaluation import lower_is_better
from tests.conftest import upload, wait_validated

pytestmark = pytest.mark.django_db(transaction=True)
LINEAGE = {"run_url": "https://mlflow.example/runs/42", "git_commit": "ABC1234def",
           "dataset": "transactions-2026-10"}


@pytest.fixture
def model(engineer):
    assert engineer.post("/api/v1/models/", {"name": "fraud"}, format="json").status_code == 201
    return "fraud"


def upload_with(client, model, data, **fields):
    from django.core.files.uploadedfile import SimpleUploadedFile

    payload = {"file": SimpleUploadedFile("m.onnx", data)}
    payload.update({k: json.dumps(v) for k, v in fields.items()})
    return client.post(f"/api/v1/models/{model}/versions/", payload, format="multipart")


def test_metrics_and_lineage_set_at_multipart_upload_are_shown_and_audited(engineer, admin,
                                                                           model):
    r = upload_with(engineer, model, samples.mlp(), metrics={"auc": 0.91, "acc": 0.88},
                    lineage=LINEAGE)
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["metrics"] == {"auc": 0.91, "acc": 0.88}
    assert body["lineage"] == {**LINEAGE, "git_commit": "abc1234def"}  # normalised lower-case
    event = admin.get("/api/v1/audit/?action=version.upload").json()["results"][0]
    assert event["after"]["metrics"] == {"auc": 0.91, "acc": 0.88}


def test_raw_put_takes_metrics_and_lineage_from_query_or_headers(engineer, model):
    url = f"/api/v1/models/{model}/versions/upload/"
    r = engineer.put(f"{url}?filename=a.onnx&metrics=" + json.dumps({"auc": 0.8}),
                     data=samples.mlp(), content_type="application/octet-stream")
    assert r.status_code == 201 and r.json()["metrics"] == {"auc": 0.8}, r.content
    r = engineer.put(url, data=samples.mlp(seed=2), content_type="application/octet-stream",
                     HTTP_X_MODEL_METRICS=json.dumps({"latency_p99_ms": 12}),
                     HTTP_X_MODEL_LINEAGE=json.dumps({"dataset": "v8"}))
    assert r.status_code == 201, r.content
    assert r.json()["metrics"] == {"latency_p99_ms": 12}
    assert r.json()["lineage"] == {"dataset": "v8"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"metrics": {"auc": "high"}}, "metric 'auc' must be a number"),
    ({"metrics": {"auc": True}}, "metric 'auc' must be a number"),
    ({"metrics": {"bad name": 1}}, "metric name 'bad name' is invalid"),
    ({"metrics": [0.9]}, "metrics must be a JSON object"),
    ({"lineage": {"run_url": "ftp://x/y"}}, "is not an http(s) URL"),
    ({"lineage": {"git_commit": "not-a-sha"}}, "is not a commit hash"),
    ({"lineage": {"owner": "me"}}, "unknown lineage field(s): owner"),
])
def test_invalid_metrics_or_lineage_are_refused_with_a_clear_400(engineer, model, fields,
                                                                 message):
    r = upload_with(engineer, model, samples.mlp(), **fields)
    assert r.status_code == 400, r.content
    assert message in r.json()["error"]
    assert r.json()["field"] == next(iter(fields))
    assert engineer.get(f"/api/v1/models/{model}/versions/").json()["count"] == 0


def test_non_finite_metric_is_refused(engineer, model):
    url = f"/api/v1/models/{model}/versions/upload/?metrics=" + '{"auc": NaN}'
    r = engineer.put(url, data=samples.mlp(), content_type="application/octet-stream")
    assert r.status_code == 400 and r.json()["field"] == "metrics", r.content


def test_patch_merges_metrics_and_lineage_and_audits_before_and_after(engineer, admin, model):
    upload_with(engineer, model, samples.mlp(), metrics={"auc": 0.91, "acc": 0.88})
    url = f"/api/v1/models/{model}/versions/1/"
    r = engineer.patch(url, {"metrics": {"auc": 0.93, "acc": None, "f1": 0.7},
                             "lineage": {"git_commit": "deadbeef"}}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["metrics"] == {"auc": 0.93, "f1": 0.7}
    assert r.json()["lineage"] == {"git_commit": "deadbeef"}
    event = admin.get("/api/v1/audit/?action=version.describe").json()["results"][0]
    assert event["before"] == {"metrics": {"auc": 0.91, "acc": 0.88}, "lineage": {}}
    assert event["after"] == {"metrics": {"auc": 0.93, "f1": 0.7},
                              "lineage": {"git_commit": "deadbeef"}}
    r = engineer.patch(url, {"metrics": {"auc": "x"}}, format="json")
    assert r.status_code == 400 and "must be a number" in r.json()["error"]
    r = engineer.patch(url, {"metadata": {"a": 1}}, format="json")
    assert r.status_code == 400 and "immutable" in r.json()["error"]
    viewer_patch = engineer.patch(url, {"max_batch_size": 4, "metrics": {"auc": 0.95}},
                                  format="json")
    assert viewer_patch.status_code == 200, viewer_patch.content
    assert viewer_patch.json()["metrics"]["auc"] == 0.95


def test_a_viewer_cannot_patch_metrics(client_for, engineer, model):
    upload_with(engineer, model, samples.mlp(), metrics={"auc": 0.9})
    r = client_for("viewer").patch(f"/api/v1/models/{model}/versions/1/",
                                   {"metrics": {"auc": 1.0}}, format="json")
    assert r.status_code == 403


def test_versions_filter_by_metric_and_metadata(engineer, model):
    upload_with(engineer, model, samples.mlp(seed=1), metrics={"auc": 0.85, "latency_ms": 9},
                metadata={"team": "ml", "epochs": 10})
    upload_with(engineer, model, samples.mlp(seed=2), metrics={"auc": 0.93, "latency_ms": 14},
                metadata={"team": "risk"})
    upload_with(engineer, model, samples.mlp(seed=3), metadata={"team": "ml"})

    def numbers(query):
        r = engineer.get(f"/api/v1/models/{model}/versions/?{query}")
        assert r.status_code == 200, r.content
        return [v["number"] for v in r.json()["results"]]

    assert numbers("metric=auc>0.9") == [2]
    assert numbers("metric=auc>=0.85") == [2, 1]
    assert numbers("metric=auc!=0.85") == [2]
    assert numbers("metric=auc>0.8&metric=latency_ms<10") == [1]
    assert numbers("metadata=team:ml") == [3, 1]
    assert numbers("metadata=epochs:10") == [1]
    assert numbers("metadata=team:ml&metric=auc>0") == [1]
    assert numbers("metric=") == [3, 2, 1]  # blank: no filter


@pytest.mark.parametrize("query", ["metric=auc", "metric=auc>>1", "metric=auc>high",
                                   "metric=auc>inf", "metadata=team", "metadata=:ml"])
def test_a_malformed_filter_is_a_400_that_says_the_syntax(engineer, model, query):
    r = engineer.get(f"/api/v1/models/{model}/versions/?{query}")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == query.split("=")[0]
    assert ("NAME OP NUMBER" in r.json()["error"] or "KEY:VALUE" in r.json()["error"]
            or "finite" in r.json()["error"])


def test_weights_hash_is_the_same_for_a_re_export_and_differs_for_new_weights(engineer, model):
    import onnx

    data = samples.mlp()
    re_export = onnx.load_from_string(data)
    re_export.producer_version = "re-exported"
    re_export.doc_string = "same weights, another file"
    for payload in (data, re_export.SerializeToString(), samples.mlp(seed=5)):
        assert upload(engineer, model, payload).status_code == 201
    v1, v2, v3 = (wait_validated(engineer, model, n) for n in (1, 2, 3))
    assert v1["sha256"] != v2["sha256"]
    assert len(v1["weights_sha256"]) == 64
    assert v1["weights_sha256"] == v2["weights_sha256"]
    assert v3["weights_sha256"] != v1["weights_sha256"]


@pytest.mark.parametrize(("name", "lower"), [
    ("auc", False), ("accuracy", False), ("f1", False), ("latency_p99_ms", True),
    ("val_loss", True), ("error_rate", True), ("rmse", True), ("p50_latency", True),
    ("size_bytes", True), ("recall", False)])
def test_direction_rule(name, lower):
    assert lower_is_better(name) is lower


def test_versions_validated_before_the_weights_hash_get_it_from_the_backfill_audited(
        engineer, admin, model):
    from django.core.management import call_command

    from registry.models import AuditEvent, ModelVersion
    from registry.validation import backfill_weights_hashes

    for payload in (samples.mlp(), samples.mlp(seed=5)):
        assert upload(engineer, model, payload).status_code == 201
    hashes = {n: wait_validated(engineer, model, n)["weights_sha256"] for n in (1, 2)}
    ModelVersion.objects.update(weights_sha256="")  # as validated by an older release
    assert backfill_weights_hashes(limit=1) == [f"{model}:1"]  # bounded per run, oldest first
    call_command("backfill_weights_hash")
    for n in (1, 2):
        assert engineer.get(f"/api/v1/models/{model}/versions/{n}/").json()[
            "weights_sha256"] == hashes[n]
    events = AuditEvent.objects.filter(action="version.weights-hash").order_by("pk")
    assert [(e.target, e.after["weights_sha256"]) for e in events] == [
        (f"{model}:1", hashes[1]), (f"{model}:2", hashes[2])]
    assert backfill_weights_hashes() == []  # nothing left: nothing read again
