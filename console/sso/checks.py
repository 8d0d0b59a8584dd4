"""Start-up checks of the single sign-on settings: a typo in the role map should stop the
console at start, not surface as users who silently get no role."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Warning, register

from registry.roles import ROLES, TEAM_ROLES

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@register()
def sso_settings(app_configs=None, **kwargs) -> list:
    if not settings.SSO_ENABLED:
        return []
    found = []
    if not (settings.OIDC_RP_CLIENT_ID and settings.OIDC_RP_CLIENT_SECRET):
        found.append(Error("MMC_OIDC_ISSUER is set but MMC_OIDC_CLIENT_ID or "
                           "MMC_OIDC_CLIENT_SECRET is not", id="mmc.sso.E001"))
    unknown = {g: r for g, r in settings.OIDC_ROLE_MAP.items() if r not in ROLES}
    if unknown:
        found.append(Error(f"MMC_OIDC_ROLE_MAP maps to unknown roles {unknown}",
                           hint=f"roles are {', '.join(ROLES)}", id="mmc.sso.E002"))
    bad = {g: spec for g, spec in settings.OIDC_TEAM_MAP.items()
           if spec.rpartition(":")[2] not in TEAM_ROLES or not spec.rpartition(":")[0]}
    if bad:
        found.append(Error(f"MMC_OIDC_TEAM_MAP has entries that are not team:role {bad}",
                           hint=f"team roles are {', '.join(TEAM_ROLES)}", id="mmc.sso.E003"))
    if not settings.OIDC_ROLE_MAP and not settings.OIDC_TEAM_MAP:
        found.append(Warning("MMC_OIDC_ROLE_MAP and MMC_OIDC_TEAM_MAP are empty: single sign-on "
                             "users get no role", id="mmc.sso.W001"))
    issuer = urlsplit(settings.OIDC_ISSUER)
    if issuer.scheme != "https" and issuer.hostname not in LOOPBACK:
        found.append(Warning(f"MMC_OIDC_ISSUER {settings.OIDC_ISSUER!r} is not https",
                             id="mmc.sso.W002"))
    return found
