"""A replica killed with SIGKILL (no goodbye) stays visible: the API lists it lost with its last
heartbeat, the health bar is degraded naming it, and ?wait names it instead of reporting
convergence, until an operator removes it. Real replicas (`mmc-serve --registry` clustered, the
embedded console+serving process otherwise) against the test database."""

import time

import pytest

from console import health
from registry import samples
from tests.replicas import replicas, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
STALE = 2.0  # seconds without a heartbeat before a replica is lost (in-process and children)
FAST = {"MMC_HEARTBEAT_SECONDS": "0.25", "MMC_REPLICA_STALE_SECONDS": str(STALE),
        "MMC_ROLLOUT_TICK_SECONDS": "0"}


def deploy(client, version: int, wait: float = 15) -> dict:
    r = client.post(f"/api/v1/models/twin/endpoint/deploy/?wait={wait}", {"version": version},
                    format="json")
    assert r.status_code == 200, r.content
    return r.json()["convergence"]


def listed(client) -> dict:
    return {r["replica"]: r for r in client.get("/api/v1/replicas/").json()["replicas"]}


def test_a_killed_replica_is_lost_named_by_health_and_wait_until_removed(
        engineer, ready_model, settings, tmp_path):
    settings.REPLICA_STALE_SECONDS = STALE
    ready_model("twin", samples.mlp(seed=1))
    ready_model("twin", samples.mlp(seed=2))
    with replicas(2, embedded=not settings.CLUSTERED, log_dir=tmp_path, **FAST) as (r1, r2):
        before = deploy(engineer, 1)
        assert before["converged"] and before["replicas"] == 2, before
        assert health.serving().state == "ok"

        r2.stop(sig_kill=True)
        killed_at = time.time()
        rows = wait_until(lambda: (rows := listed(engineer)).get("r2", {}).get("state") == "lost"
                          and rows, timeout=STALE + 5, what="r2 listed as lost")
        assert time.time() - killed_at < STALE + 2
        assert rows["r1"]["state"] == "live" and rows["r1"]["lost_since"] is None
        assert rows["r2"]["lost_since"] == rows["r2"]["last_seen"]  # its last heartbeat

        check = health.serving()
        assert check.state == "degraded" and "1 lost: r2, silent since " in check.detail, check

        t0 = time.monotonic()
        after = deploy(engineer, 2, wait=20)
        assert time.monotonic() - t0 < 10  # r1 applied it; r2 is not waited for
        assert after["converged"] is False and (after["replicas"], after["lost"]) == (1, 1)
        assert [(b["replica"], b["state"]) for b in after["laggards"]] == [("r2", "lost")]
        assert after["laggards"][0]["reason"].startswith("lost: no heartbeat since ")

        r = engineer.delete("/api/v1/replicas/r1/")
        assert r.status_code == 409 and "is live" in r.json()["error"]
        assert engineer.delete("/api/v1/replicas/r2/").status_code == 204
        assert list(listed(engineer)) == ["r1"]
        check = health.serving()
        assert check.state == "ok" and check.detail.startswith("1/1 replicas at revision"), check
        assert r1.proc.poll() is None
