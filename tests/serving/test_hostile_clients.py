"""Hostile clients against a real `mmc-serve`: a slow-loris crowd, stalled uploads and bodies over
the buffered-body budget are cut off with an answer, their memory comes back, and normal clients
keep being served meanwhile. The limits are shortened through the environment (as an operator
would set them) so each spec runs in seconds; deadlines in the specs are several times the
limits, so CPU load cannot cross them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import orjson
import pytest

from registry import samples
from tests.serving.test_app import Server, write_model

MIB = 1 << 20
LIMITS = {
    "MMC_HEADER_TIMEOUT_S": "1",
    "MMC_BODY_IDLE_TIMEOUT_S": "1",
    "MMC_BODY_MIN_RATE": "65536",
    "MMC_MAX_BODY_BYTES": str(48 * MIB),
    "MMC_BUFFERED_BODY_BUDGET_BYTES": str(64 * MIB),
    "MMC_MAX_HEADER_BYTES": str(32 * 1024),
}
GIVE_UP_S = 8.0  # 8× the 1 s limits: a hostile connection still open after this was not cut off
INFER = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
REQUEST = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                                    "data": [0.5] * 64}]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile") / "models"
    write_model(root, "mlp", "1", samples.mlp(), {"max_batch_size": 8})
    srv = Server(root, **LIMITS)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def rss_mb(server) -> float:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def rss_settles_below(server, limit_mb: float, within: float = GIVE_UP_S) -> float:
    """The server's RSS once it is under `limit_mb`, or what it still is after `within` s (the
    server gives freed heap back to the OS a second after the last large body is gone)."""
    deadline = time.monotonic() + within
    while (rss := rss_mb(server)) >= limit_mb and time.monotonic() < deadline:
        time.sleep(0.1)
    return rss


def padded(size: int) -> bytes:
    """A valid MLP request of exactly `size` bytes (JSON allows trailing whitespace)."""
    return REQUEST + b" " * (size - len(REQUEST))


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def error_of(answer: bytes) -> str:
    return orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]


class Conn:
    """One raw client connection; `answer` collects everything the server sends until it
    closes, so a spec can tell an answer-and-close from a connection left hanging."""

    async def open(self, port: int) -> Conn:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.began = time.monotonic()
        self.answer = asyncio.ensure_future(self._read_to_close())
        return self

    async def _read_to_close(self) -> tuple[bytes, float]:
        data = b""
        try:
            while chunk := await self.reader.read(65536):
                data += chunk
        except ConnectionError:
            pass
        return data, time.monotonic() - self.began

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def closed_by_server(self, within: float = GIVE_UP_S) -> tuple[bytes, float] | None:
        """What the server sent before closing, and when; None if still open `within` seconds
        of connecting."""
        left = self.began + within - time.monotonic()
        done, _ = await asyncio.wait({self.answer}, timeout=max(0.0, left))
        return self.answer.result() if done else None

    def close(self) -> None:
        self.answer.cancel()
        self.writer.transport.abort()


async def slow_header(port: int, period: float = 0.25) -> tuple[bytes, float] | None:
    """Send a request's headers one byte per `period`; what the server did about it."""
    conn = await Conn().open(port)
    try:
        for i in range(10_000):
            if time.monotonic() - conn.began > GIVE_UP_S:
                return None
            await conn.send((INFER + b"X-Slow: " + b"a" * 10_000)[i:i + 1])
            done, _ = await asyncio.wait({conn.answer}, timeout=period)
            if done:
                return conn.answer.result()
        return None
    except ConnectionError:
        return await conn.closed_by_server()
    finally:
        conn.close()


async def stalled_upload(port: int, declared: int, sent: int, close: bool = False) -> Conn:
    """Send the headers and `sent` bytes of a valid `declared`-byte request, then nothing."""
    conn = await Conn().open(port)
    await conn.send(INFER + (b"Connection: close\r\n" if close else b"")
                    + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % declared)
    body = padded(declared)
    for pos in range(0, sent, MIB):
        await conn.send(body[pos:min(pos + MIB, sent)])
    return conn


