"""Deployments as code (docs/guide/as-code.md): an mmc.yaml is planned (what would change,
resource by resource, changing nothing) and applied through the registry's own audited services,
all or nothing, in a safe order; a second apply changes nothing and says so; prune removes only
what the file's sections no longer name, and only when asked; every refusal carries the refusing
rule's message and leaves nothing half-applied; a file the schema refuses is refused with the
path of the key; the export is such a file, and planning it shows no change."""

from __future__ import annotations

import hashlib
import json

import onnx
import pytest
import yaml

from registry import samples, services
from registry.audit import Actor
from registry.errors import Forbidden, InvalidRequest, LifecycleError
from registry.models import (
    Alias,
    AuditEvent,
    Endpoint,
    ModelVersion,
    RegisteredModel,
    VersionStatus,
    WebhookSubscription,
)
from registry.services import as_code
from registry.services import webhooks as hooks
from registry.signatures import extract_signature

ME = Actor.system("spec")
# Canaries with an analysis plan start only while the analysis tick runs (registry.ticks).
ticking = pytest.mark.usefixtures("analysis_ticking")


def make_model(name: str, count: int = 3, *, incompatible: tuple[int, ...] = (),
               **attributes) -> RegisteredModel:
    """A model with ready versions 1..count (real signatures; never served here). A version in
    `incompatible` takes 3 inputs instead of 4: a canary of it is refused."""
    model = services.model_create(name=name, actor=ME)
    if attributes:
        services.model_update(name=name, actor=ME, **attributes)
    for number in range(1, count + 1):
        blob = samples.mlp(n_in=3 if number in incompatible else 4, hidden=(8,), n_out=2,
                           seed=number)
        ModelVersion.objects.create(
            model=model, number=number, sha256=hashlib.sha256(blob).hexdigest(),
            size_bytes=len(blob), status=VersionStatus.READY,
            signature=extract_signature(onnx.load_from_string(blob)))
    return model


def text(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=False)


def plan(document: dict | str, **kwargs) -> dict:
    return as_code.config_plan(text=document if isinstance(document, str) else text(document),
                               actor=kwargs.pop("actor", ME), **kwargs).as_dict()


def apply(document: dict | str, **kwargs) -> dict:
    return as_code.config_apply(text=document if isinstance(document, str) else text(document),
                                actor=kwargs.pop("actor", ME), **kwargs).as_dict()


def routing(name: str) -> dict:
    """The endpoint's routing keys as the export writes them."""
    exported = yaml.safe_load(as_code.export_text(include_webhooks=False, schema_url="x"))
    endpoint = exported["models"][name].get("endpoint", {})
    return {k: v for k, v in endpoint.items()
            if k in ("stable", "candidate", "weight", "analysis", "blue_green", "shadow")}


def resources(outcome: dict) -> dict[str, str]:
    return {c["resource"]: c["action"] for c in outcome["changes"]}


FRAUD = {
    "models": {
        "fraud": {
            "description": "card fraud scorer",
            "tags": ["team:risk", "pii"],
            "aliases": {"production": 1, "staging": 2},
            "versions": {2: {"max_batch_size": 8, "max_queue_delay_us": 500}},
            "endpoint": {"stable": "production", "candidate": "staging", "weight": 10,
                         "scale_to_zero_after_seconds": 600,
                         "rate_limits": {"rps": 50, "burst": 100}},
        },
    },
}


# -- plan and apply -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_plan_lists_each_change_resource_by_resource_and_changes_nothing():
    make_model("fraud")
    events = AuditEvent.objects.count()
    outcome = plan(FRAUD)
    assert resources(outcome) == {
        "model fraud": "update", "version fraud:2": "update", "alias fraud@production": "create",
        "alias fraud@staging": "create", "endpoint fraud": "create"}
    endpoint = next(c for c in outcome["changes"] if c["resource"] == "endpoint fraud")
    assert endpoint["before"] == {"scale_to_zero_after_seconds": 0,
                                  "rate_limits": {"rps": 0.0, "burst": 0}, "stable": None}
    assert endpoint["after"] == {"scale_to_zero_after_seconds": 600,
                                 "rate_limits": {"rps": 50.0, "burst": 100},
                                 "stable": 1, "candidate": 2, "weight": 10}
    assert endpoint["steps"][-2:] == ["deploy version 1 as the stable",
                                      "start a canary of version 2 at 10 %"]
    assert outcome["summary"] == {"create": 3, "update": 2, "delete": 0}
    assert outcome["detail"] == "3 to create, 2 to update, 0 to delete"
    assert outcome["applied"] is False and outcome["audit_event"] is None
    # nothing was changed, nothing audited
    assert AuditEvent.objects.count() == events
    assert not Endpoint.objects.filter(model__name="fraud").exists()
    assert not Alias.objects.exists()
    assert RegisteredModel.objects.get(name="fraud").description == ""


