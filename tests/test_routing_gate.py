"""One gate where routing changes: a version takes traffic - stable, a canary candidate's
weight, rollback's target, a blue-green slot, shadow, the `production` alias, a step of a
pipeline - only if it is ready and, where its model requires approval, approved.

The table crosses every routing operation with every state the version can be in, through the
REST API; the CLI (`mmc weight`, `mmc rollback`, against the real API) and the console's weight
and rollback forms are crossed with the same states. A refusal is a 409 naming the version, its
state and the role, and nothing changed. Then: taking traffic away is never refused; rejecting
a version ends what traffic it had, in the same transaction, audited; the console offers no
version the gate would refuse."""

from __future__ import annotations

import hashlib
import html
import importlib
import re

import onnx
import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from registry import samples, services
from registry.audit import Actor
from registry.errors import LifecycleError
from registry.models import Alias, AuditEvent, Endpoint, ModelVersion, VersionStatus
from registry.services.pipelines import pipeline_create
from registry.signatures import extract_signature
from tests.cli_inprocess import inprocess_cli

cli = importlib.import_module("registry.cli.main")  # the package re-exports main()
M, PIPE = "fraud", "pipe"
HINT = " — model 'fraud' requires approval before promotion; approve it first"
STATES = ("approved", "pending", "rejected", "not-ready")
WORDS = {"pending": "is pending approval", "rejected": "is rejected",
         "not-ready": "is failed, not ready"}
TAIL = {"approved": "", "pending": HINT, "rejected": "", "not-ready": " — bad graph"}


def person(name: str, role: str) -> Actor:
    user = User.objects.create_user(username=name, password=f"{name}-password-1")
    user.groups.add(Group.objects.get(name=role))
    return Actor(user=user, name=name)


@pytest.fixture
def team(db):
    """alice (engineer) uploaded versions 1-3 of `fraud`; bob (engineer) approved 1 and 3;
    version 1 is stable. The model does not require approval yet: each spec arranges the roles
    first, then puts version 2 in its state and switches the gate on (as a team would)."""
    services.ensure_roles()
    people = {"alice": person("alice", "engineer"), "bob": person("bob", "engineer")}
    model = services.model_create(name=M, actor=people["alice"])
    for number in (1, 2, 3):
        blob = samples.mlp(seed=number)
        ModelVersion.objects.create(
            model=model, number=number, sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob), status=VersionStatus.READY, created_by=people["alice"].user,
            signature=extract_signature(onnx.load_from_string(blob)))
    for number in (1, 3):
        services.version_approve(model_name=M, number=number, actor=people["bob"])
    services.endpoint_deploy(model_name=M, version_number=1, actor=people["alice"])
    services.model_create(name=PIPE, actor=people["alice"])
    return people


def put_version_2_in(state: str, team) -> None:
    """Version 2 becomes `state`; then the model requires approval."""
    if state in ("approved", "not-ready"):
        services.version_approve(model_name=M, number=2, actor=team["bob"])
    if state == "rejected":
        services.version_reject(model_name=M, number=2, actor=team["bob"], comment="AUC dropped")
    if state == "not-ready":
        ModelVersion.objects.filter(model__name=M, number=2).update(
            status=VersionStatus.FAILED, failure_reason="bad graph")
    services.model_update(name=M, requires_approval=True, actor=team["alice"])


def refusal(state: str, role: str, subject: str = "version 2 of 'fraud'") -> str:
    return f"{subject} {WORDS[state]}: it cannot {role}{TAIL[state]}"


def ep() -> Endpoint:
    return Endpoint.objects.get(model__name=M)


def routing(name: str = M) -> dict:
    e = Endpoint.objects.get(model__name=name)
    return {k: getattr(e, k) for k in ("stable_id", "candidate_id", "candidate_weight", "blue_id",
                                       "green_id", "live_color", "shadow_id", "revision")}