def test_a_slow_header_crowd_is_closed_after_the_header_timeout(server):
    async def crowd():
        idle = [await Conn().open(server.port) for _ in range(5)]
        big = await Conn().open(server.port)
        await big.send(INFER + b"X-Big: " + b"a" * 100_000)
        slow = await asyncio.gather(*[slow_header(server.port) for _ in range(30)])
        return slow, [await c.closed_by_server() for c in idle], await big.closed_by_server()

    slow, idle, big = asyncio.run(crowd())
    assert all(s is not None for s in slow), "slow-header connections left open past 8 s"
    for answer, _ in slow:
        assert status_of(answer) == 408, answer
        assert "request headers not complete within 1 s" in error_of(answer)
    assert all(c is not None and c[0] == b"" for c in idle), idle  # closed, nothing to answer
    assert big is not None and status_of(big[0]) == 431, big
    assert "headers exceed 32768 bytes" in error_of(big[0])
    assert httpx.post(f"{server.url}/v2/models/mlp/infer", content=REQUEST).status_code == 200


def test_a_stalled_upload_is_closed_with_408_and_its_memory_returned(server):
    assert httpx.post(f"{server.url}/v2/models/mlp/infer", content=REQUEST).status_code == 200
    before = rss_mb(server)

    async def stall():
        conn = await stalled_upload(server.port, 40 * MIB, 36 * MIB)
        held = rss_mb(server)
        return held, await conn.closed_by_server()

    held, closed = asyncio.run(stall())
    assert closed is not None, "a stalled upload was left open past 8 s"
    answer, _ = closed
    assert status_of(answer) == 408, answer[:300]
    assert b"connection: close" in answer.lower()
    assert "no request body bytes arrived for 1 s" in error_of(answer)
    assert held > before + 20, (before, held)  # it really was holding the upload
    assert rss_settles_below(server, before + 12) < before + 12, (before, held)
    assert httpx.post(f"{server.url}/v2/models/mlp/infer", content=REQUEST).status_code == 200


def test_a_trickling_upload_is_closed_with_408_under_the_minimum_rate(server):
    async def trickle():
        conn = await stalled_upload(server.port, 1 * MIB, 0)
        body = padded(1 * MIB)
        for pos in range(0, 1 * MIB, 1024):  # 1 KiB every 0.2 s: never idle, far too slow
            if conn.answer.done():
                break
            await conn.send(body[pos:pos + 1024])
            await asyncio.sleep(0.2)
        return await conn.closed_by_server()

    closed = asyncio.run(trickle())
    assert closed is not None, "a trickling upload was left open past 8 s"
    assert status_of(closed[0]) == 408, closed[0][:300]
    assert "slower than the minimum of 65536 bytes/s" in error_of(closed[0])