@pytest.mark.django_db
def test_apply_makes_the_registry_what_the_file_says_through_the_audited_services():
    make_model("fraud")
    file = text(FRAUD)
    outcome = apply(file, source="0123abc")
    assert outcome["applied"] is True and outcome["detail"] == (
        "applied: 3 created, 2 updated, 0 deleted")
    model = RegisteredModel.objects.get(name="fraud")
    assert (model.description, model.tags) == ("card fraud scorer", ["pii", "team:risk"])
    v2 = model.versions.get(number=2)
    assert (v2.max_batch_size, v2.max_queue_delay_us) == (8, 500)
    assert dict(model.aliases.values_list("name", "version__number")) == {
        "production": 1, "staging": 2}
    ep = Endpoint.objects.get(model=model)
    assert (ep.stable.number, ep.candidate.number, ep.candidate_weight) == (1, 2, 10)
    assert (ep.scale_to_zero_after_seconds, ep.rate_limit_rps, ep.rate_limit_burst) == (
        600, 50.0, 100)
    # each change is the service's own audit event, saying where it came from ...
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["model.create", "model.update", "version.configure",
                       "endpoint.scale_to_zero", "limits.set", "alias.set", "alias.set",
                       "endpoint.deploy", "endpoint.canary", "config.apply"]
    canary = AuditEvent.objects.get(action="endpoint.canary")
    assert canary.reason == "mmc apply of 0123abc"
    # ... and the apply's own event holds the file's sha256, its source and the changes
    event = AuditEvent.objects.get(action="config.apply")
    assert event.pk == outcome["audit_event"] and event.target == "0123abc"
    assert event.after["sha256"] == hashlib.sha256(file.encode()).hexdigest()
    assert event.after["source"] == "0123abc" and event.after["prune"] is False
    assert [c["resource"] for c in event.after["changes"]] == [
        c["resource"] for c in outcome["changes"]]


@pytest.mark.django_db
def test_capture_settings_are_applied_through_the_capture_service_and_exported():
    make_model("fraud")
    file = {"models": {"fraud": {"endpoint": {"stable": 1, "capture": {
        "percent": 12.5, "mode": "inputs", "retention_days": 14}}}}}
    outcome = apply(file)
    endpoint = next(c for c in outcome["changes"] if c["resource"] == "endpoint fraud")
    assert endpoint["after"]["capture"] == {"percent": 12.5, "mode": "inputs",
                                            "retention_days": 14}
    assert "capture percent 12.5, mode inputs, retention_days 14" in endpoint["steps"]
    ep = Endpoint.objects.get(model__name="fraud")
    assert (float(ep.capture_percent), ep.capture_mode, ep.capture_retention_days) == (
        12.5, "inputs", 14)
    event = AuditEvent.objects.get(action="endpoint.capture")
    assert event.after == {"percent": 12.5, "mode": "inputs", "retention_days": 14}
    assert apply(file)["changes"] == []  # idempotent
    exported = yaml.safe_load(as_code.export_text(include_webhooks=False, schema_url="x"))
    assert exported["models"]["fraud"]["endpoint"]["capture"] == {
        "percent": 12.5, "mode": "inputs", "max_bytes": 65536, "retention_days": 14}
    assert exported["models"]["fraud"]["team"] == "default"
    assert plan(exported)["changes"] == []  # export, then plan: no change
    with pytest.raises(InvalidRequest, match="at most three decimals") as refused:
        apply({"models": {"fraud": {"endpoint": {"capture": {"percent": 0.0001}}}}})
    assert refused.value.field == "percent"


@pytest.mark.django_db
def test_a_second_apply_changes_nothing_and_says_so():
    make_model("fraud")
    apply(FRAUD, source="one")
    events = AuditEvent.objects.count()
    again = apply(FRAUD, source="two")
    assert again["changes"] == [] and again["applied"] is False
    assert again["detail"] == "no changes: the registry already matches the file"
    assert AuditEvent.objects.count() == events  # nothing changed, nothing audited
    assert plan(FRAUD)["changes"] == []


@pytest.mark.django_db
def test_a_section_the_file_leaves_out_is_left_as_it_is():
    make_model("fraud", description="kept", tags=["a"])
    services.endpoint_deploy(model_name="fraud", version_number=2, actor=ME)
    services.alias_set(model_name="fraud", alias="production", version_number=2, actor=ME)
    outcome = plan({"models": {"fraud": {"requires_approval": False}}})
    assert outcome["changes"] == []
    # an endpoint section without stable or blue_green leaves the routing alone
    outcome = apply({"models": {"fraud": {"endpoint": {"scale_to_zero_after_seconds": 60}}}})
    assert resources(outcome) == {"endpoint fraud": "update"}
    assert routing("fraud") == {"stable": 2}


@pytest.mark.django_db
def test_a_model_the_file_names_is_created():
    outcome = apply({"models": {"churn": {"description": "d", "tags": ["x"],
                                          "requires_approval": True}}})
    assert resources(outcome) == {"model churn": "create"}
    model = RegisteredModel.objects.get(name="churn")
    assert (model.description, model.tags, model.requires_approval) == ("d", ["x"], True)
    assert plan({"models": {"churn": {"description": "d", "requires_approval": True}}})[
        "changes"] == []


# -- routing: every shape, from every shape --------------------------------------------------------


