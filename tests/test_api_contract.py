"""The OpenAPI schema is the contract CI clients generate code from: schemathesis checks every
operation against it in-process (no server error, only documented status codes, bodies that match
their schemas), and plain specs pin the error shape of everything under /api/."""

from __future__ import annotations

import io

import numpy as np
import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from registry import samples, services
from registry.audit import Actor

# Generated examples per operation, on top of schemathesis' explicit and boundary cases (about
# 2,000 requests for the 59 operations): 1-2 minutes on 2 cores, in either mode.
EXAMPLES = 6

# The schema as clients fetch it, from the app in-process (WSGI): no server, no network.
schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", WSGIHandler())


@pytest.fixture
def keep_connection():
    """Requests run inside the test's transaction: like Django's test client, keep a request
    from closing the connection that holds it."""
    for signal in (signals.request_started, signals.request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (signals.request_started, signals.request_finished):
        signal.connect(close_old_connections)


SYSTEM = Actor.system("contract")


def _ready_version(model: str, data: bytes) -> int:
    from registry.store.artifacts import default_store
    from registry.validation import validate_version

    blob = default_store().writer().read_from(io.BytesIO(data).read).finish()
    version, _ = services.version_upload(model_name=model, blob=blob, actor=SYSTEM,
                                         filename="model.onnx", metadata={"git": "abc"})
    assert validate_version(version.pk) == "ready"
    return version.number


@pytest.fixture
def world(db, keep_connection):
    """One of everything the API names in a path, so generated requests reach real objects:
    a model with two ready versions (1 deployed, alias production), a predict key, a dataset,
    a batch job, a webhook, and tokens for an admin (the caller) and an engineer. Background
    work never starts: it is queued on commit, and the test's transaction never commits."""
    from django.contrib.auth.models import Group, User

    from registry.services import jobs as job_services
    from registry.services import webhooks
    from registry.store.files import FileWriter

    services.ensure_roles()
    for role in ("admin", "engineer"):
        user = User.objects.create_user(username=role, password=f"{role}-password-1")
        user.groups.add(Group.objects.get(name=role))
    _, raw = services.token_create(username="admin", name="contract", actor=SYSTEM)
    engineer_token, _ = services.token_create(username="engineer", name="ci", actor=SYSTEM)
    services.model_create(name="contract", actor=SYSTEM, tags=["team:ci"])
    _ready_version("contract", samples.mlp(n_in=4, hidden=(8,), n_out=2, seed=1))
    _ready_version("contract", samples.mlp(n_in=4, hidden=(8,), n_out=2, seed=2))
    services.endpoint_deploy(model_name="contract", version_number=1, actor=SYSTEM)
    services.alias_set(model_name="contract", alias="production", version_number=1,
                       actor=SYSTEM)
    key, _ = services.api_key_create(model_name="contract", name="app", actor=SYSTEM)

    writer = FileWriter(limit=1 << 20, what="dataset")
    buf = io.BytesIO()
    np.save(buf, np.zeros((3, 4), dtype=np.float32))
    writer.read_from(io.BytesIO(buf.getvalue()).read)
    dataset = job_services.dataset_create(upload=writer, filename="rows.npy", actor=SYSTEM)
    job = job_services.batch_create(model_name="contract", dataset_id=dataset.pk, actor=SYSTEM)
    hook = webhooks.webhook_create(url="http://127.0.0.1:9/hook", actor=SYSTEM)
    return {
        "token": raw,
        "path": {"name": "contract", "number": 1, "alias": "production", "prefix": key.prefix,
                 "dataset_id": str(dataset.pk), "job_id": str(job.pk), "id": hook.pk,
                 # never the caller's own token: revoking it would end the run
                 "token_key": engineer_token.token_key,
                 # never the caller: deactivating it would end the run
                 "username": "engineer"},
    }


@schema.parametrize()
@hypothesis_settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                     phases=[Phase.explicit, Phase.generate],
                     suppress_health_check=list(HealthCheck))
def test_every_operation_keeps_the_contract(case, world):
    """Each operation runs in a transaction of its own, rolled back after it, so one that
    deletes (a token, a webhook, an alias) or archives takes nothing from the others; the token
    it may revoke is the engineer's, never the caller's."""
    for name in case.path_parameters or {}:
        if name in world["path"]:
            case.path_parameters[name] = world["path"][name]
    with transaction.atomic():  # each generated example in a savepoint of its own: one that
        # PostgreSQL refuses (answered 400) must not abort the examples after it
        case.call_and_validate(
            headers={"Authorization": f"Bearer {world['token']}"},
            checks=[not_a_server_error, status_code_conformance, response_schema_conformance,
                    content_type_conformance])
        transaction.set_rollback(True)


