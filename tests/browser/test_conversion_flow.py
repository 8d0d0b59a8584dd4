"""A model from today's exporter in a real browser: its version page says why it failed and
offers "Convert to IR x / opset y"; the engineer presses it and lands on the new version, which
names its origin and validates to ready by itself."""

from __future__ import annotations

import pytest

from registry.signatures import runtime_limits
from tests import onnx_cases
from tests.browser.test_console_flow import login
from tests.conftest import upload, wait_validated

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_engineer_converts_a_too_new_model_from_its_version_page(live_server, users, engineer,
                                                                  page, shot):
    max_ir, max_opset = runtime_limits()
    base = live_server.url
    assert engineer.post("/api/v1/models/", {"name": "today"}, format="json").status_code == 201
    upload(engineer, "today", onnx_cases.todays_mlp(), filename="today.onnx")
    assert wait_validated(engineer, "today", 1)["status"] == "failed"
    login(page, base, "engineer")
    page.goto(f"{base}/models/today/versions/1/")
    button = page.get_by_role("button", name=f"Convert to IR {max_ir} / opset {max_opset}")
    assert button.is_visible()
    assert "IR version 14" in page.inner_text(".error")
    shot(page, "30-convert-offered")

    button.click()
    page.wait_for_url(f"{base}/models/today/versions/2/")
    page.wait_for_selector("text=Converted from")
    assert f"Converted v1 to v2 (IR {max_ir}, opset {max_opset})" in page.inner_text("body")
    wait_validated(engineer, "today", 2)
    page.reload()
    assert "ready" in page.inner_text("h1")
    shot(page, "31-converted-version")
