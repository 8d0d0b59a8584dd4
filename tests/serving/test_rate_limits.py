"""Rate limits and daily quotas on the data plane: a key over its rate gets a 429 naming it while
other keys pass, an endpoint-wide limit, quotas that reset at the UTC day's end (a fed clock, no
waiting for midnight), one count shared by replicas through a real Redis, and requests served
while that Redis is down or hung. Replicas run in process with clocks the specs move."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from serving.core.desired_state import DesiredState, ModelRoute, api_key_hash
from serving.core.rate_limits import (
    Admission,
    Limits,
    PredictKey,
    RateLimited,
    RedisQuotaStore,
    quota_key,
)
from tests.inprocess_replica import ROW, Clock, InProcessReplica, mlp_state
from tests.replicas import free_port, wait_until

FAST, OTHER = "mmck_fast-key-secret", "mmck_other-key-secret"
#: One second before a UTC midnight.
LATE = datetime(2031, 5, 6, 23, 59, 59, tzinfo=UTC).timestamp()


def keyed(**limits) -> ModelRoute:
    """Model m with two keys: FAST with the given limits, OTHER with none."""
    fast, other = api_key_hash(FAST), api_key_hash(OTHER)
    return ModelRoute("m", stable="1", api_key_hashes=frozenset({fast, other}),
                      keys={fast: PredictKey("mmck_fast-k", Limits(**limits)),
                            other: PredictKey("mmck_other-")})


def Replica(name: str, desired: DesiredState, *, store=None, wall: Clock | None = None,
            mono: Clock | None = None) -> InProcessReplica:
    return InProcessReplica(name, desired, store=store, wall=wall or Clock(LATE - 3600),
                            mono=mono)


def state(tmp: Path, route: ModelRoute) -> DesiredState:
    return mlp_state(tmp, route)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_key_over_its_rate_gets_429_with_retry_after_while_another_key_passes(tmp_path):
    async def main():
        r = await Replica("r1", state(tmp_path, keyed(rps=0.5, burst=2))).start()
        assert [(await r.infer(FAST)).status_code for _ in range(2)] == [200, 200]
        refused = await r.infer(FAST)
        assert refused.status_code == 429
        assert refused.headers["content-type"] == "application/json"
        assert refused.headers["retry-after"] == "2"  # one token per 2 s
        error = refused.json()["error"]
        assert "rate limit" in error and "mmck_fast-k" in error and FAST not in error
        assert (await r.infer(OTHER)).status_code == 200  # other keys are not affected
        r.mono.t += 2
        assert (await r.infer(FAST)).status_code == 200  # a token came back
        assert (await r.infer(FAST)).status_code == 429
        metrics = (await r.http.get("/metrics")).text
        assert ('mmc_predict_rejected_total{key="mmck_fast-k",model="m",reason="key_rate",'
                'replica="r1"} 2.0') in metrics
        assert ('mmc_predict_requests_total{key="mmck_fast-k",model="m",replica="r1"} 3.0'
                in metrics)
        assert 'mmc_predict_requests_total{key="mmck_other-",model="m",replica="r1"} 1.0' in metrics
        assert FAST not in metrics and OTHER not in metrics
        await r.stop()

    run(main())


def test_an_endpoint_wide_rate_limit_counts_every_caller_and_the_sagemaker_route(tmp_path):
    route = ModelRoute("m", stable="1", limits=Limits(rps=2, burst=3))

    async def main():
        r = await Replica("r1", state(tmp_path, route)).start()
        assert [(await r.infer()).status_code for _ in range(2)] == [200, 200]
        assert (await r.infer(path="/invocations")).status_code == 200
        for path in ("/v2/models/m/infer", "/v2/models/m/versions/1/infer", "/invocations"):
            refused = await r.infer(path=path)
            assert refused.status_code == 429, path
            assert "rate limit of model 'm'" in refused.json()["error"]
            assert refused.headers["retry-after"] == "1"
        r.mono.t += 0.5  # one token at 2 per second
        assert (await r.infer(path="/invocations")).status_code == 200
        assert (await r.infer()).status_code == 429
        metrics = (await r.http.get("/metrics")).text
        assert ('mmc_predict_rejected_total{key="none",model="m",reason="endpoint_rate",'
                'replica="r1"} 4.0') in metrics
        await r.stop()

    run(main())


def test_a_daily_quota_refuses_until_the_utc_day_ends_then_counts_again(tmp_path):
    route = keyed(daily_quota=3)
    route = ModelRoute(**{**route.__dict__, "limits": Limits(daily_quota=5)})

    async def main():
        wall = Clock(LATE - 10)
        r = await Replica("r1", state(tmp_path, route), wall=wall).start()
        assert [(await r.infer(FAST)).status_code for _ in range(3)] == [200] * 3
        refused = await r.infer(FAST)
        assert refused.status_code == 429
        assert "daily quota of predict key mmck_fast-k" in refused.json()["error"]
        assert refused.headers["retry-after"] == "11"  # until 00:00 UTC
        assert [(await r.infer(OTHER)).status_code for _ in range(2)] == [200] * 2
        refused = await r.infer(OTHER)  # the endpoint's 5 a day are used up
        assert refused.status_code == 429 and "daily quota of model 'm'" in refused.json()["error"]
        wall.t = LATE + 2  # a new UTC day
        await r.sync()
        assert [(await r.infer(FAST)).status_code for _ in range(3)] == [200] * 3
        assert (await r.infer(FAST)).status_code == 429
        assert r.admission.quota.store.read(
            [quota_key("m", "mmck_fast-k", "2031-05-07")]) == {
                quota_key("m", "mmck_fast-k", "2031-05-07"): 3}
        await r.stop()

    run(main())


@pytest.fixture
def redis_server(tmp_path):
    """A private redis-server on a free port (never the machine's 6379)."""
    import redis

    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_timeout=1)

    def answers():
        try:
            return client.ping()
        except redis.RedisError:
            return False

    wait_until(answers, 10, what="redis-server to start")
    proc.client, proc.port, proc.answers = client, port, answers
    proc.url = f"redis://127.0.0.1:{port}/0"
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_two_replicas_share_one_daily_count_in_redis(tmp_path, redis_server):
    route = ModelRoute("m", stable="1", limits=Limits(daily_quota=5))
    desired = state(tmp_path, route)
    today = datetime.fromtimestamp(LATE - 3600, UTC).strftime("%Y-%m-%d")
    counter = quota_key("m", None, today)

    async def main():
        a = await Replica("a", desired, store=RedisQuotaStore(redis_server.url)).start()
        b = await Replica("b", desired, store=RedisQuotaStore(redis_server.url)).start()
        assert [(await a.infer()).status_code for _ in range(3)] == [200] * 3
        await a.sync()
        assert int(redis_server.client.get(counter)) == 3
        assert 7000 < redis_server.client.ttl(counter) <= 3601 + 3600  # day end + 1 h grace
        await b.sync()  # b learns a's 3
        assert [(await b.infer()).status_code for _ in range(3)] == [200, 200, 429]
        await b.sync()
        await a.sync()
        assert int(redis_server.client.get(counter)) == 5
        refused = await a.infer()  # a admitted 3 itself: the 5 are the cluster's
        assert refused.status_code == 429 and "daily quota" in refused.json()["error"]
        await a.stop()
        await b.stop()

    run(main())


