"""Issue 23's attacks on the gRPC port of a real `mmc-serve` (tests/edge_attacks.py), on both
gRPC transports: the attacker is refused, reset or closed, healthy tritonclient.grpc and HTTP
clients calling meanwhile keep being answered without a long stall, the server's memory does not
grow with what the attacker declares or withholds, and its memory and file descriptors come back
after. Limits are shortened through the environment, as an operator would set them, so each
spec runs in seconds; time bounds are seconds, not milliseconds: this suite runs on 2 cores
beside another full suite."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from registry import samples
from tests import edge_attacks as attacks
from tests.edge_attacks import (
    ENHANCE_YOUR_CALM,
    GRPC_STATUS,
    MIB,
    REFUSED_STREAM,
    HealthyClients,
    ProcessWatch,
    tile_model,
)
from tests.embedded import embedded_start
from tests.serving.test_app import Server, _free_port, write_model

REPO = Path(__file__).resolve().parents[2]
MAX_CONNECTIONS = 64
MAX_MESSAGE = 4 * MIB
LIMITS = {
    "MMC_MAX_CONNECTIONS": str(MAX_CONNECTIONS),  # HTTP 48 + gRPC 16 (connection_caps)
    "MMC_HEADER_TIMEOUT_S": "2",
    "MMC_IDLE_TIMEOUT_S": "3",
    "MMC_MAX_BODY_BYTES": str(MAX_MESSAGE),  # also the gRPC message limit
    # answers held for clients that do not read: an answer held costs up to ~5x its size in
    # RSS (the message, its serialized copy, grpcio's buffers), so half the default keeps the
    # window-0 spec well inside GROWTH_MB on both workers
    "MMC_UNSENT_ANSWER_BUDGET_BYTES": str(8 * MIB),
}
STALL_S = 3.0  # the longest a healthy call may take while an attack runs
GROWTH_MB = 150  # how much the server's RSS may grow during an attack
UNSENT_GROWTH_MB = 210  # the window-0 spec's own bound, below the 256 MiB an unbounded server holds
SETTLE_MB = 40  # ... and how near its start it must come back afterwards
SETTLE_S = 10.0
#: Where the fast transport does not meet a spec yet (measured, not guessed: run with
#: MMC_GRPC_TRANSPORT=fast after the transport's own hardening)
FAST_NOT_YET: dict[str, str] = {
}


@pytest.fixture(scope="module", params=["grpcio", "fast"])
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"edge-{request.param}") / "models"
    write_model(root, "mlp", "1", samples.mlp(), {"max_batch_size": 8})
    write_model(root, "tile", "1", tile_model(), {"max_batch_size": 8})
    srv = Server(root, grpc=True, MMC_GRPC_TRANSPORT=request.param, **LIMITS)
    srv.transport = request.param
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def not_yet(server, spec: str) -> None:
    if server.transport == "fast" and spec in FAST_NOT_YET:
        pytest.xfail(FAST_NOT_YET[spec])


def under_attack(pid: int, attack, *, grpc_address: str | None, http_url: str | None,
                 model: str = "mlp", min_s: float = 1.5):
    """Run `attack()` while healthy clients call (for at least `min_s`); (seen, healthy, watch)."""
    with HealthyClients(model=model, grpc_address=grpc_address, http_url=http_url) as healthy:
        watch = ProcessWatch(pid)
        began = time.monotonic()
        seen = attack()
        time.sleep(max(0.0, began + min_s - time.monotonic()))
    watch.stop()
    return seen, healthy, watch


def attacked(server, attack, **kw):
    return under_attack(server.proc.pid, attack, grpc_address=server.grpc_address,
                        http_url=server.url, **kw)


def assert_served(healthy: HealthyClients, *, may_refuse: tuple[str, ...] = ()) -> None:
    """Every healthy call answered (or refused with one of `may_refuse`), none slower than
    STALL_S."""
    for name, calls in (("gRPC", healthy.grpc), ("HTTP", healthy.http)):
        assert calls.ok > 0, f"{name}: no healthy call completed ({calls.summary()})"
        assert set(calls.failed) <= set(may_refuse), f"{name}: {calls.summary()}"
        assert calls.longest_s < STALL_S, f"{name}: a call took {calls.longest_s:.2f} s"


def assert_bounded(watch: ProcessWatch, growth_mb: float = GROWTH_MB) -> None:
    """RSS grew less than `growth_mb`, and RSS and fds come back near where they started."""
    assert watch.growth_mb < growth_mb, f"RSS grew {watch.growth_mb:.0f} MB"
    rss, fds = watch.settles(rss_within_mb=SETTLE_MB, fds_within=4, timeout=SETTLE_S)
    assert rss < watch.start_rss + SETTLE_MB, (watch.start_rss, rss)
    assert fds <= watch.start_fds + 4, (watch.start_fds, fds)


def refusals(seen) -> int:
    """Streams the server refused to set up (grpcio says ENHANCE_YOUR_CALM when a client opens
    them too fast)."""
    return seen.resets[REFUSED_STREAM] + seen.resets[ENHANCE_YOUR_CALM]


def refused(seen) -> bool:
    """The server said no: GOAWAY, a reset stream, an error status, or a closed connection."""
    return (seen.goaway is not None or bool(seen.resets) or seen.closed
            or any(code != 0 for code in seen.statuses))


# -- 1. memory reserved before the data arrives ----------------------------------------------------


def test_a_declared_message_length_reserves_nothing_before_the_bytes_arrive(server):
    seen, healthy, watch = attacked(server, lambda: attacks.declared_length_streams(
        server.grpc_port, streams=64, declared=MAX_MESSAGE, hold_s=2.0))
    assert not seen.closed or seen.goaway is not None, seen.summary()
    assert_served(healthy)
    assert_bounded(watch)  # 64 × 4 MiB reserved up front would be 256 MiB


# -- 2. compression bomb ---------------------------------------------------------------------------


def test_a_gzip_bomb_is_refused_with_resource_exhausted_before_it_inflates(server):
    seen, healthy, watch = attacked(server, lambda: attacks.compression_bomb(
        server.grpc_port, inflated=256 * MIB, wait_s=8))
    assert GRPC_STATUS[8] == "RESOURCE_EXHAUSTED"
    assert seen.statuses == {8: 1}, seen.summary()
    assert_served(healthy)
    assert_bounded(watch)


# -- 3. connection crowds --------------------------------------------------------------------------


def test_idle_and_preface_only_connections_are_closed_by_the_handshake_and_idle_timeouts(server):
    def crowd():
        idle = attacks.connection_crowd([server.grpc_port], count=6, hold_s=9)
        preface = attacks.connection_crowd([server.grpc_port], count=6, preface=True, hold_s=9)
        return idle, preface

    (idle, preface), healthy, watch = attacked(server, crowd)
    for seen in (idle, preface):
        assert seen.closed and seen.notes["closed_by_server"] == 6, seen.summary()
    assert idle.notes["last_closed_s"] < 2 + 3, idle.summary()  # the 2 s handshake timeout
    assert preface.notes["last_closed_s"] < 3 + 3, preface.summary()  # the 3 s idle timeout
    assert_served(healthy)
    assert_bounded(watch)


def test_a_connection_flood_past_the_cap_is_refused_and_both_ports_keep_answering(server):
    count = MAX_CONNECTIONS + 100
    seen, healthy, watch = attacked(server, lambda: attacks.connection_crowd(
        [server.grpc_port, server.port], count=count, hold_s=8))
    assert seen.notes["closed_by_server"] + seen.notes["refused_at_connect"] == count, (
        seen.summary())
    assert seen.notes["answers"].get("HTTP 503", 0) > 0, seen.summary()
    # never more client connections held than the cap (plus the healthy clients' and a few
    # accepted only to be refused at once)
    assert watch.peak_fds <= watch.start_fds + MAX_CONNECTIONS + 8, (watch.start_fds,
                                                                    watch.peak_fds)
    assert_served(healthy, may_refuse=("503", "UNAVAILABLE"))
    assert_bounded(watch)


# -- 4. cheap frames that cost the server a lot ----------------------------------------------------


def test_a_huge_settings_frame_over_many_open_streams_does_not_stall_the_loop(server):
    seen, healthy, watch = attacked(server, lambda: attacks.big_settings(
        server.grpc_port, open_streams=1000, settings_bytes=MIB, wait_s=3))
    # streams past the concurrency limit are refused, not set up
    assert refusals(seen) >= 800 or seen.goaway is not None, seen.summary()
    assert_served(healthy)
    assert_bounded(watch)


def test_hpack_size_updates_filling_a_header_block_are_refused(server):
    seen, healthy, watch = attacked(server, lambda: attacks.hpack_size_updates(
        server.grpc_port, block_bytes=2 * MIB, wait_s=3))
    assert refused(seen), seen.summary()
    assert_served(healthy)
    assert_bounded(watch)


def test_a_header_block_past_the_metadata_limit_is_refused(server):
    seen, healthy, watch = attacked(server, lambda: attacks.oversized_header_block(
        server.grpc_port, block_bytes=4 * MIB, wait_s=3))
    assert refused(seen), seen.summary()
    assert_served(healthy)
    assert_bounded(watch)


def test_a_flood_of_empty_continuation_frames_is_cut_off(server):
    seen, healthy, watch = attacked(server, lambda: attacks.continuation_flood(
        server.grpc_port, frames=1_000_000, time_s=4))
    assert refused(seen), seen.summary()
    assert_served(healthy)
    assert_bounded(watch)


def test_rapid_reset_is_answered_with_goaway_or_refused_streams(server):
    seen, healthy, watch = attacked(server, lambda: attacks.rapid_reset(
        server.grpc_port, streams=100_000, time_s=4))
    refusing = refusals(seen) >= seen.sent_units // 2
    assert seen.goaway is not None or seen.closed or refusing, seen.summary()
    assert watch.cpu_s < 8, f"the attack cost the server {watch.cpu_s:.1f} s of CPU"
    assert_served(healthy)
    assert_bounded(watch)


def test_a_ping_flood_from_a_client_that_never_reads_is_cut_off(server):
    seen, healthy, watch = attacked(server, lambda: attacks.ping_flood(
        server.grpc_port, max_bytes=128 * MIB, time_s=4))
    # told to calm down and closed, or no longer read from: either way its acks do not pile up
    assert (seen.goaway == ENHANCE_YOUR_CALM or seen.closed
            or seen.notes["stopped_reading"]), seen.summary()
    assert watch.cpu_s < 8, f"the attack cost the server {watch.cpu_s:.1f} s of CPU"
    assert_served(healthy)
    assert_bounded(watch)


# -- 5. back-pressure ------------------------------------------------------------------------------


def test_clients_granting_a_window_of_zero_cannot_make_the_server_hold_large_answers(server):
    not_yet(server, "window_zero")
    seen, healthy, watch = attacked(server, lambda: attacks.window_zero(
        server.grpc_port, model="tile", calls=64, connections=4, hold_s=3))
    assert seen.notes["connections"] == 4, seen.summary()
    # a budget for answers not yet sent may refuse calls while the attacker holds it
    assert_served(healthy, may_refuse=("RESOURCE_EXHAUSTED",))
    # 4 × 64 answers of 1 MiB each would hold 256 MiB at the very least if all were computed
    # and kept; with the 8 MiB budget growth was 58-84 MB quiet and 155 MB once beside both CI
    # lanes (worker threads' allocator arenas), so the bound sits between the two outcomes
    assert_bounded(watch, growth_mb=UNSENT_GROWTH_MB)


def test_a_stream_sending_past_its_declared_message_is_stopped(server):
    seen, healthy, watch = attacked(server, lambda: attacks.oversend(
        server.grpc_port, declared=10, max_bytes=64 * MIB, time_s=4))
    assert refused(seen) or seen.notes["stopped_reading"], seen.summary()
    assert_served(healthy)
    assert_bounded(watch)


# -- 6. malformed metadata -------------------------------------------------------------------------


def test_invalid_base64_in_binary_metadata_fails_that_call_and_keeps_the_connection(server):
    seen, healthy, watch = attacked(server, lambda: attacks.bad_binary_metadata(
        server.grpc_port, model="mlp"))
    assert seen.notes["bad_call"] in ("INVALID_ARGUMENT", "INTERNAL"), seen.summary()
    assert seen.notes["alive"], seen.summary()
    assert_served(healthy)


# -- the embedded server ---------------------------------------------------------------------------


@pytest.fixture
def embedded(tmp_path):
    """`manage.py start --grpc-port` in a data folder of its own (sqlite, the demo model)."""
    grpc_port = _free_port()
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
    env = {**{k: os.environ[k] for k in keep if k in os.environ}, "HOME": str(tmp_path), **LIMITS}
    with embedded_start(tmp_path, env, "--grpc-port", str(grpc_port),
                        ready_path="/v2/models/demo-mlp/ready") as server:
        try:
            yield server.proc, server.url, grpc_port
        finally:
            shutil.rmtree(tmp_path / "data", ignore_errors=True)


def test_the_embedded_server_keeps_answering_http_through_an_idle_crowd_and_fd_flood(embedded):
    proc, url, grpc_port = embedded
    http_port = int(url.rpartition(":")[2])
    count = MAX_CONNECTIONS + 100

    def flood():
        crowd = attacks.connection_crowd([grpc_port], count=6, preface=True, hold_s=8)
        return crowd, attacks.connection_crowd([grpc_port, http_port], count=count, hold_s=8)

    (crowd, seen), healthy, watch = under_attack(
        proc.pid, flood, grpc_address=f"127.0.0.1:{grpc_port}", http_url=url, model="demo-mlp")
    assert crowd.closed and crowd.notes["closed_by_server"] == 6, crowd.summary()
    assert seen.notes["closed_by_server"] + seen.notes["refused_at_connect"] == count, (
        seen.summary())
    assert watch.peak_fds <= watch.start_fds + MAX_CONNECTIONS + 8, (watch.start_fds,
                                                                    watch.peak_fds)
    assert_served(healthy, may_refuse=("503", "UNAVAILABLE"))
    assert_bounded(watch)
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200
