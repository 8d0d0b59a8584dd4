"""The authentication backend of the SSO callback: mozilla-django-oidc exchanges the code (with
the PKCE verifier) and checks the nonce; here the ID token is also held to RS256, the provider's
JWKS, our issuer and our client as audience, then the user and role come from
registry.services.sso_sign_in."""

from __future__ import annotations

import logging

import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.urls import NoReverseMatch, reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from console.sso import provider
from registry.errors import SignInRefused
from registry.services import sso_sign_in

log = logging.getLogger(__name__)
#: ID tokens minted by a provider whose clock is a little ahead are still accepted.
CLOCK_SKEW_SECONDS = 60


class SsoBackend(OIDCAuthenticationBackend):
    OIDC_RP_SIGN_ALGO = provider.SIGNING_ALGORITHM
    OIDC_RP_IDP_SIGN_KEY = None

    def __init__(self, *args, **kwargs):
        """Cheap on purpose: Django builds the backend for every request of a signed-in user.
        Endpoints are looked up (discovery) only when a sign-in needs them."""
        self.UserModel = get_user_model()

    OIDC_RP_CLIENT_ID = property(lambda self: settings.OIDC_RP_CLIENT_ID)
    OIDC_RP_CLIENT_SECRET = property(lambda self: settings.OIDC_RP_CLIENT_SECRET)
    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: provider.metadata()["token_endpoint"])
    OIDC_OP_USER_ENDPOINT = property(lambda self: provider.metadata().get("userinfo_endpoint"))
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: provider.metadata()["jwks_uri"])

    def authenticate(self, request, **kwargs):
        """Only the SSO callback signs in here (it passes the nonce and PKCE verifier); a password
        form that happens to carry ?code=&state= does not."""
        if request is None or not is_sso_callback(request) or "nonce" not in kwargs:
            return None
        return super().authenticate(request, **kwargs)

    def retrieve_matching_jwk(self, token):
        return provider.signing_key(token)

    def verify_token(self, token, **kwargs):
        try:
            return super().verify_token(token, **kwargs)
        except jwt.PyJWTError as exc:  # the library lets some through unwrapped
            raise SuspiciousOperation(f"ID token refused: {exc}") from exc

    def _verify_jws(self, payload, key):
        """Signature (RS256 only: no `none`, no HMAC keyed with a public key), issuer, audience,
        expiry and issue time; mozilla-django-oidc alone checks the signature only."""
        try:
            claims = jwt.decode(
                payload, key, algorithms=[provider.SIGNING_ALGORITHM],
                audience=settings.OIDC_RP_CLIENT_ID, issuer=provider.metadata()["issuer"],
                leeway=CLOCK_SKEW_SECONDS,
                options={"require": ["iss", "aud", "sub", "exp", "iat"]})
        except jwt.PyJWTError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from exc
        audience = claims["aud"]
        if isinstance(audience, list) and len(audience) > 1 and (
                claims.get("azp") != settings.OIDC_RP_CLIENT_ID):
            raise SuspiciousOperation("ID token refused: several audiences and we are not its azp")
        return claims

    def get_userinfo(self, access_token, id_token, payload):
        """The ID token's claims, completed from the userinfo endpoint where the provider has one
        (some put groups or e-mail only there)."""
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            info = super().get_userinfo(access_token, id_token, payload)
            if info.get("sub") == payload["sub"]:  # OpenID Connect Core 5.3.2
                claims = {**info, **payload}
        return claims

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        request = self.request
        username = str(claims.get(settings.OIDC_USERNAME_CLAIM) or "").strip()
        groups = claims.get(settings.OIDC_GROUPS_CLAIM) or []
        groups = [groups] if isinstance(groups, str) else [str(g) for g in groups]
        try:
            if not username:
                raise SignInRefused(
                    f"The identity provider did not say who you are: its answer has no "
                    f"{settings.OIDC_USERNAME_CLAIM!r} claim (MMC_OIDC_USERNAME_CLAIM).")
            return sso_sign_in(
                username=username[:150], email=str(claims.get("email") or ""), groups=groups,
                role_map=settings.OIDC_ROLE_MAP, team_map=settings.OIDC_TEAM_MAP,
                create_users=settings.OIDC_CREATE_USER,
                request_id=getattr(request, "request_id", ""),
                client_address=request.META.get("REMOTE_ADDR", ""))
        except SignInRefused as exc:
            request.sso_refusal = exc.message
            return None


def is_sso_callback(request, credentials: dict | None = None) -> bool:
    """axes' AXES_WHITELIST_CALLABLE: the SSO callback is no password login, so axes neither
    refuses it for a lockout (it would be one without a username) nor counts its failures;
    the provider throttles its own password form."""
    if not settings.SSO_ENABLED:
        return False
    try:
        return request.path == reverse("console:sso-callback")
    except NoReverseMatch:
        return False
