"""Metrics and lineage in a real browser: an engineer uploads two versions with metrics and
lineage from the model page, sees the metrics table with the best per metric highlighted,
filters the versions by a metric, and compares the two (metrics, size, weights)."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import samples, services
from registry.audit import Actor

from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path("/tmp/shots-metrics")


def upload(page, path: Path, metrics: str, number: int, **lineage: str) -> None:
    page.set_input_files("#id_file", str(path))
    page.fill("#id_metrics", metrics)
    for key, value in lineage.items():
        page.fill(f"#id_{key}", value)
    page.get_by_role("button", name="Upload", exact=True).click()
    page.wait_for_selector(f"#upload-result.ok >> text=Uploaded as version {number}")


def test_engineer_uploads_two_scored_versions_sees_the_best_and_the_diff(
        live_server, users, page, shot, tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    services.model_create(name="churn", description="Churn predictor", tags=["team:ml"],
                          actor=Actor.system("test"))
    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/churn/")
    assert "No metrics recorded" in page.inner_text("#versions")

    # A malformed metric is refused in the page, before any byte is sent.
    first = tmp_path / "churn-v1.onnx"
    first.write_bytes(samples.mlp(seed=0))
    page.set_input_files("#id_file", str(first))
    page.fill("#id_metrics", "auc=high")
    page.get_by_role("button", name="Upload", exact=True).click()
    page.wait_for_selector("#upload-result.error")
    assert "not NAME=NUMBER" in page.inner_text("#upload-result")

    upload(page, first, "auc=0.88, accuracy=0.91, latency_p99_ms=12", 1,
           run_url="https://mlflow.example/runs/41", git_commit="abc1234", dataset="churn-2026-09")
    page.wait_for_selector('#version-1[data-status="ready"]', timeout=60_000)
    second = tmp_path / "churn-v2.onnx"
    second.write_bytes(samples.mlp(seed=1, hidden=(256, 256, 128)))
    upload(page, second, "auc=0.93\naccuracy=0.90\nlatency_p99_ms=15", 2,
           run_url="https://mlflow.example/runs/42", git_commit="def5678", dataset="churn-2026-10")
    page.wait_for_selector('#version-2[data-status="ready"]', timeout=60_000)

    table = page.locator("#metrics")
    assert table.locator("thead th").all_inner_texts()[1:] == ["accuracy ↑", "auc ↑",
                                                                "latency_p99_ms ↓"]
    best = {(cell.evaluate("c => c.closest('tr').dataset.version"),
             cell.locator("strong").inner_text())
            for cell in table.locator("td.best").all()}
    # v2 has the better auc; v1 the better accuracy and (lower) latency.
    assert best == {("2", "0.93"), ("1", "0.91"), ("1", "12")}
    color = table.locator("td.best").first.evaluate("c => getComputedStyle(c).backgroundColor")
    assert color != "rgba(0, 0, 0, 0)"
    assert "def5678" in page.inner_text("#version-2")
    page.locator("#metrics").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "model-page.png"), full_page=True)
    shot(page, "metrics-01-model-page")

    page.fill("#id_filter_metric", "auc>0.9")
    page.locator("#version-filter").get_by_role("button", name="Filter").click()
    page.wait_for_selector('#versions[data-filtered="true"]')
    assert page.locator("#version-2").count() == 1 and page.locator("#version-1").count() == 0
    page.fill("#id_filter_metric", "auc")
    page.locator("#version-filter").get_by_role("button", name="Filter").click()
    page.wait_for_selector("#filter-errors")
    assert "NAME OP NUMBER" in page.inner_text("#filter-errors")
    page.screenshot(path=str(SHOTS / "model-page-filter-error.png"), full_page=False)

    page.select_option("#id_a", "1")
    page.select_option("#id_b", "2")
    page.get_by_role("button", name="Compare").click()
    page.wait_for_selector("#diff-metrics")
    assert page.inner_text("#weights-change") == "weights changed"
    rows = {r.get_attribute("data-metric"): r.inner_text()
            for r in page.locator("#diff-metrics tbody tr").all()}
    assert "better" in rows["auc"] and "+0.05" in rows["auc"]
    assert "worse" in rows["latency_p99_ms"] and "+3" in rows["latency_p99_ms"]
    assert "worse" in rows["accuracy"]
    assert "changed" in page.inner_text("#diff-artifact")
    page.goto(f"{base}/models/churn/diff/?a=1&b=2")
    page.screenshot(path=str(SHOTS / "diff.png"), full_page=True)
    shot(page, "metrics-02-diff")
