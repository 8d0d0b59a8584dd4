"""The approval gate: a model may require that a version be approved before it takes traffic.
Every routing change (deploy, canary start, weight and promote, rollback, blue-green deploy and
switch, shadow, the `production` alias) refuses an unapproved version with a 409 naming the
version, its state and the role (tests/test_routing_gate.py crosses them all); the automated
canary analysis holds instead of giving one more traffic; only an engineer or admin other than
the uploader decides, a rejection says why and ends what traffic the version had, and each
decision is audited, kept and announced."""

from __future__ import annotations

import hashlib

import onnx
import pytest
from django.contrib.auth.models import Group, User

from registry import samples, services
from registry.audit import Actor
from registry.cli.main import parser
from registry.errors import Forbidden, InvalidRequest, LifecycleError
from registry.integrations.webhooks import event_for
from registry.models import (
    ApprovalDecision,
    AuditEvent,
    Endpoint,
    ModelVersion,
    RegisteredModel,
    VersionStatus,
)
from registry.services import analysis
from registry.signatures import extract_signature
from tests.test_rollouts import fed, figures

M = "fraud"
HINT = " — model 'fraud' requires approval before promotion; approve it first"


def gate(n: int, state: str, role: str = "become stable") -> str:
    """The gate's refusal (registry/services/gate.py)."""
    if state == "pending":
        return f"version {n} of 'fraud' is pending approval: it cannot {role}{HINT}"
    return f"version {n} of 'fraud' is {state}: it cannot {role}"


def person(name: str, role: str) -> Actor:
    user = User.objects.create_user(username=name, password=f"{name}-password-1")
    user.groups.add(Group.objects.get(name=role))
    return Actor(user=user, name=name)


@pytest.fixture
def team(db):
    """alice (engineer) uploaded versions 1-3 of `fraud`; bob (engineer), carol (admin) and
    vic (viewer) review. Version 1 is approved and stable; the model requires approval."""
    services.ensure_roles()
    people = {n: person(n, r) for n, r in (("alice", "engineer"), ("bob", "engineer"),
                                           ("carol", "admin"), ("vic", "viewer"))}
    model = services.model_create(name=M, actor=people["alice"])
    for number in (1, 2, 3):
        blob = samples.mlp(seed=number)
        ModelVersion.objects.create(
            model=model, number=number, sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob), status=VersionStatus.READY, created_by=people["alice"].user,
            signature=extract_signature(onnx.load_from_string(blob)))
    services.version_approve(model_name=M, number=1, actor=people["bob"], comment="baseline")
    services.endpoint_deploy(model_name=M, version_number=1, actor=people["alice"])
    services.model_update(name=M, requires_approval=True, actor=people["alice"])
    return people


def ep() -> Endpoint:
    return Endpoint.objects.select_related("stable", "candidate").get(model__name=M)


ROLES = {"deploy": "become stable", "canary": "become the canary candidate (10 %)",
         "bg-deploy": "fill the idle green slot", "production-alias": "hold the production alias"}
PROMOTIONS = {
    "deploy": lambda a, n: services.endpoint_deploy(model_name=M, version_number=n, actor=a),
    "canary": lambda a, n: services.canary_start(model_name=M, version_number=n, weight=10,
                                                 actor=a),
    "bg-deploy": lambda a, n: services.bluegreen_deploy(model_name=M, version_number=n,
                                                        actor=a),
    "production-alias": lambda a, n: services.alias_set(model_name=M, alias="production",
                                                        version_number=n, actor=a),
}


# ------------------------------------------------------------------------------- the setting


def test_approval_is_off_by_default_and_then_nothing_is_gated(db):
    services.ensure_roles()
    alice = person("alice", "engineer")
    model = services.model_create(name="plain", actor=alice)
    assert model.requires_approval is False
    blob = samples.mlp(seed=1)
    ModelVersion.objects.create(model=model, number=1, sha256=hashlib.sha256(blob).hexdigest(),
                                size_bytes=len(blob), status=VersionStatus.READY)
    services.endpoint_deploy(model_name="plain", version_number=1, actor=alice)
    services.alias_set(model_name="plain", alias="production", version_number=1, actor=alice)
    assert ModelVersion.objects.get(model=model).approval == "pending"


