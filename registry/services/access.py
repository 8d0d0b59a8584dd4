from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib.auth import authenticate, get_user_model, user_logged_in
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.errors import (
    InvalidRequest,
    LifecycleError,
    LoginRefused,
    NotFound,
    TooManyAttempts,
)
from registry.models import ApiToken, Endpoint, EndpointApiKey
from registry.notify import bump_revision
from registry.roles import ROLES
from registry.services.catalog import lock_model
from registry.services.deployments import endpoint_for_update
from serving.core.desired_state import api_key_hash


def ensure_roles() -> None:
    for role in ROLES:
        Group.objects.get_or_create(name=role)


#: A token's last use is written at most this often (one UPDATE a minute, not one a request).
TOKEN_TOUCH_SECONDS = 60


def token_create(*, username: str, name: str, actor: Actor, expires_in_days: int | None = 90,
                 read_only: bool = False) -> tuple[ApiToken, str]:
    """A named API token for `username`; the raw token is returned once and only its digest kept.
    It acts with its user's role (never more), or only reads when `read_only`."""
    if not name or len(name) > 100:
        raise InvalidRequest("name must be 1-100 characters", field="name")
    if expires_in_days is not None and not 1 <= expires_in_days <= 3650:
        raise InvalidRequest("expires_in_days must be from 1 to 3650 (or null: never)",
                             field="expires_in_days")
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise NotFound(f"no active user {username!r}", field="user")
    expiry = timedelta(days=expires_in_days) if expires_in_days else None
    with transaction.atomic():
        token, raw = ApiToken.objects.create(user=user, expiry=expiry, name=name,
                                             read_only=read_only)
        record(actor, "token.create", target_type="token", target=token.token_key,
               after={"user": username, "name": name, "read_only": read_only,
                      "expiry": token.expiry.isoformat() if token.expiry else None})
    return token, raw


def token_revoke(*, token_key: str, actor: Actor, owner=None) -> None:
    """Revoke a token; with `owner`, only one of that user's (anyone else's reads as missing)."""
    with transaction.atomic():
        tokens = ApiToken.objects.select_for_update().filter(token_key=token_key)
        if owner is not None:
            tokens = tokens.filter(user=owner)
        token = tokens.select_related("user").first()
        if token is None:
            raise NotFound(f"no token {token_key!r}", field="token")
        before = {"user": token.user.get_username(), "name": token.name,
                  "read_only": token.read_only}
        token.delete()
        record(actor, "token.revoke", target_type="token", target=token_key, before=before)


def token_login(*, request, username: str, password: str, client: str) -> tuple[ApiToken, str]:
    """A password login that answers with an API token (`mmc login`), named `client`, with the
    configured lifetime (MMC_TOKEN_TTL_DAYS). It goes through the login form's backends, so
    django-axes counts each failure and refuses a locked-out client, even with the right
    password. `request` is the Django HttpRequest (axes reads the client address from it)."""
    user = authenticate(request, username=username, password=password)
    if user is None:
        if getattr(request, "axes_locked_out", False):
            # Answered here, as JSON: axes' middleware would replace it with its HTML page.
            request.axes_locked_out = False
            cool_off = get_cool_off(request)
            raise TooManyAttempts(
                "too many failed logins from this address: login refused "
                + (f"for {cool_off.total_seconds() / 60:g} minutes" if cool_off
                   else "until an admin resets it"),
                retry_after=int(cool_off.total_seconds()) if cool_off else None)
        raise LoginRefused("user name and password did not match an active user")
    # As a form login does: axes clears the failures (AXES_RESET_ON_SUCCESS), last_login is set.
    user_logged_in.send(sender=user.__class__, request=request, user=user)
    ttl = settings.REST_KNOX["TOKEN_TTL"]
    actor = Actor(user=user, name=user.get_username(),
                  request_id=getattr(request, "request_id", ""),
                  client_address=request.META.get("REMOTE_ADDR", "") or "")
    with transaction.atomic():
        token, raw = ApiToken.objects.create(user=user, expiry=ttl, name=client)
        record(actor, "token.login", target_type="token", target=token.token_key,
               after={"user": user.get_username(), "name": client,
                      "expiry": token.expiry.isoformat() if token.expiry else None},
               reason="password login for an API token")
    return token, raw