def api(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def pipeline_spec() -> dict:
    return {"steps": [{"name": "score", "model": M, "version": 2}],
            "edges": [{"from": "x", "to": "score.x"}, {"from": "score.y", "to": "y"}]}


# ------------------------------------------------------------------------------ the table

A = Actor.system("setup")
SETUP = {  # arranged before version 2 takes its state, while the gate is off
    "weight": lambda: services.canary_start(model_name=M, version_number=2, weight=5, actor=A),
    "promote": lambda: services.canary_start(model_name=M, version_number=2, weight=5,
                                             actor=A),
    "rollback": lambda: services.endpoint_deploy(model_name=M, version_number=3, actor=A),
    "rollback-unload-first": lambda: services.endpoint_deploy(model_name=M, version_number=3,
                                                              actor=A),
    "switch": lambda: services.bluegreen_deploy(model_name=M, version_number=2, actor=A),
    "pipeline-deploy": lambda: pipeline_create(model_name=PIPE, spec=pipeline_spec(), actor=A),
}
E = f"/api/v1/models/{M}/endpoint/"
# operation: (method, path, body, the role a refusal names, the status of success)
OPERATIONS = {
    "deploy": ("post", E + "deploy/", {"version": 2}, "become stable", 200),
    "canary": ("post", E + "canary/", {"version": 2, "weight": 10},
               "become the canary candidate (10 %)", 200),
    "weight": ("post", E + "weight/", {"weight": 100},
               "take 100 % of traffic as the canary candidate", 200),
    "promote": ("post", E + "promote/", {}, "become stable", 200),
    "rollback": ("post", E + "rollback/", {"version": 2}, "become stable", 200),
    "rollback-unload-first": ("post", E + "rollback/", {"version": 2, "order": "unload-first"},
                              "become stable", 200),
    "bg-deploy": ("post", E + "blue-green/deploy/", {"version": 2}, "fill the idle green slot",
                  200),
    "switch": ("post", E + "blue-green/switch/", {}, "go live in the green slot", 200),
    "shadow": ("post", E + "shadow/", {"version": 2}, "shadow live traffic", 200),
    "production-alias": ("put", f"/api/v1/models/{M}/aliases/production/", {"version": 2},
                         "hold the production alias", 200),
    "pipeline-create": ("post", f"/api/v1/models/{PIPE}/versions/pipeline/", pipeline_spec(),
                        "be step 'score' of a pipeline", 201),
    "pipeline-deploy": ("post", f"/api/v1/models/{PIPE}/endpoint/deploy/", {"version": 1},
                        "become stable", 200),
}
# Where an operation's own check answers first, and how (a 400 is a malformed request).
FIRST = {("pipeline-create", "not-ready"): (400, "step 'score': fraud:2 is failed, not ready")}


def observed() -> dict:
    """Everything a routing operation could change."""
    return {M: routing(M),
            PIPE: routing(PIPE) if Endpoint.objects.filter(model__name=PIPE).exists() else None,
            "aliases": sorted(Alias.objects.values_list("name", "version__number")),
            "pipelines": ModelVersion.objects.filter(model__name=PIPE).count()}


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_each_routing_operation_admits_only_a_version_that_may_take_traffic(team, op, state):
    if op in SETUP:
        SETUP[op]()
    put_version_2_in(state, team)
    method, path, body, role, ok = OPERATIONS[op]
    before = observed()
    r = getattr(api(team["alice"].user), method)(path, body, format="json")
    if state == "approved":
        assert r.status_code == ok, r.content
        assert observed() != before
        return
    status, message = FIRST.get((op, state), (409, refusal(state, role)))
    if op == "pipeline-deploy" and (op, state) not in FIRST:
        message = (f"version 1 of 'pipe' runs step 'score' on version 2 of 'fraud', which "
                   f"{WORDS[state]}: it cannot {role}{TAIL[state]}")
    assert (r.status_code, r.json()["error"]) == (status, message)
    assert observed() == before
    if status == 409:
        details = r.json()["details"]
        assert details["role"] == role
        assert details["rule"] == ("ready" if state == "not-ready" else "requires_approval")


def test_a_refusal_lists_the_versions_that_may_take_the_role_and_is_audited(team):
    put_version_2_in("rejected", team)
    r = api(team["alice"].user).post(E + "deploy/", {"version": 2}, format="json")
    assert r.status_code == 409
    assert r.json()["details"] == {"rule": "requires_approval", "version": 2,
                                   "state": "rejected", "role": "become stable",
                                   "may_take_traffic": [3, 1]}
    refused = AuditEvent.objects.get(action="endpoint.deploy.refused")
    assert refused.after["error"] == refusal("rejected", "become stable")


# ------------------------------------------------------------------- the CLI and the console


@pytest.fixture
def mmc(team, monkeypatch, capsys):
    """mmc(*args) -> (exit code, stderr): the real CLI, its HTTP client on this Django app."""
    token = services.token_create(username="alice", name="cli", actor=team["alice"])[1]
    with inprocess_cli(token, monkeypatch, capsys) as run:
        yield run


CLI = {"weight": (["weight", M, "100"], "take 100 % of traffic as the canary candidate"),
       "rollback": (["rollback", M, "2"], "become stable")}


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("op", sorted(CLI))
def test_the_cli_weight_and_rollback_pass_the_same_gate(mmc, team, op, state):
    SETUP[op]()
    put_version_2_in(state, team)
    before = routing()
    args, role = CLI[op]
    code, err = mmc(*args)
    if state == "approved":
        assert code == 0, err
        assert routing() != before
    else:
        assert code == 1
        assert err.strip() == f"mmc: 409: {refusal(state, role)}"
        assert routing() == before


FORMS = {"weight": ({"weight": 100}, "take 100 % of traffic as the canary candidate",
                    "The candidate now takes 100 % of traffic."),
         "rollback": ({"version": 2, "order": "load-first"}, "become stable",
                      "Rolled back: version 2 is the stable version now.")}


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("op", sorted(FORMS))
def test_the_console_weight_and_rollback_forms_pass_the_same_gate(team, client, op, state):
    SETUP[op]()
    put_version_2_in(state, team)
    before = routing()
    data, role, success = FORMS[op]
    client.force_login(team["alice"].user)
    r = client.post(f"/models/{M}/deployment/{op}/", data, follow=True)
    page = html.unescape(r.content.decode())
    if state == "approved":
        assert success in page and routing() != before
    else:
        assert refusal(state, role) in page and routing() == before


def options(page: str, select_id: str) -> list[str]:
    found = re.search(rf'<select[^>]*id="{select_id}"[^>]*>(.*?)</select>', page, re.S)
    return re.findall(r'<option value="(\d+)"', found.group(1)) if found else []


def test_the_rollback_select_offers_no_rejected_version(team, client):
    """The outside tester's path: v2 rejected, v3 promoted; Roll back offered the rejected v2."""
    services.model_update(name=M, requires_approval=True, actor=team["alice"])
    services.version_reject(model_name=M, number=2, actor=team["bob"], comment="AUC dropped")
    services.canary_start(model_name=M, version_number=3, weight=10, actor=team["alice"])
    services.canary_promote(model_name=M, actor=team["alice"])
    client.force_login(team["alice"].user)
    page = client.get(f"/models/{M}/deployment/").content.decode()
    assert options(page, "rollback-version") == ["1"]
    assert options(page, "bg-version") == ["1"]  # nor any other picker
    assert options(page, "shadow-version") == ["1"]


def test_the_pickers_offer_no_pending_version_while_the_model_requires_approval(team, client):
    services.model_update(name=M, requires_approval=True, actor=team["alice"])
    client.force_login(team["alice"].user)
    page = client.get(f"/models/{M}/deployment/").content.decode()
    assert options(page, "canary-version") == ["3"]
    services.model_update(name=M, requires_approval=False, actor=team["alice"])
    page = client.get(f"/models/{M}/deployment/").content.decode()
    assert options(page, "canary-version") == ["3", "2"]


# --------------------------------------------------------- taking traffic away is never gated


def test_traffic_is_taken_away_from_a_version_the_gate_refuses_but_never_given(team):
    """Gate switched on with pending v2 at 50 % and v1 (approved) stable: lowering the weight
    and aborting work; a switch away from a pending live version works, switching back is
    refused."""
    alice = team["alice"]
    services.canary_start(model_name=M, version_number=2, weight=50, actor=alice)
    put_version_2_in("pending", team)
    services.canary_weight(model_name=M, weight=10, actor=alice)
    with pytest.raises(LifecycleError, match="it cannot take 20 % of traffic as the canary"):
        services.canary_weight(model_name=M, weight=20, actor=alice)
    services.canary_abort(model_name=M, actor=alice)
    assert ep().candidate_id is None
    ModelVersion.objects.filter(model__name=M, number=1).update(approval="pending")
    services.bluegreen_deploy(model_name=M, version_number=3, actor=alice)  # v1 stays live
    services.bluegreen_switch(model_name=M, actor=alice)                    # v1 goes idle
    with pytest.raises(LifecycleError) as caught:
        services.bluegreen_switch_back(model_name=M, actor=alice)
    assert caught.value.message == ("version 1 of 'fraud' is pending approval: it cannot go "
                                    "live in the blue slot" + HINT)
    services.bluegreen_finish(model_name=M, actor=alice)
    services.endpoint_deploy(model_name=M, version_number=None, actor=alice)
    assert ep().stable_id is None


# ------------------------------------------------------------------ rejection ends the role


def reject_2(team) -> None:
    services.version_reject(model_name=M, number=2, actor=team["bob"], comment="bias found")


def test_rejecting_a_canarys_candidate_ends_the_canary_audited(team):
    services.model_update(name=M, requires_approval=True, actor=team["alice"])
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    services.canary_start(model_name=M, version_number=2, weight=30, actor=team["alice"])
    revision = ep().revision
    r = api(team["bob"].user).post(f"/api/v1/models/{M}/versions/2/reject/",
                                   {"comment": "bias found"}, format="json")
    assert r.status_code == 200 and r.json()["approval"] == "rejected"
    e = ep()
    assert (e.stable.number, e.candidate_id, e.candidate_weight) == (1, None, 0)
    assert e.revision > revision
    v2 = ModelVersion.objects.get(model__name=M, number=2)
    assert v2.pk not in e.warm_versions  # unlike an abort: no pinned requests either
    event = AuditEvent.objects.get(action="endpoint.withdraw")
    assert (event.actor_name, event.reason) == ("bob", "rejected: bias found")
    assert (event.before["candidate"], event.before["candidate_weight"]) == (2, 30)
    assert (event.after["candidate"], event.after["details"]) == (
        None, {"version": 2, "ended": ["candidate"]})
    assert [e.action for e in AuditEvent.objects.filter(model_name=M).order_by("-id")[:2]] == [
        "endpoint.withdraw", "version.reject"]


def test_rejecting_a_version_clears_its_idle_slot_its_shadow_and_the_production_alias(team):
    alice = team["alice"]
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    services.shadow_start(model_name=M, version_number=2, actor=alice)
    services.bluegreen_deploy(model_name=M, version_number=2, actor=alice)
    services.alias_set(model_name=M, alias="production", version_number=2, actor=alice)
    services.alias_set(model_name=M, alias="staging", version_number=2, actor=alice)
    services.model_update(name=M, requires_approval=True, actor=alice)
    reject_2(team)
    e = ep()
    assert (e.live_color, e.blue.number, e.green_id, e.shadow_id) == ("blue", 1, None, None)
    assert sorted(Alias.objects.values_list("name", flat=True)) == ["staging"]
    withdraw = AuditEvent.objects.get(action="endpoint.withdraw")
    assert withdraw.after["details"]["ended"] == ["idle green slot", "shadow"]
    removed = AuditEvent.objects.get(action="alias.remove")
    assert (removed.before, removed.reason) == ({"alias": "production", "version": 2},
                                                "rejected: bias found")


def test_rejecting_the_live_version_is_refused_until_it_is_rolled_back_then_unloads_it(team):
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    services.endpoint_deploy(model_name=M, version_number=2, actor=team["alice"])
    services.model_update(name=M, requires_approval=True, actor=team["alice"])
    r = api(team["bob"].user).post(f"/api/v1/models/{M}/versions/2/reject/",
                                   {"comment": "bias found"}, format="json")
    assert r.status_code == 409
    assert r.json()["error"] == ("version 2 of 'fraud' is the stable: roll back or deploy "
                                 "another version of 'fraud' before rejecting it")
    assert ModelVersion.objects.get(model__name=M, number=2).approval == "approved"
    assert not AuditEvent.objects.filter(action="version.reject").exists()
    services.rollback(model_name=M, version_number=1, actor=team["alice"])
    v2 = ModelVersion.objects.get(model__name=M, number=2)
    assert v2.pk in ep().warm_versions  # kept loaded for an instant way back
    reject_2(team)
    assert ep().stable.number == 1 and v2.pk not in ep().warm_versions  # no pinned requests
    event = AuditEvent.objects.get(action="endpoint.withdraw")
    assert event.after["details"] == {"version": 2, "ended": ["warm"]}


def test_rejecting_a_step_ends_the_traffic_of_a_pipeline_that_runs_it(team):
    alice = team["alice"]
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    pipeline_create(model_name=PIPE, spec=pipeline_spec(), actor=alice)
    spec = pipeline_spec()
    spec["steps"][0]["version"] = 3
    pipeline_create(model_name=PIPE, spec=spec, actor=alice)
    services.endpoint_deploy(model_name=PIPE, version_number=2, actor=alice)   # over fraud:3
    services.shadow_start(model_name=PIPE, version_number=1, actor=alice)      # over fraud:2
    services.model_update(name=M, requires_approval=True, actor=alice)
    reject_2(team)
    assert Endpoint.objects.get(model__name=PIPE).shadow_id is None
    event = AuditEvent.objects.get(action="endpoint.withdraw")
    assert (event.model_name, event.after["details"]) == (PIPE, {"version": 1,
                                                                 "ended": ["shadow"]})
    with pytest.raises(LifecycleError, match="runs step 'score' on version 2 of 'fraud', which "
                                             "is rejected: it cannot shadow live traffic"):
        services.shadow_start(model_name=PIPE, version_number=1, actor=alice)


def test_rejecting_a_step_of_a_live_pipeline_is_refused(team):
    services.version_approve(model_name=M, number=2, actor=team["bob"])
    pipeline_create(model_name=PIPE, spec=pipeline_spec(), actor=team["alice"])
    services.endpoint_deploy(model_name=PIPE, version_number=1, actor=team["alice"])
    services.model_update(name=M, requires_approval=True, actor=team["alice"])
    with pytest.raises(LifecycleError) as caught:
        reject_2(team)
    assert caught.value.message == (
        "version 2 of 'fraud' is a step of version 1 of 'pipe', which is the stable: roll back "
        "or deploy another version of 'pipe' before rejecting it")
    assert ModelVersion.objects.get(model__name=M, number=2).approval == "approved"


def test_a_rejection_where_approval_is_not_required_changes_no_traffic(team):
    services.canary_start(model_name=M, version_number=2, weight=30, actor=team["alice"])
    reject_2(team)
    assert ep().candidate.number == 2 and ep().candidate_weight == 30
    assert not AuditEvent.objects.filter(action="endpoint.withdraw").exists()
