"""The rollout controls are drawn from the console forms (defaults, choices, labels: written once,
in console/forms.py and registry/choices.py), and one helper answers htmx with the partial."""

from __future__ import annotations

import re

import pytest

from registry import samples, services
from registry.audit import Actor
from registry.choices import GraphOptimizationLevel, RollbackOrder, VersionStatus
from registry.models import Endpoint, ModelVersion
from registry.routing import AnalysisPlan

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "/models/fraud/deployment/"


@pytest.fixture
def stable_v3(catalog, ready_model):
    """fraud: v3 stable; v1 (compatible) and v2 ready and older: every picker has choices."""
    ready_model("fraud", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="fraud", version_number=3, actor=Actor.system("test"))
    return "fraud"


def tag(html: str, element_id: str) -> str:
    found = re.search(rf'<(?:input|select)[^>]*\bid="{element_id}"[^>]*>', html)
    assert found, element_id
    return found.group(0)


def options(html: str, element_id: str) -> list[tuple[str, str]]:
    select = html[html.index(f'id="{element_id}"'):]
    select = select[:select.index("</select>")]
    return re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', select)


def test_the_canary_form_offers_the_analysis_plan_defaults_and_the_ready_versions(
        page_client, stable_v3):
    html = page_client("engineer").get(PAGE).content.decode()
    plan = AnalysisPlan()
    assert options(html, "canary-version") == [("2", "v2"), ("1", "v1")]
    slider = tag(html, "canary-weight")
    assert 'type="range"' in slider and 'name="weight"' in slider and 'value="10"' in slider
    assert 'data-output="canary-weight-value"' in slider and "required" not in slider
    assert '<output id="canary-weight-value" for="canary-weight" aria-hidden="true">10 %' in html
    assert '<label for="canary-weight">Candidate weight (%)</label>' in html
    assert f'value="{", ".join(map(str, plan.steps))}"' in tag(html, "canary-steps")
    bake = tag(html, "canary-bake")
    assert 'name="bake_seconds"' in bake and f'value="{plan.bake_seconds:g}"' in bake
    automated = tag(html, "canary-automated")
    assert 'type="checkbox"' in automated and 'name="automated"' in automated
    assert 'data-note=" (the analysis will drive the weights)"' in automated
    assert ('<label for="canary-reason">Reason <span class="muted">(audit log)</span></label>'
            in html)


@pytest.mark.usefixtures("analysis_ticking")
def test_posting_the_plan_fields_as_drawn_starts_the_default_plan(page_client, stable_v3):
    plan = AnalysisPlan()
    page_client("engineer").post(f"{PAGE}canary/", {
        "version": 1, "weight": 0, "automated": "on",
        "steps": ", ".join(map(str, plan.steps)), "bake_seconds": f"{plan.bake_seconds:g}"})
    analysis = Endpoint.objects.get(model__name="fraud").rollout.analysis
    assert analysis.plan.steps == plan.steps and analysis.plan.bake_seconds == plan.bake_seconds


def test_rollback_orders_come_from_the_choice_set(page_client, stable_v3):
    html = page_client("engineer").get(PAGE).content.decode()
    assert options(html, "rollback-order") == list(RollbackOrder.choices)
    assert options(html, "rollback-version") == [("2", "v2"), ("1", "v1")]
    assert '<label for="rollback-version">To version</label>' in html
    for element_id in ("bg-version", "shadow-version", "rollback-reason", "bg-reason",
                       "shadow-reason"):
        tag(html, element_id)


def test_the_weight_slider_starts_at_the_candidates_weight(page_client, stable_v3):
    services.canary_start(model_name="fraud", version_number=1, weight=35,
                          actor=Actor.system("test"))
    html = page_client("engineer").get(PAGE).content.decode()
    assert 'value="35"' in tag(html, "set-weight") and "canary-weight" not in html
    assert 'aria-valuetext="35 percent"' in tag(html, "set-weight")
    tag(html, "weight-reason")


def test_htmx_gets_the_partial_and_a_bad_audit_filter_still_swaps_in(page_client, catalog):
    admin = page_client("admin")
    htmx = {"HTTP_HX_REQUEST": "true"}
    assert admin.get("/audit/?since=not-a-date").status_code == 400
    partial = admin.get("/audit/?since=not-a-date", **htmx)
    assert partial.status_code == 200 and "<html" not in partial.content.decode()
    assert page_client("viewer").get("/models/fraud/diff/?a=1", **htmx).status_code == 400
    listing = page_client("viewer").get("/models/", **htmx).content.decode()
    assert "<html" not in listing and "fraud" in listing


def test_version_status_badges_and_fields_read_the_choice_sets(page_client, catalog):
    from registry import models

    assert models.VersionStatus is VersionStatus
    field = ModelVersion._meta.get_field("graph_optimization_level")
    assert field.choices == GraphOptimizationLevel.choices and field.default == "all"
    html = page_client("viewer").get("/models/fraud/").content.decode()
    assert f'title="{VersionStatus.READY.help_text}">ready</span>' in html
