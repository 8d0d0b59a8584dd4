"""Teams: the teams you are in (every team for a global admin), each with its models and its
members; a team's admins set members' roles, global admins create and delete teams, and a model
moves between two teams its mover administers. Every change is a registry.services.teams call."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from registry import selectors
from registry.errors import NotFound
from registry.roles import is_admin, may, team_role
from registry.services import teams as svc

from ..forms import MemberForm, MoveModelForm, TeamCreateForm, error_text
from .access import requires, run_service


def _team(request: HttpRequest, team: str):
    try:
        return svc.visible_team(request.user, team)
    except NotFound as exc:
        raise Http404(exc.message) from None


@requires("viewer", write="admin")
def team_list(request: HttpRequest) -> HttpResponse:
    form = TeamCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        team = run_service(request, svc.team_create, success="Team created.",
                           **form.cleaned_data)
        if team is not None:
            return redirect("console:team-detail", team=team.name)
    mine = {row["team"]: row["role"] for row in selectors.my_teams(request.user)}
    rows = selectors.team_list(request.user)
    for row in rows:
        row.your_role = mine.get(row.name)
    return render(request, "console/teams.html",
                  {"rows": rows, "form": form, "nav": "teams",
                   "may_create": is_admin(request.user)},
                  status=400 if request.method == "POST" else 200)


@requires("viewer")
def team_detail(request: HttpRequest, team: str) -> HttpResponse:
    row = _team(request, team)
    admin = may(request.user, row.pk, "admin")
    members = list(row.memberships.select_related("user").order_by("user__username"))
    for m in members:
        m.form = MemberForm(initial={"username": m.user.get_username(), "role": m.role},
                            auto_id=f"member-{m.pk}-%s")
    movable = []
    if admin:  # models the user administers in other teams may move here
        movable = [m.name for m in selectors.model_list().exclude(team=row)
                   if may(request.user, m.team_id, "admin")]
    users = (get_user_model().objects.filter(is_active=True).exclude(
        team_memberships__team=row).order_by("username").values_list("username", flat=True)
        if admin else [])
    return render(request, "console/team_detail.html", {
        "team": row, "members": members, "admin": admin, "nav": "teams",
        "your_role": team_role(request.user, row.pk),
        "models": selectors.model_list().filter(team=row),
        "add_form": MemberForm(auto_id="add-%s", users=list(users)),
        "move_form": MoveModelForm(models=movable) if movable else None,
        "global_admin": is_admin(request.user)})


@require_POST
@requires("viewer", write="viewer")  # the service checks the admin role in that team
def member_set(request: HttpRequest, team: str) -> HttpResponse:
    _team(request, team)
    form = MemberForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        run_service(request, svc.member_set, team=team, username=data["username"],
                    role=data["role"], success=f"{data['username']} is now {data['role']} "
                                               f"in {team}.")
    else:
        messages.error(request, error_text(form))
    return redirect("console:team-detail", team=team)


@require_POST
@requires("viewer", write="viewer")
def member_remove(request: HttpRequest, team: str, username: str) -> HttpResponse:
    _team(request, team)
    run_service(request, svc.member_remove, team=team, username=username,
                success=f"{username} is no longer a member of {team}.")
    return redirect("console:team-detail", team=team)


@require_POST
@requires("viewer", write="admin")
def team_delete(request: HttpRequest, team: str) -> HttpResponse:
    _team(request, team)
    if run_service(request, svc.team_delete, name=team, success=f"Team {team} deleted.") is None:
        return redirect("console:team-detail", team=team)
    return redirect("console:team-list")


@require_POST
@requires("viewer", write="viewer")  # the service checks admin in both teams
def model_move(request: HttpRequest, team: str) -> HttpResponse:
    row = _team(request, team)
    if not may(request.user, row.pk, "admin"):
        messages.error(request, f"moving a model to {team!r} needs the admin role there")
        return redirect("console:team-detail", team=team)
    form = MoveModelForm(request.POST, models=None)
    if form.is_valid():
        name = form.cleaned_data["model"]
        run_service(request, svc.model_move, name=name, team=team,
                    success=f"{name} now belongs to {team}.")
    else:
        messages.error(request, error_text(form))
    return redirect("console:team-detail", team=team)

