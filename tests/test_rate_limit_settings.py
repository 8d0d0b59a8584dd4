"""Setting rate limits and daily quotas: per endpoint and per predict key through the API and the
console, validated (a 400 naming the field, nothing written), audited, shipped to replicas with
the route table, enforced by a replica built from that table, and today's use shown."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.conf import settings

from registry import samples, services
from registry.audit import Actor
from registry.models import AuditEvent, Endpoint, EndpointApiKey
from registry.serving_source import build_desired_state
from serving.core.desired_state import api_key_hash
from serving.core.rate_limits import Limits, PredictKey, quota_store
from tests.inprocess_replica import Clock, InProcessReplica

pytestmark = pytest.mark.django_db(transaction=True)
SYSTEM = Actor.system("test")


@pytest.fixture
def deployed(ready_model):
    ready_model("scorer", samples.mlp())
    services.endpoint_deploy(model_name="scorer", version_number=1, actor=SYSTEM)
    return "scorer"


def test_limits_are_set_through_the_api_audited_and_shipped_with_the_route_table(
        engineer, admin, deployed):
    revision = Endpoint.objects.get(model__name="scorer").revision
    r = engineer.put("/api/v1/models/scorer/endpoint/limits/",
                     {"rps": 50, "burst": 80, "daily_quota": 100_000, "reason": "launch"},
                     format="json")
    assert r.status_code == 200, r.content
    assert r.json()["limits"] == {"rps": 50.0, "burst": 80, "daily_quota": 100_000,
                                  "used_today": 0}
    key, raw = services.api_key_create(model_name="scorer", name="checkout", actor=SYSTEM)
    r = engineer.put(f"/api/v1/models/scorer/endpoint/keys/{key.prefix}/limits/",
                     {"rps": 2.5}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["limits"] == {"rps": 2.5, "burst": 0, "daily_quota": 0, "used_today": None}
    listed = engineer.get("/api/v1/models/scorer/endpoint/keys/").json()
    assert [k["limits"]["rps"] for k in listed] == [2.5]
    # only what was given changes
    r = engineer.put("/api/v1/models/scorer/endpoint/limits/", {"rps": 0}, format="json")
    assert r.json()["limits"] == {"rps": 0.0, "burst": 80, "daily_quota": 100_000,
                                  "used_today": 0}
    assert Endpoint.objects.get(model__name="scorer").revision > revision
    events = admin.get("/api/v1/audit/?model=scorer").json()["results"]
    changes = [(e["target"], e["before"], e["after"]) for e in events
               if e["action"] == "limits.set"]
    assert changes == [
        ("scorer", {"rps": 50.0, "burst": 80, "daily_quota": 100_000},
         {"rps": 0.0, "burst": 80, "daily_quota": 100_000}),
        (f"scorer/{key.prefix}", {"rps": 0.0, "burst": 0, "daily_quota": 0},
         {"rps": 2.5, "burst": 0, "daily_quota": 0}),
        ("scorer", {"rps": 0.0, "burst": 0, "daily_quota": 0},
         {"rps": 50.0, "burst": 80, "daily_quota": 100_000}),
    ]
    assert events[-1 - [e["action"] for e in reversed(events)].index("limits.set")][
        "reason"] == "launch"
    route = build_desired_state().routes["scorer"]
    assert route.limits == Limits(rps=0, burst=80, daily_quota=100_000)
    assert route.keys == {api_key_hash(raw): PredictKey(key.prefix, Limits(rps=2.5))}
    assert raw not in repr(route)


@pytest.mark.parametrize("body, field, words", [
    ({"rps": -1}, "rps", "0 (no limit) or more"),
    ({"rps": 2_000_000}, "rps", "at most 1000000"),
    ({"rps": "fast"}, "rps", "valid number"),
    ({"burst": 1.5}, "burst", "integer"),
    ({"burst": -3}, "burst", "0 (no limit) or more"),
    ({"daily_quota": 10**13}, "daily_quota", "at most"),
    ({"daily_quota": 10, "rps": -0.5}, "rps", "0 (no limit) or more"),
    ({}, "rps", "at least one"),
])
def test_bad_limit_values_are_400s_naming_the_field_and_nothing_is_written(
        engineer, deployed, body, field, words):
    key, _ = services.api_key_create(model_name="scorer", name="app", actor=SYSTEM)
    for url in ("/api/v1/models/scorer/endpoint/limits/",
                f"/api/v1/models/scorer/endpoint/keys/{key.prefix}/limits/"):
        r = engineer.put(url, body, format="json")
        assert r.status_code == 400, (url, r.content)
        assert r.json()["field"] == field and words in r.json()["error"], r.json()
    ep = Endpoint.objects.get(model__name="scorer")
    assert ep.limits == Limits() and EndpointApiKey.objects.get(pk=key.pk).limits == Limits()
    assert not AuditEvent.objects.filter(action="limits.set").exists()


def test_only_engineers_set_limits_and_only_on_active_keys(client_for, engineer, deployed):
    viewer = client_for("viewer")
    assert viewer.put("/api/v1/models/scorer/endpoint/limits/", {"rps": 1},
                      format="json").status_code == 403
    key, _ = services.api_key_create(model_name="scorer", name="old", actor=SYSTEM)
    services.api_key_revoke(model_name="scorer", prefix=key.prefix, actor=SYSTEM)
    r = engineer.put(f"/api/v1/models/scorer/endpoint/keys/{key.prefix}/limits/",
                     {"rps": 1}, format="json")
    assert r.status_code == 404 and r.json()["field"] == "key"


def test_the_console_sets_limits_a_replica_enforces_them_and_the_page_shows_todays_use(
        users, deployed, tmp_path):
    from django.test import Client

    client = Client()
    client.force_login(users["engineer"])
    key, raw = services.api_key_create(model_name="scorer", name="checkout", actor=SYSTEM)
    r = client.post("/models/scorer/deployment/limits/",
                    {"rps": "200", "burst": "0", "daily_quota": "1000"})
    assert r.status_code == 302 and r["Location"].endswith("#limits")
    r = client.post(f"/models/scorer/deployment/keys/{key.prefix}/limits/",
                    {"rps": "0", "burst": "0", "daily_quota": "2"})
    assert r.status_code == 302
    # what the console asks for is refused with the reason, nothing written
    r = client.post("/models/scorer/deployment/limits/",
                    {"rps": "-1", "burst": "0", "daily_quota": "0"})
    assert r.status_code == 400 and "Requests per second" in r.content.decode()
    r = client.post("/models/scorer/deployment/limits/",
                    {"rps": "5000000", "burst": "0", "daily_quota": "0"})
    assert r.status_code == 400 and "rps must be at most 1000000" in r.content.decode()
    assert Endpoint.objects.get(model__name="scorer").rate_limit_rps == 200

    # A replica built from the registry's route table (the store the console reads from).
    desired = build_desired_state()

    async def serve():
        replica = await InProcessReplica("r1", desired,
                                         store=quota_store(settings.QUOTA_REDIS_URL),
                                         wall=Clock(time.time())).start()
        answers = [(await replica.infer(raw)).status_code for _ in range(3)]
        refused = await replica.infer(raw)
        await replica.sync()
        await replica.stop()
        return answers, refused

    answers, refused = asyncio.run(asyncio.wait_for(serve(), 60))
    assert answers == [200, 200, 429] and refused.status_code == 429
    assert f"predict key {key.prefix}" in refused.json()["error"]
    html = client.get("/models/scorer/deployment/").content.decode()
    assert '<dd id="endpoint-rps">200 on each replica, burst 200</dd>' in html
    assert '<dd id="endpoint-quota">2 of 1000 used today (UTC)</dd>' in html
    row = html[html.index(f'id="key-{key.prefix}"'):]
    row = row[:row.index("</tr>")]
    assert '<td class="nowrap key-quota">2 / 2</td>' in row
    assert 'id="kl-' in row and "Save" in row  # the key's own limits form
    assert [e.action for e in AuditEvent.objects.filter(action="limits.set")] == [
        "limits.set", "limits.set"]
