"""Deleting: a version nothing holds (no role on its endpoint, no pipeline step, no alias, no
queued or running job, no validation in progress) is deleted by an engineer or admin through
the API, the CLI or the console, audited with what was removed; its blob goes with the next
garbage collection unless another version shares it. A held version is a 409 naming every hold.
A model goes with all its versions when none is held from outside it."""

from __future__ import annotations

import hashlib
import html
import importlib
from datetime import timedelta

import onnx
import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from registry import samples, services
from registry.audit import Actor
from registry.models import (
    Alias,
    AuditEvent,
    Endpoint,
    Job,
    JobKind,
    ModelVersion,
    RegisteredModel,
    VersionStatus,
)
from registry.services.pipelines import pipeline_create
from registry.signatures import extract_signature
from registry.store.artifacts import default_store
from registry.store.gc import collect_garbage
from tests.cli_inprocess import inprocess_cli

cli = importlib.import_module("registry.cli.main")  # the package re-exports main()
M = "fraud"
A = Actor.system("setup")


def person(name: str, role: str) -> User:
    user = User.objects.create_user(username=name, password=f"{name}-password-1")
    user.groups.add(Group.objects.get(name=role))
    return user


def add_version(model: str, number: int, data: bytes) -> ModelVersion:
    """A ready version whose artifact is really in the store (the GC sees it)."""
    blob = default_store().save_bytes(data)
    return ModelVersion.objects.create(
        model=RegisteredModel.objects.get(name=model), number=number, sha256=blob.sha256,
        size_bytes=blob.size, status=VersionStatus.READY,
        signature=extract_signature(onnx.load_from_string(data)))


@pytest.fixture
def team(db, settings, tmp_path):
    """`fraud` v1 (stable), v2 and v3 (idle), each its own artifact; an engineer, an admin and
    a viewer. The store is a folder of this test's own, so the GC sees only these blobs."""
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    services.ensure_roles()
    users = {role: person(role, role) for role in ("engineer", "admin", "viewer")}
    services.model_create(name=M, actor=A)
    for number in (1, 2, 3):
        add_version(M, number, samples.mlp(seed=number))
    services.endpoint_deploy(model_name=M, version_number=1, actor=A)
    return users


