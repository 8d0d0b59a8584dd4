"""Models, aliases, search and the error shape."""

import pytest

from registry import samples
from tests.conftest import upload, wait_validated

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_list_search_filter_and_paginate_models(engineer):
    for i in range(7):
        tags = ["vision"] if i % 2 else ["nlp"]
        r = engineer.post("/api/v1/models/", {"name": f"model-{i}", "description": f"d{i}",
                                              "tags": tags}, format="json")
        assert r.status_code == 201, r.content
    page = engineer.get("/api/v1/models/?page_size=3").json()
    assert page["count"] == 7 and len(page["results"]) == 3 and page["next"]
    assert [m["name"] for m in engineer.get("/api/v1/models/?tag=vision").json()["results"]] == [
        "model-1", "model-3", "model-5"]
    assert engineer.get("/api/v1/models/?search=model-4").json()["count"] == 1


def test_bad_input_gets_a_message_naming_the_field(engineer):
    r = engineer.post("/api/v1/models/", {"name": "Bad Name!"}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "name"
    r = engineer.post("/api/v1/models/", {"name": "ok", "tags": "notalist"}, format="json")
    assert r.status_code == 400 and "tags" in r.json()["error"]
    r = engineer.post("/api/v1/models/", "{not json", content_type="application/json")
    assert r.status_code == 400 and r.json()["error"]
    engineer.post("/api/v1/models/", {"name": "dup"}, format="json")
    r = engineer.post("/api/v1/models/", {"name": "dup"}, format="json")
    assert r.status_code == 409 and "already exists" in r.json()["error"]
    r = engineer.get("/api/v1/models/nope/")
    assert r.status_code == 404 and "nope" in r.json()["error"]


def test_aliases_point_at_versions_and_move(engineer, ready_model):
    ready_model("ranker", samples.mlp(seed=1))
    ready_model("ranker", samples.mlp(seed=2))
    assert engineer.put("/api/v1/models/ranker/aliases/production/", {"version": 1},
                        format="json").status_code == 200
    engineer.put("/api/v1/models/ranker/aliases/staging/", {"version": 2}, format="json")
    engineer.put("/api/v1/models/ranker/aliases/production/", {"version": 2}, format="json")
    aliases = {a["name"]: a["version"] for a in engineer.get(
        "/api/v1/models/ranker/aliases/").json()}
    assert aliases == {"production": 2, "staging": 2}
    assert sorted(engineer.get("/api/v1/models/ranker/versions/2/").json()["aliases"]) == [
        "production", "staging"]
    r = engineer.put("/api/v1/models/ranker/aliases/production/", {"version": 9}, format="json")
    assert r.status_code == 404 and "no version 9" in r.json()["error"]
    assert engineer.delete("/api/v1/models/ranker/aliases/staging/").status_code == 204
    assert engineer.delete("/api/v1/models/ranker/aliases/staging/").status_code == 404


def test_update_model_description_and_tags(engineer, admin):
    engineer.post("/api/v1/models/", {"name": "m"}, format="json")
    r = engineer.patch("/api/v1/models/m/", {"description": "new", "tags": ["b", "a"]},
                       format="json")
    assert r.status_code == 200 and r.json()["tags"] == ["a", "b"]
    event = admin.get("/api/v1/audit/?action=model.update").json()["results"][0]
    assert event["before"]["description"] == "" and event["after"]["description"] == "new"
    assert event["actor_name"] == "engineer" and event["request_id"]


def test_deploy_needs_a_ready_version(engineer):
    engineer.post("/api/v1/models/", {"name": "m"}, format="json")
    upload(engineer, "m", b"garbage")
    wait_validated(engineer, "m", 1)
    r = engineer.post("/api/v1/models/m/endpoint/deploy/", {"version": 1}, format="json")
    assert r.status_code == 409 and "failed, not ready" in r.json()["error"]


def test_openapi_schema_and_docs_render(engineer):
    r = engineer.get("/api/schema/?format=json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    assert "/api/v1/models/{name}/versions/" in paths
    assert engineer.get("/api/docs/").status_code == 200
