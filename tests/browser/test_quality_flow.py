"""Model quality and a canary judged by its answers, as an engineer sees them: the deployment
page charts each version's accuracy per window from feedback, with the registered metric as a
reference line and the feedback counts; the analysis card lists the answer checks and the
rollback with its agreement figure."""

from __future__ import annotations

import time

import numpy as np
import pytest

from registry import samples
from registry.metrics import record_samples
from registry.models import ModelVersion
from registry.monitoring import capture_store, quality
from registry.services import analysis
from serving.core.mirror import MirrorStats
from serving.core.stats import LATENCY_BUCKETS_S

from ..test_canary_answers import with_classes_reversed
from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def answered(version: int, ts: float, rid: str, row: list[float]) -> dict:
    return {"id": rid, "model": "graded", "version": version, "role": "stable", "ts": ts,
            "latency_ms": 1.0, "inputs": {},
            "outputs": {"y": {"datatype": "FP32", "shape": [1, 3], "data": row}},
            "truncated": False}


@pytest.mark.usefixtures("analysis_ticking")
def test_quality_chart_and_an_answer_judged_rollback_on_the_deployment_page(
        live_server, engineer, ready_model, page, shot):
    stable = samples.mlp(seed=1, n_out=3)
    ready_model("graded", stable)
    ready_model("graded", with_classes_reversed(stable))
    ModelVersion.objects.filter(model__name="graded", number=1).update(
        metrics={"accuracy": 0.85})
    ModelVersion.objects.filter(model__name="graded", number=2).update(
        metrics={"accuracy": 0.9})
    assert engineer.post("/api/v1/models/graded/endpoint/deploy/", {"version": 1},
                         format="json").status_code == 200

    # six hours of answers with labels: v1 right ~85 % of the time, v2 (the last two hours)
    rng = np.random.default_rng(3)
    now = time.time()
    records, labels = [], []
    for i in range(360):
        ts = now - 6 * 3600 + i * 60
        version = 2 if ts > now - 2 * 3600 else 1
        truth = int(rng.integers(3))
        right = rng.random() < (0.88 - 0.02 * (i % 5) if version == 1 else 0.6)
        guess = truth if right else (truth + 1) % 3
        row = [0.1, 0.1, 0.1]
        row[guess] = 0.8
        records.append(answered(version, ts, f"r{i}", row))
        labels.append({"request_id": f"r{i}", "label": truth})
    capture_store.write_records(records, writer="spec")
    labels.append({"request_id": "never-answered", "label": 1})
    assert engineer.post("/api/v1/models/graded/feedback/", {"feedback": labels},
                         format="json").status_code == 200
    quality.run()

    # the canary: its replica's comparison says the candidate disagrees on most rows
    plan = {"steps": [50, 100], "bake_seconds": 0, "min_requests": 10, "mirror_percent": 25,
            "min_agreement": 0.95, "min_compared": 40}
    assert engineer.post("/api/v1/models/graded/endpoint/canary/", {"version": 2, "plan": plan},
                         format="json").status_code == 200
    mirror = MirrorStats("2", "1")
    x = rng.standard_normal((80, 3)).astype(np.float32)
    mirror.compare({"y": x}, {"y": x[:, ::-1].copy()})
    hist = [0] * (len(LATENCY_BUCKETS_S) + 1)
    hist[10] = 60
    state = {"count": 60, "errors": 0, "latency_sum_s": 0.06, "latency_buckets": hist,
             "since": now - 30}
    record_samples("replica-a", {"graded:1": {"stats": state},
                                 "graded:2": {"stats": state, "mirror": mirror.to_json()}})
    decided = analysis.tick()
    assert decided[0]["action"] == "rollback", decided

    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/graded/deployment/")
    page.wait_for_selector("#quality-accuracy")
    card = page.inner_text("#quality")
    assert "Labels received" in card and "Unknown request ids" in card
    assert "v1 accuracy" in card and "v1 registered accuracy" in card
    assert "agrees with the stable on" in page.inner_text("#decisions")
    assert "top-class agreement over 80 mirrored rows" in page.inner_text("#decisions")
    page.locator("#quality").scroll_into_view_if_needed()
    shot(page, "deployment-quality")
    page.locator("#quality").screenshot(path=str(_path("quality-chart")))
    page.locator("#analysis").screenshot(path=str(_path("analysis-agreement")))


def _path(name: str):
    from .conftest import SCREENSHOTS

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / f"{name}.png"
