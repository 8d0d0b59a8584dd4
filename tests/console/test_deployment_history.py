"""The deployment page's charts over time: a range picker (15 min to 7 days) reads the history
tier that fits, a version promoted over keeps its line (retired), and yesterday's rollout
events from the audit log are numbered markers on every chart with a legend."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
from django.utils import timezone
from django.utils.html import escape

from console import charts
from registry import samples, services
from registry.audit import Actor
from tests.metric_history import CANARY_AT, PROMOTE_AT, WEIGHT_AT, yesterdays_rollout

pytestmark = pytest.mark.django_db(transaction=True)
PAGE = "/models/fraud/deployment/"


@pytest.fixture
def history(catalog, ready_model):
    ready_model("fraud", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    return yesterdays_rollout()


def chart(html: str, key: str) -> str:
    start = html.index(f'id="chart-{key}"')
    return html[start:html.index("</figure>", start)]


def test_24h_shows_yesterdays_rollout_with_markers_and_the_retired_version(page_client, history):
    r = page_client("viewer").get(f"{PAGE}charts/?range=24h", HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'hx-trigger="every 60s"' in html and "charts/?range=24h" in html
    assert re.search(r'data-range="24h" aria-current="true">24 hours<', html)
    assert "last 24 hours" in html and "one point per 10 min" in html
    rps = chart(html, "rps")
    # v3 is stable now; v1 is no longer routed after the promote but keeps its line
    v3 = int(re.search(r'data-label="v3 stable" data-points="(\d+)"', rps)[1])
    v1 = int(re.search(r'data-label="v1 retired" data-points="(\d+)"', rps)[1])
    # one point per 10 min from the 10-minute tier: 144 a day on a 308 px plot
    assert 20 * 6 - 2 <= v3 <= 20 * 6 + 1 and 5 * 6 - 2 <= v1 <= 6 * 6 + 1
    assert '<span>v3 stable:</span> <strong class="latest">10</strong>' in rps
    assert '<span>v1 retired:</span> <strong class="latest">30</strong>' in rps
    # three numbered markers (the deploy two days ago is outside the range) where they happened
    plot_w = charts.WIDTH - charts.LEFT - charts.RIGHT
    for key in ("rps", "error-rate", "p50-ms", "p95-ms", "p99-ms"):
        marks = re.findall(r'<g class="event" data-event="(\d)"><title>([^<]+)</title>\s*'
                           r'<line x1="([\d.]+)"', chart(html, key))
        assert [(n, text) for n, text, _ in marks] == [
            ("1", "1: canary start: v3 at 20 %"), ("2", "2: weight change: v3 at 50 %"),
            ("3", "3: promote: v3 stable")]
        for (_, _, x), ago in zip(marks, (CANARY_AT, WEIGHT_AT, PROMOTE_AT), strict=True):
            assert float(x) == pytest.approx(charts.LEFT + plot_w * (1 - ago / 86400), abs=0.5)
    legend = html[html.index('<ol id="chart-events">'):]
    assert "canary start: v3 at 20 %" in legend and "promote: v3 stable" in legend
    ticks = re.findall(r"text-anchor=\"middle\">(−\d+[hd]|now)</text>", rps)
    assert ticks == ["−1d", "−18h", "−12h", "−6h", "now"]


def test_15_minutes_reads_the_fine_tier_without_yesterday(page_client, history):
    html = page_client("viewer").get(f"{PAGE}charts/").content.decode()
    assert 'hx-trigger="every 2s"' in html and "last 15 min" in html
    assert re.search(r'data-range="15m" aria-current="true"', html)
    rps = chart(html, "rps")
    assert "v1 retired" not in rps and 'class="event"' not in rps
    assert int(re.search(r'data-label="v3 stable" data-points="(\d+)"', rps)[1]) >= 25


def test_7_days_reads_the_10_minute_tier_and_the_page_keeps_the_range(page_client, history):
    html = page_client("viewer").get(f"{PAGE}charts/?range=7d").content.decode()
    rps = chart(html, "rps")
    # one point per 30 min from the 10-minute tier: 20 hours of v3
    assert int(re.search(r'data-label="v3 stable" data-points="(\d+)"', rps)[1]) in range(
        38, 42)
    assert len(re.findall(r'<g class="event"', rps)) == 4  # the deploy two days ago too
    page = page_client("viewer").get(f"{PAGE}?range=7d").content.decode()
    assert "deployment/charts/?range=7d" in page and 'hx-trigger="load, every 60s"' in page
    assert page_client("viewer").get(f"{PAGE}charts/?range=bogus").status_code == 200


def test_a_custom_range_shows_yesterdays_canary_window_only(page_client, history):
    """From/to as typed in the picker: the canary's three hours yesterday, both versions' lines,
    the weight change inside it, the promote after it left out; the x axis ends at 'to'."""
    now = time.time()

    def typed(ago: float) -> str:
        return timezone.localtime(datetime.fromtimestamp(now - ago, tz=UTC)).strftime(
            "%Y-%m-%dT%H:%M")

    query = urlencode({"range": "custom", "from": typed(CANARY_AT + 600),
                       "to": typed(PROMOTE_AT + 600)})
    html = page_client("viewer").get(f"{PAGE}charts/?{query}").content.decode()
    rps = chart(html, "rps")
    marks = re.findall(r'<g class="event" data-event="(\d)"><title>([^<]+)</title>', rps)
    assert [text for _, text in marks] == ["1: canary start: v3 at 20 %",
                                          "2: weight change: v3 at 50 %"]
    assert "v1 retired" in rps and "v3 stable" in rps
    # two hours from the minute tier, one point a minute; v3 from the canary start on
    v3 = re.search(r'data-label="v3 stable" data-points="(\d+)"', rps)
    assert int(v3[1]) in range(105, 115)
    assert "now</text>" not in rps  # the axis ends at 'to', not now
    page = page_client("viewer").get(f"{PAGE}?{query}").content.decode()
    assert f"deployment/charts/?{escape(query)}" in page


@pytest.mark.parametrize(("start", "end", "says"), [
    ("2026-11-23T12:00", "2026-11-23T11:00", "'from' must be before 'to'"),
    ("yesterday", "2026-11-23T11:00", "'from' must be a date and time"),
    ("2020-01-01T00:00", "2020-01-02T00:00", "history is kept for 8 days"),
])
def test_a_custom_range_that_cannot_be_drawn_is_refused_saying_why(page_client, history, start,
                                                                   end, says):
    query = urlencode({"range": "custom", "from": start, "to": end})
    r = page_client("viewer").get(f"{PAGE}charts/?{query}")
    assert r.status_code == 400 and says in r.content.decode()
    page = page_client("viewer").get(f"{PAGE}?{query}")
    assert page.status_code == 400
    assert says in re.search(r'id="range-error">([^<]+)<', page.content.decode())[1].replace(
        "&#x27;", "'")
