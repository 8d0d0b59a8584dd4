"""Scale to zero on one replica (in-process, real onnxruntime): a model idle past its route's
timeout is unloaded but stays routed and the replica stays ready; the next request loads it once
for every request waiting, is answered and counted as a cold start; a request that cannot wait
gets 503 + Retry-After and still starts the load; a rollout racing the load fails no request."""

from __future__ import annotations

import asyncio

import pytest
from test_reconciler import FakeSource, Replica, desired, run, spec

from registry import samples
from serving.core.desired_state import SCALED_TO_ZERO, ModelRoute

IDLE = 0.2  # seconds: the route's idle timeout, short so specs wait little


@pytest.fixture
def versions(tmp_path):
    return spec(tmp_path, "1", samples.mlp(seed=0)), spec(tmp_path, "2", samples.mlp(seed=1))


def route(**kw) -> ModelRoute:
    return ModelRoute("m", stable="1", scale_to_zero_after_s=IDLE, **kw)


async def until_scaled_to_zero(replica: Replica, timeout: float = 30.0) -> None:
    """Run the replica's idle check until it unloads m (the spec's bound, not a timing)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while "m" not in await replica.reconciler.scale_idle():
        assert asyncio.get_running_loop().time() < deadline, "m never scaled to zero"
        await asyncio.sleep(IDLE / 2)


def test_an_idle_model_is_unloaded_stays_routed_and_the_replica_stays_ready(versions):
    source = FakeSource(desired(1, route(), versions[0]))

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        assert (await replica.infer()).status_code == 200
        await until_scaled_to_zero(replica)
        table = replica.dataplane.table
        assert ("m", "1") not in table.loaded and "m" in table.routes
        assert table.status[("m", "1")] == (SCALED_TO_ZERO, None)
        observed = replica.reconciler.observed().versions["m:1"]
        assert observed["state"] == SCALED_TO_ZERO
        assert observed["stats"]["count"] == 1  # the counters outlive the unload
        ready = await replica.http.get("/v2/health/ready")
        assert ready.status_code == 200, ready.text
        assert replica.states()["1"] == ("UNAVAILABLE",
                                         "scaled to zero: an inference request loads it")
        metadata = await replica.http.get("/v2/models/m")
        assert metadata.status_code == 503 and "scaled to zero" in metadata.json()["error"]
        await replica.reconciler.stop()

    run(main())


def test_the_first_requests_after_it_share_one_load_and_are_answered(versions):
    source = FakeSource(desired(1, route(), versions[0]))

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        await until_scaled_to_zero(replica)
        answers = await asyncio.gather(*(replica.infer() for _ in range(8)),
                                       replica.infer("1"))  # a pinned one wakes it too
        assert [a.status_code for a in answers] == [200] * 9
        stats = replica.dataplane.table.loaded[("m", "1")].stats
        assert stats.cold_starts == 1 and stats.cold_start_last_s > 0
        assert stats.success_count == 9
        observed = replica.reconciler.observed().versions["m:1"]
        assert observed["state"] == "READY" and observed["stats"]["cold_starts"] == 1
        metrics = (await replica.http.get("/metrics")).text
        assert 'mmc_cold_starts_total{model="m",replica="t1",version="1"} 1.0' in metrics
        assert 'mmc_cold_start_last_seconds{model="m",replica="t1",version="1"}' in metrics
        # busy again: it stays loaded while requests keep coming within the timeout
        assert (await replica.infer()).status_code == 200
        await replica.reconciler.stop()

    run(main())


def test_a_request_that_cannot_wait_gets_503_retry_after_and_the_load_goes_on(versions):
    source = FakeSource(desired(1, route(), versions[0]))

    async def main():
        replica = Replica(source)
        replica.dataplane.cold_start_wait_s = 0  # MMC_COLD_START_WAIT_SECONDS=0: never wait
        await replica.reconciler.reconcile()
        await until_scaled_to_zero(replica)
        r = await replica.infer()
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert "cold start" in r.json()["error"]
        while replica.reconciler._waking:  # the load it started finishes without it
            await asyncio.sleep(0.05)
        answered = await replica.infer()
        assert answered.status_code == 200
        assert replica.dataplane.table.loaded[("m", "1")].stats.cold_starts == 1
        await replica.reconciler.stop()

    run(main())


@pytest.mark.parametrize("first", ["requests", "rollout"])
def test_a_rollout_racing_a_cold_start_fails_no_request(versions, first):
    source = FakeSource(desired(1, route(), versions[0]))

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        await until_scaled_to_zero(replica)
        canary = desired(2, route(candidate="2", candidate_weight=50), *versions)
        if first == "requests":
            requests = [asyncio.create_task(replica.infer()) for _ in range(12)]
            while "m" not in replica.reconciler._waking:
                await asyncio.sleep(0)
            source.state = canary
            rollout = asyncio.create_task(replica.reconciler.reconcile())
        else:
            source.state = canary
            rollout = asyncio.create_task(replica.reconciler.reconcile())
            while not replica.dataplane.loading:  # the rollout is loading version 2
                await asyncio.sleep(0)
            requests = [asyncio.create_task(replica.infer()) for _ in range(12)]
        answers = await asyncio.gather(*requests)
        await rollout
        assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers]
        assert {a.headers["x-model-version"] for a in answers} <= {"1", "2"}
        table = replica.dataplane.table
        assert table.revision == 2 and table.routes["m"].candidate == "2"
        assert {k for k in table.loaded} == {("m", "1"), ("m", "2")}
        await replica.reconciler.stop()

    run(main())


def test_a_new_version_loads_while_its_model_sleeps_and_turning_it_off_loads_all(versions):
    source = FakeSource(desired(1, route(), versions[0]))

    async def main():
        replica = Replica(source)
        await replica.reconciler.reconcile()
        await until_scaled_to_zero(replica)
        source.state = desired(2, route(candidate="2", candidate_weight=10), *versions)
        await replica.reconciler.reconcile()
        status = replica.dataplane.table.status
        assert status[("m", "1")] == (SCALED_TO_ZERO, None)  # still asleep, still routed
        assert status[("m", "2")] == ("READY", None)  # the rollout's version is loaded
        assert replica.dataplane.table.routes["m"].candidate == "2"
        source.state = desired(3, ModelRoute("m", stable="1", candidate="2",
                                             candidate_weight=10), *versions)
        await replica.reconciler.reconcile()
        table = replica.dataplane.table
        assert set(table.loaded) == {("m", "1"), ("m", "2")}
        assert replica.reconciler.observed().versions["m:1"]["stats"]["cold_starts"] == 0
        await replica.reconciler.stop()

    run(main())


def test_the_cold_start_wait_comes_from_the_environment(versions):
    from serving.http.app import ServingSettings, create_app

    settings = ServingSettings.from_env({"MMC_COLD_START_WAIT_SECONDS": "2.5"})
    app = create_app(FakeSource(desired(1, route(), versions[0])), replica="t9",
                     settings=settings)
    assert app.dataplane.cold_start_wait_s == 2.5
    assert ServingSettings.from_env({}).cold_start_wait_seconds == 30.0


def test_a_model_repository_folder_sets_it_in_config_json(tmp_path):
    import json

    from registry.signatures import read_signature
    from serving.sources.repository import RepositorySource

    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(samples.mlp())
    config = tmp_path / "m" / "config.json"
    config.write_text(json.dumps({"scale_to_zero_after_seconds": 90}))
    source = RepositorySource(tmp_path, read_signature=read_signature)
    assert source.fetch().routes["m"].scale_to_zero_after_s == 90
    config.write_text(json.dumps({"scale_to_zero_after_seconds": -1}))
    with pytest.raises(ValueError, match="scale_to_zero_after_seconds must be 0"):
        RepositorySource(tmp_path, read_signature=read_signature).fetch()
