"""Single sign-on in a real browser: the console's login page offers the provider's button; the
user signs in on the provider's own page, consents, and lands in the console with the role its
groups map to. The provider is a real one (tests/oidc_provider) in its own process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path("/tmp/shots-sso")


def test_sso_button_signs_in_on_the_provider_and_lands_with_the_mapped_role(
        sso, live_server, page, shot, settings):
    base = live_server.url
    csp_reports = []
    page.on("console", lambda m: csp_reports.append(m.text)
            if "Content Security Policy" in m.text else None)
    login = page.goto(f"{base}/login/")
    policy = login.headers["content-security-policy"]
    # django-csp joins the directives in set order (it varies per process): compare them as such
    directives = {d.strip() for d in policy.split(";")}
    assert "form-action 'self'" in directives and "script-src 'self'" in directives, policy
    assert sso.url not in policy  # the login page only links to the provider
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "login-with-sso.png"), full_page=True)
    shot(page, "sso-01-login")

    page.get_by_role("link", name="Sign in with Test IdP").click()
    page.wait_for_url(re.compile(re.escape(sso.url) + r"/accounts/login/"))
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("alice-idp-pw-1")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#authorizationForm")  # the provider asks for consent
    shot(page, "sso-02-provider-consent")
    page.get_by_role("button", name="Authorize").click()

    page.wait_for_url(f"{base}/models/")
    assert "alice" in page.inner_text("header .who")
    assert "role: engineer" in page.inner_text("header")
    assert page.get_by_role("link", name="Jobs").is_visible()  # engineers see Jobs
    shot(page, "sso-03-signed-in")
    me = page.request.get(f"{base}/api/v1/me/")  # the browser's session, not a token
    assert me.json() == {"username": "alice", "role": "engineer", "token": None,  # a session
                         "teams": [{"team": "default", "role": "approver"}]}
    assert csp_reports == []

    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(re.compile(r".*/login/"))
    assert page.get_by_role("link", name="Sign in with Test IdP").is_visible()

    # a provider user the console does not know, with user creation off: refused, and told why
    settings.OIDC_CREATE_USER = False
    page.context.clear_cookies()  # signed out of the provider too
    page.goto(f"{base}/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    page.get_by_label("Username").fill("dave")
    page.get_by_label("Password").fill("dave-idp-pw-1")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("button", name="Authorize").click()
    page.wait_for_url(f"{base}/login/")
    assert "has no user 'dave' and does not create users" in page.inner_text(".messages")
    page.screenshot(path=str(SHOTS / "login-sso-refused.png"), full_page=True)