def test_bodies_over_the_buffered_budget_get_503_with_retry_after(server):
    async def over_budget():
        first = await stalled_upload(server.port, 40 * MIB, 2 * MIB, close=True)
        body = padded(40 * MIB)
        refused = await Conn().open(server.port)
        await refused.send(INFER + b"Content-Length: %d\r\n\r\n" % (30 * MIB))
        sent = 2 * MIB
        while sent < 20 * MIB and not refused.answer.done():  # the first trickles on, well
            await first.send(body[sent:sent + 256 * 1024])  # above the minimum rate
            sent += 256 * 1024
            await asyncio.sleep(0.05)
        answer = await refused.closed_by_server()
        await first.send(body[sent:])  # the first completes: its reservation goes back
        done = await first.closed_by_server(within=30)
        first.close()
        return answer, done

    answer, first_done = asyncio.run(over_budget())
    assert answer is not None, "a body over the budget was neither refused nor answered"
    assert first_done is not None and status_of(first_done[0]) == 200, first_done
    assert status_of(answer[0]) == 503, answer[0][:300]
    head = answer[0].lower()
    assert b"retry-after: 1" in head and b"connection: close" in head
    assert "would exceed its budget of 67108864 bytes" in error_of(answer[0])
    r = httpx.post(f"{server.url}/v2/models/mlp/infer", content=padded(30 * MIB), timeout=30)
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def patient_server(tmp_path_factory):
    """The same limits, but 3 s for a head or a body to arrive: the normal clients below share
    an event loop with 100 slow senders, and a machine this suite shares with another suite and
    CPU burners can hold that loop between a request's head and its body for over a second."""
    root = tmp_path_factory.mktemp("hostile-patient") / "models"
    write_model(root, "mlp", "1", samples.mlp(), {"max_batch_size": 8})
    srv = Server(root, **{**LIMITS, "MMC_HEADER_TIMEOUT_S": "3", "MMC_BODY_IDLE_TIMEOUT_S": "3"})
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def test_normal_clients_are_served_during_a_slowloris_crowd(patient_server):
    server = patient_server
    assert httpx.post(f"{server.url}/v2/models/mlp/infer", content=REQUEST).status_code == 200
    before = rss_mb(server)

    async def attack_and_serve():
        crowd = [asyncio.ensure_future(slow_header(server.port, period=0.5)) for _ in range(100)]
        uploads = [await stalled_upload(server.port, 32 * MIB, 30 * MIB) for _ in range(2)]
        statuses = []
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            async def normal(n):
                for _ in range(n):
                    r = await client.post("/v2/models/mlp/infer", content=REQUEST)
                    statuses.append(r.status_code)

            await asyncio.gather(*[normal(25) for _ in range(8)])
        peak = rss_mb(server)
        cut = await asyncio.gather(*crowd)
        ended = [await u.closed_by_server() for u in uploads]
        for u in uploads:
            u.close()
        return statuses, peak, cut, ended

    statuses, peak, cut, ended = asyncio.run(attack_and_serve())
    assert statuses == [200] * 200
    assert all(c is not None and status_of(c[0]) == 408 for c in cut), "slow-loris left open"
    assert all(e is not None and status_of(e[0]) == 408 for e in ended), "uploads left open"
    assert rss_settles_below(server, before + 25) < before + 25, (before, peak)


@pytest.mark.django_db(transaction=True)
def test_embedded_mode_cuts_off_slow_headers_and_stalled_v2_uploads_too(tmp_path):
    from tests.replicas import replicas

    limits = {k: v for k, v in LIMITS.items() if k != "MMC_MAX_HEADER_BYTES"}
    with replicas(1, embedded=True, log_dir=tmp_path, **limits) as (console,):
        async def hostile():
            slow = await asyncio.gather(slow_header(console.port), slow_header(console.port))
            ended = []
            for path in (b"/v2/models/any/infer", b"/invocations"):
                conn = await Conn().open(console.port)
                await conn.send(b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                b"Content-Length: 1000000\r\n\r\n" + b" " * 1000)
                ended.append(await conn.closed_by_server())
                conn.close()
            return slow, ended

        slow, ended = asyncio.run(hostile())
        assert all(s is not None and status_of(s[0]) == 408 for s in slow), slow
        assert all(e is not None and status_of(e[0]) == 408 for e in ended), ended
        assert "no request body bytes arrived" in error_of(ended[0][0])


def test_connections_over_the_cap_get_503_until_one_closes(tmp_path):
    root = tmp_path / "models"
    write_model(root, "mlp", "1", samples.mlp(), {"max_batch_size": 8})
    srv = Server(root, MMC_MAX_CONNECTIONS="4")
    try:
        srv.wait_ready()

        async def over_cap():
            held = [await Conn().open(srv.port) for _ in range(4)]  # idle, within the cap
            extra = await Conn().open(srv.port)
            await extra.send(INFER + b"Content-Length: %d\r\n\r\n" % len(REQUEST) + REQUEST)
            answer = await extra.closed_by_server()
            for conn in held:
                conn.close()
            return answer

        answer = asyncio.run(over_cap())
        assert answer is not None and status_of(answer[0]) == 503, answer
        assert b"retry-after: 1" in answer[0].lower()
        assert "maximum of 4 connections" in error_of(answer[0])
        deadline = time.monotonic() + GIVE_UP_S
        while (status := httpx.post(f"{srv.url}/v2/models/mlp/infer",
                                    content=REQUEST).status_code) != 200:
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
    finally:
        srv.stop()
