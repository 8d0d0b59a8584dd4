"""Chart history in a real browser: an engineer opens the deployment page, picks 24 hours and
sees yesterday's canary (start, weight change, promote) as numbered markers on the charts, the
promoted-over version's line kept, and the address bar remembering the range."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.utils import timezone

from registry import samples, services
from registry.audit import Actor
from tests.metric_history import CANARY_AT, PROMOTE_AT, yesterdays_rollout

from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path("/tmp/shots-history")


def test_picking_24_hours_shows_yesterdays_rollout_markers(live_server, users, page,
                                                             ready_model):
    ready_model("fraud", samples.mlp(seed=0))
    ready_model("fraud", samples.mlp(seed=1, n_out=2))
    ready_model("fraud", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    yesterdays_rollout()
    base = live_server.url

    login(page, base, "engineer")
    page.goto(f"{base}/models/fraud/deployment/")
    page.wait_for_selector("#chart-rps .series[data-label='v3 stable']")
    assert page.locator("#chart-rps g.event").count() == 0  # 15 min: yesterday is outside
    page.evaluate("window.__sameDocument = true")
    page.get_by_role("navigation", name="Chart time range").get_by_role(
        "link", name="24 hours").click()
    page.wait_for_selector("#chart-rps g.event[data-event='3']")
    assert page.evaluate("window.__sameDocument") is True  # swapped in place, no reload
    assert page.url.endswith("/models/fraud/deployment/?range=24h")
    assert page.get_attribute("[data-range='24h']", "aria-current") == "true"
    assert page.locator("#chart-p99-ms g.event").count() == 3
    assert page.locator("#chart-rps .series[data-label='v1 retired']").count() == 1
    events = page.inner_text("#chart-events")
    assert "canary start: v3 at 20 %" in events and "weight change: v3 at 50 %" in events
    assert "promote: v3 stable" in events
    tooltip = page.text_content("#chart-rps g.event[data-event='1'] title")
    assert tooltip == "1: canary start: v3 at 20 %"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#charts").screenshot(path=str(SHOTS / "deployment-24h.png"))
    page.screenshot(path=str(SHOTS / "deployment-24h-page.png"), full_page=True)
    page.reload()  # the range survives a reload (the address bar has it)
    page.wait_for_selector("#chart-rps g.event[data-event='3']")


def test_a_custom_range_typed_in_the_picker_shows_that_window(live_server, users, page,
                                                              ready_model):
    ready_model("fraud", samples.mlp(seed=0))
    ready_model("fraud", samples.mlp(seed=1, n_out=2))
    ready_model("fraud", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    now = yesterdays_rollout()

    def typed(ago: float) -> str:
        return timezone.localtime(datetime.fromtimestamp(now - ago, tz=UTC)).strftime(
            "%Y-%m-%dT%H:%M")

    login(page, live_server.url, "engineer")
    page.goto(f"{live_server.url}/models/fraud/deployment/")
    page.wait_for_selector("#chart-rps .series[data-label='v3 stable']")
    page.fill("input[name=from]", typed(CANARY_AT + 600))
    page.fill("input[name=to]", typed(PROMOTE_AT + 600))
    page.get_by_role("button", name="Show").click()
    page.wait_for_selector("#chart-rps g.event[data-event='2']")
    assert "range=custom" in page.url
    assert page.locator("#chart-rps g.event").count() == 2  # the promote came after 'to'
    assert page.input_value("input[name=from]") == typed(CANARY_AT + 600)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#charts").screenshot(path=str(SHOTS / "deployment-custom.png"))
