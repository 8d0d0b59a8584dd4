"""A canary whose automated analysis has gone silent, as an engineer sees it in a browser: the
deployment page says how long ago the analysis last ran and that it stopped, the candidate's
share is back to 0 %, the health bar is degraded naming the analysis, and the decision is listed."""

from __future__ import annotations

import re

import pytest

from registry.models import Endpoint

from ..test_analysis_watch import analysing, silent_for  # noqa: F401  (fixture)
from .test_console_flow import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_stale_analysis_shows_on_the_deployment_page_with_the_candidate_dropped(
        live_server, users, analysing, page, shot):  # noqa: F811
    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/scorer/deployment/")
    assert re.search(r"Analysis checks: ran \d s ago \(every 5 s\)", page.inner_text("body"))
    silent_for(95)
    page.goto(f"{base}/models/scorer/deployment/")
    body = page.inner_text("body")
    assert "canary analysis has not run for 9" in body  # 95 s, or a second more by now
    assert "endpoint.analysis.stale" in body
    assert Endpoint.objects.get(model__name="scorer").candidate_weight == 0
    assert "health-degraded" in page.get_attribute("#health", "class")
    assert "not run for" in page.inner_text("#health")
    shot(page, "deployment-stale-analysis")
