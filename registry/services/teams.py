"""Teams: create one, give a user a role in it, move a model between teams. Each is one
transaction with its audit event. Global admins create and delete teams; a team's admins manage
its members; moving a model needs admin in both teams (registry.roles says who holds what)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from registry.audit import Actor, record
from registry.errors import Forbidden, InvalidRequest, LifecycleError, NotFound
from registry.models import DEFAULT_TEAM, SLUG, RegisteredModel, Team, TeamMembership
from registry.roles import TEAM_RANK, TEAM_ROLES, forget, is_admin, may, teams_where
from registry.services.catalog import lock_model


def _team(name: str, *, lock: bool = False) -> Team:
    rows = Team.objects.select_for_update() if lock else Team.objects
    team = rows.filter(name=name).first()
    if team is None:
        raise NotFound(f"team {name!r} does not exist", field="team")
    return team


def visible_team(user, name: str) -> Team:
    """The team `name` if the user holds a role in it (else 404, as for no such team)."""
    team = Team.objects.filter(name=name).first()
    teams = teams_where(user)
    if team is None or (teams is not None and team.pk not in teams):
        raise NotFound(f"team {name!r} does not exist", field="team")
    return team


def _require_team_admin(actor: Actor, team: Team) -> None:
    """Managing members needs admin in the team; a team the actor is not in does not exist."""
    if not may(actor.user, team.pk, "admin"):
        if may(actor.user, team.pk, "viewer"):
            raise Forbidden(f"managing the members of {team.name!r} needs the admin role in it")
        raise NotFound(f"team {team.name!r} does not exist", field="team")


def _check_role(role) -> str:
    if role not in TEAM_ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(TEAM_ROLES)}", field="role")
    return role


def team_create(*, name: str, actor: Actor, description: str = "") -> Team:
    if not is_admin(actor.user):
        raise Forbidden("creating a team needs the global admin role")
    try:
        SLUG(name)
    except Exception as exc:
        raise InvalidRequest(f"name {name!r}: {' '.join(exc.messages)}", field="name") from None
    if len(name) > 64:
        raise InvalidRequest("a team name has at most 64 characters", field="name")
    if not isinstance(description, str):
        raise InvalidRequest("description must be a string", field="description")
    with transaction.atomic():
        try:
            with transaction.atomic():
                team = Team.objects.create(name=name, description=description)
        except IntegrityError:
            raise LifecycleError(f"a team named {name!r} already exists", field="name") from None
        record(actor, "team.create", target_type="team", target=name,
               after={"name": name, "description": description})
    return team


def team_delete(*, name: str, actor: Actor) -> None:
    if not is_admin(actor.user):
        raise Forbidden("deleting a team needs the global admin role")
    with transaction.atomic():
        team = _team(name, lock=True)
        if team.name == DEFAULT_TEAM:
            raise LifecycleError(f"the team {DEFAULT_TEAM!r} stays: global roles apply there")
        owned = list(team.models.values_list("name", flat=True)[:10])
        if owned:
            raise LifecycleError(f"team {name!r} owns models ({', '.join(owned)}): move or "
                                 "delete them first", details={"models": owned})
        members = list(team.memberships.values_list("user__username", "role"))
        team.delete()
        record(actor, "team.delete", target_type="team", target=name,
               before={"name": name, "members": dict(members)})


def member_set(*, team: str, username: str, role: str, actor: Actor,
               source: str = "") -> TeamMembership:
    """Give `username` the role `role` in `team` (a team admin's or a global admin's act)."""
    _check_role(role)
    with transaction.atomic():
        row = _team(team, lock=True)
        _require_team_admin(actor, row)
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise NotFound(f"no user {username!r}", field="username")
        membership = TeamMembership.objects.filter(team=row, user=user).first()
        before = {"role": membership.role} if membership else None
        if membership is None:
            membership = TeamMembership.objects.create(team=row, user=user, role=role,
                                                       source=source)
        elif membership.role != role or membership.source != source:
            _keep_a_team_admin(row, membership, role)
            membership.role, membership.source = role, source
            membership.save(update_fields=["role", "source"])
        record(actor, "team.member_set", target_type="team", target=team, before=before,
               after={"user": username, "role": role, **({"source": source} if source else {})})
    forget(user)
    return membership


def _keep_a_team_admin(team: Team, membership: TeamMembership, new_role: str | None) -> None:
    """A team keeps at least one admin member once it has had one (global admins aside)."""
    if membership.role != "admin" or new_role == "admin":
        return
    others = team.memberships.select_for_update().filter(role="admin").exclude(pk=membership.pk)
    if not others.exists():
        raise LifecycleError(f"{membership.user.get_username()!r} is the last admin of "
                             f"{team.name!r}: make another member admin first", field="username")


def member_remove(*, team: str, username: str, actor: Actor) -> None:
    with transaction.atomic():
        row = _team(team, lock=True)
        _require_team_admin(actor, row)
        membership = (TeamMembership.objects.select_related("user")
                      .filter(team=row, user__username=username).first())
        if membership is None:
            raise NotFound(f"{username!r} is not a member of {team!r}", field="username")
        _keep_a_team_admin(row, membership, None)
        membership.delete()
        record(actor, "team.member_remove", target_type="team", target=team,
               before={"user": username, "role": membership.role})
    forget(membership.user)


def model_move(*, name: str, team: str, actor: Actor) -> RegisteredModel:
    """Give the model `name` to `team`: admin in the team that owns it and in `team`."""
    with transaction.atomic():
        model = lock_model(name, allow_archived=True)
        if not may(actor.user, model.team_id, "admin"):
            raise Forbidden(f"moving {name!r} needs the admin role in its team")
        target = Team.objects.filter(name=team).first()
        teams = teams_where(actor.user)
        if target is None or (teams is not None and target.pk not in teams):
            raise InvalidRequest(f"team {team!r} does not exist", field="team")
        if not may(actor.user, target.pk, "admin"):
            raise Forbidden(f"moving a model to {team!r} needs the admin role there")
        before = model.team.name
        if target.pk == model.team_id:
            raise LifecycleError(f"{name!r} already belongs to {team!r}", field="team")
        model.team = target
        model.save(update_fields=["team", "updated_at"])
        record(actor, "model.move", target_type="model", target=name, model_name=name,
               before={"team": before}, after={"team": team})
    return model


def sso_team_roles(groups, team_map) -> dict[str, str]:
    """team -> the highest role the identity provider's `groups` give there, by `team_map`
    (MMC_OIDC_TEAM_MAP: group -> "team:role")."""
    wanted: dict[str, str] = {}
    for group in groups:
        spec = team_map.get(group)
        if not spec or ":" not in spec:
            continue
        team, _, role = spec.rpartition(":")
        if role in TEAM_RANK and TEAM_RANK[role] > TEAM_RANK.get(wanted.get(team), -1):
            wanted[team] = role
    return wanted


def sso_memberships(user, groups, team_map, *, actor: Actor) -> dict:
    """Set the user's memberships of the teams `team_map` names from `groups` (in the caller's
    transaction): the identity provider is the source of truth there, as for global roles.
    Memberships of teams the map does not name stay as admins set them. What changed."""
    wanted = sso_team_roles(groups, team_map)
    mapped = {spec.rpartition(":")[0] for spec in team_map.values() if ":" in spec}
    changes = {}
    for name in sorted(mapped):
        team = Team.objects.filter(name=name).first()
        role = wanted.get(name)
        if team is None:
            if role is None:
                continue
            team = Team.objects.create(name=name, description="created at single sign-on")
            record(actor, "team.create", target_type="team", target=name,
                   after={"name": name, "source": "sso"})
        membership = TeamMembership.objects.filter(team=team, user=user).first()
        if role is None:
            if membership is not None:
                membership.delete()
                changes[name] = None
            continue
        if membership is None:
            TeamMembership.objects.create(team=team, user=user, role=role, source="sso")
            changes[name] = role
        elif membership.role != role or membership.source != "sso":
            membership.role, membership.source = role, "sso"
            membership.save(update_fields=["role", "source"])
            changes[name] = role
    forget(user)
    return changes
