"""The access pages: API tokens (everyone), users & roles (admins), an endpoint's predict keys
on its deployment page, and the protected / open badge wherever an endpoint shows."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from rest_framework.test import APIClient

from registry import samples, services
from registry.audit import Actor
from registry.models import ApiToken, AuditEvent, EndpointApiKey
from tests.conftest import upload, wait_validated

pytestmark = pytest.mark.django_db(transaction=True)


def raw_secret(html: str, element_id: str) -> str:
    found = re.search(rf'<pre id="{element_id}"[^>]*>([^<]+)</pre>', html)
    assert found, element_id
    return found.group(1).strip()


def test_nav_links_tokens_for_everyone_users_for_admins_django_admin_for_superusers(
        page_client, users):
    html = page_client("viewer").get("/models/").content.decode()
    assert 'href="/tokens/"' in html and 'href="/users/"' not in html
    assert 'href="/admin/"' not in html
    html = page_client("admin").get("/models/").content.decode()
    assert 'href="/tokens/"' in html and 'href="/users/"' in html
    User.objects.filter(username="admin").update(is_superuser=True)
    assert 'href="/admin/"' in page_client("admin").get("/models/").content.decode()


def test_an_engineer_creates_a_token_shown_once_and_uses_it_to_upload_and_deploy(page_client,
                                                                                 users):
    client = page_client("engineer")
    r = client.post("/tokens/", {"name": "laptop", "expires_in_days": "30"})
    assert r.status_code == 200 and r["Cache-Control"] == "no-store"
    html = r.content.decode()
    raw = raw_secret(html, "new-token")
    assert raw.startswith("mmc_")
    assert raw_secret(html, "new-token-env") == f"export MMC_URL=http://testserver MMC_TOKEN={raw}"
    assert 'data-copy="new-token"' in html and 'data-copy="new-token-env"' in html
    token = ApiToken.objects.get(name="laptop")
    assert token.user.username == "engineer" and not token.read_only
    assert raw not in client.get("/tokens/").content.decode()  # shown once
    assert token.token_key in client.get("/tokens/").content.decode()

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.post("/api/v1/models/", {"name": "cli"}, format="json").status_code == 201
    assert upload(api, "cli", samples.mlp()).status_code == 201
    assert wait_validated(api, "cli", 1)["status"] == "ready"
    assert api.post("/api/v1/models/cli/endpoint/deploy/", {"version": 1},
                    format="json").status_code == 200
    assert "never" not in client.get("/tokens/").content.decode().split(token.token_key)[1][:400]
    assert AuditEvent.objects.filter(action="token.create", actor_name="engineer").exists()


def test_a_read_only_token_from_the_page_cannot_mutate(page_client, users):
    html = page_client("admin").post("/tokens/", {"name": "grafana", "expires_in_days": "90",
                                                  "read_only": "on"}).content.decode()
    raw = raw_secret(html, "new-token")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/models/").status_code == 200
    r = api.post("/api/v1/models/", {"name": "x"}, format="json")
    assert r.status_code == 403 and "read-only scope" in r.json()["error"]
    assert "read-only" in page_client("admin").get("/tokens/").content.decode()


def test_the_tokens_page_refuses_bad_input_and_keeps_the_throttle(page_client, users, settings):
    client = page_client("viewer")
    r = client.post("/tokens/", {"name": "", "expires_in_days": "0"})
    assert r.status_code == 400 and not ApiToken.objects.exists()
    settings.TOKEN_CREATE_RATE = "1/hour"
    assert client.post("/tokens/", {"name": "a", "expires_in_days": "1"}).status_code == 200
    r = client.post("/tokens/", {"name": "b", "expires_in_days": "1"})
    assert r.status_code == 429 and "Too many tokens" in r.content.decode()
    assert ApiToken.objects.count() == 1


def test_users_see_and_revoke_their_own_tokens_admins_everyones(page_client, users):
    system = Actor.system("t")
    mine, _ = services.token_create(username="viewer", name="mine", actor=system)
    theirs, _ = services.token_create(username="engineer", name="theirs", actor=system)
    viewer = page_client("viewer")
    html = viewer.get("/tokens/").content.decode()
    assert mine.token_key in html and theirs.token_key not in html
    r = viewer.post(f"/tokens/{theirs.token_key}/revoke/", follow=True)
    assert "no token" in r.content.decode()
    assert ApiToken.objects.filter(pk=theirs.pk).exists()
    admin = page_client("admin")
    html = admin.get("/tokens/").content.decode()
    assert mine.token_key in html and theirs.token_key in html
    r = admin.post(f"/tokens/{theirs.token_key}/revoke/", follow=True)
    assert "revoked" in r.content.decode() and not ApiToken.objects.filter(pk=theirs.pk).exists()
    assert AuditEvent.objects.get(action="token.revoke").actor_name == "admin"


def test_an_admin_creates_a_user_sets_a_role_and_deactivation_stops_its_token(page_client,
                                                                             users):
    admin = page_client("admin")
    assert page_client("engineer").get("/users/").status_code == 403
    r = admin.post("/users/", {"username": "sam", "email": "sam@example.com", "role": "viewer",
                               "password": ""})
    assert r.status_code == 200
    password = raw_secret(r.content.decode(), "new-password")
    assert APIClient().login(username="sam", password=password)
    r = admin.post("/users/sam/role/", {"role": "engineer"}, follow=True)
    assert "sam is now engineer" in r.content.decode()
    _, raw = services.token_create(username="sam", name="ci", actor=Actor.system("t"))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.post("/api/v1/models/", {"name": "sams"}, format="json").status_code == 201
    r = admin.post("/users/sam/deactivate/", follow=True)
    assert "deactivated" in r.content.decode()
    assert api.get("/api/v1/models/").status_code == 401
    r = admin.post("/users/sam/password/")
    new_password = raw_secret(r.content.decode(), "new-password")
    assert new_password != password and r["Cache-Control"] == "no-store"
    admin.post("/users/sam/reactivate/")
    assert api.get("/api/v1/models/").status_code == 200
    assert APIClient().login(username="sam", password=new_password)
    assert [e.action for e in AuditEvent.objects.filter(target="sam").order_by("id")] == [
        "user.create", "user.role", "user.deactivate", "user.password_reset", "user.activate"]


def test_the_last_admin_cannot_demote_or_deactivate_itself(page_client, users):
    admin = page_client("admin")
    r = admin.post("/users/admin/role/", {"role": "viewer"}, follow=True)
    assert "last active admin" in r.content.decode()
    r = admin.post("/users/admin/deactivate/", follow=True)
    assert "last active admin" in r.content.decode()
    assert User.objects.get(username="admin").groups.filter(name="admin").exists()
    assert User.objects.get(username="admin").is_active


def test_a_duplicate_user_or_weak_password_is_said_on_the_page(page_client, users):
    admin = page_client("admin")
    r = admin.post("/users/", {"username": "viewer", "role": "viewer"})
    assert r.status_code == 400 and "already exists" in r.content.decode()
    r = admin.post("/users/", {"username": "new", "role": "viewer", "password": "short"})
    assert r.status_code == 400 and "too short" in r.content.decode()


# -- predict keys -------------------------------------------------------------------------------


@pytest.fixture
def deployed(catalog):
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=Actor.system("test"))
    return "fraud"


def test_an_engineer_creates_a_predict_key_shown_once_and_revokes_it(page_client, deployed):
    client = page_client("engineer")
    html = client.get("/models/fraud/deployment/").content.decode()
    assert 'class="badge badge-open"' in html and "<strong>Open</strong>" in html
    r = client.post("/models/fraud/deployment/keys/", {"name": "checkout"})
    assert r.status_code == 200 and r["Cache-Control"] == "no-store"
    html = r.content.decode()
    raw = raw_secret(html, "new-key")
    assert raw.startswith("mmck_") and 'data-remember-key="fraud"' in html
    key = EndpointApiKey.objects.get(name="checkout")
    assert 'class="badge badge-protected"' in html and f"{key.prefix}…" in html
    assert raw not in client.get("/models/fraud/deployment/").content.decode()
    client.post(f"/models/fraud/deployment/keys/{key.prefix}/revoke/")
    assert EndpointApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert [e.action for e in AuditEvent.objects.filter(target_type="apikey")
            .order_by("id")] == ["apikey.create", "apikey.revoke"]


def test_a_viewer_sees_keys_but_no_key_controls(page_client, deployed):
    services.api_key_create(model_name="fraud", name="app", actor=Actor.system("t"))
    html = page_client("viewer").get("/models/fraud/deployment/").content.decode()
    assert "app" in html and "Create key" not in html and "Revoke" not in html
    assert page_client("viewer").post("/models/fraud/deployment/keys/",
                                      {"name": "x"}).status_code == 403


def test_a_protected_endpoint_shows_its_badge_and_asks_for_the_key_in_try_it(page_client,
                                                                             deployed):
    client = page_client("viewer")
    version = client.get("/models/fraud/versions/1/").content.decode()
    assert 'badge-open' in version and "no predict key is needed" in version
    assert 'id="try-key"' not in version
    services.api_key_create(model_name="fraud", name="app", actor=Actor.system("t"))
    for url in ("/models/fraud/", "/models/fraud/deployment/", "/models/fraud/versions/1/"):
        assert 'class="badge badge-protected"' in client.get(url).content.decode(), url
    version = client.get("/models/fraud/versions/1/").content.decode()
    assert 'id="try-key"' in version and 'data-model="fraud"' in version
    assert "Paste one of its keys" in version


@override_settings(REQUIRE_PREDICT_KEYS=True)
def test_with_keys_required_a_keyless_endpoint_says_it_refuses_everything(page_client,
                                                                          deployed):
    client = page_client("engineer")
    html = client.get("/models/fraud/deployment/").content.decode()
    assert "Keys required everywhere" in html and 'id="keys-none"' in html
    assert "protected, no keys" in html
    assert "every request is refused" in client.get("/models/fraud/").content.decode()
    assert "create one" in client.get("/models/fraud/versions/1/").content.decode()
