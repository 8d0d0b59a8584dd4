"""A starting replica never calls a model unknown: until its first route table is in, a request
naming a model answers 503 with Retry-After (the replica cannot know yet); 404 comes after.

In process: a source we hold back. With real processes: an `mmc-serve --registry` replica
started against the test database, hammered from the moment its port accepts connections."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from serving.core.dataplane import DataPlane
from serving.core.desired_state import DesiredState, ObservedState
from serving.core.reconciler import Reconciler
from serving.http.app import ServingApp, ServingSettings

pytestmark = pytest.mark.faults

INFER = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}

# Every request that names a model, as (method, path, body).
NAMING_A_MODEL = [
    ("POST", "/v2/models/scorer/infer", INFER),
    ("POST", "/v2/models/scorer/versions/1/infer", INFER),
    ("GET", "/v2/models/scorer", None),
    ("GET", "/v2/models/scorer/ready", None),
    ("GET", "/v2/models/scorer/versions/1/ready", None),
    ("GET", "/v2/models/scorer/config", None),
    ("GET", "/v2/models/scorer/stats", None),
    ("POST", "/invocations", INFER),
    ("POST", "/v2/repository/index", None),
]


class HeldBackSource:
    """A DesiredStateSource whose first answer waits until the test releases it."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def revision(self) -> int:
        self.released.wait(10)
        return 1

    def fetch(self) -> DesiredState:
        return DesiredState(1, {}, {})

    def report(self, observed: ObservedState) -> None:
        pass

    def subscribe(self, callback) -> None:
        pass


def test_before_its_first_table_a_replica_answers_503_retry_after_not_404():
    async def scenario() -> None:
        source = HeldBackSource()
        dataplane = DataPlane(replica="t1")
        app = ServingApp(dataplane, Reconciler(source, dataplane, poll_seconds=60,
                                               heartbeat_seconds=60), ServingSettings())
        await app.startup()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://replica") as http:
            try:
                assert (await http.get("/v2/health/live")).status_code == 200
                assert (await http.get("/v2/health/ready")).status_code == 503
                for method, path, body in NAMING_A_MODEL:
                    r = await http.request(method, path, json=body)
                    assert r.status_code == 503, (path, r.status_code, r.text)
                    assert r.headers["retry-after"] == "1", path
                    assert "starting" in r.json()["error"], (path, r.text)
                    assert "model table" in r.json()["error"], (path, r.text)

                source.released.set()
                for _ in range(200):
                    if dataplane.started:
                        break
                    await asyncio.sleep(0.01)
                assert (await http.get("/v2/health/ready")).status_code == 200
                for method, path, body in NAMING_A_MODEL[:-1]:
                    r = await http.request(method, path, json=body)
                    assert r.status_code in (400, 404), (path, r.status_code, r.text)
                    assert "retry-after" not in r.headers, path
                index = await http.post("/v2/repository/index")
                assert index.status_code == 200 and index.json() == []
            finally:
                source.released.set()
                await app.shutdown()

    asyncio.run(scenario())


# -- real processes --------------------------------------------------------------------------


def hammer_from_first_connect(url: str, proc, *, after_ok: int = 30,
                              timeout: float = 60) -> list[tuple[int, dict]]:
    """POST infer from the moment the port accepts until `after_ok` 200s were seen: every
    answer as (status, headers)."""
    answers: list[tuple[int, dict]] = []
    ok = 0
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=10) as http:
        while ok < after_ok and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError("the replica exited while starting")
            try:
                r = http.post("/v2/models/scorer/infer", json=INFER)
            except httpx.ConnectError:
                time.sleep(0.002)  # not listening yet
                continue
            answers.append((r.status_code, dict(r.headers), r.text))
            ok += r.status_code == 200
    return answers


@pytest.mark.django_db(transaction=True)
def test_a_starting_replica_answers_503_until_its_table_then_200_never_404(
        engineer, ready_model, tmp_path):
    from registry import samples
    from tests.replicas import Replica

    ready_model("scorer", samples.mlp(seed=1))
    r = engineer.post("/api/v1/models/scorer/endpoint/deploy/", {"version": 1}, format="json")
    assert r.status_code == 200, r.content

    for attempt in range(3):  # three cold starts: the window is short, so look more than once
        replica = Replica(f"start{attempt}", embedded=False, log_dir=tmp_path)
        try:
            answers = hammer_from_first_connect(replica.url, replica.proc)
        finally:
            replica.stop()
        statuses = [status for status, _, _ in answers]
        assert 404 not in statuses, [a for a in answers if a[0] == 404][:3]
        first_ok = statuses.index(200)
        for status, headers, text in answers[:first_ok]:
            assert status == 503 and headers.get("retry-after") == "1", (status, text)
            assert "starting" in text, text
        assert statuses[first_ok:].count(200) >= 30
        assert set(statuses[first_ok:]) == {200}, answers[first_ok:]
        print(f"start {attempt}: {first_ok} answers of 503 before the first 200")
