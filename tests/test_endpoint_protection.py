"""Whether /infer needs a predict key is an endpoint's own setting: creating a key protects it,
revoking its last key leaves it closed (every call 401) and says so, and only "open" (audited,
engineer or admin) lets anonymous calls in again; "protect" closes an open one."""

from __future__ import annotations

import importlib

import httpx
import pytest
from django.apps import apps
from django.test import override_settings

from registry import samples, services
from registry.audit import Actor
from registry.models import AuditEvent, Endpoint
from registry.serving_source import build_desired_state
from serving.core.dataplane import _authorize
from serving.core.errors import Unauthorized
from tests.conftest import CLUSTERED
from tests.replicas import replicas, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]}
SYSTEM = Actor.system("test")


@pytest.fixture
def deployed(engineer, ready_model):
    ready_model("scorer", samples.mlp())
    r = engineer.post("/api/v1/models/scorer/endpoint/deploy/", {"version": 1}, format="json")
    assert r.status_code == 200, r.content
    return "scorer"


def test_revoking_the_last_key_refuses_everyone_until_the_endpoint_is_opened(
        engineer, deployed, tmp_path):
    def infer(url: str, key: str | None = None) -> int:
        headers = {"X-Api-Key": key} if key else {}
        return httpx.post(f"{url}/v2/models/scorer/infer", json=BODY, headers=headers,
                          timeout=10).status_code

    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path) as (rep,):
        wait_until(lambda: infer(rep.url) == 200, what="the open endpoint to answer")
        key = engineer.post("/api/v1/models/scorer/endpoint/keys/", {"name": "app"},
                            format="json").json()
        assert engineer.get("/api/v1/models/scorer/endpoint/").json()["protected"] is True
        wait_until(lambda: infer(rep.url, key["key"]) == 200 and infer(rep.url) == 401,
                   what="the key to be needed")

        r = engineer.delete(f"/api/v1/models/scorer/endpoint/keys/{key['prefix']}/")
        assert r.status_code == 200, r.content
        said = r.json()
        assert said["remaining_keys"] == 0 and said["protected"] and said["refusing_all"]
        assert "every call is refused" in said["detail"]
        wait_until(lambda: infer(rep.url, key["key"]) == 401, what="the revoked key refused")
        assert infer(rep.url) == 401  # revoking the last key never opens the endpoint

        r = engineer.post("/api/v1/models/scorer/endpoint/open/",
                          {"reason": "public demo"}, format="json")
        assert r.status_code == 200 and r.json()["protected"] is False, r.content
        wait_until(lambda: infer(rep.url) == 200, what="anonymous calls after open")

        r = engineer.post("/api/v1/models/scorer/endpoint/protect/", {}, format="json")
        assert r.status_code == 200 and r.json()["protected"] is True, r.content
        wait_until(lambda: infer(rep.url) == 401, what="every call refused after protect")

    events = {e.action: e for e in AuditEvent.objects.filter(model_name="scorer")}
    assert events["apikey.revoke"].after == {"remaining_keys": 0, "refusing_all": True}
    assert events["endpoint.open"].actor_name == "engineer"
    assert events["endpoint.open"].reason == "public demo"
    assert (events["endpoint.open"].before, events["endpoint.open"].after) == (
        {"protected": True}, {"protected": False})
    assert events["endpoint.protect"].after == {"protected": True}


def test_the_route_of_a_protected_endpoint_without_keys_refuses_every_key(deployed):
    key, raw = services.api_key_create(model_name="scorer", name="app", actor=SYSTEM)
    services.api_key_revoke(model_name="scorer", prefix=key.prefix, actor=SYSTEM)
    route = build_desired_state().routes["scorer"]
    assert route.protected and not route.api_key_hashes
    for shown in (raw, None, "guess"):
        with pytest.raises(Unauthorized):
            _authorize(route, shown)
    services.endpoint_open(model_name="scorer", actor=SYSTEM)
    assert not build_desired_state().routes["scorer"].protected


def test_opening_is_refused_while_keys_remain_or_keys_are_required_everywhere(
        deployed, engineer, client_for):
    services.api_key_create(model_name="scorer", name="app", actor=SYSTEM)
    r = engineer.post("/api/v1/models/scorer/endpoint/open/", {}, format="json")
    assert r.status_code == 409 and "revoke them before opening" in r.json()["error"]
    assert client_for("viewer").post("/api/v1/models/scorer/endpoint/open/", {},
                                     format="json").status_code == 403
    r = engineer.post("/api/v1/models/scorer/endpoint/protect/", {}, format="json")
    assert r.status_code == 409 and "already protected" in r.json()["error"]
    with override_settings(REQUIRE_PREDICT_KEYS=True):
        for key in Endpoint.objects.get(model__name="scorer").api_keys.all():
            services.api_key_revoke(model_name="scorer", prefix=key.prefix, actor=SYSTEM)
        r = engineer.post("/api/v1/models/scorer/endpoint/open/", {}, format="json")
        assert r.status_code == 409 and "MMC_REQUIRE_PREDICT_KEYS" in r.json()["error"]
    assert Endpoint.objects.get(model__name="scorer").protected
    assert not AuditEvent.objects.filter(action="endpoint.open").exists()


def test_revoking_one_of_several_keys_says_the_others_still_work(deployed, engineer):
    first = engineer.post("/api/v1/models/scorer/endpoint/keys/", {"name": "a"},
                          format="json").json()
    engineer.post("/api/v1/models/scorer/endpoint/keys/", {"name": "b"}, format="json")
    said = engineer.delete(f"/api/v1/models/scorer/endpoint/keys/{first['prefix']}/").json()
    assert said["remaining_keys"] == 1 and not said["refusing_all"]
    assert "1 key(s) still work" in said["detail"]


def test_the_migration_makes_endpoints_with_active_keys_protected(deployed, ready_model):
    ready_model("other", samples.mlp(seed=2))
    services.endpoint_deploy(model_name="other", version_number=1, actor=SYSTEM)
    services.api_key_create(model_name="scorer", name="app", actor=SYSTEM)
    Endpoint.objects.update(protected=False)  # as every endpoint was before the setting
    migration = importlib.import_module("registry.migrations.0021_endpoint_protected_tickrecord")
    migration.protect_endpoints_with_keys(apps, None)
    assert dict(Endpoint.objects.values_list("model__name", "protected")) == {
        "scorer": True, "other": False}