def test_turning_the_setting_on_is_audited(team):
    event = AuditEvent.objects.filter(action="model.update").latest("id")
    assert event.before["requires_approval"] is False and event.after["requires_approval"]
    assert event.actor_name == "alice"


# ------------------------------------------------------------------------------ the refusals


@pytest.mark.parametrize("op", sorted(PROMOTIONS))
def test_each_promotion_refuses_a_pending_version_naming_the_rule(team, op):
    before = ep().revision
    with pytest.raises(LifecycleError) as caught:
        PROMOTIONS[op](team["alice"], 2)
    assert caught.value.status == 409
    assert caught.value.message == gate(2, "pending", ROLES[op])
    assert caught.value.details["rule"] == "requires_approval"
    assert ep().revision == before and ep().stable.number == 1


@pytest.mark.parametrize("op", sorted(PROMOTIONS))
def test_each_promotion_takes_the_version_once_approved(team, op):
    services.version_approve(model_name=M, number=2, actor=team["bob"], comment="eval ok")
    PROMOTIONS[op](team["alice"], 2)


def test_a_rejected_version_is_refused_and_the_message_says_rejected(team):
    services.version_reject(model_name=M, number=3, actor=team["carol"], comment="AUC dropped")
    with pytest.raises(LifecycleError) as caught:
        services.endpoint_deploy(model_name=M, version_number=3, actor=team["alice"])
    assert caught.value.message == gate(3, "rejected")


def test_a_refused_deploy_is_audited_as_a_refusal(team):
    with pytest.raises(LifecycleError):
        services.endpoint_deploy(model_name=M, version_number=2, actor=team["alice"])
    refused = AuditEvent.objects.get(action="endpoint.deploy.refused")
    assert refused.after["error"] == gate(2, "pending")


def test_rejecting_a_candidate_after_its_canary_started_ends_the_canary(team):
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    services.canary_start(model_name=M, version_number=2, weight=10, actor=team["alice"])
    services.version_reject(model_name=M, number=2, actor=team["bob"], comment="bias found")
    assert ep().stable.number == 1 and ep().candidate is None
    with pytest.raises(LifecycleError, match="in state 'stable'"):
        services.canary_promote(model_name=M, actor=team["alice"])


def test_rejecting_an_idle_colour_after_it_was_deployed_empties_it(team):
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    services.bluegreen_deploy(model_name=M, version_number=2, actor=team["alice"])
    services.version_reject(model_name=M, number=2, actor=team["bob"], comment="regression")
    assert ep().green is None and ep().blue.number == 1
    with pytest.raises(LifecycleError, match="the idle colour .green. has no version"):
        services.bluegreen_switch(model_name=M, actor=team["alice"])


def test_other_aliases_are_not_gated_and_a_rollback_to_an_approved_version_is(team):
    services.alias_set(model_name=M, alias="staging", version_number=2, actor=team["alice"])
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    services.endpoint_deploy(model_name=M, version_number=2, actor=team["alice"])
    services.model_update(name=M, requires_approval=True, actor=team["alice"])
    services.rollback(model_name=M, version_number=1, actor=team["alice"])
    assert ep().stable.number == 1


def test_turning_the_setting_off_lifts_the_gate(team):
    services.model_update(name=M, requires_approval=False, actor=team["bob"])
    services.endpoint_deploy(model_name=M, version_number=2, actor=team["alice"])
    assert ep().stable.number == 2


# ------------------------------------------------------------------------------ who decides


def test_the_uploader_may_not_approve_their_own_version(team):
    with pytest.raises(Forbidden) as caught:
        services.version_approve(model_name=M, number=2, actor=team["alice"])
    assert caught.value.status == 403
    assert caught.value.message == ("you uploaded version 2; another engineer or admin must "
                                    "approve or reject it")
    assert ModelVersion.objects.get(model__name=M, number=2).approval == "pending"
    assert not AuditEvent.objects.filter(action="version.approve", target=f"{M}:2").exists()


