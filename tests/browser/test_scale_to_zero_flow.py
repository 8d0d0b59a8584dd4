"""Scale to zero in a real browser: an engineer sets the endpoint's idle timeout on the deployment
page, and the page shows the replicas it is scaled to zero on and its cold starts."""

from __future__ import annotations

import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import Endpoint
from registry.notify import current_revision
from registry.serving_source import RegistrySource
from serving.core.desired_state import SCALED_TO_ZERO, ObservedState
from serving.core.stats import VersionStats

from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_engineer_sets_scale_to_zero_and_sees_replicas_asleep_and_cold_starts(
        live_server, users, ready_model, page, shot):
    ready_model("nightly", samples.mlp())
    services.endpoint_deploy(model_name="nightly", version_number=1, actor=Actor.system("test"))
    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/nightly/deployment/")
    form = page.locator("#stz-form")
    form.get_by_label("Scale to zero after (s)").fill("300")
    form.get_by_role("button", name="Save").click()
    page.wait_for_selector("text=Replicas unload nightly after 300 s without a request")
    assert page.inner_text("#stz-after") == ("replicas unload the versions after 300 s "
                                             "without a request")
    assert Endpoint.objects.get(model__name="nightly").scale_to_zero_after_seconds == 300

    # two replicas report (as their heartbeats do): one woke once (1.75 s), one is asleep
    woke = VersionStats("nightly", "1")
    woke.record_cold_start(1.75)
    for replica, state, stats in [("r1", "READY", woke),
                                  ("r2", SCALED_TO_ZERO, VersionStats("nightly", "1"))]:
        RegistrySource(address=f"http://10.0.0.{replica[-1]}:8000").report(ObservedState(
            replica=replica, revision=current_revision(), versions={"nightly:1": {
                "state": state, "reason": None, "providers": [], "queue_depth": 0,
                "stats": stats.snapshot()}}))
    page.goto(f"{base}/models/nightly/deployment/")
    row = page.locator('#cold-starts tr[data-version="1"]')
    assert row.locator(".cold-count").inner_text() == "1"
    assert row.locator(".cold-last").inner_text().startswith("1.75 s")
    assert row.locator(".cold-asleep").inner_text().strip() == "r2"
    replica = page.locator('#replicas tr[data-replica="r2"]')
    assert "scaled to zero" in replica.inner_text()
    shot(page, "scale-to-zero-01-deployment-page")
    page.locator("#scale-to-zero").screenshot(path=str(
        shot(page, "scale-to-zero-02-card").with_name("scale-to-zero-02-card.png")))
