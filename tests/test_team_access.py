"""Access for real teams: everyone mints their own tokens (never with more rights than they
have), read-only tokens only read, admins manage users over the API, a deactivated user's
tokens stop at once, the last admin stays, and predict keys can be required everywhere."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from registry import samples
from registry.audit import Actor
from registry.models import ApiToken, AuditEvent
from registry.services import token_create
from tests.conftest import CLUSTERED, upload, wait_validated
from tests.replicas import replicas, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_an_engineer_mints_its_own_token_and_uses_it_to_upload_and_deploy(engineer, users):
    r = engineer.post("/api/v1/tokens/", {"name": "laptop", "expires_in_days": 7},
                      format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["user"] == "engineer" and body["read_only"] is False and body["token"]
    ci = bearer(body["token"])
    assert ci.post("/api/v1/models/", {"name": "mine"}, format="json").status_code == 201
    assert upload(ci, "mine", samples.mlp()).status_code == 201
    assert wait_validated(ci, "mine", 1)["status"] == "ready"
    r = ci.post("/api/v1/models/mine/endpoint/deploy/", {"version": 1}, format="json")
    assert r.status_code == 200 and r.json()["stable"] == 1
    event = AuditEvent.objects.get(action="token.create", target=body["token_key"])
    assert event.actor_name == "engineer" and event.after["user"] == "engineer"


def test_naming_another_user_stays_admin_only(client_for, users):
    for role in ("viewer", "engineer"):
        r = client_for(role).post("/api/v1/tokens/", {"name": "x", "user": "admin"},
                                  format="json")
        assert r.status_code == 403 and "admin" in r.json()["error"]
    r = client_for("admin").post("/api/v1/tokens/", {"name": "ci", "user": "viewer"},
                                 format="json")
    assert r.status_code == 201 and r.json()["user"] == "viewer"


def test_a_viewers_token_reads_but_every_mutation_is_refused(client_for, users, ready_model):
    ready_model("base", samples.mlp())
    viewer = client_for("viewer")
    assert viewer.get("/api/v1/models/base/").status_code == 200
    for method, path, body in [("post", "/api/v1/models/", {"name": "v"}),
                               ("post", "/api/v1/models/base/endpoint/deploy/", {"version": 1}),
                               ("post", "/api/v1/models/base/endpoint/keys/", {"name": "k"}),
                               ("get", "/api/v1/users/", None)]:
        r = getattr(viewer, method)(path, body, format="json")
        assert r.status_code == 403, (path, r.content)


def test_a_read_only_token_of_an_admin_cannot_mutate_anything(client_for, users, ready_model):
    ready_model("base", samples.mlp())
    admin = client_for("admin")
    raw = admin.post("/api/v1/tokens/", {"name": "dashboards", "read_only": True},
                     format="json").json()["token"]
    ro = bearer(raw)
    assert ro.get("/api/v1/models/base/").status_code == 200
    assert ro.get("/api/v1/audit/").status_code == 200  # reads keep the admin's reach
    assert ro.get("/api/v1/users/").status_code == 200
    before = AuditEvent.objects.count()
    for method, path, body in [
            ("post", "/api/v1/models/", {"name": "nope"}),
            ("patch", "/api/v1/models/base/", {"description": "x"}),
            ("post", "/api/v1/models/base/endpoint/deploy/", {"version": 1}),
            ("post", "/api/v1/models/base/endpoint/keys/", {"name": "k"}),
            ("post", "/api/v1/tokens/", {"name": "escalate"}),
            ("post", "/api/v1/users/", {"username": "x", "role": "admin"}),
            ("patch", "/api/v1/users/viewer/", {"role": "admin"}),
            ("delete", "/api/v1/replicas/none/", None)]:
        r = getattr(ro, method)(path, body, format="json")
        assert r.status_code == 403, (path, r.content)
        assert "read-only scope" in r.json()["error"], r.json()
    assert AuditEvent.objects.count() == before
    r = ro.generic("PUT", "/api/v1/models/base/versions/upload/", samples.mlp(seed=3),
                   content_type="application/octet-stream")
    assert r.status_code == 403 and "read-only" in r.json()["error"]


def test_read_only_tokens_cannot_load_or_unload_through_a_replica(users):
    from registry.serving_source import RegistrySource
    from serving.core.errors import Forbidden

    _, raw = token_create(username="admin", name="ro", read_only=True, actor=Actor.system("t"))
    with pytest.raises(Forbidden, match="read-only"):
        RegistrySource()._authorise(f"Bearer {raw}")


def test_others_see_and_revoke_only_their_own_tokens_admins_everyones(client_for, users):
    engineer, admin = client_for("engineer"), client_for("admin")
    theirs = admin.post("/api/v1/tokens/", {"name": "other", "user": "viewer"},
                        format="json").json()["token_key"]
    assert engineer.delete(f"/api/v1/tokens/{theirs}/").status_code == 404
    assert ApiToken.objects.filter(token_key=theirs).exists()
    users_seen = {t["user"] for t in admin.get("/api/v1/tokens/").json()["results"]}
    assert {"viewer", "engineer", "admin"} <= users_seen
    assert admin.delete(f"/api/v1/tokens/{theirs}/").status_code == 204
    own = engineer.post("/api/v1/tokens/", {"name": "mine"}, format="json").json()["token_key"]
    assert engineer.delete(f"/api/v1/tokens/{own}/").status_code == 204


def test_token_creation_keeps_its_throttle_for_everyone(client_for, users, settings):
    settings.TOKEN_CREATE_RATE = "2/hour"
    viewer = client_for("viewer")
    codes = [viewer.post("/api/v1/tokens/", {"name": f"t{i}"}, format="json").status_code
             for i in range(3)]
    assert codes == [201, 201, 429]


def test_last_used_is_noted_at_most_once_a_minute(users):
    token, raw = token_create(username="viewer", name="t", actor=Actor.system("t"))
    assert token.last_used_at is None
    client = bearer(raw)
    assert client.get("/api/v1/me/").status_code == 200
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    assert client.get("/api/v1/me/").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first  # within the minute: no write
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    assert client.get("/api/v1/me/").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first - timedelta(seconds=1)
    assert ApiToken.objects.get(pk=token.pk).last_used_at <= timezone.now()


def test_an_admin_creates_a_user_sets_its_role_and_deactivating_stops_its_token_at_once(
        admin, users):
    r = admin.post("/api/v1/users/", {"username": "dana", "email": "dana@example.com",
                                      "role": "viewer"}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["role"] == "viewer" and body["is_active"] and len(body["password"]) >= 16
    assert APIClient().login(username="dana", password=body["password"])
    r = admin.post("/api/v1/users/", {"username": "dana", "role": "viewer"}, format="json")
    assert r.status_code == 409
    r = admin.patch("/api/v1/users/dana/", {"role": "engineer"}, format="json")
    assert r.status_code == 200 and r.json()["role"] == "engineer"

    _, raw = token_create(username="dana", name="ci", actor=Actor.system("t"))
    dana = bearer(raw)
    assert dana.post("/api/v1/models/", {"name": "danas"}, format="json").status_code == 201
    r = admin.patch("/api/v1/users/dana/", {"is_active": False}, format="json")
    assert r.status_code == 200 and r.json()["is_active"] is False
    r = dana.get("/api/v1/models/")
    assert r.status_code == 401 and r.json()["error"]  # at once: knox checks is_active
    assert admin.patch("/api/v1/users/dana/", {"is_active": True},
                       format="json").status_code == 200
    assert dana.get("/api/v1/models/").status_code == 200
    actions = list(AuditEvent.objects.filter(target="dana", target_type="user")
                   .order_by("id").values_list("action", flat=True))
    assert actions == ["user.create", "user.role", "user.deactivate", "user.activate"]
    listed = {u["username"]: u for u in admin.get("/api/v1/users/").json()["results"]}
    assert listed["dana"]["role"] == "engineer" and listed["dana"]["token_count"] == 1


def test_a_given_password_must_pass_the_validators(admin, users):
    r = admin.post("/api/v1/users/", {"username": "eve", "role": "viewer", "password": "short"},
                   format="json")
    assert r.status_code == 400 and "password" in r.json()["error"].lower()
    r = admin.post("/api/v1/users/", {"username": "eve", "role": "viewer",
                                      "password": "long-enough-1"}, format="json")
    assert r.status_code == 201 and r.json()["password"] is None


def test_the_last_active_admin_cannot_demote_or_deactivate_itself(admin, users):
    for change in ({"role": "engineer"}, {"is_active": False}):
        r = admin.patch("/api/v1/users/admin/", change, format="json")
        assert r.status_code == 409, r.content
        assert "last active admin" in r.json()["error"]
    assert User.objects.get(username="admin").is_active
    admin.post("/api/v1/users/", {"username": "second", "role": "admin"}, format="json")
    r = admin.patch("/api/v1/users/admin/", {"role": "engineer"}, format="json")
    assert r.status_code == 200 and r.json()["role"] == "engineer"
    assert admin.get("/api/v1/users/").status_code == 403  # its own token follows its role


# -- predict keys required everywhere -----------------------------------------------------------


def test_required_keys_refuse_a_keyless_route_on_the_data_plane():
    from serving.core.dataplane import _authorize, _opens
    from serving.core.desired_state import ModelRoute, api_key_hash
    from serving.core.errors import Unauthorized

    open_route = ModelRoute(model="m", stable="1")
    assert not open_route.protected and _opens(open_route, None)
    required = ModelRoute(model="m", stable="1", keys_required=True)
    assert required.protected and not _opens(required, None)
    with pytest.raises(Unauthorized, match="create a key"):
        _authorize(required, "anything")
    keyed = ModelRoute(model="m", stable="1", keys_required=True,
                       api_key_hashes=frozenset({api_key_hash("k")}))
    _authorize(keyed, "k")


@override_settings(REQUIRE_PREDICT_KEYS=True)
def test_the_registry_marks_every_route_keys_required_when_the_setting_is_on(ready_model,
                                                                              engineer):
    from registry.serving_source import build_desired_state

    ready_model("m", samples.mlp())
    engineer.post("/api/v1/models/m/endpoint/deploy/", {"version": 1}, format="json")
    route = build_desired_state().routes["m"]
    assert route.keys_required and not route.api_key_hashes


def test_with_keys_required_a_real_replica_refuses_a_keyless_endpoint_until_it_has_a_key(
        engineer, ready_model, tmp_path):
    import httpx

    ready_model("locked", samples.mlp())
    body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]}
    with replicas(1, embedded=not CLUSTERED, log_dir=tmp_path,
                  MMC_REQUIRE_PREDICT_KEYS="1") as (rep,):
        r = engineer.post("/api/v1/models/locked/endpoint/deploy/?wait=15", {"version": 1},
                          format="json")
        assert r.status_code == 200 and r.json()["convergence"]["converged"], r.content
        r = httpx.post(f"{rep.url}/v2/models/locked/infer", json=body)
        assert r.status_code == 401, r.text
        assert "create a key" in r.json()["error"]
        assert httpx.post(f"{rep.url}/v2/models/locked/infer", json=body,
                          headers={"X-Api-Key": "guess"}).status_code == 401
        key = engineer.post("/api/v1/models/locked/endpoint/keys/", {"name": "app"},
                            format="json").json()["key"]
        wait_until(lambda: httpx.post(f"{rep.url}/v2/models/locked/infer", json=body,
                                      headers={"X-Api-Key": key}).status_code == 200,
                   what="the new key to be accepted")
        assert httpx.post(f"{rep.url}/v2/models/locked/infer", json=body).status_code == 401