def test_a_viewer_may_not_decide(team):
    with pytest.raises(Forbidden, match="approver role"):
        services.version_approve(model_name=M, number=2, actor=team["vic"])


def test_a_rejection_needs_a_comment(team):
    with pytest.raises(InvalidRequest) as caught:
        services.version_reject(model_name=M, number=2, actor=team["bob"], comment="  ")
    assert caught.value.field == "comment" and caught.value.status == 400


def test_deciding_the_same_twice_is_refused(team):
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    with pytest.raises(LifecycleError, match="already approved"):
        services.version_approve(model_name=M, number=2, actor=team["carol"])


def test_each_decision_is_kept_and_audited(team):
    services.version_approve(model_name=M, number=2, actor=team["bob"], comment="offline ok")
    services.version_reject(model_name=M, number=2, actor=team["carol"], comment="drift")
    version = ModelVersion.objects.get(model__name=M, number=2)
    assert version.approval == "rejected"
    history = [(d.decision, d.decided_by_name, d.comment)
               for d in ApprovalDecision.objects.filter(version=version)]
    assert history == [("rejected", "carol", "drift"), ("approved", "bob", "offline ok")]
    events = AuditEvent.objects.filter(target=f"{M}:2").order_by("id")
    assert [(e.action, e.actor_name, e.before, e.after["approval"], e.reason)
            for e in events] == [
        ("version.approve", "bob", {"approval": "pending"}, "approved", "offline ok"),
        ("version.reject", "carol", {"approval": "approved"}, "rejected", "drift")]


@pytest.mark.parametrize(("action", "event"), [("version.approve", "version.approved"),
                                               ("version.reject", "version.rejected")])
def test_decisions_are_webhook_events(action, event):
    assert event_for(action) == event


# ------------------------------------------------------------------- the automated analysis

PLAN = {"steps": [50, 100], "bake_seconds": 0, "min_requests": 10}


@pytest.mark.usefixtures("analysis_ticking")
def test_the_analysis_holds_an_unapproved_candidate_says_why_once_then_promotes(team):
    services.model_update(name=M, requires_approval=False, actor=team["alice"])
    services.canary_start(model_name=M, version_number=2, plan=PLAN, actor=team["alice"])
    services.model_update(name=M, requires_approval=True, actor=team["alice"])
    healthy = fed({1: figures(900), 2: figures(100)})
    for _ in range(2):
        decision = analysis.tick(metrics=healthy)[0]
        assert decision["action"] == "hold"
        assert decision["why"] == (gate(2, "pending", "take 100 % of traffic as the canary "
                                        "candidate") + "; the analysis holds at 50 % until then")
    e = ep()
    assert e.candidate.number == 2 and e.stable.number == 1 and e.candidate_weight == 50
    assert "requires approval" in e.rollout.analysis.held
    holds = AuditEvent.objects.filter(action="endpoint.analysis.hold")
    assert holds.count() == 1 and holds[0].actor_name == "canary-analysis"

    services.version_approve(model_name=M, number=2, actor=team["carol"], comment="go")
    assert analysis.tick(metrics=healthy)[0]["action"] == "advance"
    assert analysis.tick(metrics=healthy)[0]["action"] == "promote"
    assert ep().stable.number == 2 and ep().candidate is None


# ------------------------------------------------------------------------------------- API


@pytest.fixture
def api(team):
    from rest_framework.test import APIClient

    def as_(name: str) -> APIClient:
        client = APIClient()
        client.force_authenticate(User.objects.get(username=name))
        return client

    return as_


def test_api_patch_sets_the_setting_and_the_model_says_it(api):
    r = api("bob").patch(f"/api/v1/models/{M}/", {"requires_approval": False}, format="json")
    assert r.status_code == 200 and r.json()["requires_approval"] is False
    r = api("vic").patch(f"/api/v1/models/{M}/", {"requires_approval": True}, format="json")
    assert r.status_code == 403
    assert RegisteredModel.objects.get(name=M).requires_approval is False


