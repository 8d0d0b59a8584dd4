"""Single sign-on: a user the identity provider vouched for gets in, with the role its groups map
to. The provider is the source of truth for roles: each sign-in sets the role afresh, so a user
taken out of a group loses that role at the next sign-in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from registry.audit import Actor, record
from registry.errors import SignInRefused
from registry.roles import RANK, ROLES
from registry.services.teams import sso_memberships, sso_team_roles


def role_from_groups(groups: Iterable[str], role_map: Mapping[str, str]) -> str | None:
    """The highest role any of `groups` maps to; None when none of them is mapped."""
    roles = [role_map[g] for g in groups if role_map.get(g) in RANK]
    return max(roles, key=RANK.__getitem__, default=None)


def sso_sign_in(*, username: str, email: str = "", groups: list[str],
                role_map: Mapping[str, str], create_users: bool, request_id: str = "",
                client_address: str = "", team_map: Mapping[str, str] | None = None):
    """The console user named `username`, created if allowed, with its global role set from
    `groups` by `role_map` and its roles in the teams `team_map` names; audited as
    user.sso_login (or user.sso_refused, and SignInRefused raised)."""
    users = get_user_model()
    try:
        with transaction.atomic():
            user = users.objects.select_for_update().filter(username=username).first()
            created = user is None
            if created:
                if not create_users:
                    raise SignInRefused(
                        f"The identity provider signed you in as {username!r}, but this console "
                        f"has no user {username!r} and does not create users at sign-in. Ask a "
                        f"console admin to add the user {username!r}.")
                user = users.objects.create_user(username=username, email=email)  # no password
            elif not user.is_active:
                raise SignInRefused(f"The console user {username!r} is deactivated. Ask a "
                                    "console admin to reactivate it.")
            held = user.groups.filter(name__in=ROLES).values_list("name", flat=True)
            before = max(held, key=RANK.__getitem__, default=None)
            role = role_from_groups(groups, role_map)
            user.groups.remove(*Group.objects.filter(name__in=ROLES).exclude(name=role))
            if role is not None:
                user.groups.add(Group.objects.get_or_create(name=role)[0])
            if email and user.email != email:
                user.email = email
                user.save(update_fields=["email"])
            actor = Actor(user=user, name=username, request_id=request_id,
                          client_address=client_address)
            teams = sso_memberships(user, groups, team_map or {}, actor=actor)
            record(actor, "user.sso_login", target_type="user", target=username,
                   before=None if created else {"role": before},
                   after={"groups": sorted(groups), "role": role, "created": created,
                          **({"teams": teams} if teams else {})},
                   reason="" if role or sso_team_roles(groups, team_map or {})
                   else "no group maps to a role: signed in without one")
            return user
    except SignInRefused as exc:
        with transaction.atomic():
            record(Actor(user=None, name="anonymous", request_id=request_id,
                         client_address=client_address), "user.sso_refused", target_type="user",
                   target=username, after={"groups": sorted(groups)}, reason=exc.message)
        raise
