"""Rate limits in a real browser: an engineer sets the endpoint's limits and one predict key's
daily quota on the deployment page and sees them there."""

from __future__ import annotations

import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import EndpointApiKey

from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_engineer_sets_endpoint_and_key_limits_on_the_deployment_page(
        live_server, users, ready_model, page, shot):
    ready_model("limited", samples.mlp())
    system = Actor.system("test")
    services.endpoint_deploy(model_name="limited", version_number=1, actor=system)
    key, _ = services.api_key_create(model_name="limited", name="checkout", actor=system)
    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/limited/deployment/")
    form = page.locator("#limits-form")
    form.get_by_label("Requests per second").fill("25.5")
    form.get_by_label("Burst").fill("50")
    form.get_by_label("Daily quota").fill("100000")
    form.get_by_role("button", name="Save limits").click()
    page.wait_for_selector("text=Limits of the endpoint saved")
    assert page.inner_text("#endpoint-rps") == "25.5 on each replica, burst 50"
    assert page.inner_text("#endpoint-quota") == "0 of 100000 used today (UTC)"

    row = page.locator(f"#key-{key.prefix}")
    row.get_by_text("Limits", exact=True).click()
    row.get_by_label("Daily quota").fill("500")
    row.get_by_role("button", name="Save").click()
    page.wait_for_selector(f"text=Limits of predict key {key.prefix}… saved")
    row = page.locator(f"#key-{key.prefix}")
    assert row.locator(".key-quota").inner_text() == "0 / 500"
    assert row.locator(".key-rps").inner_text() == "none"
    assert EndpointApiKey.objects.get(pk=key.pk).daily_quota == 500
    shot(page, "rate-limits-01-deployment-page")
    row.get_by_text("Limits", exact=True).click()
    assert row.get_by_label("Daily quota").input_value() == "500"  # the form shows today's
    row.screenshot(path=str(shot(page, "rate-limits-02-key-form").with_name(
        "rate-limits-02-key-row.png")))
