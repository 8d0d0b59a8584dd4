"""Single sign-on against a real OpenID provider (django-oauth-toolkit, its own process; see
tests/oidc_provider): discovery, the authorization-code flow with PKCE, roles from the provider's
groups at every sign-in, and refusals that say why. Flows are driven with httpx."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.exceptions import SuspiciousOperation
from django.test import Client

from registry.models import AuditEvent
from tests.conftest import SSO_CLIENT, SSO_HS256_CLIENT
from tests.oidc_provider.flow import sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def me(client) -> dict:
    r = client.get(f"{client.console}/api/v1/me/")
    assert r.status_code == 200, r.text
    return r.json()


def signed_in(live_server, username: str, password: str, **kwargs):
    client, r = sign_in(live_server.url, username, password, **kwargs)
    client.console = live_server.url
    return client, r


def discovery_fetches(op) -> int:
    return op.log_tail().count("GET /o/.well-known/openid-configuration")


def test_without_an_issuer_there_is_no_sso_button_and_no_sso_url(db):
    client = Client()
    html = client.get("/login/").content.decode()
    assert "sso-button" not in html and "Log in" in html
    assert client.get("/login/sso/").status_code == 404
    assert client.get("/login/sso/callback/?code=x&state=y").status_code == 404


def test_discovery_gives_the_endpoints_and_is_fetched_once(sso, settings):
    from console.sso import provider

    provider.forget()
    before = discovery_fetches(sso)
    document = provider.metadata()
    assert document["issuer"] == sso.issuer
    for key in ("authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint"):
        assert document[key].startswith(f"{sso.issuer}/"), key
    assert provider.metadata() is document
    time.sleep(0.3)  # the provider's request log is written after it answers
    assert discovery_fetches(sso) == before + 1

    # a document that names another issuer than the one configured is not used
    settings.OIDC_ISSUER = sso.issuer.replace("127.0.0.1", "localhost")
    with pytest.raises(provider.ProviderUnavailable, match="names issuer"):
        provider.metadata()
    # and the console says so on its login page instead of failing
    r = Client().get("/login/sso/", follow=True)
    assert "Single sign-on is unavailable" in r.content.decode()


def test_sign_in_gives_the_mapped_role_and_follows_the_groups_at_each_sign_in(sso, live_server):
    client, r = signed_in(live_server, "alice", "alice-idp-pw-1")
    # the flow used the authorization code with PKCE (S256), state and nonce
    authorize = next(h for h in r.history if h.url.path == "/o/authorize/")
    query = parse_qs(urlsplit(str(authorize.url)).query)
    assert query["response_type"] == ["code"] and query["code_challenge_method"] == ["S256"]
    assert query["state"][0] and query["nonce"][0] and query["code_challenge"][0]
    assert r.url.path == "/models/" and "role: <strong>engineer</strong>" in r.text
    assert me(client) == {"username": "alice", "role": "engineer", "token": None,
                          "teams": [{"team": "default", "role": "approver"}]}
    event = AuditEvent.objects.get(action="user.sso_login")
    assert (event.actor_name, event.target) == ("alice", "alice")
    assert event.after == {"groups": ["ml-eng"], "role": "engineer", "created": True}

    sso.set_groups("alice", "ml-read", "ml-admins", "unrelated")  # the highest mapped role wins
    client, _ = signed_in(live_server, "alice", "alice-idp-pw-1")
    assert me(client)["role"] == "admin"

    sso.set_groups("alice", "ml-read")  # taken out of ml-admins: admin is gone at next sign-in
    client, _ = signed_in(live_server, "alice", "alice-idp-pw-1")
    assert me(client)["role"] == "viewer"
    event = AuditEvent.objects.filter(action="user.sso_login").latest("id")
    assert event.before == {"role": "admin"}
    assert event.after == {"groups": ["ml-read"], "role": "viewer", "created": False}

    sso.set_groups("alice", "unrelated")  # no mapped group: signed in, without a role
    client, r = signed_in(live_server, "alice", "alice-idp-pw-1")
    assert r.status_code == 403 and "role: <strong>no role</strong>" in r.text  # signed in
    assert "none of your identity provider groups maps to a role" in r.text
    assert client.get(f"{live_server.url}/api/v1/me/").status_code == 403  # not 401
    assert "no group maps to a role" in AuditEvent.objects.filter(
        action="user.sso_login").latest("id").reason


def test_with_create_users_off_an_unknown_user_is_refused_with_a_clear_message(
        sso, live_server, settings, users):
    from axes.models import AccessAttempt
    from django.contrib.auth.models import User

    settings.OIDC_CREATE_USER = False
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):  # refusals are no failed password logins
        client, r = signed_in(live_server, "dave", "dave-idp-pw-1")
        assert r.url.path == "/login/"
        assert ("this console has no user &#x27;dave&#x27; and does not create users at "
                "sign-in") in r.text
        assert client.get(f"{live_server.url}/api/v1/me/").status_code == 401
    assert not User.objects.filter(username="dave").exists()
    refused = AuditEvent.objects.filter(action="user.sso_refused").latest("id")
    assert refused.target == "dave" and "does not create users" in refused.reason
    assert not AccessAttempt.objects.exists()
    password = Client()
    assert password.post("/login/", {"username": "viewer",
                                     "password": "viewer-password-1"}).status_code == 302

    User.objects.create_user("dave")  # an admin adds dave: the next sign-in gets in
    client, r = signed_in(live_server, "dave", "dave-idp-pw-1")
    assert r.url.path == "/models/"
    assert me(client) == {"username": "dave", "role": "viewer", "token": None,
                          "teams": [{"team": "default", "role": "viewer"}]}


def test_a_real_token_signed_hs256_or_a_wrong_client_secret_is_refused(
        sso, live_server, settings):
    # the provider signs this client's ID tokens with HS256 (its secret): we take RS256 only
    settings.OIDC_RP_CLIENT_ID = SSO_HS256_CLIENT["client_id"]
    settings.OIDC_RP_CLIENT_SECRET = SSO_HS256_CLIENT["secret"]
    client, r = signed_in(live_server, "alice", "alice-idp-pw-1")
    assert r.url.path == "/login/"
    assert "answer could not be verified" in r.text
    assert client.get(f"{live_server.url}/api/v1/me/").status_code == 401

    settings.OIDC_RP_CLIENT_ID = SSO_CLIENT["client_id"]
    settings.OIDC_RP_CLIENT_SECRET = "not-the-secret"
    client, r = signed_in(live_server, "alice", "alice-idp-pw-1")
    assert "refused the console&#x27;s token request (HTTP 401)" in r.text
    assert client.get(f"{live_server.url}/api/v1/me/").status_code == 401
    assert not AuditEvent.objects.filter(action="user.sso_login").exists()


def test_a_user_who_declines_consent_or_a_callback_without_its_state_gets_a_message(
        sso, live_server):
    client, r = signed_in(live_server, "alice", "alice-idp-pw-1", consent=False)
    assert r.url.path == "/login/" and "did not sign you in: access_denied" in r.text
    r = Client().get("/login/sso/callback/?code=abc&state=forged", follow=True)
    assert "Single sign-on did not complete" in r.content.decode()


def sign(claims: dict, key, kid: str, algorithm: str = "RS256") -> str:
    return jwt.encode(claims, key, algorithm=algorithm, headers={"kid": kid})


def test_id_tokens_that_are_forged_unsigned_or_for_someone_else_are_refused(sso):
    """Tokens signed here with the provider's own key (so only the claim at fault differs), with
    another key, with no signature, or with HMAC: the backend accepts the first only."""
    import httpx

    from console.sso import provider
    from console.sso.backend import SsoBackend

    document = provider.metadata()
    kid = httpx.get(document["jwks_uri"]).json()["keys"][0]["kid"]
    now = int(time.time())
    good = {"iss": sso.issuer, "aud": SSO_CLIENT["client_id"], "sub": "1", "iat": now,
            "exp": now + 300, "nonce": "n-1"}
    backend = SsoBackend()

    assert backend.verify_token(sign(good, sso.key_pem, kid), nonce="n-1")["sub"] == "1"
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused = {
        "for another client": sign({**good, "aud": "someone-else"}, sso.key_pem, kid),
        "from another issuer": sign({**good, "iss": "https://evil.example"}, sso.key_pem, kid),
        "expired": sign({**good, "iat": now - 900, "exp": now - 600}, sso.key_pem, kid),
        "with no expiry": sign({k: v for k, v in good.items() if k != "exp"}, sso.key_pem, kid),
        "for several audiences, not by us": sign(
            {**good, "aud": [SSO_CLIENT["client_id"], "x"], "azp": "x"}, sso.key_pem, kid),
        "signed with another key": sign(good, other_key, kid),
        "unsigned": jwt.encode(good, None, algorithm="none", headers={"kid": kid}),
        "HMAC keyed with the client secret": sign(good, SSO_CLIENT["secret"], kid, "HS256"),
        "with another nonce": sign({**good, "nonce": "n-2"}, sso.key_pem, kid),
    }
    for what, token in refused.items():
        with pytest.raises(SuspiciousOperation):
            backend.verify_token(token, nonce="n-1")
            pytest.fail(f"a token {what} was accepted")