def api(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def blob_exists(sha: str) -> bool:
    return default_store().stat(sha) is not None


def sha_of(model: str, number: int) -> str:
    return ModelVersion.objects.get(model__name=model, number=number).sha256


# ------------------------------------------------------------------------------- a version


def test_an_idle_version_is_deleted_gone_from_lists_and_audited_with_what_was_removed(team):
    sha = sha_of(M, 2)
    r = api(team["engineer"]).delete(f"/api/v1/models/{M}/versions/2/?reason=superseded")
    assert r.status_code == 204, r.content
    client = api(team["viewer"])
    assert client.get(f"/api/v1/models/{M}/versions/2/").status_code == 404
    listed = client.get(f"/api/v1/models/{M}/versions/").json()
    assert [v["number"] for v in listed["results"]] == [3, 1]
    assert client.get(f"/api/v1/models/{M}/").json()["version_count"] == 2
    event = AuditEvent.objects.get(action="version.delete")
    assert (event.target, event.model_name, event.actor_name, event.reason) == (
        "fraud:2", M, "engineer", "superseded")
    assert event.before["number"] == 2 and event.before["sha256"] == sha
    assert event.before["blob"] == "unreferenced: removed by the next garbage collection"


def test_the_gc_collects_an_unshared_blob_and_keeps_one_another_version_shares(team):
    services.model_create(name="copy", actor=A)
    add_version("copy", 1, samples.mlp(seed=3))  # the same bytes as fraud v3
    unshared, shared = sha_of(M, 2), sha_of(M, 3)
    for number in (2, 3):
        services.version_delete(model_name=M, number=number, actor=A)
    assert blob_exists(unshared) and blob_exists(shared)  # the delete itself removes no blob
    events = {e.target: e.before["blob"] for e in AuditEvent.objects.filter(
        action="version.delete")}
    assert events["fraud:3"] == "kept: version 1 of 'copy' shares it"
    done = collect_garbage(grace=timedelta(0))
    assert done["blobs"] == [unshared]
    assert not blob_exists(unshared) and blob_exists(shared)
    r = api(team["viewer"]).get("/api/v1/models/copy/versions/1/artifact/")
    assert r.status_code == 200 and hashlib.sha256(b"".join(r.streaming_content)).hexdigest() \
        == shared


def test_a_deleted_number_is_never_given_out_again(team):
    services.version_delete(model_name=M, number=3, actor=A)
    blob = default_store().save_bytes(samples.mlp(seed=9))
    version, created = services.version_upload(model_name=M, blob=blob, actor=A)
    assert created and version.number == 4


def pipeline_spec(number: int = 2) -> dict:
    return {"steps": [{"name": "score", "model": M, "version": number}],
            "edges": [{"from": "x", "to": "score.x"}, {"from": "score.y", "to": "y"}]}


def _loadtest_job() -> None:
    Job.objects.create(kind=JobKind.LOADTEST, version=ModelVersion.objects.get(
        model__name=M, number=2), params={"replica": "embedded"})


HOLDS = {  # how version 2 comes to be held: what the 409 says
    "stable": (lambda: services.endpoint_deploy(model_name=M, version_number=2, actor=A),
               "is the stable version of its endpoint"),
    "candidate": (lambda: services.canary_start(model_name=M, version_number=2, weight=5,
                                                actor=A),
                  "is the canary candidate of its endpoint"),
    "idle slot": (lambda: services.bluegreen_deploy(model_name=M, version_number=2, actor=A),
                  "is the idle green slot of its endpoint"),
    "live slot": (lambda: (services.bluegreen_deploy(model_name=M, version_number=2, actor=A),
                           services.bluegreen_switch(model_name=M, actor=A)),
                  "is the live green slot of its endpoint"),
    "shadow": (lambda: services.shadow_start(model_name=M, version_number=2, actor=A),
               "is the shadow of its endpoint"),
    "warm": (lambda: (services.endpoint_deploy(model_name=M, version_number=2, actor=A),
                      services.rollback(model_name=M, version_number=1, actor=A)),
             "is kept warm for an instant rollback until "),
    "pipeline step": (lambda: (services.model_create(name="p", actor=A),
                               pipeline_create(model_name="p", spec=pipeline_spec(), actor=A)),
                      "is step 'score' of pipeline 'p' v1"),
    "alias": (lambda: services.alias_set(model_name=M, alias="production", version_number=2,
                                         actor=A),
              "is the target of alias 'production'"),
    "load test": (_loadtest_job, "has a load test job queued ("),
    "validation": (lambda: ModelVersion.objects.filter(model__name=M, number=2).update(
        status=VersionStatus.VALIDATING), "is still being validated"),
}


@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_a_held_version_is_a_409_naming_what_holds_it_and_nothing_changes(team, hold):
    arrange, says = HOLDS[hold]
    arrange()
    events = AuditEvent.objects.count()
    r = api(team["admin"]).delete(f"/api/v1/models/{M}/versions/2/")
    assert r.status_code == 409, r.content
    error = r.json()["error"]
    assert error.startswith(f"version 2 of 'fraud' {says}"), error
    assert error.endswith(": it cannot be deleted")
    assert r.json()["details"]["rule"] == "in-use"
    assert ModelVersion.objects.filter(model__name=M, number=2).exists()
    assert AuditEvent.objects.count() == events


def test_every_hold_is_named_at_once(team):
    services.canary_start(model_name=M, version_number=2, weight=5, actor=A)
    services.alias_set(model_name=M, alias="champion", version_number=2, actor=A)
    r = api(team["engineer"]).delete(f"/api/v1/models/{M}/versions/2/")
    assert r.json()["error"] == ("version 2 of 'fraud' is the canary candidate of its endpoint; "
                                 "is the target of alias 'champion': it cannot be deleted")


def test_a_warm_version_whose_grace_is_over_may_go(team):
    services.endpoint_deploy(model_name=M, version_number=2, actor=A)
    services.rollback(model_name=M, version_number=1, actor=A)
    v2 = ModelVersion.objects.get(model__name=M, number=2)
    Endpoint.objects.filter(model__name=M).update(warm_until="2000-01-01T00:00:00Z")
    services.version_delete(model_name=M, number=2, actor=A)
    assert v2.pk not in Endpoint.objects.get(model__name=M).warm_versions


def test_a_finished_job_goes_with_its_version(team):
    Job.objects.create(kind=JobKind.LOADTEST, version=ModelVersion.objects.get(
        model__name=M, number=2), status="succeeded")
    services.version_delete(model_name=M, number=2, actor=A)
    assert not Job.objects.exists()
    assert AuditEvent.objects.get(action="version.delete").before["jobs"] == 1


def test_a_viewer_may_not_delete_and_a_read_only_token_neither(team):
    r = api(team["viewer"]).delete(f"/api/v1/models/{M}/versions/2/")
    assert r.status_code == 403 and r.json()["error"].startswith(
        "this needs the engineer role in the team 'default'")
    assert api(team["viewer"]).delete(f"/api/v1/models/{M}/").status_code == 403
    _, raw = services.token_create(username="engineer", name="ro", read_only=True, actor=A)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.delete(f"/api/v1/models/{M}/versions/2/").status_code == 403
    assert ModelVersion.objects.filter(model__name=M).count() == 3


def test_an_unknown_version_or_model_is_a_404(team):
    assert api(team["admin"]).delete(f"/api/v1/models/{M}/versions/9/").status_code == 404
    assert api(team["admin"]).delete("/api/v1/models/nope/").status_code == 404


# --------------------------------------------------------------------------------- a model


def test_a_model_serving_nothing_is_deleted_with_its_versions_aliases_and_endpoint(team):
    services.endpoint_deploy(model_name=M, version_number=None, actor=A)
    services.alias_set(model_name=M, alias="champion", version_number=1, actor=A)
    services.api_key_create(model_name=M, name="app", actor=A)
    shas = [sha_of(M, n) for n in (1, 2, 3)]
    r = api(team["engineer"]).delete(f"/api/v1/models/{M}/?reason=retired")
    assert r.status_code == 204, r.content
    assert api(team["viewer"]).get(f"/api/v1/models/{M}/").status_code == 404
    assert not ModelVersion.objects.exists() and not Alias.objects.exists()
    assert not Endpoint.objects.exists()
    event = AuditEvent.objects.get(action="model.delete")
    assert (event.target, event.reason) == (M, "retired")
    assert [(v["number"], v["sha256"]) for v in event.before["versions"]] == list(
        zip([1, 2, 3], shas, strict=True))
    assert event.before["aliases"] == {"champion": 1}
    assert collect_garbage(grace=timedelta(0))["blobs"] == sorted(shas)
    # a model made again under the name goes on from the numbers the old one used
    services.model_create(name=M, actor=A)
    version, _ = services.version_upload(model_name=M, blob=default_store().save_bytes(
        samples.mlp(seed=1)), actor=A)
    assert version.number == 4


def test_a_model_with_a_serving_version_is_a_409_naming_it(team):
    r = api(team["engineer"]).delete(f"/api/v1/models/{M}/")
    assert r.status_code == 409
    assert r.json()["error"] == ("model 'fraud' cannot be deleted: version 1 is the stable "
                                 "version of its endpoint")
    assert ModelVersion.objects.filter(model__name=M).count() == 3


def test_a_model_whose_version_is_another_model_s_pipeline_step_is_a_409(team):
    services.endpoint_deploy(model_name=M, version_number=None, actor=A)
    services.model_create(name="p", actor=A)
    pipeline_create(model_name="p", spec=pipeline_spec(3), actor=A)
    r = api(team["engineer"]).delete(f"/api/v1/models/{M}/")
    assert r.status_code == 409
    assert r.json()["error"] == ("model 'fraud' cannot be deleted: version 3 is step 'score' "
                                 "of pipeline 'p' v1")
    # the pipeline's own model goes (its version is held by nothing), then fraud may
    assert api(team["engineer"]).delete("/api/v1/models/p/").status_code == 204
    assert api(team["engineer"]).delete(f"/api/v1/models/{M}/").status_code == 204


# ------------------------------------------------------------------- the CLI and the console


@pytest.fixture
def mmc(team, monkeypatch, capsys):
    """mmc(*args) -> (exit code, stderr): the real CLI, its HTTP client on this Django app."""
    token = services.token_create(username="engineer", name="cli", actor=A)[1]
    with inprocess_cli(token, monkeypatch, capsys) as run:
        yield run


def test_the_cli_deletes_a_version_and_a_model_and_prints_a_refusal(mmc):
    assert mmc("delete-version", M, "2", "--reason", "old") == (0, "deleted fraud:2\n")
    assert AuditEvent.objects.get(action="version.delete").reason == "old"
    assert mmc("delete-version", M, "1") == (
        1, "mmc: 409: version 1 of 'fraud' is the stable version of its endpoint: it cannot be "
           "deleted\n")
    code, err = mmc("delete-model", M)
    assert code == 1 and "version 1 is the stable version of its endpoint" in err
    services.endpoint_deploy(model_name=M, version_number=None, actor=A)
    assert mmc("delete-model", M) == (0, "deleted model fraud\n")
    assert not RegisteredModel.objects.exists()


def page(client, path: str) -> str:
    r = client.get(path)
    assert r.status_code == 200
    return html.unescape(r.content.decode())


def test_the_version_page_offers_delete_only_when_deletable_and_says_why_not(team, client):
    client.force_login(team["engineer"])
    idle = page(client, f"/models/{M}/versions/2/")
    assert 'action="/models/fraud/versions/2/delete/"' in idle and "data-confirm" in idle
    stable = page(client, f"/models/{M}/versions/1/")
    assert "/versions/1/delete/" not in stable
    assert ("Version 1 of 'fraud' is the stable version of its endpoint: it cannot be deleted."
            in stable)
    client.force_login(team["viewer"])
    assert "/delete/" not in page(client, f"/models/{M}/versions/2/")


def test_the_console_deletes_a_version_and_a_model(team, client):
    client.force_login(team["engineer"])
    r = client.post(f"/models/{M}/versions/2/delete/", {"reason": "old"}, follow=True)
    assert r.redirect_chain[-1][0] == f"/models/{M}/", [str(m) for m in r.context["messages"]]
    assert "Version 2 deleted" in html.unescape(r.content.decode())
    assert not ModelVersion.objects.filter(model__name=M, number=2).exists()
    refused = client.post(f"/models/{M}/versions/1/delete/", follow=True)
    assert "is the stable version of its endpoint" in html.unescape(refused.content.decode())
    model_page = page(client, f"/models/{M}/")
    assert "/models/fraud/delete/" not in model_page
    assert "Model 'fraud' cannot be deleted: version 1 is the stable version" in model_page
    services.endpoint_deploy(model_name=M, version_number=None, actor=A)
    assert 'action="/models/fraud/delete/"' in page(client, f"/models/{M}/")
    r = client.post(f"/models/{M}/delete/", follow=True)
    assert r.redirect_chain[-1][0] == "/models/" and not RegisteredModel.objects.exists()
    client.force_login(team["viewer"])
    assert client.post("/models/copy/delete/").status_code == 403
