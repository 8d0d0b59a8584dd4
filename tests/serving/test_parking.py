"""Workers park while the host has no core to spare for them (serving/parking.py): the policy
and the supervisor's side on fed figures, the figures themselves read from /proc for a burning
process, and a real two-worker server that parks one when told, keeps answering through the
change, and spreads again once told two may listen."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving import parking
from serving.parking import ParkingPolicy, SpareCpu
from tests.serving.test_workers import (  # noqa: F401
    BODY,
    _children,
    _wait,
    repository,
    wait_both_ready,
)

# -- the policy ---------------------------------------------------------------------------------


def _run(policy: ParkingPolicy, spares: list[float], demand: float = 0.9) -> list[int]:
    return [policy.decide(s, demand) for s in spares]


def test_a_host_with_cores_to_spare_keeps_every_worker_listening():
    assert _run(ParkingPolicy(2), [2.0, 1.9, 1.6, 1.5, 1.45, 2.0]) == [2] * 6


def test_three_samples_short_of_a_core_park_a_worker_and_a_dip_does_not():
    assert _run(ParkingPolicy(2), [0.8, 0.9, 1.9, 0.8, 0.7, 0.85]) == [2, 2, 2, 2, 2, 1]


def test_an_idle_server_keeps_its_count_whatever_a_neighbour_does():
    # our workers use almost nothing while others are busy: no reason to park
    assert _run(ParkingPolicy(2), [0.1] * 5, demand=0.1) == [2] * 5
    # parked and idle while the host is free again: stays so until load shows the need
    assert _run(ParkingPolicy(2, active=1), [2.0] * 5, demand=0.05) == [1] * 5
    # an idle sample breaks a streak
    policy = ParkingPolicy(2)
    assert [policy.decide(s, u) for s, u in [(0.8, 0.8), (0.8, 0.8), (1.0, 0.0), (0.8, 0.8),
                                             (0.8, 0.8), (0.8, 0.8)]] == [2, 2, 2, 2, 2, 1]


def test_a_parked_worker_listens_again_once_a_core_is_idle_beside_the_busy_one():
    policy = ParkingPolicy(2, active=1)
    # one worker saturated (1.0) and 0.3 idle: not enough; 0.7 idle beside it: listen again
    assert _run(policy, [1.3, 1.3, 1.3, 1.7, 1.7, 1.7]) == [1, 1, 1, 1, 1, 2]


def test_the_count_follows_the_cores_to_spare_between_one_and_all():
    policy = ParkingPolicy(4)
    assert _run(policy, [2.1] * 3, demand=2.0) == [4, 4, 2]
    assert _run(policy, [0.6] * 3, demand=0.6) == [2, 2, 1]
    assert _run(policy, [9.0] * 3, demand=0.9) == [1, 1, 4]


def test_a_burning_process_counts_as_cpu_its_supervisor_could_give_it():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        spare = SpareCpu()
        spare.sample([burner.pid])
        time.sleep(1.0)
        # a busy loop is always running or waiting to run: its demand is one core whatever
        # share of it the host gave it; spare is that share plus the idle, at most every CPU
        total, demand = spare.sample([burner.pid])
        assert 0.7 < demand < 1.3
        assert total <= len(spare.cpus) + 0.05
    finally:
        burner.kill()
        burner.wait()


class _Fed:
    """Stands in for SpareCpu: (spare, demand) figures, one per sample."""

    def __init__(self, figures: list[tuple[float, float]]) -> None:
        self.figures = list(figures)

    def sample(self, pids: list[int]) -> tuple[float, float] | None:
        return self.figures.pop(0)


def test_the_supervisor_tells_the_workers_through_its_folder_and_says_so(tmp_path, caplog,
                                                                         monkeypatch):
    monkeypatch.setattr(parking, "SAMPLE_SECONDS", 0.0)
    fed = _Fed([(0.7, 0.9)] * 3 + [(1.8, 1.0)] * 3)
    supervised = parking.Parking(str(tmp_path), 2, spare=fed)
    assert parking.read_active(str(tmp_path)) == 2  # all listen from the start
    seen = []
    for _ in range(6):
        supervised.tick([1, 2])
        seen.append(parking.read_active(str(tmp_path)))
    assert seen == [2, 2, 1, 1, 1, 2]
    assert "1 of 2 workers listening (0.70 cores to spare)" in caplog.text
    assert "2 of 2 workers listening (1.80 cores to spare)" in caplog.text


# -- a real server ------------------------------------------------------------------------------


def _answered(url: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("mmc_predict_requests_total{"):
            replica = line.split('replica="')[1].split('"')[0]
            found[replica] = found.get(replica, 0) + float(line.rsplit(" ", 1)[1])
    return found


def _on_new_connections(url: str, n: int) -> None:
    for _ in range(n):
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.post("/v2/models/mlp/infer", json=BODY).status_code == 200


def test_a_worker_told_to_park_stops_taking_connections_and_listens_again_when_told(
        repository):  # noqa: F811
    from tests.serving.test_app import Server

    # the supervisor decides nothing itself (off): the spec writes what it would write
    server = Server(repository, MMC_SERVE_WORKERS="2", MMC_SERVE_PARKING="off")
    failures: list[str] = []
    stop = threading.Event()

    def keep_alive_client() -> None:  # pooled connections, busy, throughout the change
        with httpx.Client(base_url=server.url, timeout=10) as client:
            while not stop.is_set():
                try:
                    r = client.post("/v2/models/mlp/infer", json=BODY)
                    if r.status_code != 200:
                        failures.append(f"{r.status_code} {r.text}")
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))

    clients = [threading.Thread(target=keep_alive_client) for _ in range(4)]
    try:
        wait_both_ready(server)
        workers = sorted(_children(server.proc.pid))
        folder = Path(dict(line.split("=", 1) for line in Path(
            f"/proc/{workers[0]}/environ").read_text().split("\0") if "=" in line)[
            "MMC_SERVE_WORKER_DIR"])
        for client in clients:
            client.start()
        parking.write_active(str(folder), 1)
        _wait(lambda: b"parked" in server.log.read_bytes(), 30, "the parked worker's log")
        # the parked worker's pooled connections close after their next answer
        _wait(lambda: _settled(server.url), 30, "the parked worker's last answer")
        before = _answered(server.url)
        _on_new_connections(server.url, 20)
        after = _answered(server.url)
        assert after.get("test-r1-w1", 0) == before.get("test-r1-w1", 0)  # parked: none of the 20
        assert after["test-r1-w0"] >= before["test-r1-w0"] + 20

        parking.write_active(str(folder), 2)
        _wait(lambda: b"listening again" in server.log.read_bytes(), 30, "listening again")
        before = _answered(server.url)
        _on_new_connections(server.url, 30)
        after = _answered(server.url)
        # all 30 on one worker: 1 in 5e8
        assert after.get("test-r1-w1", 0) > before.get("test-r1-w1", 0)
        stop.set()
        for client in clients:
            client.join(15)
        assert failures == []
    finally:
        stop.set()
        server.stop()


def _settled(url: str) -> bool:
    """The parked worker (w1) answered nothing across half a second of the clients' load."""
    before = _answered(url).get("test-r1-w1", 0)
    time.sleep(0.5)
    return _answered(url).get("test-r1-w1", 0) == before


@pytest.mark.parametrize("value", ["off", "0", "false"])
def test_parking_can_be_turned_off(monkeypatch, value):
    monkeypatch.setenv(parking.ENV_PARKING, value)
    assert not parking.enabled()
    monkeypatch.setenv(parking.ENV_PARKING, "auto")
    assert parking.enabled()
