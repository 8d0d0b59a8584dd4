"""Teams that own models (issue 29, item 4), table-driven: every REST route of a model and every
console page of one, asked by a member of the owning team in each role, by an admin of another
team and by a user in no team. Another team's model answers as a model that does not exist
(404, nothing learnt, nothing written); lists, exports, audit pages and applies show only the
caller's teams; tokens act within their user's teams; OIDC groups map to team roles; global
roles keep their meaning in the team "default"."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from registry import samples
from registry.audit import Actor
from registry.models import AuditEvent, RegisteredModel, Team, TeamMembership
from registry.services import token_create
from tests.conftest import upload, wait_validated

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN = Actor.system("test")
MEMBERS = {"f-viewer": "viewer", "f-engineer": "engineer", "f-approver": "approver",
           "f-admin": "admin"}
SECRET = "fraud-clf"  # the name that must never reach anyone outside the team "fraud"


def api_as(username: str) -> APIClient:
    _, raw = token_create(username=username, name=f"{username}-ci", actor=ADMIN)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def console_as(username: str) -> Client:
    client = Client()
    client.force_login(User.objects.get(username=username))
    return client


@pytest.fixture
def world(users, admin):
    """Teams fraud (one member per role) and ads (its admin "a-admin"); fraud-clf (v1 ready and
    serving, v2 ready) in fraud, ads-clf in ads; "nobody" holds no role anywhere."""
    for team in ("fraud", "ads"):
        assert admin.post("/api/v1/teams/", {"name": team}, format="json").status_code == 201
    for username, role in [*MEMBERS.items(), ("a-admin", "admin")]:
        User.objects.create_user(username=username, password=f"{username}-pw-1")
        team = "ads" if username.startswith("a-") else "fraud"
        r = admin.put(f"/api/v1/teams/{team}/members/{username}/", {"role": role}, format="json")
        assert r.status_code == 200, r.content
    clients = {u: api_as(u) for u in [*MEMBERS, "a-admin", "nobody"]}
    for model, team, engineer in ((SECRET, "fraud", "f-engineer"), ("ads-clf", "ads", "a-admin")):
        client = clients[engineer]
        r = client.post("/api/v1/models/", {"name": model, "team": team}, format="json")
        assert r.status_code == 201 and r.json()["team"] == team, r.content
        for seed in (1, 2):
            number = upload(client, model, samples.mlp(seed=seed)).json()["number"]
            assert wait_validated(client, model, number)["status"] == "ready"
        r = client.post(f"/api/v1/models/{model}/endpoint/deploy/", {"version": 1},
                        format="json")
        assert r.status_code == 200, r.content
    return clients


def api_routes() -> list[tuple[str, list[str]]]:
    """Every REST route of one model ("models/<name>/…"), parameters filled, with its methods."""
    found = []

    def walk(patterns, prefix):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern) and "<str:name>" in prefix + str(p.pattern):
                cls = getattr(p.callback, "view_class", None) or getattr(p.callback, "cls", None)
                methods = [m for m in ("get", "post", "put", "patch", "delete")
                           if cls is not None and hasattr(cls, m)]
                found.append((prefix + str(p.pattern), methods))

    walk(get_resolver().url_patterns, "/")
    return [(fill(path), methods) for path, methods in found if path.startswith("/api/v1/")]


def console_routes() -> list[str]:
    found = []

    def walk(patterns, prefix, namespace):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern), p.namespace or namespace)
            elif namespace == "console" and "<str:name>" in str(p.pattern):
                found.append(prefix + str(p.pattern))

    walk(get_resolver().url_patterns, "/", None)
    return [fill(path) for path in found]


def fill(path: str) -> str:
    values = {"name": SECRET, "number": "1", "search_id": "1", "alias": "prod", "prefix": "abc",
              "request_id": "r1", "filename": "m.onnx", "op": "promote"}
    return re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values.get(m[1], "x"), path)


def call(client, method: str, path: str):
    if method == "get":
        return client.get(path)
    return getattr(client, method)(path, data=json.dumps({}), content_type="application/json")


def said(response, default: str = "") -> str:
    """The error an API answer gives (registry/api/errors.py: {"error": …})."""
    try:
        return str(response.json().get("error", default))
    except ValueError:
        return default


def written() -> tuple:
    """What a refused request must leave as it was."""
    return (AuditEvent.objects.count(),
            list(RegisteredModel.objects.order_by("name").values_list(
                "name", "team__name", "description", "archived", "requires_approval")),
            list(TeamMembership.objects.order_by("pk").values_list("user_id", "team_id", "role")))


def test_every_model_route_answers_by_the_role_held_in_the_owning_team(world):
    routes = api_routes()
    assert len(routes) > 40 and any("/endpoint/capture/" in p for p, _ in routes)
    # the registry's words for a model that does not exist, and nothing more
    missing = said(world["a-admin"].get("/api/v1/models/ghost-model/")).replace(
        "ghost-model", SECRET)
    assert missing == f"model '{SECRET}' does not exist"
    before = written()
    wrong = []
    for path, methods in routes:
        for method in methods:
            # another team's admin: the model does not exist; no role anywhere: refused
            r = call(world["a-admin"], method, path)
            if (r.status_code, said(r)) != (404, missing):
                wrong.append(f"a-admin {method} {path}: {r.status_code} {said(r)}")
            r = call(world["nobody"], method, path)
            if r.status_code != 403:
                wrong.append(f"nobody {method} {path}: {r.status_code}")
            # the team's viewer reads, never writes
            r = call(world["f-viewer"], method, path)
            if method == "get" and r.status_code in (401, 403):
                wrong.append(f"f-viewer GET {path}: {r.status_code} {r.content[:200]!r}")
            if method != "get" and r.status_code != 403:
                wrong.append(f"f-viewer {method} {path}: {r.status_code}")
            elif method != "get" and "in the team 'fraud'" not in said(r):
                wrong.append(f"f-viewer {method} {path}: {said(r)}")
    assert wrong == [], "\n".join(wrong)
    assert written() == before  # nothing refused was written, audited or half-applied


def test_every_console_page_of_another_teams_model_is_a_404(world):
    paths = console_routes()
    assert len(paths) > 30 and "/models/fraud-clf/deployment/" in paths
    outsider, viewer = console_as("a-admin"), console_as("f-viewer")
    before = written()
    wrong = []
    for path in paths:
        for method in ("get", "post"):
            r = getattr(outsider, method)(path)
            if r.status_code not in (404, 405):  # 405: a page that takes only the other method
                wrong.append(f"a-admin {method} {path}: {r.status_code}")
        r = viewer.post(path)
        if r.status_code not in (403, 405):
            wrong.append(f"f-viewer POST {path}: {r.status_code}")
    assert wrong == [], "\n".join(wrong)
    assert written() == before
    page = viewer.get(f"/models/{SECRET}/")
    assert page.status_code == 200 and b'id="model-team"' in page.content
    assert b"Edit description" not in page.content  # a viewer gets no buttons


def test_lists_exports_and_audit_show_only_the_callers_teams(world, admin):
    world["f-engineer"].post(f"/api/v1/models/{SECRET}/endpoint/canary/",
                             {"version": 2, "weight": 10}, format="json")
    lists = ["/api/v1/models/", "/api/v1/audit/", "/api/v1/teams/", "/api/v1/replicas/",
             "/api/v1/jobs/", "/api/v1/datasets/", "/api/v1/export/", "/api/v1/me/",
             "/api/v1/tokens/", "/api/v1/webhooks/", "/api/v1/users/"]
    for path in lists:
        r = world["a-admin"].get(path)
        assert r.status_code in (200, 403), (path, r.status_code)
        assert SECRET.encode() not in r.content, path
    names = [m["name"] for m in world["f-viewer"].get("/api/v1/models/").json()["results"]]
    assert names == [SECRET]
    assert {m["name"] for m in admin.get("/api/v1/models/").json()["results"]} >= {
        SECRET, "ads-clf"}
    # a team admin reads its team's part of the audit log; a viewer none of it
    events = world["f-admin"].get("/api/v1/audit/?page_size=200").json()["results"]
    assert events and all(e["model_name"] == SECRET or e["target"] == "fraud" for e in events)
    assert {"endpoint.canary", "team.member_set"} <= {e["action"] for e in events}
    assert world["f-viewer"].get("/api/v1/audit/").status_code == 403
    export = world["f-engineer"].get("/api/v1/export/").content.decode()
    assert f"{SECRET}:" in export and "ads-clf" not in export and "team: fraud" in export
    me = world["f-approver"].get("/api/v1/me/").json()
    assert me["role"] is None and me["teams"] == [{"team": "fraud", "role": "approver"}]
    # console lists
    for path in ("/models/", "/teams/", "/audit/", "/applies/", "/jobs/"):
        r = console_as("a-admin").get(path)
        assert r.status_code in (200, 403) and SECRET.encode() not in r.content, path
    page = console_as("f-admin").get("/audit/").content.decode()
    assert "endpoint.canary" in page and "ads-clf" not in page


def test_team_roles_decide_approval_member_changes_and_moves(world, admin):
    r = world["f-admin"].patch(f"/api/v1/models/{SECRET}/", {"requires_approval": True},
                               format="json")
    assert r.status_code == 200, r.content
    url = f"/api/v1/models/{SECRET}/versions/2/approve/"
    r = world["f-engineer"].post(url, {"comment": "mine"}, format="json")
    assert r.status_code == 403 and "approver role" in said(r)
    assert world["f-approver"].post(url, {"comment": "eval ok"}, format="json").status_code == 200

    # members: the team's admin manages them, an engineer may not, the last admin stays
    r = world["f-engineer"].put("/api/v1/teams/fraud/members/nobody/", {"role": "viewer"},
                                format="json")
    assert r.status_code == 403 and "admin role" in said(r)
    r = world["f-admin"].put("/api/v1/teams/fraud/members/f-admin/", {"role": "viewer"},
                             format="json")
    assert r.status_code == 409 and "last admin" in said(r)
    r = world["a-admin"].put("/api/v1/teams/fraud/members/a-admin/", {"role": "admin"},
                             format="json")
    assert r.status_code == 404  # another team: not even its name is confirmed
    r = world["f-admin"].put("/api/v1/teams/fraud/members/nobody/", {"role": "boss"},
                             format="json")
    assert r.status_code == 400 and "role" in said(r)
    assert world["f-admin"].put("/api/v1/teams/fraud/members/nobody/", {"role": "viewer"},
                                format="json").status_code == 200
    names = [m["name"] for m in world["nobody"].get("/api/v1/models/").json()["results"]]
    assert names == [SECRET]  # a team role is enough to read: no global role needed

    # moving needs admin in both teams
    r = world["f-admin"].put(f"/api/v1/models/{SECRET}/team/", {"team": "ads"}, format="json")
    assert r.status_code == 400 and "does not exist" in said(r)
    assert admin.put("/api/v1/teams/ads/members/f-admin/", {"role": "admin"},
                     format="json").status_code == 200
    r = world["f-admin"].put(f"/api/v1/models/{SECRET}/team/", {"team": "ads"}, format="json")
    assert r.status_code == 200 and r.json()["team"] == "ads"
    assert world["f-viewer"].get(f"/api/v1/models/{SECRET}/").status_code == 404
    assert world["a-admin"].get(f"/api/v1/models/{SECRET}/").status_code == 200
    event = AuditEvent.objects.get(action="model.move")
    assert (event.before, event.after) == ({"team": "fraud"}, {"team": "ads"})
    # a team that owns models is not deleted; an empty one is, by a global admin only
    assert world["a-admin"].delete("/api/v1/teams/ads/").status_code == 403
    r = admin.delete("/api/v1/teams/ads/")
    assert r.status_code == 409 and "owns models" in said(r)
    assert admin.delete("/api/v1/teams/fraud/").status_code == 204


def test_plan_and_apply_act_within_the_callers_teams(world):
    other = f"format: 1\nmodels:\n  {SECRET}:\n    description: taken over\n"
    for path in ("/api/v1/plan/", "/api/v1/apply/"):
        r = world["a-admin"].post(path, other, content_type="application/yaml")
        assert r.status_code == 404 and "does not exist" in said(r), r.content
    assert RegisteredModel.objects.get(name=SECRET).description == ""
    mine = "models:\n  churn:\n    team: fraud\n    description: new\n"
    r = world["f-engineer"].post("/api/v1/apply/", mine, content_type="application/yaml")
    assert r.status_code == 200, r.content
    assert RegisteredModel.objects.get(name="churn").team.name == "fraud"
    moved = "models:\n  churn:\n    team: ads\n"
    r = world["f-engineer"].post("/api/v1/plan/", moved, content_type="application/yaml")
    assert r.status_code == 403 and "admin role" in said(r)
    r = world["f-viewer"].post("/api/v1/apply/", mine, content_type="application/yaml")
    assert r.status_code == 403
    applies = console_as("a-admin").get("/applies/")
    assert applies.status_code == 200 and b"churn" not in applies.content


def test_global_roles_keep_their_meaning_in_the_default_team(users, client_for):
    engineer, viewer = client_for("engineer"), client_for("viewer")
    r = engineer.post("/api/v1/models/", {"name": "legacy"}, format="json")
    assert r.status_code == 201 and r.json()["team"] == "default"
    assert engineer.get("/api/v1/me/").json()["teams"] == [
        {"team": "default", "role": "approver"}]  # engineers approved before teams
    assert viewer.get("/api/v1/models/legacy/").status_code == 200
    assert viewer.patch("/api/v1/models/legacy/", {"description": "x"},
                        format="json").status_code == 403
    assert client_for("nobody").get("/api/v1/models/").status_code == 403


def test_the_migration_puts_every_existing_model_in_the_default_team(transactional_db):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("registry", "0026_feedback")])
    old = executor.loader.project_state([("registry", "0026_feedback")]).apps
    old.get_model("registry", "RegisteredModel").objects.create(name="before-teams")
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    model = RegisteredModel.objects.select_related("team").get(name="before-teams")
    assert model.team.name == "default" and Team.objects.count() == 1


def test_oidc_groups_map_to_team_roles_at_every_sign_in(sso, settings, live_server, admin):
    from tests.oidc_provider.flow import sign_in

    settings.OIDC_TEAM_MAP = {"fraud-eng": "fraud:engineer", "fraud-leads": "fraud:admin"}
    assert admin.post("/api/v1/models/", {"name": "ads-clf"}, format="json").status_code == 201
    sso.set_groups("alice", "fraud-eng")
    client, r = sign_in(live_server.url, "alice", "alice-idp-pw-1")
    me = client.get(f"{live_server.url}/api/v1/me/").json()
    assert me["role"] is None and me["teams"] == [{"team": "fraud", "role": "engineer"}]
    assert Team.objects.get(name="fraud").description == "created at single sign-on"
    assert admin.post("/api/v1/models/", {"name": "churn", "team": "fraud"},
                      format="json").status_code == 201
    assert client.get(f"{live_server.url}/api/v1/models/ads-clf/").status_code == 404
    names = [m["name"] for m in client.get(f"{live_server.url}/api/v1/models/").json()["results"]]
    assert names == ["churn"]
    assert TeamMembership.objects.get(user__username="alice").source == "sso"
    sso.set_groups("alice", "fraud-leads", "fraud-eng")  # the highest mapped role wins
    client, _ = sign_in(live_server.url, "alice", "alice-idp-pw-1")
    assert client.get(f"{live_server.url}/api/v1/me/").json()["teams"] == [
        {"team": "fraud", "role": "admin"}]
    sso.set_groups("alice", "unrelated")  # out of the group: out of the team at next sign-in
    client, r = sign_in(live_server.url, "alice", "alice-idp-pw-1")
    assert r.status_code == 403 and not TeamMembership.objects.filter(
        user__username="alice").exists()
    event = AuditEvent.objects.filter(action="user.sso_login").latest("id")
    assert event.after["teams"] == {"fraud": None}
    assert Group.objects.filter(user__username="alice").count() == 0
