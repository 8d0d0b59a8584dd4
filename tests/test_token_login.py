"""A person gets an API token with their password (POST /api/v1/tokens/login/, what `mmc login`
calls): named for the client, with the configured lifetime, audited as them, and guarded like the
login form (django-axes counts failures and locks the user name from that address; a rate per
address bounds minting). POST /api/v1/tokens/logout/ revokes the calling token, for any role."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from registry.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)
LOGIN = "/api/v1/tokens/login/"


def log_in(username: str, password: str, client: str = "mmc-cli@laptop", **extra):
    return APIClient(**extra).post(LOGIN, {"username": username, "password": password,
                                           "client": client}, format="json")


def test_a_password_login_answers_a_named_token_with_the_configured_lifetime(users, settings):
    settings.REST_KNOX = {**settings.REST_KNOX, "TOKEN_TTL": timedelta(days=7)}
    r = log_in("viewer", "viewer-password-1")
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["name"], body["user"]) == ("mmc-cli@laptop", "viewer")
    token = ApiToken.objects.get(token_key=body["token_key"])
    assert abs(token.expiry - (timezone.now() + timedelta(days=7))) < timedelta(minutes=1)
    event = AuditEvent.objects.get(action="token.login")
    assert (event.actor_name, event.target, event.after["name"]) == (
        "viewer", body["token_key"], "mmc-cli@laptop")

    me = APIClient()
    me.credentials(HTTP_AUTHORIZATION=f"Bearer {body['token']}")
    answer = me.get("/api/v1/me/").json()
    assert (answer["username"], answer["role"], answer["token"]["name"]) == (
        "viewer", "viewer", "mmc-cli@laptop")

    # a viewer may end its own token; after that the token is refused
    assert me.post("/api/v1/tokens/logout/").status_code == 204
    assert not ApiToken.objects.filter(token_key=body["token_key"]).exists()
    assert AuditEvent.objects.filter(action="token.revoke", target=body["token_key"]).exists()
    assert me.get("/api/v1/me/").status_code == 401


def test_a_wrong_password_is_refused_and_counts_towards_the_lockout(users, settings):
    limit = settings.AXES_FAILURE_LIMIT
    for _ in range(limit - 1):
        r = log_in("admin", "guess")
        assert r.status_code == 401 and "did not match" in r.json()["error"]
    r = log_in("admin", "guess")
    assert r.status_code == 429 and r["Content-Type"] == "application/json"
    assert "too many failed logins" in r.json()["error"] and int(r["Retry-After"]) > 0
    # locked: the right password is refused too, through the API and on the login form
    assert log_in("admin", "admin-password-1").status_code == 429
    assert APIClient().post("/login/", {"username": "admin", "password": "admin-password-1"}
                            ).status_code == 429
    assert AuditEvent.objects.filter(action="auth.lockout", target="admin").count() == 1
    assert not ApiToken.objects.filter(user__username="admin").exists()
    # from another address the real admin still gets a token
    assert log_in("admin", "admin-password-1", REMOTE_ADDR="10.1.2.3").status_code == 201


def test_a_success_clears_the_failures_as_a_form_login_does(users, settings):
    limit = settings.AXES_FAILURE_LIMIT
    for _ in range(limit - 1):
        assert log_in("engineer", "guess").status_code == 401
    assert log_in("engineer", "engineer-password-1").status_code == 201
    for _ in range(limit - 1):
        assert log_in("engineer", "guess").status_code == 401
    assert log_in("engineer", "engineer-password-1").status_code == 201


def test_logins_per_address_are_rate_limited(users, settings):
    settings.TOKEN_LOGIN_RATE = "2/hour"
    assert log_in("engineer", "engineer-password-1").status_code == 201
    assert log_in("viewer", "viewer-password-1").status_code == 201
    r = log_in("engineer", "engineer-password-1")
    assert r.status_code == 429 and int(r["Retry-After"]) > 0
    assert log_in("engineer", "engineer-password-1", REMOTE_ADDR="10.9.9.9").status_code == 201


def test_a_client_name_is_a_plain_label(users):
    r = log_in("engineer", "engineer-password-1", client="mmc-cli@<script>")
    assert r.status_code == 400 and r.json()["field"] == "client"


def test_logout_needs_a_token_not_a_session(users):
    browser = APIClient()
    browser.force_login(users["engineer"])
    r = browser.post("/api/v1/tokens/logout/")
    assert r.status_code in (400, 403)  # a session is not a token (CSRF refuses it first)
    assert APIClient().post("/api/v1/tokens/logout/").status_code == 401