ANALYSIS = {"steps": [10, 50, 100], "bake_seconds": 0, "min_requests": 10}
JOURNEY = [
    ({"stable": 1}, ["deploy version 1 as the stable"]),
    ({"stable": 1, "candidate": 2, "weight": 10}, ["start a canary of version 2 at 10 %"]),
    ({"stable": 1, "candidate": 2, "weight": 25}, ["set the candidate's weight to 25 %"]),
    ({"stable": 2}, ["promote the candidate (version 2)"]),
    ({"stable": 2, "shadow": 3}, ["shadow version 3"]),
    ({"blue_green": {"live": 2, "idle": 3}}, ["load version 3 into the idle slot",
                                              "stop the shadow (version 3)"]),
    ({"blue_green": {"live": 3, "idle": 2}}, ["switch traffic to version 3"]),
    ({"blue_green": {"live": 3, "idle": 1}}, ["load version 1 into the idle slot"]),
    ({"stable": 3}, ["finish blue-green (version 3 stays)"]),
    ({"stable": 3, "candidate": 1, "analysis": ANALYSIS},
     ["start a canary of version 1 under analysis"]),
    ({"stable": 3, "candidate": 1, "weight": 5},
     ["pause the analysis (weights by hand)", "set the candidate's weight to 5 %"]),
    ({"stable": 2, "candidate": 1, "weight": 5},
     ["abort the canary of version 1", "deploy version 2 as the stable",
      "start a canary of version 1 at 5 %"]),
    ({"blue_green": {"live": 1, "idle": 2}},
     ["promote the candidate (version 1)", "load version 2 into the idle slot"]),
    ({"stable": 2}, ["switch traffic to version 2", "finish blue-green (version 2 stays)"]),
    ({"stable": None}, ["stop serving (undeploy)"]),
]


@ticking
@pytest.mark.django_db
def test_each_routing_the_file_declares_is_reached_through_the_state_machine():
    make_model("fraud")
    for wanted, steps in JOURNEY:
        document = {"models": {"fraud": {"endpoint": wanted}}}
        outcome = apply(document)
        endpoint = next(c for c in outcome["changes"] if c["resource"] == "endpoint fraud")
        assert endpoint["steps"] == steps, wanted
        expected = dict(wanted)
        if "analysis" in expected:
            expected["analysis"] = {**expected["analysis"], "bake_seconds": 0.0,
                                    "max_p99_ratio": 1.5, "min_p99_increase_ms": 1.0,
                                    "max_error_rate": 0.01}
        assert routing("fraud") == expected, wanted
        assert plan(document)["changes"] == [], wanted


R = as_code.transitions.Route


@pytest.mark.parametrize("current, wanted, steps", [
    # into blue-green from the version the file makes idle: load the new one, then switch
    (R(state="stable", stable=2), R(state="blue-green", live=3, idle=2),
     [("bluegreen_deploy", {"version_number": 3}), ("bluegreen_switch", {})]),
    # both slots replaced: fill the idle slot, switch to it, fill the other
    (R(state="blue-green", live=1, idle=2), R(state="blue-green", live=3, idle=4),
     [("bluegreen_deploy", {"version_number": 3}), ("bluegreen_switch", {}),
      ("bluegreen_deploy", {"version_number": 4})]),
    # back to the version just switched away from
    (R(state="blue-green", live=2, idle=1, switched=True), R(state="blue-green", live=1, idle=2),
     [("bluegreen_switch_back", {})]),
    # a candidate that becomes the stable of a new canary
    (R(state="canary", stable=1, candidate=2, weight=50),
     R(state="canary", stable=2, candidate=3, weight=5),
     [("canary_promote", {}), ("canary_start", {"version_number": 3, "weight": 5})]),
    # an unload-first rollback under way to the file's version is left to finish ...
    (R(state="unloading", stable=1), R(state="stable", stable=1), []),
    # ... and any other change is put to the state machine, which refuses it
    (R(state="unloading", stable=1), R(state="stable", stable=2),
     [("endpoint_deploy", {"version_number": 2})]),
])
def test_route_steps_take_the_state_machines_own_path(current, wanted, steps):
    found = as_code.transitions.route_steps(current, wanted)
    assert [(s.service, s.args) for s in found] == steps


@ticking
@pytest.mark.django_db
def test_a_paused_analysis_is_resumed_and_one_that_promoted_is_done():
    make_model("fraud")
    wanted = {"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2,
                                                "analysis": ANALYSIS}}}}
    apply(wanted)
    services.analysis_pause(model_name="fraud", actor=ME)
    endpoint = plan(wanted)["changes"][0]
    assert endpoint["steps"] == ["resume the analysis"]
    apply(wanted)
    assert Endpoint.objects.get(model__name="fraud").rollout.analysis.paused is False
    # the analysis promotes its candidate: the file's canary is done, not started again
    services.canary_promote(model_name="fraud", actor=ME)
    assert plan(wanted)["changes"] == []


# -- prune --------------------------------------------------------------------------------------


@pytest.fixture
def outbound_allowed(settings):
    settings.OUTBOUND_ALLOW = ["127.0.0.1/32"]


