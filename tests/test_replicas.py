"""Replicas as the control plane sees them, from heartbeat rows the specs write: a replica that
went silent stays listed as lost until an operator removes it or it is forgotten; one applying a
new revision is converging, not degraded; ?wait names a lost replica instead of converging; and
the health bar says the store's free space."""

from datetime import timedelta

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from console import health
from console.templatetags.console import health_bar
from registry.convergence import wait_for_revision
from registry.models import AuditEvent, ReplicaHeartbeat
from registry.notify import bump_revision, current_revision
from registry.services.rollouts import housekeeping
from registry.serving_source import RegistrySource
from registry.store.space import GIB
from serving.core.desired_state import ObservedState

pytestmark = pytest.mark.django_db(transaction=True)


def heartbeat(name: str, *, revision: int, silent: float = 0.0, behind: float | None = None,
              degraded: str = "") -> ReplicaHeartbeat:
    now = timezone.now()
    return ReplicaHeartbeat.objects.create(
        replica=name, revision=revision, started_at=now - timedelta(hours=2), degraded=degraded,
        last_seen=now - timedelta(seconds=silent), address=f"10.0.0.9:{8000 + len(name)}",
        behind_since=None if behind is None else now - timedelta(seconds=behind))


@pytest.fixture
def revision() -> int:
    from django.db import transaction

    with transaction.atomic():
        return bump_revision()


def test_a_silent_replica_is_listed_as_lost_with_its_last_heartbeat(engineer, revision, settings):
    settings.REPLICA_STALE_SECONDS = 10
    heartbeat("r1", revision=revision)
    dead = heartbeat("r2", revision=revision, silent=60)
    body = engineer.get("/api/v1/replicas/").json()
    rows = {r["replica"]: r for r in body["replicas"]}
    assert (body["live"], body["lost"], body["converged"]) == (1, 1, 1)
    assert rows["r1"]["state"] == "live" and rows["r1"]["lost_since"] is None
    assert rows["r2"]["state"] == "lost"
    assert rows["r2"]["lost_since"] == dead.last_seen.isoformat().replace("+00:00", "Z")


def test_an_operator_removes_a_lost_replica_but_not_a_live_one(client_for, revision, settings):
    settings.REPLICA_STALE_SECONDS = 10
    heartbeat("r1", revision=revision)
    heartbeat("r2", revision=revision, silent=60)
    engineer, viewer = client_for("engineer"), client_for("viewer")
    assert viewer.delete("/api/v1/replicas/r2/").status_code == 403
    r = engineer.delete("/api/v1/replicas/r1/")
    assert r.status_code == 409
    assert "replica 'r1' is live" in r.json()["error"] and "stop it first" in r.json()["error"]
    assert engineer.delete("/api/v1/replicas/nope/").status_code == 404
    assert engineer.delete("/api/v1/replicas/r2/?reason=host+retired").status_code == 204
    assert [r["replica"] for r in engineer.get("/api/v1/replicas/").json()["replicas"]] == ["r1"]
    event = AuditEvent.objects.get(action="replica.remove")
    assert (event.target, event.actor_name, event.reason) == ("r2", "engineer", "host retired")
    assert event.before["revision"] == revision


def test_housekeeping_forgets_a_replica_lost_for_longer_than_the_setting(revision, settings):
    settings.REPLICA_STALE_SECONDS, settings.REPLICA_FORGET_SECONDS = 10, 3600
    heartbeat("r1", revision=revision)
    heartbeat("lost-a-while", revision=revision, silent=600)
    heartbeat("long-gone", revision=revision, silent=7200)
    assert housekeeping() == ["replica long-gone: forgotten"]
    assert set(ReplicaHeartbeat.objects.values_list("replica", flat=True)) == {
        "r1", "lost-a-while"}
    event = AuditEvent.objects.get(action="replica.forget")
    assert event.target == "long-gone" and event.actor_name == "rollout-scheduler"


