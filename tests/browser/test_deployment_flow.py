"""A canary in a real browser while a real serving replica takes traffic: the engineer sets the
weight with the keyboard on the slider, starts the canary, watches the charts and the replica
table redraw without a reload, promotes, rolls back and reads the audit entry; a viewer sees the
same page without buttons."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import Endpoint
from tests.conftest import CLUSTERED
from tests.replicas import replicas

from .test_console_flow import login, logout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


class Traffic:
    """Two clients posting unpinned predictions to the replica until stopped."""

    def __init__(self, url: str, model: str):
        self.url, self.model, self.stop = url, model, threading.Event()
        self.ok = self.failed = 0
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self.stop.is_set():
                try:
                    r = http.post(f"/v2/models/{self.model}/infer", json=BODY)
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed += 1
                except httpx.HTTPError:
                    self.failed += 1
                time.sleep(0.01)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def points(page, chart: str, label: str) -> int:
    return int(page.get_attribute(f'#{chart} .series[data-label="{label}"]', "data-points"))


def test_canary_from_the_slider_with_live_charts_then_promote_and_roll_back(
        live_server, users, page, shot, ready_model, tmp_path):
    ready_model("demo", samples.mlp(seed=0), description="browser canary demo")
    ready_model("demo", samples.mlp(seed=1))
    services.endpoint_deploy(model_name="demo", version_number=1, actor=Actor.system("test"))
    base = live_server.url

    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path,
                  MMC_ROLLOUT_TICK_SECONDS="0") as (replica,), Traffic(replica.url, "demo") as load:
        login(page, base, "engineer")
        page.goto(f"{base}/models/demo/")
        page.get_by_role("link", name="Deployment: canary, blue-green, live metrics").click()
        page.wait_for_url(f"{base}/models/demo/deployment/")
        page.evaluate("window.__sameDocument = true")
        # The replica table converges and v1's chart fills from real heartbeats, no reload.
        page.wait_for_selector("#replicas >> text=1/1 replica at revision", timeout=30_000)
        page.wait_for_function("() => { const s = document.querySelector("
                               "'#chart-rps .series[data-label=\"v1 stable\"]');"
                               " return s && +s.dataset.points >= 2; }", timeout=30_000)
        assert page.evaluate("window.__sameDocument") is True
        assert page.locator("#replicas tbody").inner_text().count("v1") >= 1
        shot(page, "08-deployment-stable")

        slider = page.get_by_label("Candidate weight (%)")
        slider.focus()
        page.keyboard.press("Home")
        for _ in range(25):
            page.keyboard.press("ArrowRight")
        assert slider.input_value() == "25"
        assert page.inner_text("#canary-weight-value") == "25 %"
        page.select_option("#canary-version", "2")
        page.fill("#canary-reason", "browser canary")
        questions = []
        page.once("dialog", lambda d: (questions.append(d.message), d.accept()))
        page.get_by_role("button", name="Start canary").click()
        page.wait_for_selector("text=Canary started: version 2 is the candidate.")
        assert "version 2 takes 25 %" in questions[0]
        assert Endpoint.objects.get(model__name="demo").candidate_weight == 25
        assert "Version 2 (candidate): 25 %" in page.inner_text("#split")

        # Requests keep flowing: the candidate's line appears and grows without a reload.
        page.evaluate("window.__sameDocument = true")
        page.wait_for_function("() => { const s = document.querySelector("
                               "'#chart-rps .series[data-label=\"v2 candidate\"]');"
                               " return s && +s.dataset.points >= 3; }", timeout=30_000)
        first = points(page, "chart-rps", "v2 candidate")
        page.wait_for_function(f"() => +document.querySelector('#chart-rps .series[data-label="
                               f"\"v2 candidate\"]').dataset.points > {first}", timeout=15_000)
        assert page.evaluate("window.__sameDocument") is True
        assert "v2 candidate" in page.inner_text("#chart-p99-ms .legend")
        page.wait_for_selector("#replicas >> text=1/1 replica at revision")
        shot(page, "09-deployment-canary-live-charts")

        page.once("dialog", lambda d: d.accept())
        page.get_by_role("button", name="Promote v2").click()
        page.wait_for_selector("text=Candidate promoted")
        assert "Version 2 (stable): 100 %" in page.inner_text("#split")

        page.select_option("#rollback-version", "1")
        page.fill("#rollback-reason", "p99 regression seen in the browser")
        page.once("dialog", lambda d: d.accept())
        page.get_by_role("button", name="Roll back").click()
        page.wait_for_selector("text=Rolled back: version 1 is the stable version now.")
        decisions = page.inner_text("#decisions tbody")
        assert "endpoint.rollback" in decisions
        assert "p99 regression seen in the browser" in decisions
        assert "endpoint.promote" in decisions and "endpoint.canary" in decisions
        page.wait_for_selector("#replicas >> text=1/1 replica at revision", timeout=30_000)
        shot(page, "10-deployment-after-rollback")
        assert load.ok > 0

    # The audit log has the rollback with who, why and before -> after.
    logout(page)
    login(page, base, "admin")
    page.goto(f"{base}/audit/?model=demo&action=endpoint.rollback")
    rows = page.inner_text("#audit-table tbody")
    assert "engineer" in rows and "p99 regression seen in the browser" in rows
    logout(page)

    login(page, base, "viewer")
    page.goto(f"{base}/models/demo/deployment/")
    assert page.get_by_role("button", name="Start canary").count() == 0
    assert page.locator("input[type=range]").count() == 0
    assert "needs the engineer role" in page.inner_text("#controls")
    shot(page, "11-deployment-viewer")