@pytest.mark.django_db
def test_prune_removes_only_what_the_files_sections_no_longer_name(outbound_allowed, users):
    make_model("fraud")
    make_model("other")
    for alias, number in (("production", 1), ("old", 2)):
        services.alias_set(model_name="fraud", alias=alias, version_number=number, actor=ME)
    services.alias_set(model_name="other", alias="old", version_number=1, actor=ME)
    services.endpoint_deploy(model_name="other", version_number=1, actor=ME)
    hooks.webhook_create(url="http://127.0.0.1:9/kept", actor=ME)
    hooks.webhook_create(url="http://127.0.0.1:9/gone", actor=ME)
    admin = Actor(user=users["admin"], name="admin")
    document = {"models": {"fraud": {"aliases": {"production": 1}}},
                "webhooks": [{"url": "http://127.0.0.1:9/kept"}]}
    # without prune nothing is removed; the answer says what prune would remove
    outcome = apply(document, actor=admin)
    assert outcome["changes"] == [] and outcome["not_pruned"] == [
        "alias fraud@old", "webhook http://127.0.0.1:9/gone"]
    assert Alias.objects.count() == 3 and WebhookSubscription.objects.count() == 2
    outcome = plan(document, actor=admin, prune=True)
    assert resources(outcome) == {"alias fraud@old": "delete",
                                  "webhook http://127.0.0.1:9/gone": "delete"}
    outcome = apply(document, actor=admin, prune=True)
    assert outcome["summary"] == {"create": 0, "update": 0, "delete": 2}
    assert set(Alias.objects.values_list("model__name", "name")) == {
        ("fraud", "production"), ("other", "old")}  # a model the file does not name is not its
    assert list(WebhookSubscription.objects.values_list("url", flat=True)) == [
        "http://127.0.0.1:9/kept"]
    # models, versions and endpoints are never pruned
    assert set(RegisteredModel.objects.values_list("name", flat=True)) == {"fraud", "other"}
    assert ModelVersion.objects.count() == 6
    assert routing("other") == {"stable": 1}
    assert AuditEvent.objects.filter(action="config.apply").latest("id").after["prune"] is True


@pytest.mark.django_db
def test_a_webhooks_secret_comes_from_the_variable_its_secret_env_names(users, outbound_allowed):
    from mmc.as_code import secrets_from_environment

    admin = Actor(user=users["admin"], name="admin")
    document = {"webhooks": [{"url": "http://127.0.0.1:9/hook", "active": False,
                              "secret_env": "HOOK_SECRET"}]}
    assert secrets_from_environment(text(document), {"HOOK_SECRET": "a" * 20, "OTHER": "b"}) == {
        "HOOK_SECRET": "a" * 20}
    apply(document, actor=admin, secrets={"HOOK_SECRET": "a" * 20})
    assert WebhookSubscription.objects.get().secret == "a" * 20
    assert plan(document, actor=admin, secrets={"HOOK_SECRET": "a" * 20})["changes"] == []
    assert plan(document, actor=admin)["changes"] == []  # not sent: the secret is kept
    outcome = apply(document, actor=admin, secrets={"HOOK_SECRET": "b" * 20})
    assert [(c["before"], c["after"]) for c in outcome["changes"]] == [
        ({"secret": "(kept)"}, {"secret": "(from HOOK_SECRET)"})]
    assert WebhookSubscription.objects.get().secret == "b" * 20
    logged = json.dumps(list(AuditEvent.objects.values_list("before", "after")))
    assert "a" * 20 not in logged and "b" * 20 not in logged  # never in the audit log
    with pytest.raises(InvalidRequest) as short:
        plan(document, actor=admin, secrets={"HOOK_SECRET": "short"})
    assert short.value.field == "webhooks[0].secret_env"
    assert "secret" not in as_code.export_text(include_webhooks=True, schema_url="x")


# -- refusals -----------------------------------------------------------------------------------


def _refused(document: dict, error_type=LifecycleError, **kwargs) -> str:
    """The message both plan and apply are refused with (the same), after checking that the
    apply left everything as it was and audited its refusal."""
    before = _snapshot()
    with pytest.raises(error_type) as planned:
        plan(document, **kwargs)
    with pytest.raises(error_type) as applied:
        apply(document, source="pr-7", **kwargs)
    assert planned.value.message == applied.value.message
    assert _snapshot() == before, "half-applied"
    refusal = AuditEvent.objects.filter(action="config.apply.refused").latest("id")
    assert refusal.after["error"] == applied.value.message and refusal.target == "pr-7"
    return applied.value.message


def _snapshot() -> dict:
    return {
        "models": list(RegisteredModel.objects.order_by("name").values(
            "name", "description", "tags", "requires_approval")),
        "versions": list(ModelVersion.objects.order_by("pk").values(
            "pk", "max_batch_size", "response_cache")),
        "aliases": list(Alias.objects.order_by("pk").values("name", "version_id")),
        "endpoints": list(Endpoint.objects.order_by("pk").values(
            "stable_id", "candidate_id", "candidate_weight", "shadow_id", "revision",
            "rate_limit_rps", "scale_to_zero_after_seconds")),
        "audit": list(AuditEvent.objects.exclude(action="config.apply.refused")
                      .values_list("pk", flat=True)),
    }


@pytest.mark.django_db
def test_an_unapproved_version_is_refused_with_the_gates_message_and_nothing_is_applied():
    make_model("fraud", requires_approval=True)
    ModelVersion.objects.filter(model__name="fraud", number=1).update(approval="approved")
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=ME)
    message = _refused({"models": {"fraud": {
        "description": "changed before the routing",  # phase 1: rolled back with the rest
        "versions": {1: {"response_cache": True}},
        "endpoint": {"stable": 1, "candidate": 2, "weight": 10}}}})
    assert "version 2 of 'fraud'" in message and "approv" in message
    assert "it cannot become the canary candidate (10 %)" in message


