"""Roles, tokens and the audit log."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from registry import samples
from registry.audit import Actor
from registry.models import ApiToken, AuditEvent, RegisteredModel
from tests.conftest import upload

pytestmark = pytest.mark.django_db(transaction=True)

# (method, path, body, minimum role) for every mutating endpoint.
MUTATIONS = [
    ("post", "/api/v1/models/", {"name": "new-model"}, "engineer"),
    ("patch", "/api/v1/models/base/", {"description": "x"}, "engineer"),
    ("post", "/api/v1/models/base/archive/", {"archived": True}, "engineer"),
    ("upload", "/api/v1/models/base/versions/", None, "engineer"),
    ("put", "/api/v1/models/base/versions/upload/", None, "engineer"),
    ("patch", "/api/v1/models/base/versions/1/", {"max_queue_size": 10}, "engineer"),
    ("put", "/api/v1/models/base/aliases/prod/", {"version": 1}, "engineer"),
    ("delete", "/api/v1/models/base/aliases/staging/", None, "engineer"),
    ("post", "/api/v1/models/base/endpoint/deploy/", {"version": 1}, "engineer"),
    ("post", "/api/v1/models/base/endpoint/keys/", {"name": "app"}, "engineer"),
    ("post", "/api/v1/tokens/", {"user": "viewer", "name": "ci"}, "admin"),
]
RANK = {"viewer": 0, "engineer": 1, "admin": 2}


@pytest.fixture
def base(ready_model, engineer):
    ready_model("base", samples.mlp())
    engineer.put("/api/v1/models/base/aliases/staging/", {"version": 1}, format="json")


def call(client, method, path, body):
    if method == "upload":
        return upload(client, "base", samples.mlp(seed=77))
    if method == "put" and body is None:
        return client.generic("PUT", path, samples.mlp(seed=78),
                              content_type="application/octet-stream")
    return getattr(client, method)(path, body, format="json")


@pytest.mark.parametrize("role", ["anonymous", "nobody", "viewer", "engineer", "admin"])
@pytest.mark.parametrize(("method", "path", "body", "needed"), MUTATIONS,
                         ids=[f"{m} {p}" for m, p, _, _ in MUTATIONS])
def test_rbac_matrix(client_for, base, role, method, path, body, needed):
    client = client_for(None if role == "anonymous" else role)
    before = AuditEvent.objects.count()
    r = call(client, method, path, body)
    if role == "anonymous":
        assert r.status_code == 401, r.content
    elif role == "nobody" or RANK[role] < RANK[needed]:
        assert r.status_code == 403, r.content
        # a user without any role is refused for that first (tokens: "needs the viewer role")
        assert needed in r.json()["error"] or (role == "nobody" and "role" in r.json()["error"])
        assert AuditEvent.objects.count() == before  # refused: nothing recorded, nothing changed
    else:
        assert r.status_code in (200, 201, 204), (role, r.content)
        assert AuditEvent.objects.count() > before


@pytest.mark.parametrize("role", ["viewer", "engineer"])
def test_only_admins_read_the_audit_log_and_everyones_tokens(client_for, users, role):
    client = client_for(role)
    client_for("admin")  # another user's token, which this one must not see
    assert client.get("/api/v1/audit/").status_code == 403
    assert [t["user"] for t in client.get("/api/v1/tokens/").json()["results"]] == [role]
    assert client.get("/api/v1/users/").status_code == 403
    assert client.get("/api/v1/models/").status_code == 200


def test_revoked_token_is_401(admin, users):
    r = admin.post("/api/v1/tokens/", {"user": "engineer", "name": "pipeline"}, format="json")
    assert r.status_code == 201
    raw, key = r.json()["token"], r.json()["token_key"]
    from rest_framework.test import APIClient

    ci = APIClient()
    ci.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert ci.get("/api/v1/models/").status_code == 200
    assert admin.delete(f"/api/v1/tokens/{key}/").status_code == 204
    r = ci.get("/api/v1/models/")
    assert r.status_code == 401 and r.json()["error"]
    assert AuditEvent.objects.filter(action="token.revoke", target=key).exists()


def test_expired_token_is_401(client_for, users):
    from rest_framework.test import APIClient

    from registry.services import token_create

    token, raw = token_create(username="engineer", name="old", actor=Actor.system("test"),
                              expires_in_days=1)
    ApiToken.objects.filter(pk=token.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    ci = APIClient()
    ci.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert ci.get("/api/v1/models/").status_code == 401


def test_tokens_are_stored_hashed(admin, users):
    raw = admin.post("/api/v1/tokens/", {"user": "viewer", "name": "x"},
                     format="json").json()["token"]
    assert raw.startswith("mmc_")
    assert not ApiToken.objects.filter(digest__contains=raw).exists()
    assert all(raw not in t.digest for t in ApiToken.objects.all())


def test_a_failing_mutation_leaves_neither_change_nor_audit_event(users):
    from registry.services import model_create

    events = AuditEvent.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        model_create(name="half-done", actor=Actor.system("test"))
        assert AuditEvent.objects.count() == events + 1  # written in the same transaction...
        raise RuntimeError("a later step fails")
    assert not RegisteredModel.objects.filter(name="half-done").exists()
    assert AuditEvent.objects.count() == events  # ...so it rolled back with the change


def test_audit_is_append_only_and_filterable(admin, engineer):
    engineer.post("/api/v1/models/", {"name": "a"}, format="json")
    engineer.post("/api/v1/models/", {"name": "b"}, format="json")
    rows = admin.get("/api/v1/audit/?model=a").json()["results"]
    assert [(e["action"], e["target"], e["actor_name"]) for e in rows] == [
        ("model.create", "a", "engineer")]
    assert admin.get("/api/v1/audit/?actor=engineer&action=model.").json()["count"] == 2
    since = (timezone.now() + timedelta(minutes=1)).isoformat()
    assert admin.get("/api/v1/audit/", {"since": since}).json()["count"] == 0
    event = AuditEvent.objects.first()
    event.reason = "tampered"
    with pytest.raises(ValueError):
        event.save()
    with pytest.raises(ValueError):
        event.delete()