def api_key_create(*, model_name: str, name: str, actor: Actor) -> tuple[EndpointApiKey, str]:
    """A predict key for one endpoint; the endpoint is protected from then on (every call to
    /infer needs one of its keys) until someone opens it, even after its last key is revoked."""
    if not name or len(name) > 64:
        raise InvalidRequest("name must be 1-64 characters", field="name")
    raw = "mmck_" + secrets.token_urlsafe(32)
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name))
        key = EndpointApiKey.objects.create(endpoint=endpoint, name=name, prefix=raw[:12],
                                            key_hash=api_key_hash(raw), created_by=actor.user)
        protecting = not endpoint.protected
        endpoint.protected = True
        endpoint.revision = bump_revision()
        endpoint.save(update_fields=["protected", "revision", "updated_at"])
        record(actor, "apikey.create", target_type="apikey", target=f"{model_name}/{key.prefix}",
               model_name=model_name, after={"name": name, "prefix": key.prefix,
                                             **({"protected": True} if protecting else {})})
    return key, raw


@dataclass(frozen=True)
class KeyRevoked:
    """What a revoke left: the endpoint's active keys, and whether every call is now refused."""

    prefix: str
    remaining_keys: int
    protected: bool

    @property
    def refusing_all(self) -> bool:
        return self.protected and not self.remaining_keys

    @property
    def detail(self) -> str:
        if self.refusing_all:
            return (f"predict key {self.prefix}… revoked; it was the endpoint's last key: the "
                    f"endpoint stays protected, so every call is refused (401) until a key is "
                    f"created" + ("" if settings.REQUIRE_PREDICT_KEYS else
                                  " or the endpoint is opened"))
        return (f"predict key {self.prefix}… revoked; calls with it are refused (401), "
                f"{self.remaining_keys} key(s) still work")


def api_key_revoke(*, model_name: str, prefix: str, actor: Actor) -> KeyRevoked:
    """Revoke one key. The endpoint stays protected: revoking its last key closes it (every call
    401), it never opens it (that is endpoint_open, audited on its own)."""
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name, allow_archived=True))
        key = endpoint.api_keys.filter(prefix=prefix, revoked_at__isnull=True).first()
        if key is None:
            raise NotFound(f"no active key {prefix!r} on {model_name!r}", field="key")
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        # an endpoint with keys from before protection was a setting counts as protected
        endpoint.protected = True
        endpoint.revision = bump_revision()
        endpoint.save(update_fields=["protected", "revision", "updated_at"])
        result = KeyRevoked(prefix=prefix, protected=True,
                            remaining_keys=endpoint.api_keys.filter(
                                revoked_at__isnull=True).count())
        record(actor, "apikey.revoke", target_type="apikey", target=f"{model_name}/{prefix}",
               model_name=model_name, before={"name": key.name, "prefix": prefix},
               after={"remaining_keys": result.remaining_keys,
                      "refusing_all": result.refusing_all})
    return result


def endpoint_protect(*, model_name: str, actor: Actor, reason: str = "") -> Endpoint:
    """Require a predict key on every call to the endpoint; with no key yet, every call is
    refused (401) until one is created."""
    return _protection(model_name=model_name, protected=True, actor=actor, reason=reason)


def endpoint_open(*, model_name: str, actor: Actor, reason: str = "") -> Endpoint:
    """Let anyone who can reach /v2 call the endpoint without a key. Refused while it has active
    keys (their holders would think them needed) and where the server requires keys
    everywhere (MMC_REQUIRE_PREDICT_KEYS)."""
    return _protection(model_name=model_name, protected=False, actor=actor, reason=reason)


def _protection(*, model_name: str, protected: bool, actor: Actor, reason: str) -> Endpoint:
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name, allow_archived=protected))
        if endpoint.protected == protected:
            raise LifecycleError(f"endpoint {model_name!r} is already "
                                 f"{'protected' if protected else 'open'}", field="protected")
        if not protected:
            if settings.REQUIRE_PREDICT_KEYS:
                raise LifecycleError("this server requires a predict key on every endpoint "
                                     "(MMC_REQUIRE_PREDICT_KEYS): an endpoint cannot be opened",
                                     field="protected")
            keys = endpoint.api_keys.filter(revoked_at__isnull=True).count()
            if keys:
                raise LifecycleError(f"endpoint {model_name!r} has {keys} active predict "
                                     f"key(s): revoke them before opening it", field="protected")
        endpoint.protected = protected
        endpoint.revision = bump_revision()
        endpoint.save(update_fields=["protected", "revision", "updated_at"])
        record(actor, "endpoint.protect" if protected else "endpoint.open",
               target_type="endpoint", target=model_name, model_name=model_name,
               before={"protected": not protected}, after={"protected": protected},
               reason=reason)
    return endpoint


def token_touch(token: ApiToken) -> None:
    """Note that `token` authenticated a request, unless that was noted in the last minute.
    Not audited: it is bookkeeping, not a change anyone made."""
    now = timezone.now()
    if token.last_used_at and (now - token.last_used_at).total_seconds() < TOKEN_TOUCH_SECONDS:
        return
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now