@pytest.mark.django_db
def test_an_incompatible_signature_is_refused_with_the_canarys_message():
    make_model("fraud", incompatible=(2,))
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=ME)
    message = _refused({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2,
                                                           "weight": 10}}}})
    assert message.startswith("version 2's signature is incompatible with the stable version "
                              "1's: ")


@pytest.mark.django_db
def test_a_refusal_late_in_the_file_undoes_what_came_before_it():
    """All or nothing: the first endpoint is changed, the second is refused (its version is
    not ready): neither is kept."""
    make_model("alpha")
    make_model("beta")
    ModelVersion.objects.filter(model__name="beta", number=2).update(
        status=VersionStatus.FAILED, failure_reason="bad graph")
    message = _refused({"models": {"alpha": {"endpoint": {"stable": 1}, "aliases": {"p": 1}},
                                   "beta": {"endpoint": {"stable": 2}}}})
    assert "version 2 of 'beta'" in message and "failed" in message


@pytest.mark.django_db
def test_a_state_that_forbids_a_step_is_refused_in_the_state_machines_words():
    make_model("fraud")
    services.endpoint_deploy(model_name="fraud", version_number=2, actor=ME)
    Endpoint.objects.filter(model__name="fraud").update(stable=None, rollout_state={
        "pending_rollback": {"version": 1, "since": "2030-01-01T00:00:00+00:00"}})
    message = _refused({"models": {"fraud": {"endpoint": {"stable": 3}}}})
    assert message.startswith("cannot deploy endpoint 'fraud': it is in state 'unloading'")


@pytest.mark.django_db
def test_webhooks_need_the_admin_role(users, outbound_allowed):
    make_model("fraud")
    engineer = Actor(user=users["engineer"], name="engineer")
    message = _refused({"webhooks": [{"url": "http://127.0.0.1:9/hook"}]}, error_type=Forbidden,
                       actor=engineer)
    assert message == ("the file's webhooks section needs the admin role, as the webhook API "
                       "does")


# -- the file's shape ---------------------------------------------------------------------------


@pytest.mark.parametrize("file, path, message", [
    ({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2, "weight": 150}}}},
     "models.fraud.endpoint.weight", "must be an integer from 0 to 100"),
    ({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2, "weight": 10.5}}}},
     "models.fraud.endpoint.weight", "must be an integer from 0 to 100"),
    ({"models": {"fraud": {"endpoint": {"stable": 1, "wieght": 10}}}},
     "models.fraud.endpoint.wieght", "unknown key (known keys: analysis, blue_green, "
                                     "candidate, capture, rate_limits, "
                                     "scale_to_zero_after_seconds, shadow, stable, weight)"),
    ({"models": {"fraud": {"endpoint": {"capture": {"percent": 120}}}}},
     "models.fraud.endpoint.capture.percent", "must be a number from 0 to 100"),
    ({"models": {"fraud": {"endpoint": {"capture": {"mode": "all"}}}}},
     "models.fraud.endpoint.capture.mode", "must be inputs, outputs or both"),
    ({"models": {"fraud": {"team": "Risk Team"}}}, "models.fraud.team", "must be a team name"),
    ({"models": {"fraud": {"tags": "risk"}}}, "models.fraud.tags", "must be a list of tags"),
    ({"models": {"Fraud!": {}}}, "models.Fraud!", "a model name is 1-100 lowercase letters, "
                                                  "digits, '-', '_' or '.', starting with a "
                                                  "letter or digit"),
    ({"models": {"fraud": {"aliases": {"production": "latest"}}}},
     "models.fraud.aliases.production", "must be a version number or sha256:<64 hex digits>"),
    ({"models": {"fraud": {"versions": {2: {"instance_count": 40}}}}},
     "models.fraud.versions.2.instance_count", "must be an integer from 1 to 16"),
    ({"models": {"fraud": {"endpoint": {"weight": 5}}}},
     "models.fraud.endpoint.weight", "needs candidate too"),
    ({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2, "weight": 5,
                                        "analysis": {}}}}},
     "models.fraud.endpoint.weight", "is not used with analysis (the analysis sets the weight)"),
    ({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2,
                                        "analysis": {"steps": [50, 10]}}}}},
     "models.fraud.endpoint.analysis.steps", "must be increasing whole percentages from 1 to "
                                             "100"),
    ({"models": {"fraud": {"endpoint": {"blue_green": {"live": 1}}}}},
     "models.fraud.endpoint.blue_green.idle", "is required"),
    ({"webhooks": [{"url": "http://x", "events": ["canary.started", "bogus"]}]},
     "webhooks[0].events[1]", "must be one of bluegreen.switched, canary.promoted, "
                              "canary.rolled_back, canary.started, endpoint.rolled_back, "
                              "job.finished, monitor.drift, ping, version.approved, "
                              "version.failed, version.ready, version.rejected"),
    ({"webhooks": [{"url": "http://x"}, {"url": "http://x"}]},
     "webhooks[1].url", "is also webhooks[0]'s: a webhook is known by its url"),
    ({"modles": {}}, "modles", "unknown key (known keys: $schema, format, models, webhooks)"),
])
@pytest.mark.django_db
def test_a_file_the_schema_refuses_is_refused_with_the_path_of_the_key(file, path, message):
    with pytest.raises(InvalidRequest) as refused:
        plan(file)
    assert refused.value.field == path
    assert refused.value.message.startswith(f"{path}: {message}"), refused.value.message
    assert refused.value.details["errors"][0] == {"path": path, "message": message}