def test_wait_names_a_lost_replica_as_a_laggard_without_waiting_for_it(revision, settings):
    settings.REPLICA_STALE_SECONDS = 10
    heartbeat("r1", revision=revision)
    dead = heartbeat("r2", revision=revision - 1, silent=60)
    out = wait_for_revision(revision, timeout=30)  # returns at once: r1 is there, r2 cannot be
    assert out["converged"] is False and (out["replicas"], out["lost"]) == (1, 1)
    (laggard,) = out["laggards"]
    assert laggard["replica"] == "r2" and laggard["state"] == "lost"
    assert laggard["reason"] == f"lost: no heartbeat since {dead.last_seen:%H:%M:%S} UTC"
    ReplicaHeartbeat.objects.filter(replica="r2").delete()
    assert wait_for_revision(revision, timeout=0)["converged"] is True


@pytest.mark.usefixtures("analysis_ticking")  # the analysis runs: only serving converges
def test_a_replica_applying_a_new_revision_is_converging_not_degraded(revision, settings):
    settings.REPLICA_STALE_SECONDS, settings.REPLICA_CONVERGE_SECONDS = 10, 30
    heartbeat("r1", revision=revision - 1, behind=3)
    check = health.serving()
    assert (check.state, check.ok) == ("converging", False)
    assert check.detail == f"converging: 0/1 replicas at revision {revision}"
    html = render_to_string("console/partials/health_bar.html", health_bar())
    assert 'class="health health-converging"' in html and "<strong>Converging</strong>" in html
    assert "Serving: <strong>converging</strong>" in html and "Degraded" not in html


def test_a_replica_behind_for_longer_than_the_bound_is_degraded(revision, settings):
    settings.REPLICA_STALE_SECONDS, settings.REPLICA_CONVERGE_SECONDS = 10, 30
    heartbeat("r1", revision=revision)
    heartbeat("r2", revision=revision - 1, behind=45)
    check = health.serving()
    assert check.state == "degraded"
    assert check.detail == (f"1/2 replicas at revision {revision}; "
                            "1 behind for more than 30 s: r2")


def test_a_replica_that_reports_itself_degraded_is_degraded_even_while_converging(
        revision, settings):
    settings.REPLICA_STALE_SECONDS = 10
    heartbeat("r1", revision=revision - 1, behind=1, degraded="route source unavailable")
    check = health.serving()
    assert check.state == "degraded" and "1 degraded (route source unavailable)" in check.detail


def test_health_names_a_lost_replica_until_it_is_removed(engineer, revision, settings):
    settings.REPLICA_STALE_SECONDS = 10
    heartbeat("r1", revision=revision)
    dead = heartbeat("r2", revision=revision, silent=60)
    check = health.serving()
    assert check.state == "degraded"
    assert check.detail == (f"1/1 replicas at revision {revision}; "
                            f"1 lost: r2, silent since {dead.last_seen:%H:%M:%S} UTC")
    html = render_to_string("console/partials/health_bar.html", health_bar())
    assert "<strong>Degraded</strong>" in html and "1 lost: r2" in html
    assert engineer.delete("/api/v1/replicas/r2/").status_code == 204
    assert health.serving().state == "ok"


def test_heartbeats_keep_when_a_replica_fell_behind_and_clear_it_once_caught_up(revision):
    source = RegistrySource(address="10.0.0.9:8000")
    source.report(ObservedState(replica="r1", revision=revision - 1, versions={}))
    first = ReplicaHeartbeat.objects.get(replica="r1").behind_since
    assert first is not None
    source.report(ObservedState(replica="r1", revision=revision - 1, versions={}))
    assert ReplicaHeartbeat.objects.get(replica="r1").behind_since == first  # still the first
    source.report(ObservedState(replica="r1", revision=current_revision(), versions={}))
    assert ReplicaHeartbeat.objects.get(replica="r1").behind_since is None
    source.leave("r1")  # a graceful shutdown: gone, not lost
    assert not ReplicaHeartbeat.objects.exists()


def test_store_check_says_free_space_and_degrades_below_the_threshold(settings):
    settings.STORE_MIN_FREE_BYTES = 0
    check = health.store()
    assert check.state == "ok" and " GiB free of " in check.detail
    settings.STORE_MIN_FREE_BYTES = 10**18  # more than any disk: below it
    check = health.store()
    assert check.state == "degraded"
    assert check.detail.endswith(f"below {10**18 / GIB:.1f} GiB (MMC_STORE_MIN_FREE_BYTES)")
    assert "Store" in [c.name for c in health.checks()]

