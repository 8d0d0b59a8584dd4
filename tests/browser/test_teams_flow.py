"""Teams in a real browser: an admin creates a team on the Teams page and makes a user its
engineer; that user (no global role) sees only the team's models, registers one in it, and the
applies page shows them only their team's changes; another team's model page is a 404."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from registry.audit import Actor
from registry.services import model_create
from registry.services.as_code import config_apply

from .test_console_flow import login, logout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_makes_a_team_and_its_engineer_sees_only_its_models(live_server, users, page,
                                                                     shot):
    base = live_server.url
    User.objects.create_user(username="fiona", password="fiona-password-1")
    model_create(name="ads-ranker", actor=Actor.system("test"))  # the team "default"
    login(page, base, "admin")
    page.get_by_role("link", name="Teams").click()
    page.wait_for_url(f"{base}/teams/")
    page.get_by_label("Team name").fill("fraud")
    page.get_by_label("Description").fill("payments fraud models")
    page.get_by_role("button", name="Create team").click()
    page.wait_for_url(f"{base}/teams/fraud/")
    page.select_option("#add-username", "fiona")
    page.select_option("#add-role", "engineer")
    page.get_by_role("button", name="Add member").click()
    page.wait_for_selector("#member-fiona")
    assert page.locator("#member-fiona select").input_value() == "engineer"
    shot(page, "teams-01-team-with-a-member")
    page.goto(f"{base}/teams/")
    assert page.locator("#team-fraud").count() == 1 and page.locator("#team-default").count() == 1
    shot(page, "teams-02-every-team-for-an-admin")
    logout(page)

    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill("fiona")
    page.get_by_label("Password").fill("fiona-password-1")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/models/")
    assert "engineer in fraud" in page.inner_text(".who")
    assert "ads-ranker" not in page.inner_text("#model-table")
    page.get_by_role("link", name="New model").click()
    page.get_by_label("Name").fill("fraud-clf")
    page.get_by_role("button", name="Create model").click()
    page.wait_for_url(f"{base}/models/fraud-clf/")
    assert page.inner_text("#model-team") == "fraud"
    config_apply(text="models:\n  fraud-clf:\n    description: scored nightly\n"
                      "  ads-ranker:\n    description: ranks ads\n",
                 actor=Actor.system("ci"), source="git:4f2a9c1")
    page.goto(f"{base}/applies/")
    text = page.inner_text("main")
    assert "fraud-clf" in text and "ads-ranker" not in text
    shot(page, "teams-03-applies-show-only-my-team")
    response = page.goto(f"{base}/models/ads-ranker/")
    assert response.status == 404
    page.goto(f"{base}/teams/fraud/")
    assert page.locator("#add-member").count() == 0  # an engineer does not manage members
    shot(page, "teams-04-team-page-as-engineer")
