"""The approval gate in a real browser: an engineer turns on "promotion needs approval" on the
model page; their own pending version is offered no deploy button (it says to approve it) and
the version page offers them no approve button; a second engineer approves it there with a comment,
the decision shows in its history, and the first engineer's deploy then works."""

from __future__ import annotations

import hashlib

import onnx
import pytest

from registry import samples, services
from registry.audit import Actor
from registry.models import AuditEvent, Endpoint, ModelVersion, VersionStatus
from registry.signatures import extract_signature

from .test_console_flow import login, logout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
M = "fraud"


def deploy_from_model_page(page, number: int) -> str:
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f"#version-{number}").get_by_role("button", name="Deploy as stable").click()
    page.wait_for_load_state()
    return page.inner_text(".messages")


def test_a_pending_version_is_blocked_until_a_second_engineer_approves_it(
        live_server, users, page, shot):
    from django.contrib.auth.models import Group, User

    reviewer = User.objects.create_user(username="reviewer", password="reviewer-password-1")
    reviewer.groups.add(Group.objects.get(name="engineer"))
    engineer = users["engineer"]
    model = services.model_create(name=M, description="Card fraud scorer",
                                  actor=Actor(user=engineer, name="engineer"))
    for number in (1, 2):
        blob = samples.mlp(seed=number)
        ModelVersion.objects.create(
            model=model, number=number, sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob), status=VersionStatus.READY, created_by=engineer,
            original_filename=f"fraud-{number}.onnx",
            signature=extract_signature(onnx.load_from_string(blob)))
    base = live_server.url

    login(page, base, "engineer")
    page.goto(f"{base}/models/{M}/")
    assert page.get_attribute("[data-requires-approval]", "data-requires-approval") == "false"
    page.get_by_role("button", name="Require approval").click()
    page.wait_for_selector('[data-requires-approval="true"]')
    assert "Promotion now needs an approved version." in page.inner_text(".messages")
    assert page.get_attribute("#version-1 .approval", "data-approval") == "pending"

    row = page.locator("#version-1")
    assert row.get_by_role("button", name="Deploy as stable").count() == 0  # the gate's rule
    assert "approve to deploy" in row.inner_text()
    assert Endpoint.objects.filter(model__name=M, stable__isnull=False).count() == 0
    shot(page, "approval-01-model-deploy-blocked")

    row.get_by_role("link", name="v1", exact=True).click()
    page.wait_for_url(f"{base}/models/{M}/versions/1/")
    assert "You uploaded version 1; another engineer or admin must approve or reject it" in (
        page.inner_text("#approval"))
    assert page.locator("#approval").get_by_role("button", name="Approve").count() == 0
    shot(page, "approval-02-version-own-upload")
    logout(page)

    login(page, base, "reviewer")
    page.goto(f"{base}/models/{M}/versions/1/")
    approval = page.locator("#approval")
    approval.get_by_label("Comment").fill("Offline AUC 0.94 on the March holdout; ship it.")
    shot(page, "approval-03-version-review-form")
    approval.get_by_role("button", name="Approve").click()
    page.wait_for_url(f"{base}/models/{M}/versions/1/#approval")
    assert "Version 1 approved." in page.inner_text(".messages")
    row = page.locator("#approval-history tbody tr").first
    assert "reviewer" in row.inner_text() and "Offline AUC 0.94" in row.inner_text()
    assert page.locator("h1 .badge-approval-approved").count() == 1
    shot(page, "approval-04-version-approved")
    logout(page)

    login(page, base, "engineer")
    page.goto(f"{base}/models/{M}/")
    assert page.get_attribute("#version-1 .approval", "data-approval") == "approved"
    message = deploy_from_model_page(page, 1)
    assert "Version 1 is now stable" in message
    assert page.locator("#version-1 .badge-stable").count() == 1
    shot(page, "approval-05-model-deployed")
    assert Endpoint.objects.get(model__name=M).stable.number == 1
    assert list(AuditEvent.objects.filter(action__in=["version.approve", "endpoint.deploy"])
                .order_by("id").values_list("action", "actor_name")) == [
        ("version.approve", "reviewer"), ("endpoint.deploy", "engineer")]