@pytest.mark.parametrize("file, message", [
    ("models: [1\n", "the file is not valid YAML or JSON: expected ',' or ']', but got "
                     "'<stream end>' (line 2, column 1)"),
    ("models:\n  a: &x {}\n  b: *x\n", "the file is not valid YAML or JSON: anchors and "
                                       "aliases (& and *) are not accepted (line 3, column 6)"),
    ("models:\n  a: {}\n  a: {}\n", "the file is not valid YAML or JSON: the key 'a' is given "
                                    "twice (line 3, column 3)"),
    ("- models\n", "the file must be a mapping (models:, webhooks:)"),
    ("[" * 5000 + "]" * 5000, "the file is"),
])
@pytest.mark.django_db
def test_a_file_that_is_not_a_mapping_of_names_is_refused_saying_where(file, message):
    with pytest.raises(InvalidRequest) as refused:
        plan(file)
    assert refused.value.message.startswith(message) and refused.value.field == "file"


@pytest.mark.django_db
def test_a_reference_that_does_not_resolve_is_refused_with_its_path():
    make_model("fraud", count=2)
    services.alias_set(model_name="fraud", alias="production", version_number=1, actor=ME)
    with pytest.raises(InvalidRequest) as refused:
        plan({"models": {"fraud": {"endpoint": {"stable": 9, "candidate": "canary",
                                                "shadow": "sha256:" + "0" * 64}},
                         "new": {"aliases": {"production": 1}}}})
    assert refused.value.details["errors"] == [
        {"path": "models.fraud.endpoint.stable", "message": "model 'fraud' has no version 9"},
        {"path": "models.fraud.endpoint.candidate", "message": "model 'fraud' has no alias "
                                                               "'canary'"},
        {"path": "models.fraud.endpoint.shadow",
         "message": "model 'fraud' has no version with sha256:000000000000…"},
        {"path": "models.new.aliases.production",
         "message": "model 'new' has no version 1 (the file creates it: a new model has no "
                    "versions)"}]


@pytest.mark.django_db
def test_versions_are_named_by_number_alias_or_sha256():
    model = make_model("fraud")
    sha3 = model.versions.get(number=3).sha256
    apply({"models": {"fraud": {
        "aliases": {"production": f"sha256:{sha3}"},
        "versions": {"production": {"response_cache": True}, 1: {"instance_count": 2}},
        "endpoint": {"stable": "production", "shadow": 1}}}})
    assert routing("fraud") == {"stable": 3, "shadow": 1}
    assert model.versions.get(number=3).response_cache is True
    assert model.versions.get(number=1).instance_count == 2


# -- export ---------------------------------------------------------------------------------------


@ticking
@pytest.mark.django_db
def test_export_then_plan_shows_no_change(users, outbound_allowed):
    admin = Actor(user=users["admin"], name="admin")
    make_model("fraud", description="scorer", tags=["team:risk"], requires_approval=False)
    make_model("churn")
    make_model("ranker")
    make_model("empty")
    services.alias_set(model_name="fraud", alias="production", version_number=1, actor=ME)
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=ME)
    services.canary_start(model_name="fraud", version_number=2, plan=ANALYSIS, actor=ME)
    services.shadow_start(model_name="fraud", version_number=3, actor=ME)
    services.version_configure(model_name="fraud", number=2, actor=ME, max_batch_size=4,
                               preferred_batch_sizes=[4, 2])
    services.limits_set(model_name="fraud", actor=ME, rps=2.5, daily_quota=1000)
    services.endpoint_deploy(model_name="churn", version_number=1, actor=ME)
    services.bluegreen_deploy(model_name="churn", version_number=2, actor=ME)
    services.bluegreen_switch(model_name="churn", actor=ME)
    services.endpoint_deploy(model_name="ranker", version_number=1, actor=ME)
    services.canary_start(model_name="ranker", version_number=3, weight=30, actor=ME)
    services.scale_to_zero_set(model_name="ranker", seconds=300, actor=ME)
    hooks.webhook_create(url="http://127.0.0.1:9/hook", model="fraud",
                         events=["canary.started"], name="ci", actor=ME)
    exported = as_code.export_text(include_webhooks=True, schema_url="http://c/s.json")
    assert exported.startswith("# yaml-language-server: $schema=http://c/s.json\n")
    document = yaml.safe_load(exported)
    assert document["models"]["fraud"]["endpoint"]["shadow"] == 3
    assert document["models"]["fraud"]["versions"] == {
        2: {"max_batch_size": 4, "preferred_batch_sizes": [2, 4]}}
    assert document["models"]["churn"]["endpoint"]["blue_green"] == {"live": 2, "idle": 1}
    assert "endpoint" not in document["models"]["empty"]  # never deployed: no endpoint
    assert "secret" not in exported
    assert plan(exported, actor=admin)["changes"] == []
    assert plan(exported, actor=admin, prune=True)["changes"] == []


