"""Jobs in a real browser: a batch transform's progress bar moves without a reload, the engineer
cancels it from its page; a TensorRT build is asked for on the version page and its outcome
appears there by itself."""

from __future__ import annotations

import pytest

from registry import samples
from serving.core.runtime import gpu_available
from tests.browser.test_console_flow import login
from tests.console.test_jobs_pages import start_batch

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ROWS = 100_000


def bar_value(page, selector: str) -> int:
    return int(page.eval_on_selector(selector, "e => e.value"))


def test_engineer_follows_and_cancels_a_batch_then_asks_for_a_tensorrt_build(
        live_server, users, engineer, ready_model, page, shot):
    base = live_server.url
    mlp = ready_model("mlp", samples.mlp())
    job_id = start_batch(engineer, mlp, ROWS, chunk_rows=1000, max_rows_per_second=8000)
    login(page, base, "engineer")
    page.get_by_role("link", name="Jobs").click()
    page.wait_for_url(f"{base}/jobs/")
    page.evaluate("window.__sameDocument = true")
    row = f'tr[data-job="{job_id}"]'
    page.wait_for_selector(f'{row}[data-status="running"]')
    first = bar_value(page, f"{row} progress")
    page.wait_for_function(
        f"() => document.querySelector('{row} progress').value > {first}", timeout=20_000)
    assert page.evaluate("window.__sameDocument") is True  # htmx swapped the table in place
    shot(page, "12-jobs-running")

    page.locator(row).get_by_role("link").first.click()
    page.wait_for_url(f"{base}/jobs/{job_id}/")
    page.wait_for_selector('#job-progress dd[data-status="running"]')
    assert "rows/s" in page.inner_text("#job-progress")
    page.get_by_label("Reason").fill("wrong dataset")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel job").click()
    page.wait_for_selector("text=Job cancelled")
    assert "cancelled by engineer: wrong dataset" in page.inner_text("#job-progress")
    done = bar_value(page, "#job-progress progress")
    assert 0 < done < ROWS
    shot(page, "13-job-cancelled")

    page.goto(f"{base}/models/mlp/versions/1/")
    page.select_option("#id_precision", "fp16")
    page.get_by_role("button", name="Build TensorRT engine").click()
    page.wait_for_selector("text=FP16 TensorRT engine build queued")
    outcome = "built" if gpu_available() else "skipped"
    page.wait_for_selector(f'#tensorrt tr[data-precision="fp16"][data-status="{outcome}"]',
                           timeout=120_000 if gpu_available() else 20_000)
    if not gpu_available():
        assert "keeps serving on CPU" in page.inner_text("#tensorrt")
    shot(page, "14-version-tensorrt")


def test_rollout_controls_follow_a_change_made_elsewhere_without_a_reload(
        live_server, users, ready_model, page, shot):
    from registry import services
    from registry.audit import Actor

    ready_model("fraud", samples.mlp(seed=1))
    ready_model("fraud", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("t"))
    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/fraud/deployment/")
    assert page.get_by_role("button", name="Start canary").count() == 1
    page.evaluate("window.__sameDocument = true")
    services.canary_start(model_name="fraud", version_number=2, weight=25,
                          actor=Actor.system("canary-analysis"))  # not this page's doing
    page.wait_for_selector("#controls >> text=Candidate version 2")
    assert page.evaluate("window.__sameDocument") is True
    assert page.get_by_role("button", name="Start canary").count() == 0
    assert "endpoint.canary by canary-analysis" in page.inner_text("#split")
    assert page.eval_on_selector("#set-weight", "e => e.value") == "25"
    shot(page, "15-controls-redrawn")
