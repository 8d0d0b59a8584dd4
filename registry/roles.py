"""Roles are Django groups: viewer reads, engineer uploads and deploys, admin also manages users,
tokens and reads the audit log. Each role includes the ones below it."""

from __future__ import annotations

ROLES = ("viewer", "engineer", "admin")
RANK = {role: i for i, role in enumerate(ROLES)}


def role_of(user) -> str | None:
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return "admin"
    cached = getattr(user, "_mmc_role", False)
    if cached is not False:
        return cached
    names = {group.name for group in user.groups.all()}  # uses prefetch_related("groups")
    role = next((r for r in reversed(ROLES) if r in names), None)
    user._mmc_role = role
    return role


def has_role(user, needed: str) -> bool:
    role = role_of(user)
    return role is not None and RANK[role] >= RANK[needed]