def test_requests_are_served_while_redis_is_down_or_hung_and_counted_after(tmp_path,
                                                                           redis_server, caplog):
    route = ModelRoute("m", stable="1", limits=Limits(daily_quota=1000))
    today = datetime.fromtimestamp(LATE - 3600, UTC).strftime("%Y-%m-%d")
    counter = quota_key("m", None, today)

    async def main():
        # Hung (SIGSTOP): a sync waits on it in a worker thread; requests do not.
        store = RedisQuotaStore(redis_server.url, timeout=30)
        r = await Replica("r1", state(tmp_path, route), store=store).start()
        assert (await r.infer()).status_code == 200
        redis_server.send_signal(signal.SIGSTOP)
        stuck = asyncio.create_task(r.sync())
        await asyncio.sleep(0)
        answers = [(await r.infer()).status_code for _ in range(3)]
        assert answers == [200] * 3 and not stuck.done()
        redis_server.send_signal(signal.SIGCONT)
        await stuck
        await r.sync()
        assert int(redis_server.client.get(counter)) == 4
        await r.stop()
        # Down: the sync fails fast, is logged once, and what was served is added on return.
        redis_server.kill()
        redis_server.wait()
        r = await Replica("r2", state(tmp_path, route),
                          store=RedisQuotaStore(redis_server.url)).start()
        with caplog.at_level(logging.WARNING, logger="serving.core.rate_limits"):
            for _ in range(3):
                assert (await r.infer()).status_code == 200
                await r.sync()
        assert len([m for m in caplog.messages if "counted on this replica only" in m]) == 1
        assert "mmc_quota_store_up{replica=\"r2\"} 0.0" in (await r.http.get("/metrics")).text
        assert r.admission.quota.pending == {counter: 3}
        back = subprocess.Popen(["redis-server", "--port", str(redis_server.port), "--bind",
                                 "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
                                 str(tmp_path)], stdout=subprocess.DEVNULL)
        try:
            wait_until(lambda: redis_server.answers(), 10, what="redis-server to restart")
            await r.sync()
            assert int(redis_server.client.get(counter)) == 3
            assert r.admission.quota.pending == {}
            await r.stop()
        finally:
            back.kill()
            back.wait()

    run(main())


