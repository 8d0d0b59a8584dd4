"""The model page's metrics table (best per metric highlighted), its version filter, and the
diff's metrics, size and weights rows."""

from __future__ import annotations

import re

import onnx
import pytest

from registry import samples, services
from registry.audit import Actor

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scored(ready_model):
    """fraud v1 (auc 0.88, latency_ms 9), v2 re-export of v1's weights (auc 0.91, latency 14),
    v3 new weights, no metrics."""
    data = samples.mlp()
    ready_model("fraud", data)
    re_export = onnx.load_from_string(data)
    re_export.producer_version = "again"
    ready_model("fraud", re_export.SerializeToString())
    ready_model("fraud", samples.mlp(seed=4))
    system = Actor.system("test")
    services.version_describe(model_name="fraud", number=1, actor=system,
                              metrics={"auc": 0.88, "latency_ms": 9},
                              lineage={"git_commit": "abc1234", "dataset": "tx-v7"})
    services.version_describe(model_name="fraud", number=2, actor=system,
                              metrics={"auc": 0.91, "latency_ms": 14})
    return "fraud"


def best_cells(html: str) -> list[str]:
    return re.findall(r'<td class="num best" title="best"><strong>([^<]+)</strong>', html)


def test_metrics_table_has_a_column_per_metric_and_highlights_the_best(page_client, scored):
    html = page_client("viewer").get("/models/fraud/").content.decode()
    table = html[html.index('id="metrics"'):html.index("</table>", html.index('id="metrics"'))]
    assert 'data-metric="auc"' in table and 'data-metric="latency_ms"' in table
    assert 'data-version="3"' not in table  # no metrics: no row
    # Rows newest first. auc: higher is better -> v2's 0.91; latency_ms: lower -> v1's 9.
    assert best_cells(table) == ["0.91", "9"]
    assert "lower is better" in table


def test_versions_filter_on_the_model_page_uses_the_api_syntax(page_client, scored):
    client = page_client("viewer")
    html = client.get("/models/fraud/versions/?metric=auc%3E0.9",
                      HTTP_HX_REQUEST="true").content.decode()
    assert 'id="version-2"' in html and 'id="version-1"' not in html
    assert "1 version matches the filter" in html
    html = client.get("/models/fraud/?metric=auc").content.decode()
    assert "Filter not applied" in html and "NAME OP NUMBER" in html
    assert 'id="version-1"' in html  # a malformed filter narrows nothing


def test_diff_says_same_weights_for_a_re_export_and_compares_metrics(page_client, scored):
    client = page_client("viewer")
    html = client.get("/models/fraud/diff/?a=1&b=2", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="weights-change">same weights<' in html
    assert re.search(r'data-metric="auc">.*?\+0\.03.*?better', html, re.S)
    assert re.search(r'data-metric="latency_ms">.*?\+5.*?worse', html, re.S)
    assert "abc1234" in html  # lineage row
    html = client.get("/models/fraud/diff/?a=1&b=3", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="weights-change">weights changed<' in html
    assert "only in A" in html


def test_version_page_shows_metrics_and_lineage(page_client, scored):
    html = page_client("viewer").get("/models/fraud/versions/1/").content.decode()
    assert "0.88" in html and "tx-v7" in html and "abc1234" in html
