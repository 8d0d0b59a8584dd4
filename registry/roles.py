"""Who may do what. Two kinds of role, each including the ones below it:

- **Global roles** are Django groups: viewer, engineer, admin. A global admin may do everything
  everywhere (users, tokens of others, webhooks for every model, every team). A global viewer
  or engineer holds that role in the team "default", where every model registered before teams
  went: a global engineer is an *approver* there (before teams, engineers approved versions), so
  nobody gained or lost access when teams came.
- **Team roles** (registry.models.TeamMembership): viewer reads the team's models, engineer
  uploads and deploys, approver also approves versions (never their own upload), admin also
  manages the team's members, predict keys' openings and reads the team's audit log.

A model belongs to one team; everything about it (versions, endpoint, jobs, metrics, audit
events, webhook deliveries) is seen only by those holding a role in that team, and changed by
those holding the role the action needs there (`may`).
"""

from __future__ import annotations

ROLES = ("viewer", "engineer", "admin")
RANK = {role: i for i, role in enumerate(ROLES)}
TEAM_ROLES = ("viewer", "engineer", "approver", "admin")
TEAM_RANK = {role: i for i, role in enumerate(TEAM_ROLES)}
#: What a global role means in the team "default" (registry.models.DEFAULT_TEAM).
GLOBAL_IN_DEFAULT = {"viewer": "viewer", "engineer": "approver", "admin": "admin"}


def role_of(user) -> str | None:
    """The user's global role (its group), or None."""
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


def is_admin(user) -> bool:
    """A global admin: every team, every model."""
    return role_of(user) == "admin"


def team_roles(user) -> dict[int, str]:
    """team id -> the user's role in it (memberships, and the global role in "default");
    cached on the user instance for the request."""
    if user is None or not user.is_authenticated or not user.is_active:
        return {}
    cached = getattr(user, "_mmc_team_roles", None)
    if cached is not None:
        return cached
    from registry.models import TeamMembership, default_team_id

    held = dict(TeamMembership.objects.filter(user=user).values_list("team_id", "role"))
    role = role_of(user)
    if role is not None:
        default = default_team_id()
        mapped = GLOBAL_IN_DEFAULT[role]
        if TEAM_RANK[mapped] > TEAM_RANK.get(held.get(default), -1):
            held[default] = mapped
    user._mmc_team_roles = held
    return held


def forget(user) -> None:
    """Drop what this instance cached (after its roles changed)."""
    user.__dict__.pop("_mmc_role", None)
    user.__dict__.pop("_mmc_team_roles", None)


def team_role(user, team_id: int | None) -> str | None:
    """The user's role in the team `team_id` (a global admin is admin in every team)."""
    if is_admin(user):
        return "admin"
    return team_roles(user).get(team_id)


def may(user, team_id: int | None, needed: str) -> bool:
    """Whether the user holds `needed` (a team role) or higher in the team `team_id`."""
    role = team_role(user, team_id)
    return role is not None and TEAM_RANK[role] >= TEAM_RANK[needed]


def teams_where(user, needed: str = "viewer") -> set[int] | None:
    """The ids of the teams where the user holds `needed` or higher; None means every team (a
    global admin)."""
    if is_admin(user):
        return None
    return {t for t, r in team_roles(user).items() if TEAM_RANK[r] >= TEAM_RANK[needed]}


def has_role(user, needed: str) -> bool:
    """Whether the user holds `needed` anywhere: "admin" is the global role only; viewer and
    engineer are held globally or in any team. What it allows on one model is `may`'s to say."""
    role = role_of(user)
    if role is not None and RANK[role] >= RANK[needed]:
        return True
    if needed == "admin":
        return False
    return any(TEAM_RANK[r] >= TEAM_RANK[needed] for r in team_roles(user).values())


def visible_models(queryset, user):
    """`queryset` (of RegisteredModel) narrowed to the models the user may see."""
    teams = teams_where(user)
    return queryset if teams is None else queryset.filter(team_id__in=teams)


def visible_by_model(queryset, user, field: str = "model", needed: str = "viewer"):
    """`queryset` narrowed to rows whose `field` (a RegisteredModel relation path) belongs to a
    team where the user holds `needed`."""
    teams = teams_where(user, needed)
    return queryset if teams is None else queryset.filter(**{f"{field}__team_id__in": teams})


def visible_model_names(user) -> set[str] | None:
    """The names of the models the user may see; None means all."""
    from registry.models import RegisteredModel

    teams = teams_where(user)
    if teams is None:
        return None
    return set(RegisteredModel.objects.filter(team_id__in=teams).values_list("name", flat=True))


def model_team(name: str) -> tuple[int, str] | None:
    """(team id, team name) of the model named `name`, or None when there is no such model."""
    from registry.models import RegisteredModel

    return RegisteredModel.objects.filter(name=name).values_list("team_id", "team__name").first()


def require_model(user, name: str, needed: str) -> bool:
    """Refuse unless the user holds `needed` in the team that owns the model `name`: a model
    the user may not see is answered as one that does not exist (404, nothing learnt), one
    they see but may not change so (403). False when there is no such model (the caller
    answers that itself)."""
    from registry.errors import Forbidden, NotFound

    found = model_team(name)
    if found is None:
        return False
    team_id, team_name = found
    if team_role(user, team_id) is None:
        raise NotFound(f"model {name!r} does not exist", field="model")
    if not may(user, team_id, needed):
        raise Forbidden(f"this needs the {needed} role in the team {team_name!r}, which owns "
                        f"the model {name!r}")
    return True
