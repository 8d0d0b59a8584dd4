"""Logins are throttled (django-axes): wrong passwords in a row lock the username from that
address, even against the right password, until the cool-off passes or an admin lifts it; the
lockout is audited once and shown to admins. Token creation has a rate limit of its own."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from registry.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(client: Client, username: str, password: str, path: str = "/login/", **extra):
    return client.post(path, {"username": username, "password": password}, **extra)


def logged_in(client: Client) -> bool:
    return client.get("/models/").status_code == 200


def test_repeated_wrong_passwords_lock_the_login_and_are_audited(users, settings):
    from axes.models import AccessAttempt
    from django.contrib.auth.models import User

    limit = settings.AXES_FAILURE_LIMIT
    attacker = Client()
    for _ in range(limit - 1):
        r = log_in(attacker, "admin", "guess")
        assert r.status_code == 200 and "did not match" in r.content.decode()
    r = log_in(attacker, "admin", "guess")
    assert r.status_code == 429 and "Too many failed logins" in r.content.decode()
    # locked: the right password is refused too, and so are more guesses
    assert log_in(attacker, "admin", "admin-password-1").status_code == 429
    assert not logged_in(attacker)
    for _ in range(3):
        assert log_in(attacker, "admin", "guess").status_code == 429
    # the Django admin's login goes through the same lock
    assert log_in(attacker, "admin", "admin-password-1", "/admin/login/").status_code == 429

    events = AuditEvent.objects.filter(action="auth.lockout")
    assert events.count() == 1  # the lockout, not every refused attempt after it
    event = events.get()
    assert (event.target, event.client_address, event.actor_name) == (
        "admin", "127.0.0.1", "anonymous")
    assert f"{limit} failed logins in a row from 127.0.0.1" in event.reason

    # admins see it: on the console's audit page, and in the Django admin where they lift it
    watcher = Client()
    watcher.force_login(users["admin"])
    html = watcher.get("/audit/").content.decode()
    assert 'id="lockouts"' in html and "admin from 127.0.0.1" in html
    root = Client()
    root.force_login(User.objects.create_superuser("root", password="root-password-1"))
    listing = root.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200 and "127.0.0.1" in listing.content.decode()

    # the lock is on this username from this address: the real admin elsewhere still gets in
    elsewhere = Client(REMOTE_ADDR="10.1.2.3")
    assert log_in(elsewhere, "admin", "admin-password-1").status_code == 302

    # once the cool-off has passed, the right password works again from the attacker's address
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert log_in(attacker, "admin", "admin-password-1").status_code == 302
    assert logged_in(attacker)
    assert 'id="lockouts"' not in watcher.get("/audit/").content.decode()


def test_token_creation_is_throttled_too(admin, users, settings):
    settings.TOKEN_CREATE_RATE = "3/hour"
    made = ApiToken.objects.count()
    for i in range(3):
        r = admin.post("/api/v1/tokens/", {"user": "engineer", "name": f"ci-{i}"}, format="json")
        assert r.status_code == 201, r.content
    r = admin.post("/api/v1/tokens/", {"user": "engineer", "name": "ci-3"}, format="json")
    assert r.status_code == 429
    assert "throttled" in r.json()["error"].lower() and int(r["Retry-After"]) > 0
    assert ApiToken.objects.count() == made + 3
    assert admin.get("/api/v1/tokens/").status_code == 200  # reading is not throttled
