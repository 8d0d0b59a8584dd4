"""Model quality from ground truth: feedback bodies are checked whole (400 naming the field,
nothing written), joined with captured predictions by request id (late, duplicate and unknown
ids counted, never errors), and turned into accuracy / F1 / AUC or RMSE / MAE that match
hand-computed figures; a canary plan's answer checks are validated field by field."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from registry import samples
from registry.monitoring import capture_store, quality
from registry.monitoring.agreement import judge, summary
from registry.routing import AnalysisPlan
from serving.core.mirror import MirrorStats

# ------------------------------------------------------------------------- figures by hand


def test_classifier_figures_match_hand_computed_values():
    # 3 classes; answers' argmax: 0, 1, 2, 2, 1, 0 against labels 0, 1, 1, 2, 1, 2
    scores = [[.8, .1, .1], [.1, .7, .2], [.2, .3, .5], [.1, .2, .7], [.3, .6, .1], [.5, .2, .3]]
    labels = [0, 1, 1, 2, 1, 2]
    got = quality.classifier_metrics(labels, scores)
    assert got["accuracy"] == pytest.approx(4 / 6)
    # per class F1: c0 tp1 fp1 fn0 -> 2/3; c1 tp2 fp0 fn1 -> 4/5; c2 tp1 fp1 fn1 -> 1/2
    assert got["f1"] == pytest.approx((2 / 3 + 4 / 5 + 1 / 2) / 3)
    # one-vs-rest AUC by counting ordered (positive, negative) pairs
    def auc(k):
        pos = [s[k] for s, y in zip(scores, labels, strict=True) if y == k]
        neg = [s[k] for s, y in zip(scores, labels, strict=True) if y != k]
        wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
        return wins / (len(pos) * len(neg))
    assert got["auc"] == pytest.approx(np.mean([auc(0), auc(1), auc(2)]))


def test_binary_auc_counts_ties_as_half_and_a_probability_column_is_class_one():
    assert quality.auc_binary(np.array([0, 0, 1, 1]), np.array([.1, .4, .35, .8])) == 0.75
    assert quality.auc_binary(np.array([0, 1]), np.array([.5, .5])) == 0.5
    assert quality.auc_binary(np.array([1, 1]), np.array([.2, .3])) is None
    got = quality.classifier_metrics([0, 1, 1, 0], [[.2], [.9], [.4], [.6]])
    assert got["accuracy"] == 0.5 and got["auc"] == 0.75


def test_regressor_figures_match_hand_computed_values():
    got = quality.regressor_metrics([1.0, 2.0, 3.0, 4.0], [1.5, 2.0, 2.0, 6.0])
    assert got["mae"] == pytest.approx((0.5 + 0 + 1 + 2) / 4)
    assert got["rmse"] == pytest.approx(math.sqrt((0.25 + 0 + 1 + 4) / 4))


def test_the_task_is_inferred_from_the_output_signature():
    def sig(datatype, shape):
        return {"outputs": [{"name": "y", "datatype": datatype, "shape": shape}]}
    assert quality.inferred_task(sig("FP32", [-1, 10])) == "classifier"
    assert quality.inferred_task(sig("INT64", [-1])) == "classifier"
    assert quality.inferred_task(sig("FP32", [-1, 1])) == "regressor"
    assert quality.inferred_task(sig("FP32", [-1])) == "regressor"


# ---------------------------------------------------------------------- the answer checks


def compared(permute: bool, rows: int = 200) -> dict:
    rng = np.random.default_rng(0)
    stats = MirrorStats("2", "1")
    for _ in range(rows // 10):
        a = rng.standard_normal((10, 4)).astype(np.float32)
        b = a[:, [1, 0, 3, 2]] if permute else a.copy()
        stats.compare({"y": a}, {"y": b})
    s = stats.to_json()
    return summary({k: s[k] for k in ("requests", "errors", "compared_rows", "argmax_agree",
                                      "values", "abs_diff_sum", "diff_buckets",
                                      "stable_values", "candidate_values")})


def test_swapped_classes_disagree_and_identical_answers_agree():
    plan = AnalysisPlan.clean({"mirror_percent": 50, "min_agreement": 0.9, "min_compared": 50})
    same, swapped = compared(False), compared(True)
    assert same["agreement"] == 1.0 and same["max_abs_diff"] <= 1e-6
    assert same["distribution_distance"] == 0.0
    assert judge(plan, "classifier", same) is None
    assert swapped["agreement"] < 0.2
    assert "agrees with the stable on" in judge(plan, "classifier", swapped)
    regress = AnalysisPlan.clean({"mirror_percent": 50, "max_abs_diff": 0.01})
    assert "differ from the stable's by up to" in judge(regress, "regressor", swapped)
    assert judge(regress, "regressor", same) is None


@pytest.mark.parametrize("plan, field", [
    ({"min_agreement": 1.5, "mirror_percent": 10}, "plan.min_agreement"),
    ({"min_agreement": "high", "mirror_percent": 10}, "plan.min_agreement"),
    ({"mirror_percent": 101}, "plan.mirror_percent"),
    ({"min_agreement": 0.9}, "plan.mirror_percent"),
    ({"max_quality_drop": -1}, "plan.max_quality_drop"),
    ({"min_feedback": 0}, "plan.min_feedback"),
])
def test_a_bad_answer_check_is_refused_naming_its_field(engineer, ready_model, plan, field):
    ready_model("checked", samples.mlp(seed=1))
    ready_model("checked", samples.mlp(seed=2))
    assert engineer.post("/api/v1/models/checked/endpoint/deploy/", {"version": 1},
                         format="json").status_code == 200
    r = engineer.post("/api/v1/models/checked/endpoint/canary/",
                      {"version": 2, "plan": {"steps": [50, 100], **plan}}, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field


# --------------------------------------------------------------------------- feedback API


@pytest.mark.parametrize("body, field", [
    ({"feedback": [{"request_id": "a", "label": 1}, {"request_id": "b", "label": 2},
                   {"request_id": "c", "label": 0}, {"request_id": "d", "label": {"x": 1}}]},
     "feedback[3].label"),
    ({"feedback": [{"request_id": 7, "label": 1}]}, "feedback[0].request_id"),
    ({"feedback": [{"request_id": "a"}]}, "feedback[0].label"),
    ({"feedback": [{"request_id": "a", "label": True}]}, "feedback[0].label"),
    ({"feedback": [{"request_id": "a", "label": 1, "weight": 2}]}, "feedback[0].weight"),
    ({"feedback": "many"}, "feedback"),
    ({"request_id": "a", "label": [1, None]}, "label"),
])
def test_a_bad_feedback_body_is_refused_naming_the_field_and_nothing_is_written(
        engineer, ready_model, body, field):
    from registry.models import Feedback

    ready_model("rated", samples.mlp(seed=1))
    r = engineer.post("/api/v1/models/rated/feedback/", body, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field
    assert Feedback.objects.count() == 0


def test_feedback_needs_the_engineer_role(client_for, ready_model):
    ready_model("rated", samples.mlp(seed=1))
    viewer = client_for("viewer")
    r = viewer.post("/api/v1/models/rated/feedback/", {"request_id": "a", "label": 1},
                    format="json")
    assert r.status_code == 403
    assert viewer.get("/api/v1/models/rated/quality/").status_code == 200


def record(rid: str, version: int, ts: float, row: list[float]) -> dict:
    return {"id": rid, "model": "rated", "version": version, "role": "stable", "ts": ts,
            "latency_ms": 1.0, "inputs": {},
            "outputs": {"y": {"datatype": "FP32", "shape": [1, len(row)], "data": row}},
            "truncated": False}


def test_feedback_joins_captured_answers_counting_late_duplicate_and_unknown_ids(
        engineer, ready_model, settings):
    from registry.models import QualityPoint

    settings.QUALITY_WINDOW_SECONDS = 60
    ready_model("rated", samples.mlp(seed=1, n_out=3))
    window = (int(time.time()) // 60 - 2) * 60  # a closed window
    answers = {"r1": [.9, .05, .05], "r2": [.1, .8, .1], "r3": [.2, .2, .6], "r4": [.7, .2, .1]}
    capture_store.write_records([record(rid, 1, window + 5 + i, row)
                                 for i, (rid, row) in enumerate(answers.items())], writer="spec")

    r = engineer.post("/api/v1/models/rated/feedback/", {"feedback": [
        {"request_id": "r1", "label": 0}, {"request_id": "r2", "label": 1},
        {"request_id": "r1", "label": 2},                      # duplicate: the first is kept
        {"request_id": "nobody-asked", "label": 1}]}, format="json")
    assert r.status_code == 200, r.content
    assert r.json() == {"accepted": 3, "duplicate": 1}
    assert engineer.post("/api/v1/models/rated/feedback/", {"request_id": "r2", "label": 0},
                         format="json").json() == {"accepted": 0, "duplicate": 1}

    first = quality.run()
    assert first["joined"] == 2 and first["unknown"] == 1
    point = QualityPoint.objects.get(version=1)
    assert point.count == 2 and point.metrics["accuracy"] == 1.0 and point.late == 0

    # labels for the same, already computed, closed window arrive later: late, still used
    engineer.post("/api/v1/models/rated/feedback/", {"feedback": [
        {"request_id": "r3", "label": 0}, {"request_id": "r4", "label": 0}]}, format="json")
    second = quality.run()
    assert second["joined"] == 2 and second["late"] == 2
    point.refresh_from_db()
    assert point.count == 4 and point.late == 2
    assert point.metrics["accuracy"] == pytest.approx(3 / 4)  # r3 answered class 2, label 0

    counts = engineer.get("/api/v1/models/rated/feedback/").json()
    assert counts == {"received": 5, "duplicates": 2, "joined": 4, "pending": 0, "unknown": 1,
                      "late": 2}
    body = engineer.get("/api/v1/models/rated/quality/").json()
    assert body["versions"][0]["task"] == "classifier"
    assert body["versions"][0]["points"][0]["accuracy"] == pytest.approx(0.75)


def test_the_task_is_set_and_audited_and_the_reference_is_the_registered_metric(
        engineer, ready_model):
    from registry.models import AuditEvent, ModelVersion

    ready_model("rated", samples.mlp(seed=1))
    r = engineer.put("/api/v1/models/rated/versions/1/task/", {"task": "regressor"},
                     format="json")
    assert r.status_code == 200 and r.json()["effective"] == "regressor"
    assert AuditEvent.objects.filter(action="version.task").exists()
    r = engineer.put("/api/v1/models/rated/versions/1/task/", {"task": "ranker"}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "task"
    version = ModelVersion.objects.get(model__name="rated", number=1)
    version.metrics = {"RMSE": 0.4}
    assert quality.reference(version, "rmse") == 0.4


def test_quality_windows_are_by_prediction_time():
    at = datetime(2026, 1, 1, 10, 7, 30, tzinfo=UTC)
    assert quality.window_start(at, 300) == at.replace(minute=5, second=0)
    assert quality.window_start(at, 3600) == at - timedelta(minutes=7, seconds=30)


def test_the_route_carries_the_mirror_share_to_replicas_and_refuses_one_out_of_range():
    from serving.core.desired_state import DesiredState, ModelRoute
    from serving.core.state_wire import WireError, decode_desired, encode_desired

    route = ModelRoute(model="m", stable="1", candidate="2", candidate_weight=5,
                       mirror_percent=20)
    doc = encode_desired(DesiredState(revision=3, routes={"m": route}, versions={}))
    back = decode_desired(doc, artifact_path=lambda sha: sha)
    assert back.routes["m"].mirror_percent == 20
    doc["routes"]["m"]["mirror_percent"] = 101
    with pytest.raises(WireError, match="mirror_percent"):
        decode_desired(doc, artifact_path=lambda sha: sha)


@pytest.mark.usefixtures("analysis_ticking")
def test_a_candidate_whose_labelled_answers_are_worse_is_rolled_back_with_the_figures(
        engineer, ready_model):
    from registry.models import AuditEvent, Endpoint
    from registry.services import analysis

    ready_model("rated", samples.mlp(seed=1, n_out=3))
    ready_model("rated", samples.mlp(seed=2, n_out=3))
    engineer.post("/api/v1/models/rated/endpoint/deploy/", {"version": 1}, format="json")
    plan = {"steps": [50, 100], "bake_seconds": 0, "min_requests": 10,
            "max_quality_drop": 0.1, "min_feedback": 10}
    r = engineer.post("/api/v1/models/rated/endpoint/canary/", {"version": 2, "plan": plan},
                      format="json")
    assert r.status_code == 200, r.content
    now = time.time()
    records, labels = [], []
    for i in range(20):  # the stable is right every time, the candidate half the time
        for version, right in ((1, True), (2, i % 2 == 0)):
            row = [0.8, 0.1, 0.1] if right else [0.1, 0.8, 0.1]
            records.append({**record(f"v{version}-{i}", version, now, row),
                            "role": "stable" if version == 1 else "candidate"})
            labels.append({"request_id": f"v{version}-{i}", "label": 0})
    capture_store.write_records(records, writer="spec")
    engineer.post("/api/v1/models/rated/feedback/", {"feedback": labels}, format="json")
    quality.run()

    def healthy(model, version, since):
        return {"count": 100, "errors": 0, "error_rate": 0.0, "p50_ms": 1.0, "p95_ms": 1.0,
                "p99_ms": 1.0, "rps": 10.0}

    decided = analysis.tick(metrics=healthy)
    assert decided[0]["action"] == "rollback", decided
    assert "candidate accuracy 0.5 vs stable 1" in decided[0]["why"]
    assert Endpoint.objects.get(model__name="rated").candidate_id is None
    event = AuditEvent.objects.filter(action="endpoint.abort").latest("id")
    assert event.after["details"]["answers"]["quality"]["drop"] == pytest.approx(0.5)