def test_two_serving_processes_share_one_daily_count_in_redis(tmp_path, redis_server):
    """Real `mmc-serve --model-repository` processes, the limits from config.json."""
    from test_app import Server, write_model

    from registry import samples

    root = tmp_path / "models"
    write_model(root, "mlp", "1", samples.mlp(), {"max_batch_size": 8, "api_keys": [
        {"sha256": api_key_hash(FAST), "label": "fast", "daily_quota": 6}]})
    servers = [Server(root, REDIS_URL=redis_server.url, MMC_QUOTA_SYNC_SECONDS="0.05")
               for _ in range(2)]
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    counter = quota_key("mlp", "fast", day)
    admitted = [0, 0]
    try:
        for server in servers:
            server.wait_ready()

        def infer(i: int) -> httpx.Response:
            r = httpx.post(f"{servers[i].url}/v2/models/mlp/infer", json=ROW,
                           headers={"X-Api-Key": FAST}, timeout=10)
            admitted[i] += r.status_code == 200
            return r

        assert [infer(i).status_code for i in (0, 0, 0, 1, 1, 1)] == [200] * 6
        wait_until(lambda: int(redis_server.client.get(counter) or 0) >= 6, 20,
                   what="both replicas' counts in Redis")
        for i in (0, 1):
            refused = wait_until(lambda i=i: (r := infer(i)).status_code == 429 and r, 20,
                                 interval=0.3, what=f"replica {i} to refuse")
            assert "daily quota of predict key fast" in refused.json()["error"]
            assert 0 < int(refused.headers["retry-after"]) <= 86_400
        # one count: each replica alone admitted less than the quota, together all of it
        assert admitted[0] < 6 and admitted[1] < 6
        wait_until(lambda: int(redis_server.client.get(counter)) == sum(admitted), 20,
                   what="every admission counted once")
    finally:
        for server in servers:
            server.stop()


def test_a_refused_request_takes_nothing_from_any_limit():
    wall, mono = Clock(LATE - 5), Clock(50.0)
    admission = Admission(clock=wall, monotonic=mono)
    key = PredictKey("k1", Limits(rps=1, burst=2))
    endpoint = Limits(daily_quota=1)
    admission.admit("m", endpoint, key)  # one token left, the day's one request used
    for _ in range(3):
        with pytest.raises(RateLimited) as refused:
            admission.admit("m", endpoint, key)
        assert refused.value.reason == "endpoint_quota" and refused.value.retry_after == 6
    wall.t = LATE + 1  # a new day; the monotonic clock has not moved
    admission.admit("m", endpoint, key)  # the token the refusals did not take
    with pytest.raises(RateLimited) as refused:
        admission.admit("m", Limits(), key)
    assert refused.value.reason == "key_rate"
    assert admission.requests == {("m", "k1"): 2}
    assert admission.rejected == {("m", "k1", "endpoint_quota"): 3, ("m", "k1", "key_rate"): 1}