@pytest.mark.django_db
def test_an_export_is_a_file_the_published_schema_accepts():
    from jsonschema import Draft202012Validator

    make_model("fraud")
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=ME)
    document = as_code.state.export_document(include_webhooks=True)
    Draft202012Validator(as_code.schema()).validate(json.loads(json.dumps(document)))


# -- over HTTP ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_plan_and_apply_take_the_file_as_json_or_as_the_yaml_body_itself(client_for):
    make_model("fraud")
    engineer = client_for("engineer")
    file = text({"models": {"fraud": {"endpoint": {"stable": 1}}}})
    r = engineer.post("/api/v1/plan/", {"file": file}, format="json")
    assert r.status_code == 200, r.content
    assert [c["resource"] for c in r.json()["changes"]] == ["endpoint fraud"]
    assert r.json()["sha256"] == hashlib.sha256(file.encode()).hexdigest()
    # the document as a JSON object
    r = engineer.post("/api/v1/plan/", {"file": {"models": {"fraud": {"endpoint": {
        "stable": 1}}}}}, format="json")
    assert r.json()["summary"] == {"create": 1, "update": 0, "delete": 0}
    # the YAML itself as the body (curl --data-binary @mmc.yaml), source in the query string
    r = engineer.generic("POST", "/api/v1/apply/?source=abc123", file.encode(),
                         content_type="application/yaml")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["applied"] is True and body["source"] == "abc123"
    event = AuditEvent.objects.get(pk=body["audit_event"])
    assert (event.action, event.after["source"], event.after["sha256"]) == (
        "config.apply", "abc123", hashlib.sha256(file.encode()).hexdigest())
    assert event.actor_name == "engineer"


@pytest.mark.django_db(transaction=True)
def test_refusals_over_http_are_the_apis_json_errors(client_for):
    make_model("fraud", incompatible=(2,))
    services.endpoint_deploy(model_name="fraud", version_number=1, actor=ME)
    engineer = client_for("engineer")
    r = engineer.post("/api/v1/apply/", {"file": text({"models": {"fraud": {"endpoint": {
        "stable": 1, "candidate": 2, "weight": 101}}}})}, format="json")
    assert r.status_code == 400
    assert r.json()["error"] == "models.fraud.endpoint.weight: must be an integer from 0 to 100"
    assert r.json()["field"] == "models.fraud.endpoint.weight"
    r = engineer.post("/api/v1/apply/", {"file": text({"models": {"fraud": {"endpoint": {
        "stable": 1, "candidate": 2, "weight": 10}}}})}, format="json")
    assert r.status_code == 409 and "signature is incompatible" in r.json()["error"]
    r = engineer.post("/api/v1/plan/", {"file": 7}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "file"
    # a refused apply is in the audit log, whatever refused it
    refused = AuditEvent.objects.filter(action="config.apply.refused").order_by("id")
    assert [e.after["error"][:40] for e in refused] == [
        "models.fraud.endpoint.weight: must be an", "version 2's signature is incompatible wi"]
    assert refused[0].actor_name == "engineer"


@pytest.mark.django_db(transaction=True)
def test_roles_plan_and_apply_need_an_engineer_and_a_read_only_token_may_only_plan(client_for,
                                                                                    users):
    from rest_framework.test import APIClient

    make_model("fraud")
    file = {"file": text({"models": {"fraud": {"endpoint": {"stable": 1}}}})}
    viewer = client_for("viewer")
    assert viewer.post("/api/v1/plan/", file, format="json").status_code == 403
    assert viewer.post("/api/v1/apply/", file, format="json").status_code == 403
    assert viewer.get("/api/v1/export/").status_code == 200
    _, raw = services.token_create(username="engineer", name="pr", read_only=True, actor=ME)
    pr = APIClient()
    pr.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert pr.post("/api/v1/plan/", file, format="json").status_code == 200
    r = pr.post("/api/v1/apply/", file, format="json")
    assert r.status_code == 403 and "read-only" in r.json()["error"]
    assert APIClient().post("/api/v1/plan/", file, format="json").status_code == 401
    assert not Endpoint.objects.filter(model__name="fraud").exists()


@pytest.mark.django_db(transaction=True)
def test_the_export_is_yaml_an_admin_gets_the_webhooks_and_the_schema_is_public(
        client_for, outbound_allowed):
    from rest_framework.test import APIClient

    make_model("fraud")
    hooks.webhook_create(url="http://127.0.0.1:9/hook", actor=ME, secret="s" * 32)
    r = client_for("admin").get("/api/v1/export/")
    assert r.status_code == 200 and r["Content-Type"].startswith("application/yaml")
    exported = r.content.decode()
    assert exported.startswith(
        "# yaml-language-server: $schema=http://testserver/api/v1/mmc.schema.json\n")
    assert yaml.safe_load(exported)["webhooks"] == [{
        "url": "http://127.0.0.1:9/hook", "model": None, "name": "", "events": [],
        "active": True}]
    assert "s" * 32 not in exported
    assert "webhooks" not in yaml.safe_load(client_for("engineer").get("/api/v1/export/").content)
    r = APIClient().get("/api/v1/mmc.schema.json")  # an editor sends no token
    assert r.status_code == 200 and r.json() == as_code.schema()


def test_the_published_schema_holds_the_limits_the_services_check():
    from registry.choices import GraphOptimizationLevel
    from registry.integrations.webhooks import EVENTS
    from registry.services.limits import FIELDS
    from registry.services.scaling import MAX_IDLE_SECONDS
    from registry.services.versions import CONFIG_FIELDS, SERVING_FIELDS

    defs = as_code.schema()["$defs"]
    settings = defs["servingSettings"]["properties"]
    assert set(settings) == set(SERVING_FIELDS)
    for name, (_, low, high) in CONFIG_FIELDS.items():
        assert (settings[name]["minimum"], settings[name]["maximum"]) == (low, high), name
    assert settings["graph_optimization_level"]["enum"] == GraphOptimizationLevel.values
    limits = defs["endpoint"]["properties"]["rate_limits"]["properties"]
    assert {name: limits[name]["maximum"] for name in limits} == {
        name: top for name, (top, _, _) in FIELDS.items()}
    endpoint = defs["endpoint"]["properties"]
    assert endpoint["scale_to_zero_after_seconds"]["maximum"] == MAX_IDLE_SECONDS
    assert defs["webhook"]["properties"]["events"]["items"]["enum"] == EVENTS


# -- the command line ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_mmc_plan_exits_2_on_changes_and_0_without_and_apply_then_export_state(
        users, monkeypatch, capsys, tmp_path):
    from tests.cli_inprocess import cli, inprocess_cli

    make_model("fraud")
    token = services.token_create(username="engineer", name="cli", actor=ME)[1]
    file = tmp_path / "mmc.yaml"
    file.write_text(text({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2,
                                                            "weight": 10}}}}))

    def mmc(*args: str) -> tuple[int, str, str]:
        code = cli.main(["--url", "http://testserver", "--token", token, *args])
        out, err = capsys.readouterr()
        return code, out, err

    with inprocess_cli(token, monkeypatch, capsys):
        code, out, _ = mmc("plan", "-f", str(file))
        assert code == 2, out
        assert out.splitlines() == [
            "+ endpoint fraud", "    stable: 1", "    candidate: 2", "    weight: 10",
            "    1. deploy version 1 as the stable", "    2. start a canary of version 2 at 10 %",
            "1 to create, 0 to update, 0 to delete"]
        code, out, err = mmc("apply", "-f", str(file), "--source", "f00d")
        assert code == 0 and "source f00d" in err, err
        assert out.rstrip().endswith("applied: 1 created, 0 updated, 0 deleted")
        code, out, _ = mmc("plan", "-f", str(file))
        assert (code, out) == (0, "no changes: the registry already matches the file\n")
        state = tmp_path / "state.yaml"
        assert mmc("export-state", "-o", str(state))[0] == 0
        assert mmc("plan", "-f", str(state))[0] == 0
        code, out, _ = mmc("plan", "-f", str(state), "--json")
        assert code == 0 and json.loads(out)["changes"] == []
        # a refusal is exit 1 with the server's message, naming the key
        file.write_text(text({"models": {"fraud": {"endpoint": {"stable": 1, "weigth": 1}}}}))
        code, _, err = mmc("plan", "-f", str(file))
        assert code == 1 and err.startswith("mmc: 400: models.fraud.endpoint.weigth: unknown key")