# -- the schema, read as a client reads it ------------------------------------------------------


@pytest.fixture(scope="module")
def openapi() -> dict:
    from django.test import Client

    r = Client().get("/api/schema/?format=json")
    assert r.status_code == 200
    return r.json()


def _resolve(spec: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _request_schema(spec: dict, path: str, method: str = "post") -> dict:
    body = spec["paths"][f"/api/v1/models/{{name}}/endpoint/{path}/"][method]["requestBody"]
    return _resolve(spec, body["content"]["application/json"]["schema"])


def test_rollout_operations_document_their_required_fields(openapi):
    required = {path: set(_request_schema(openapi, path).get("required", []))
                for path in ("canary", "weight", "rollback", "blue-green/deploy", "shadow",
                             "promote", "abort")}
    assert required == {"canary": {"version"}, "weight": {"weight"}, "rollback": {"version"},
                        "blue-green/deploy": {"version"}, "shadow": {"version"},
                        "promote": set(), "abort": set()}
    assert "plan" in _request_schema(openapi, "canary")["properties"]
    assert "order" in _request_schema(openapi, "rollback")["properties"]


def test_a_webhook_url_is_required_on_create_only(openapi):
    create = openapi["paths"]["/api/v1/webhooks/"]["post"]["requestBody"]
    update = openapi["paths"]["/api/v1/webhooks/{id}/"]["patch"]["requestBody"]
    schema = _resolve(openapi, create["content"]["application/json"]["schema"])
    assert "url" in schema["required"]
    assert "url" not in _resolve(openapi, update["content"]["application/json"]["schema"]).get(
        "required", [])


def test_nullable_fields_are_documented_nullable(openapi):
    schemas = openapi["components"]["schemas"]
    for component, field in [("Model", "owner"), ("Model", "latest_version"),
                             ("Version", "created_by"), ("Endpoint", "updated_at"),
                             ("Endpoint", "stable"), ("Dataset", "created_by"),
                             ("Job", "created_by"), ("Webhook", "model")]:
        assert schemas[component]["properties"][field].get("nullable"), (component, field)


def test_every_operation_documents_its_json_errors(openapi):
    error = {"$ref": "#/components/schemas/Error"}
    operations = [(path, method, op) for path, ops in openapi["paths"].items()
                  for method, op in ops.items()]
    for path, method, op in operations:
        responses = op["responses"]
        for code in ("401", "403"):
            assert responses[code]["content"]["application/json"]["schema"] == error, (path,
                                                                                        method)
        if "{" in path:
            assert "404" in responses, (path, method)
        if "requestBody" in op:
            assert {"400", "413"} <= set(responses), (path, method)
        if method != "get":
            assert "409" in responses, (path, method)
    assert set(openapi["components"]["schemas"]["Error"]["required"]) == {"error"}


def test_delete_shadow_answers_what_is_documented(openapi):
    documented = openapi["paths"]["/api/v1/models/{name}/endpoint/shadow/"]["delete"]
    ok = [code for code in documented["responses"] if code < "400"]
    assert ok == ["200"]
    schema = documented["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/Endpoint"}
    # what it answers is checked over HTTP in test_rollouts (the endpoint, shadow null) and
    # against the schema by test_every_operation_keeps_the_contract


# -- over HTTP ----------------------------------------------------------------------------------


def _is_json_error(r, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.content[:300])
    assert r["Content-Type"].startswith("application/json"), r["Content-Type"]
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    return body


def _nested_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@pytest.mark.django_db(transaction=True)
def test_deeply_nested_metadata_is_a_json_400_in_multipart_and_raw_upload(engineer):
    from django.core.files.uploadedfile import SimpleUploadedFile

    assert engineer.post("/api/v1/models/", {"name": "deep"}, format="json").status_code == 201
    model = samples.mlp(n_in=4, hidden=(8,), n_out=2)
    deep = _nested_object(5000)
    r = engineer.post("/api/v1/models/deep/versions/", {
        "file": SimpleUploadedFile("m.onnx", model), "metadata": deep}, format="multipart")
    body = _is_json_error(r, 400)
    assert body["field"] == "metadata" and "nested too deeply" in body["error"]
    r = engineer.put("/api/v1/models/deep/versions/upload/?filename=m.onnx", model,
                     content_type="application/octet-stream", HTTP_X_MODEL_METADATA=deep)
    body = _is_json_error(r, 400)
    assert body["field"] == "metadata" and "nested too deeply" in body["error"]
    r = engineer.put("/api/v1/models/deep/versions/upload/", model,
                     content_type="application/octet-stream",
                     QUERY_STRING=f"filename=m.onnx&metadata={_nested_object(100)}")
    assert _is_json_error(r, 400)["field"] == "metadata"
    assert engineer.get("/api/v1/models/deep/versions/").json()["count"] == 0
    # a reasonable lineage still goes through
    r = engineer.put("/api/v1/models/deep/versions/upload/?filename=m.onnx", model,
                     content_type="application/octet-stream",
                     HTTP_X_MODEL_METADATA='{"git": {"commit": "abc", "dirty": false}}')
    assert r.status_code == 201 and r.json()["metadata"]["git"]["commit"] == "abc"


@pytest.mark.django_db(transaction=True)
def test_a_deeply_nested_json_body_is_a_400_naming_the_problem(engineer):
    for depth in (5000, 65):
        r = engineer.post("/api/v1/models/", f'{{"name": "m", "tags": {"[" * depth}{"]" * depth}}}',
                          content_type="application/json")
        assert "nested too deeply" in _is_json_error(r, 400)["error"]
    assert engineer.post("/api/v1/models/", '{"name": "m", "tags": ["a"]}',
                         content_type="application/json").status_code == 201


@pytest.mark.django_db(transaction=True)
def test_every_error_under_api_is_json(admin, settings, monkeypatch):
    from rest_framework.test import APIClient

    # 404: no such route, a path converter that does not match, an unknown object
    _is_json_error(admin.get("/api/v1/no-such-thing/"), 404)
    _is_json_error(admin.get("/api/v1/models/m/versions/-1/"), 404)
    _is_json_error(admin.get("/api/nothing-here"), 404)
    _is_json_error(admin.get("/api/v1/models/nope/", HTTP_ACCEPT="text/html"), 404)
    # 405, also from the schema view (which otherwise renders YAML)
    _is_json_error(admin.put("/api/v1/models/", {}, format="json"), 405)
    _is_json_error(admin.post("/api/schema/", {}, format="json"), 405)
    # 400 from Django itself: a host it does not serve
    _is_json_error(admin.get("/api/v1/models/", HTTP_HOST="evil.example"), 400)
    # 413: a JSON body, or a multipart field, over DATA_UPLOAD_MAX_MEMORY_SIZE
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    _is_json_error(admin.post("/api/v1/models/", {"name": "m", "description": "x" * 2000},
                              format="json"), 413)
    assert admin.post("/api/v1/models/", {"name": "big"}, format="json").status_code == 201
    _is_json_error(admin.post("/api/v1/models/big/versions/", {"metadata": "x" * 2000},
                              format="multipart"), 413)
    # 500: an unexpected exception is logged and answered in JSON with the request id
    monkeypatch.setattr("registry.selectors.model_list",
                        lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=admin._credentials["HTTP_AUTHORIZATION"])
    r = client.get("/api/v1/models/", HTTP_X_REQUEST_ID="req-42")
    body = _is_json_error(r, 500)
    assert "req-42" in body["error"] and "boom" not in body["error"]
    # the console keeps its pages
    assert "text/html" in admin.get("/no-such-page/")["Content-Type"]


@pytest.mark.django_db(transaction=True)
def test_an_invalid_page_size_is_a_400(engineer):
    for name in ("a", "b", "c"):
        engineer.post("/api/v1/models/", {"name": name}, format="json")
    for query, field in [("page_size=abc", "page_size"), ("page_size=0", "page_size"),
                         ("page_size=-1", "page_size"), ("page_size=501", "page_size"),
                         ("page=0", "page"), ("page=two", "page")]:
        body = _is_json_error(engineer.get(f"/api/v1/models/?{query}"), 400)
        assert body["field"] == field, query
    page = engineer.get("/api/v1/models/?page_size=2&page=2").json()
    assert page["count"] == 3 and [m["name"] for m in page["results"]] == ["c"]
    _is_json_error(engineer.get("/api/v1/models/?page_size=2&page=3"), 404)


@pytest.mark.django_db(transaction=True)
def test_a_never_deployed_endpoint_answers_the_documented_shape(engineer, openapi):
    engineer.post("/api/v1/models/", {"name": "fresh"}, format="json")
    body = engineer.get("/api/v1/models/fresh/endpoint/").json()
    documented = openapi["components"]["schemas"]["Endpoint"]
    assert set(documented["required"]) <= set(body), set(documented["required"]) - set(body)
    assert body["model"] == "fresh" and body["state"] == "empty" and body["revision"] == 0
    assert body["stable"] is None and body["candidate_weight"] == 0 and body["rollout"] == {}
    assert body["warm_versions"] == [] and body["updated_at"] is None