def test_api_deploy_of_a_pending_version_is_a_409_naming_the_rule(api):
    r = api("alice").post(f"/api/v1/models/{M}/endpoint/deploy/", {"version": 2}, format="json")
    assert r.status_code == 409
    assert r.json()["error"] == gate(2, "pending")
    r = api("alice").put(f"/api/v1/models/{M}/aliases/production/", {"version": 2},
                         format="json")
    assert r.status_code == 409 and "requires approval" in r.json()["error"]


def test_api_approve_and_reject_and_the_version_shows_them(api):
    url = f"/api/v1/models/{M}/versions/2/"
    r = api("alice").post(url + "approve/", {"comment": "mine"}, format="json")
    assert r.status_code == 403
    assert r.json()["error"].startswith("you uploaded version 2")
    assert api("bob").post(url + "reject/", {}, format="json").status_code == 400
    r = api("bob").post(url + "approve/", {"comment": "eval ok"}, format="json")
    assert r.status_code == 200
    body = r.json()
    assert body["approval"] == "approved"
    assert [(a["decision"], a["decided_by"], a["comment"]) for a in body["approvals"]] == [
        ("approved", "bob", "eval ok")]
    r = api("alice").post(f"/api/v1/models/{M}/endpoint/deploy/", {"version": 2}, format="json")
    assert r.status_code == 200 and r.json()["stable"] == 2
    listed = api("vic").get(f"/api/v1/models/{M}/versions/").json()["results"]
    assert {v["number"]: v["approval"] for v in listed} == {3: "pending", 2: "approved",
                                                            1: "approved"}
    assert api("vic").post(url + "reject/", {"comment": "x"}, format="json").status_code == 403


# ------------------------------------------------------------------------------------- CLI


def test_cli_reject_needs_a_comment_and_approve_takes_one():
    with pytest.raises(SystemExit):
        parser().parse_args(["reject", M, "2"])
    args = parser().parse_args(["approve", M, "2", "--comment", "eval ok"]).command
    assert (args.model, args.version, args.comment) == (M, 2, "eval ok")


def test_cli_approve_posts_to_the_version(monkeypatch, capsys):
    import importlib
    import json

    import httpx

    import mmc

    cli = importlib.import_module("registry.cli.main")  # the package re-exports main()

    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"approval": "approved", "number": 2})

    class Recorded(mmc.Client):  # the real client, its requests answered here
        def __init__(self, url, token):
            super().__init__(url, token, transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli, "Client", Recorded)
    assert cli.main(["--url", "http://console", "--token", "t", "approve", M, "2",
                     "--comment", "ok"]) == 0
    assert calls == [("POST", f"/api/v1/models/{M}/versions/2/approve/", {"comment": "ok"})]
    assert f"{M}:2 approved" in capsys.readouterr().err


# --------------------------------------------------------------------------------- console


def test_console_reject_without_a_comment_says_so_and_a_viewer_cannot_toggle(team, client):
    client.force_login(User.objects.get(username="bob"))
    r = client.post(f"/models/{M}/versions/2/approval/", {"decision": "reject", "comment": ""},
                    follow=True)
    assert "a rejection needs a comment saying why" in r.content.decode()
    assert ModelVersion.objects.get(model__name=M, number=2).approval == "pending"
    client.force_login(User.objects.get(username="vic"))
    assert client.post(f"/models/{M}/approval/", {}).status_code == 403
    page = client.get(f"/models/{M}/versions/2/").content.decode()
    assert 'id="approval-history"' in page and "Approve</button>" not in page


@pytest.mark.usefixtures("analysis_ticking")
def test_the_deployment_page_says_why_the_analysis_holds(team, client):
    services.model_update(name=M, requires_approval=False, actor=team["alice"])
    services.canary_start(model_name=M, version_number=2, plan={"steps": [100],
                          "bake_seconds": 0, "min_requests": 10}, actor=team["alice"])
    services.model_update(name=M, requires_approval=True, actor=team["alice"])
    assert analysis.tick(metrics=fed({1: figures(900), 2: figures(100)}))[0]["action"] == "hold"
    client.force_login(User.objects.get(username="vic"))
    page = client.get(f"/models/{M}/deployment/").content.decode()
    assert "Holding:" in page and "requires approval before promotion" in page
