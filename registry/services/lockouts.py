"""Login lockouts: django-axes counts failed logins and refuses a locked-out client; this module
writes the audit event when a lockout begins and lists the lockouts in force for admins."""

from __future__ import annotations

from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_cool_off, get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.db import transaction
from django.db.models import Max, Sum
from django.utils import timezone

from registry.audit import Actor, record


class LoginThrottleBackend(AxesStandaloneBackend):
    """axes' backend, except that `authenticate()` without a request (the test client's login, a
    shell) is passed through instead of being an error: every login form sends its request."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def audit_lockout(sender, request, username: str | None, ip_address: str, **kwargs) -> None:
    """axes' `user_locked_out` listener. axes signals every refused attempt of a locked client;
    the audit log gets the one that locked it (failures == limit), not the flood after it."""
    credentials = getattr(request, "axes_credentials", None)
    limit = get_failure_limit(request, credentials)
    failures = getattr(request, "axes_failures_since_start", limit)
    if failures != limit:
        return
    cool_off = get_cool_off(request)
    how_long = (f"for {cool_off.total_seconds() / 60:g} minutes" if cool_off
                else "until an admin resets it")
    with transaction.atomic():
        record(Actor.from_request(request), "auth.lockout", target_type="user",
               target=username or "", after={
                   "failures": failures, "ip_address": ip_address,
                   "path": getattr(request, "path", ""),
                   "cool_off_seconds": cool_off.total_seconds() if cool_off else None},
               reason=f"{failures} failed logins in a row from {ip_address}; login refused "
                      f"{how_long}")


def active_lockouts() -> list[dict]:
    """The clients locked out now (per axes' lockout parameters), newest first: who, from where,
    how many failures, until when."""
    cool_off: timedelta | None = settings.AXES_COOLOFF_TIME
    attempts = AccessAttempt.objects.all()
    if cool_off:
        attempts = attempts.filter(attempt_time__gte=timezone.now() - cool_off)
    found = {}
    for parameters in settings.AXES_LOCKOUT_PARAMETERS:
        fields = [parameters] if isinstance(parameters, str) else list(parameters)
        rows = (attempts.values(*fields)
                .annotate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
                .filter(failures__gte=settings.AXES_FAILURE_LIMIT))
        for row in rows:
            key = tuple(row.get(f, "") for f in ("username", "ip_address", "user_agent"))
            found[key] = {"username": row.get("username", ""),
                          "ip_address": row.get("ip_address", ""), "failures": row["failures"],
                          "until": row["last"] + cool_off if cool_off else None,
                          "last": row["last"]}
    return sorted(found.values(), key=lambda r: r["last"], reverse=True)
