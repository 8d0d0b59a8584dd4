from __future__ import annotations

import secrets
from datetime import timedelta

from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib.auth import authenticate, get_user_model, user_logged_in
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.errors import InvalidRequest, LoginRefused, NotFound, TooManyAttempts
from registry.models import ApiToken, EndpointApiKey
from registry.notify import bump_revision
from registry.roles import ROLES
from registry.services.catalog import lock_model
from registry.services.deployments import endpoint_for_update
from serving.routes import api_key_hash


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
    """A predict key for one endpoint: once any active key exists, /infer requires one."""
    if not name or len(name) > 64:
        raise InvalidRequest("name must be 1-64 characters", field="name")
    raw = "mmck_" + secrets.token_urlsafe(32)
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name))
        key = EndpointApiKey.objects.create(endpoint=endpoint, name=name, prefix=raw[:12],
                                            key_hash=api_key_hash(raw), created_by=actor.user)
        endpoint.revision = bump_revision()
        endpoint.save(update_fields=["revision", "updated_at"])
        record(actor, "apikey.create", target_type="apikey", target=f"{model_name}/{key.prefix}",
               model_name=model_name, after={"name": name, "prefix": key.prefix})
    return key, raw


def api_key_revoke(*, model_name: str, prefix: str, actor: Actor) -> None:
    with transaction.atomic():
        endpoint = endpoint_for_update(lock_model(model_name, allow_archived=True))
        key = endpoint.api_keys.filter(prefix=prefix, revoked_at__isnull=True).first()
        if key is None:
            raise NotFound(f"no active key {prefix!r} on {model_name!r}", field="key")
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        endpoint.revision = bump_revision()
        endpoint.save(update_fields=["revision", "updated_at"])
        record(actor, "apikey.revoke", target_type="apikey", target=f"{model_name}/{prefix}",
               model_name=model_name, before={"name": key.name, "prefix": prefix})


def token_touch(token: ApiToken) -> None:
    """Note that `token` authenticated a request, unless that was noted in the last minute.
    Not audited: it is bookkeeping, not a change anyone made."""
    now = timezone.now()
    if token.last_used_at and (now - token.last_used_at).total_seconds() < TOKEN_TOUCH_SECONDS:
        return
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now
