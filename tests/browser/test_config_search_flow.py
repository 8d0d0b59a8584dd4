"""A serving-config search in a real browser: the engineer sweeps an idle version's batch size
and instances on a live embedded server (the live_server has no data plane), watches the points
arrive, finds the best marked in the table and the throughput-vs-p99 chart, and applies it."""

from __future__ import annotations

import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import AuditEvent, ModelVersion, ReplicaHeartbeat
from tests.browser.conftest import SCREENSHOTS
from tests.browser.test_console_flow import login
from tests.replicas import replicas, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_engineer_sweeps_an_idle_version_and_applies_the_best_point(
        live_server, users, ready_model, page, shot, tmp_path):
    ready_model("demo", samples.mlp(seed=0))
    ready_model("demo", samples.mlp(seed=1))
    services.endpoint_deploy(model_name="demo", version_number=1, actor=Actor.system("test"))
    base = live_server.url
    with replicas(1, embedded=True, log_dir=tmp_path) as (rep,):
        wait_until(lambda: (ReplicaHeartbeat.objects.get(replica=rep.name).versions
                            .get("demo:1", {}).get("state") == "READY"), timeout=30,
                   what="v1 loaded")
        login(page, base, "engineer")
        page.goto(f"{base}/models/demo/versions/2/#config-search")
        card = page.locator("#config-search")
        assert "No search of v2 yet" in card.inner_text()
        page.get_by_label("Try batch sizes").fill("0, 8")
        page.get_by_label("Try instance counts").fill("1, 2")
        page.get_by_label("In flight").fill("2")
        page.get_by_label("Seconds per point").fill("1")
        page.get_by_label("p99 budget (ms)").fill("250")
        page.select_option("#cs-replica", rep.name)
        page.get_by_role("button", name="Start search").click()
        page.wait_for_selector("text=Serving-config search queued")
        page.wait_for_selector('#config-search-run[data-status="succeeded"]', timeout=120_000)

        rows = page.locator("#config-search-points tbody tr")
        assert rows.count() == 4
        best = page.locator('#config-search-points tr[data-best="true"]')
        assert best.count() == 1 and "best" in best.inner_text()
        n = best.get_attribute("data-point")
        assert page.locator("#config-search-chart g.dot").count() == 4
        assert page.locator(f'#config-search-chart g.dot.best[data-point="{n}"]').count() == 1
        assert "put back" in page.inner_text("#config-search-restored")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        card.screenshot(path=str(SCREENSHOTS / "config-search-card.png"))

        page.get_by_role("button", name="Apply the best point").click()
        page.wait_for_selector("text=/Applied point #[0-9]+ of search [0-9]+ to v2/")
        assert "applied" in page.locator(f'#config-search-points tr[data-point="{n}"]').inner_text()
        shot(page, "config-search-applied")
    version = ModelVersion.objects.get(model__name="demo", number=2)
    event = AuditEvent.objects.get(action="config_search.apply")
    assert event.actor_name == "engineer" and event.after["point"] == int(n)
    assert version.instance_count == event.after["settings"]["instance_count"]
    assert version.max_batch_size == event.after["settings"]["max_batch_size"]
