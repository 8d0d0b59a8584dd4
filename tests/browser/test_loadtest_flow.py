"""A load test in a real browser: the engineer starts one from the version page against a live
embedded server (the live_server has no data plane), follows it on the job page and finds its
result in the version's history."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import ReplicaHeartbeat
from tests.browser.test_console_flow import login
from tests.replicas import replicas, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path("/tmp/shots-loadtest")


def test_engineer_load_tests_the_stable_version_and_sees_the_result_in_its_history(
        live_server, users, ready_model, page, shot, tmp_path):
    ready_model("demo", samples.mlp(seed=0))
    services.endpoint_deploy(model_name="demo", version_number=1, actor=Actor.system("test"))
    base = live_server.url
    with replicas(1, embedded=True, log_dir=tmp_path) as (rep,):
        wait_until(lambda: (ReplicaHeartbeat.objects.get(replica=rep.name).versions
                            .get("demo:1", {}).get("state") == "READY"), timeout=30,
                   what="v1 loaded")
        login(page, base, "engineer")
        page.goto(f"{base}/models/demo/versions/1/#loadtest")
        section = page.locator("#loadtest")
        assert "takes real traffic (stable)" in section.inner_text()
        page.get_by_label("Requests", exact=True).fill("300")
        page.get_by_label("Concurrency").fill("4")
        page.select_option("#id_replica", rep.name)
        page.get_by_role("button", name="Start load test").click()
        page.wait_for_selector("text=takes real traffic (stable of demo)")  # refused: no confirm
        page.get_by_label("It takes real traffic: run anyway").check()
        page.get_by_label("Requests", exact=True).fill("300")
        page.get_by_role("button", name="Start load test").click()
        page.wait_for_url(f"{base}/jobs/*/")
        page.wait_for_selector("text=Load test queued")
        page.wait_for_selector('#job-progress dd[data-status="succeeded"]', timeout=60_000)
        result = page.inner_text("#loadtest-result")
        assert "req/s" in result and "300 of 300 ok" in result
        shot(page, "loadtest-job")

        page.get_by_role("link", name="history").click()
        page.wait_for_selector('#loadtest-history tr[data-status="succeeded"]')
        row = page.locator('#loadtest-history tr[data-status="succeeded"]').inner_text()
        assert rep.name in row and "300" in row and "none" in row
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#loadtest").screenshot(path=str(SHOTS / "version-loadtest-history.png"))
        page.screenshot(path=str(SHOTS / "version-page.png"), full_page=True)