# -- the console ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_console_lists_the_last_applies_with_their_diff(users, outbound_allowed):
    from django.test import Client

    make_model("fraud")
    admin = Actor(user=users["admin"], name="admin")
    apply({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2, "weight": 10}}},
           "webhooks": [{"url": "http://127.0.0.1:9/hook", "active": False}]}, actor=admin,
          source="c0ffee1")
    with pytest.raises(LifecycleError):
        apply({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2, "weight": 10,
                                                 "shadow": 1}}}}, source="badbad2")
    apply({"models": {"fraud": {"endpoint": {"stable": 1, "candidate": 2, "weight": 25}}}},
          source="beef003")

    def page(role: str) -> str:
        client = Client()
        client.force_login(users[role])
        r = client.get("/applies/")
        assert r.status_code == 200
        return r.content.decode()

    html = page("engineer")
    assert html.index("beef003") < html.index("badbad2") < html.index("c0ffee1")  # newest first
    assert "version 1 is the live version; shadow another" in html  # the refusal, as refused
    assert '<td><code>weight</code></td><td class="mono">10</td><td class="mono">25</td>' in html
    assert ('<td class="muted" title="unchanged"><code>stable</code></td>'
            '<td class="mono muted">1</td>') in html
    assert "<li>deploy version 1 as the stable</li>" in html
    assert "http://127.0.0.1:9/hook" not in html and "and 1 change you may not see" in html
    assert 'href="/applies/"' in html  # in the nav for engineers
    assert "http://127.0.0.1:9/hook" in page("admin")
    viewer = Client()
    viewer.force_login(users["viewer"])
    assert viewer.get("/applies/").status_code == 403
    assert 'href="/applies/"' not in viewer.get("/models/").content.decode()
    admin_client = Client()
    admin_client.force_login(users["admin"])
    assert 'href="/applies/"' in admin_client.get("/audit/").content.decode()
