"""Access for a team in a real browser: an engineer makes an API token on the tokens page and
uses it from "CI" to upload and deploy; an admin creates a user, sets its role and deactivates it
(its token stops at once) and cannot demote itself; an engineer protects an endpoint with a
predict key and the try-it form fills it in."""

from __future__ import annotations

import time

import httpx
import pytest

from registry import samples, services
from registry.audit import Actor

from .test_console_flow import login, logout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def wait_ready(api: httpx.Client, model: str, number: int) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        if api.get(f"/api/v1/models/{model}/versions/{number}/").json()["status"] == "ready":
            return
        time.sleep(0.1)
    raise AssertionError(f"{model}:{number} not ready")


def test_an_engineer_makes_a_token_on_the_page_and_ci_uploads_and_deploys_with_it(
        live_server, users, page, shot):
    base = live_server.url
    login(page, base, "engineer")
    page.get_by_role("link", name="API tokens").click()
    page.wait_for_url(f"{base}/tokens/")
    page.get_by_label("Name").fill("ci-train-pipeline")
    page.get_by_label("Expires in (days)").fill("30")
    page.get_by_role("button", name="Create token").click()
    page.wait_for_selector("#new-token")
    raw = page.inner_text("#new-token").strip()
    assert page.inner_text("#new-token-env").strip() == (
        f"export MMC_URL={base} MMC_TOKEN={raw}")
    assert page.locator("#token-table >> text=ci-train-pipeline").count() == 1
    shot(page, "access-01-tokens-created")

    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {raw}"},
                      timeout=30) as api:
        assert api.post("/api/v1/models/", json={"name": "from-ci"}).status_code == 201
        r = api.put("/api/v1/models/from-ci/versions/upload/?filename=m.onnx",
                    content=samples.mlp(), headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 201, r.text
        wait_ready(api, "from-ci", 1)
        r = api.post("/api/v1/models/from-ci/endpoint/deploy/", json={"version": 1})
        assert r.status_code == 200 and r.json()["stable"] == 1

    page.goto(f"{base}/tokens/")  # the raw token is gone; the row says it was used
    assert page.locator("#new-token").count() == 0
    assert "never" not in page.inner_text("#token-table tbody tr:first-child td:nth-child(5)")

    logout(page)
    login(page, base, "viewer")
    page.goto(f"{base}/tokens/")
    page.get_by_label("Name").fill("read-things")
    page.get_by_label("Read-only").check()
    page.get_by_role("button", name="Create token").click()
    viewer_raw = page.inner_text("#new-token").strip()
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {viewer_raw}"}) as api:
        assert api.get("/api/v1/models/").status_code == 200
        r = api.post("/api/v1/models/", json={"name": "nope"})
        assert r.status_code == 403 and "read-only" in r.json()["error"]


def test_an_admin_manages_a_user_whose_token_stops_when_deactivated(live_server, users, page,
                                                                    shot):
    base = live_server.url
    login(page, base, "admin")
    page.get_by_role("link", name="Users & roles").click()
    page.wait_for_url(f"{base}/users/")
    page.get_by_label("Username").fill("sam")
    page.get_by_label("Email").fill("sam@example.com")
    page.get_by_label("Role", exact=True).select_option("viewer")
    page.get_by_role("button", name="Create user").click()
    page.wait_for_selector("#new-password")
    assert len(page.inner_text("#new-password").strip()) >= 16
    shot(page, "access-02-users-created")

    row = page.locator("#user-sam")
    row.get_by_label("Role of sam").select_option("engineer")
    row.get_by_role("button", name="Set role").click()
    page.wait_for_selector("text=sam is now engineer.")

    _, raw = services.token_create(username="sam", name="ci", actor=Actor.system("test"))
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {raw}"}) as api:
        assert api.post("/api/v1/models/", json={"name": "sams"}).status_code == 201
        page.once("dialog", lambda d: d.accept())
        page.locator("#user-sam").get_by_role("button", name="Deactivate").click()
        page.wait_for_selector("#user-sam >> text=deactivated")
        assert api.get("/api/v1/models/").status_code == 401  # at once

    page.locator("#user-admin").get_by_label("Role of admin").select_option("viewer")
    page.locator("#user-admin").get_by_role("button", name="Set role").click()
    page.wait_for_selector(".msg-error >> text=last active admin")
    shot(page, "access-03-users-last-admin")

    page.goto(f"{base}/tokens/")  # an admin sees (and may revoke) everyone's tokens
    row = page.locator("#token-table tbody tr", has_text="sam")
    assert row.count() == 1
    shot(page, "access-06-tokens-admin")


def test_a_protected_endpoint_has_its_badge_and_try_it_fills_the_new_key(live_server, users,
                                                                         page, shot,
                                                                         ready_model):
    ready_model("scorer", samples.mlp())
    services.endpoint_deploy(model_name="scorer", version_number=1, actor=Actor.system("test"))
    base = live_server.url
    login(page, base, "engineer")
    page.goto(f"{base}/models/scorer/versions/1/")
    assert page.inner_text("h1 .badge-open") == "open"
    assert page.locator("#try-key").count() == 0
    assert "no predict key is needed" in page.inner_text("#try")

    page.goto(f"{base}/models/scorer/deployment/")
    page.get_by_label("Key name").fill("checkout-service")
    page.get_by_role("button", name="Create key").click()
    # the new key, or the console's reason for refusing it (60 s: the page renders the whole
    # deployment again, once seen past 20 s with both CI lanes and chromium on two CPUs)
    page.wait_for_selector("#new-key, .msg-error", timeout=60_000)
    assert page.locator("#new-key").count() == 1, page.inner_text(".msg-error")
    raw = page.inner_text("#new-key").strip()
    assert raw.startswith("mmck_")
    assert "protected" in page.inner_text("#keys-h")
    page.locator("#keys").scroll_into_view_if_needed()
    shot(page, "access-04-deployment-keys")

    page.goto(f"{base}/models/scorer/")
    assert page.inner_text("#endpoint-h .badge") == "protected"
    shot(page, "access-07-model-protected")
    page.goto(f"{base}/models/scorer/versions/1/")
    assert page.inner_text("h1 .badge-protected") == "protected"
    assert page.input_value("#try-key") == raw  # created in this tab: filled in
    shot(page, "access-05-version-protected")
