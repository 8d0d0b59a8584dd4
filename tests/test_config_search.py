"""Serving-config search of a version: a bounded grid over batching, queue delay, instances,
threads and the response cache, each point applied to the version and measured with the load
test's generator on a real embedded replica; the best point (most req/s with p99 within the
budget and no errors) applied with one call; the version's own settings put back after the
search, whether it finished, was cancelled or its worker died; refusals that write nothing."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from registry.models import AuditEvent, ConfigSearch, ModelVersion, ReplicaHeartbeat
from registry.services.config_search import choose_best, grid_points, settings_of
from registry.services.config_sweep import recover_config_searches, restore
from tests import test_loadtest
from tests.replicas import replicas, wait_until

two_versions = test_loadtest.two_versions  # the fixture: mlp v1 stable, v2 ready and idle
BASE = "/api/v1/models/mlp/versions"
FINISHED = ("succeeded", "failed", "cancelled")


def point(rps, p99, errors=None, failure=None) -> dict:
    figures = {"settings": {}, "rps": rps, "p50_ms": p99 / 2 if p99 else None, "p99_ms": p99,
               "errors": errors or {}}
    return {**figures, "failure": failure} if failure else figures


def test_the_best_point_has_the_most_throughput_within_the_p99_budget_and_no_errors():
    points = [point(900.0, 12.0),            # within 10 ms? no
              point(500.0, 8.0),             # fits
              point(700.0, 9.5),             # fits, faster: the best
              point(950.0, 4.0, errors={"503": 3}),   # errors disqualify
              point(None, None, failure="the replica could not load it so")]
    assert choose_best(points, 10.0) == 2
    assert choose_best(points, 12.0) == 0
    assert choose_best(points, 3.0) is None  # none qualifies: said so, nothing chosen
    assert choose_best([point(700.0, 5.0), point(700.0, 6.0)], 10.0) == 0  # a tie: the first


def test_the_grid_is_its_cross_product_and_what_is_not_searched_keeps_its_value():
    original = {"max_batch_size": 0, "max_queue_delay_us": 100, "instance_count": 1,
                "intra_op_threads": 0, "response_cache": False}
    points = grid_points({"max_batch_size": [0, 8], "instance_count": [1, 2]}, original)
    assert [(p["max_batch_size"], p["instance_count"]) for p in points] == [
        (0, 1), (0, 2), (8, 1), (8, 2)]
    assert {p["max_queue_delay_us"] for p in points} == {100}
    assert all(p["response_cache"] is False and p["intra_op_threads"] == 0 for p in points)


def start(client, number: int, **body):
    return client.post(f"{BASE}/{number}/config-search/", body, format="json")


@pytest.mark.parametrize("body, field", [
    ({"grid": {"max_batch_size": [0, 1, 2, 4], "instance_count": [1, 2, 3, 4],
               "intra_op_threads": [1, 2]}}, "grid"),                   # 32 points
    ({"grid": {"max_batch_size": [0, 1, 2, 4, 8, 16], "instance_count": [1, 2, 3, 4]},
      "seconds": 30}, "seconds"),                                        # 24 × 30 s > 600 s
    ({"grid": {"max_batch_size": [-1]}}, "grid.max_batch_size"),
    ({"grid": {"instance_count": [0, 2]}}, "grid.instance_count"),
    ({"grid": {"instance_count": [2, 2]}}, "grid.instance_count"),
    ({"grid": {"intra_op_threads": list(range(1, 9))}}, "grid.intra_op_threads"),
    ({"grid": {"max_queue_size": [1, 2]}}, "grid"),                      # not searchable
    ({"grid": {}}, "grid"),
    ({"grid": {"instance_count": [1, 2]}, "concurrency": 0}, "concurrency"),
    ({"grid": {"instance_count": [1, 2]}, "seconds": 0}, "seconds"),
    ({"grid": {"instance_count": [1, 2]}, "p99_budget_ms": 0}, "p99_budget_ms"),
])
def test_a_search_beyond_the_bounds_is_refused_naming_the_field_and_writes_nothing(
        two_versions, engineer, body, field):
    before = settings_of(ModelVersion.objects.get(model__name="mlp", number=2))
    r = start(engineer, 2, **body)
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field, r.json()
    assert not ConfigSearch.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="config_search.").exists()
    assert settings_of(ModelVersion.objects.get(model__name="mlp", number=2)) == before


def test_the_refusals_say_what_is_over_the_bound(two_versions, engineer):
    r = start(engineer, 2, grid={"max_batch_size": [0, 1, 2, 4, 8, 16],
                                 "instance_count": [1, 2, 3, 4]}, seconds=30)
    assert "24 points × 30 s = 720 s" in r.json()["error"] and "600" in r.json()["error"]
    r = start(engineer, 2, grid={"max_batch_size": [0, 1, 2, 4], "instance_count": [1, 2, 3, 4],
                                 "intra_op_threads": [1, 2]})
    assert "32 points (4 × 4 × 2)" in r.json()["error"] and "at most 24" in r.json()["error"]
    r = start(engineer, 2, grid={"max_queue_size": [1, 2]})
    assert "max_queue_size" in r.json()["error"] and "cannot be searched" in r.json()["error"]


def test_a_version_taking_real_traffic_needs_confirm_and_nothing_is_written(
        two_versions, engineer):
    r = start(engineer, 1, grid={"instance_count": [1, 2]}, seconds=1)
    assert r.status_code == 409, r.content
    assert r.json()["field"] == "confirm"
    assert "takes real traffic (stable of mlp)" in r.json()["error"]
    assert "confirm=true" in r.json()["error"]
    assert not ConfigSearch.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="config_search.").exists()


def test_viewers_read_searches_but_cannot_start_one(two_versions, client_for):
    viewer = client_for("viewer")
    assert start(viewer, 2, grid={"instance_count": [1, 2]}).status_code == 403
    r = viewer.get(f"{BASE}/2/config-search/")
    assert r.status_code == 200 and r.json()["results"] == []


def wait_search(client, number: int, search_id: int, timeout: float = 90, until=FINISHED):
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = client.get(f"{BASE}/{number}/config-search/{search_id}/").json()
        if body["status"] in until:
            return body
        time.sleep(0.1)
    raise AssertionError(f"config search {search_id} is {body['status']} {body['progress']}")


def test_a_small_sweep_on_an_embedded_replica_measures_restores_and_applies_the_best(
        two_versions, engineer, users, tmp_path):
    from django.test import Client

    original = settings_of(ModelVersion.objects.get(model__name="mlp", number=2))
    with replicas(1, embedded=True, log_dir=tmp_path) as (rep,):
        wait_until(lambda: (ReplicaHeartbeat.objects.get(replica=rep.name).versions
                            .get("mlp:1", {}).get("state") == "READY"), timeout=30,
                   what="v1 loaded")
        r = start(engineer, 2, grid={"instance_count": [1, 2]}, seconds=1, concurrency=2,
                  p99_budget_ms=10_000)
        assert r.status_code == 202, r.content
        search = r.json()
        assert r["Location"] == search["url"] == f"{BASE}/2/config-search/{search['id']}/"
        assert search["points_total"] == 2 and search["replica"] == rep.name
        done = wait_search(engineer, 2, search["id"])
    assert done["status"] == "succeeded", done
    points = done["points"]
    assert [p["settings"]["instance_count"] for p in points] == [1, 2]
    for p in points:
        assert p["rps"] > 0 and 0 < p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"]
        assert p["errors"] == {} and p["ok"] == p["requests"] > 0
    best = max(range(2), key=lambda i: (points[i]["rps"], -i))  # every point fits the budget
    assert done["best"] == best and done["best_point"] == points[best]
    # the version's own settings are back, and every trial was audited as the search's doing
    version = ModelVersion.objects.get(model__name="mlp", number=2)
    assert settings_of(version) == original and done["restore_note"].startswith("the version's")
    trials = AuditEvent.objects.filter(action="version.configure", target="mlp:2",
                                       actor_name=f"config search {search['id']}")
    assert [e.after["instance_count"] for e in trials.order_by("id")] == [2, 1]
    assert AuditEvent.objects.filter(action="config_search.create",
                                     actor_name="engineer").exists()

    browser = Client()
    browser.force_login(users["engineer"])
    page = browser.get("/models/mlp/versions/2/").content.decode()
    assert 'id="config-search"' in page and 'id="config-search-chart"' in page
    assert f'data-point="{best}" data-best="true"' in page

    r = engineer.post(f"{BASE}/2/config-search/{search['id']}/apply/", {}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["instance_count"] == points[best]["settings"]["instance_count"]
    applied = AuditEvent.objects.get(action="config_search.apply")
    assert applied.actor_name == "engineer" and applied.after["point"] == best
    assert AuditEvent.objects.filter(action="version.configure", actor_name="engineer").exists()
    assert engineer.get(f"{BASE}/2/config-search/{search['id']}/").json()["applied_point"] == best


def test_a_cancelled_search_stops_and_puts_the_settings_back(two_versions, engineer,
                                                             tmp_path):
    original = settings_of(ModelVersion.objects.get(model__name="mlp", number=2))
    with replicas(1, embedded=True, log_dir=tmp_path) as (rep,):
        wait_until(lambda: ReplicaHeartbeat.objects.filter(replica=rep.name).exists(),
                   timeout=30, what="replica live")
        r = start(engineer, 2, grid={"max_batch_size": [4, 8]}, seconds=20, concurrency=2)
        assert r.status_code == 202, r.content
        sid = r.json()["id"]
        wait_search(engineer, 2, sid, until=("running",), timeout=30)
        wait_until(lambda: ConfigSearch.objects.get(pk=sid).trial is not None, timeout=60,
                   what="a trial applied")
        r = engineer.post(f"{BASE}/2/config-search/{sid}/cancel/", {"reason": "enough"},
                          format="json")
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.content
        wait_until(lambda: ConfigSearch.objects.get(pk=sid).trial is None, timeout=30,
                   what="settings put back")
    assert settings_of(ModelVersion.objects.get(model__name="mlp", number=2)) == original
    r = engineer.post(f"{BASE}/2/config-search/{sid}/cancel/", {}, format="json")
    assert r.status_code == 409  # over already


def fabricated(version: ModelVersion, **fields) -> ConfigSearch:
    """A search row as a worker left it (no replica needed)."""
    defaults = {"grid": {"instance_count": [1, 3]}, "concurrency": 1, "seconds": 1,
                "p99_budget_ms": 50.0, "replica": "r9", "url": "http://127.0.0.1:9",
                "original": settings_of(version), "points_total": 2}
    return ConfigSearch.objects.create(version=version, **{**defaults, **fields})


def test_a_search_whose_worker_died_is_failed_and_its_trial_settings_are_put_back(
        two_versions, engineer):
    engineer.patch(f"{BASE}/2/", {"instance_count": 3}, format="json")  # as its trial did
    version = ModelVersion.objects.get(model__name="mlp", number=2)
    search = fabricated(version, status="running", original={**settings_of(version),
                                                             "instance_count": 1},
                        trial=settings_of(version),
                        heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert recover_config_searches() == [search.pk]
    search.refresh_from_db()
    assert search.status == "failed" and search.trial is None
    assert "its worker stopped" in search.failure_reason
    assert ModelVersion.objects.get(pk=version.pk).instance_count == 1
    assert AuditEvent.objects.filter(action="config_search.failed").exists()


def test_settings_someone_changed_during_a_search_are_theirs_and_stay(two_versions,
                                                                      engineer):
    version = ModelVersion.objects.get(model__name="mlp", number=2)
    search = fabricated(version, status="cancelled", original={**settings_of(version),
                                                               "instance_count": 1},
                        trial={**settings_of(version), "instance_count": 3})
    engineer.patch(f"{BASE}/2/", {"instance_count": 2}, format="json")  # not the trial's 3
    note = restore(search.pk)
    assert "changed during the search" in note and "instance_count 3 → 2" in note
    assert ModelVersion.objects.get(pk=version.pk).instance_count == 2


def test_apply_needs_a_measured_point_and_a_finished_search(two_versions, engineer):
    version = ModelVersion.objects.get(model__name="mlp", number=2)
    running = fabricated(version, status="running", heartbeat_at=timezone.now())
    url = f"{BASE}/2/config-search/{running.pk}/apply/"
    assert engineer.post(url, {}, format="json").status_code == 409
    ConfigSearch.objects.filter(pk=running.pk).update(
        status="succeeded", points=[point(100.0, 80.0)], best=None)
    r = engineer.post(url, {}, format="json")
    assert r.status_code == 409 and r.json()["field"] == "point"
    assert "no point" in r.json()["error"] and "50 ms" in r.json()["error"]
    r = engineer.post(url, {"point": 5}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "point"
    assert not AuditEvent.objects.filter(action="config_search.apply").exists()


def test_one_search_of_a_version_at_a_time(two_versions, engineer):
    version = ModelVersion.objects.get(model__name="mlp", number=2)
    running = fabricated(version, status="running", heartbeat_at=timezone.now())
    r = start(engineer, 2, grid={"instance_count": [1, 2]}, seconds=1)
    assert r.status_code == 409 and r.json()["field"] == "version"
    assert f"config search {running.pk} of v2 is running" in r.json()["error"]
    assert ConfigSearch.objects.count() == 1


def test_the_predict_key_goes_to_the_worker_but_is_never_stored(
        two_versions, engineer, django_capture_on_commit_callbacks, monkeypatch):
    from registry import background

    sent = []
    monkeypatch.setattr(background, "_send", lambda declared, delay, kwargs, *a: sent.append(
        (declared.name, kwargs)))
    assert engineer.post("/api/v1/models/mlp/endpoint/keys/", {"name": "app"},
                         format="json").status_code == 201
    ReplicaHeartbeat.objects.create(
        replica="r9", address="http://127.0.0.1:9", versions={"mlp:2": {"state": "READY"}},
        started_at=timezone.now(), last_seen=timezone.now())
    body = {"grid": {"instance_count": [1, 2]}, "seconds": 1}
    r = start(engineer, 2, **body)
    assert r.status_code == 400 and r.json()["field"] == "key"
    with django_capture_on_commit_callbacks(execute=True):
        r = start(engineer, 2, **body, key="sekrit-key-123")
    assert r.status_code == 202, r.content
    assert sent == [("registry.run_config_search", {"search_id": r.json()["id"],
                                                    "key": "sekrit-key-123"})]
    stored = str(list(ConfigSearch.objects.values())) + str(
        list(AuditEvent.objects.values_list("after", flat=True)))
    assert "sekrit" not in stored and "sekrit" not in r.content.decode()


def test_the_chart_rings_the_best_point_and_tells_the_misses_apart_by_shape():
    from console.charts import scatter_chart

    points = [point(500.0, 8.0), point(700.0, 9.5), point(900.0, 12.0),
              point(950.0, 4.0, errors={"503": 3}), point(None, None, failure="no load")]
    chart = scatter_chart(points, budget=10.0, best=1)
    assert [d["n"] for d in chart["dots"]] == [0, 1, 2, 3]  # the failed point has no mark
    assert [d["fits"] for d in chart["dots"]] == [True, True, False, False]
    assert chart["best"]["n"] == 1 and chart["best"]["label"] == "#1 best"
    assert chart["dots"][2]["marker"].endswith("h6v6h-6z")  # a square, not only a colour
    assert not chart["budget"]["off"] and chart["budget"]["label"] == "p99 budget 10 ms"
    far = scatter_chart(points, budget=1000.0, best=None)
    assert far["budget"]["off"] and far["budget"]["label"].endswith("→")  # named, not drawn
