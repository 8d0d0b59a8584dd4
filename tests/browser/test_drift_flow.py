"""Baselines and drift as an engineer sees them: the version page's baseline table with a small
histogram per feature, and the deployment page's drift card (PSI per feature with the threshold
line, on the range picker, the latest window and the ongoing episode)."""

from __future__ import annotations

import pytest

from ..test_drift import FEATURES, drifted_history, watched  # noqa: F401 (a fixture)
from .conftest import SCREENSHOTS
from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_baseline_table_and_drift_chart(live_server, engineer, watched, page):  # noqa: F811
    drifted_history(engineer)
    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/watched/versions/1/")
    page.wait_for_selector("#baseline table")
    assert page.locator("#baseline tr[data-feature]").count() == FEATURES
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#baseline").screenshot(path=str(SCREENSHOTS / "version-baseline.png"))

    page.goto(f"{base}/models/watched/deployment/")
    page.wait_for_selector("#drift-v1")
    page.click('#drift a[data-range="1h"]')
    page.wait_for_selector('#drift a[data-range="1h"][aria-current="true"]')
    card = page.inner_text("#drift")
    assert "x[2]" in card and "threshold" in card and "(ongoing)" in card
    page.locator("#drift").screenshot(path=str(SCREENSHOTS / "deployment-drift.png"))
