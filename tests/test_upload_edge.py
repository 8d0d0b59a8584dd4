"""Uploads are authenticated before a byte is stored (issue 23, item 4), through the real ASGI
server: a raw upload (`PUT …/versions/upload/`) is admitted from its headers alone (caller,
role, uploads in progress, free space), its body stalls or trickles into a 408 that removes what
arrived, and any other body over 1 MiB is read only from a caller with a token or a session.

Each server gets an artifact folder of its own, so what its upload spool (ARTIFACT_ROOT/tmp)
holds is what these specs sent. "Nothing stored" is seen two ways: a watcher samples the spool's
size while the request runs, and the spool folder's mtime, which any file created in it would
change, is the same after as before. The clients are plain sockets that, like curl, read an
answer that arrives while they are still sending, and then stop.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import select
import shutil
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from registry.audit import Actor
from registry.services import model_create, token_create
from tests.replicas import Replica, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024
GIB = 1024 * MIB
UPLOAD = "/api/v1/models/big/versions/upload/?filename=big.onnx"
MULTIPART = "/api/v1/models/big/versions/"


@dataclass
class Console:
    server: Replica
    spool: Path  # the server's ARTIFACT_ROOT/tmp

    def files(self) -> list[Path]:
        return sorted(self.spool.iterdir())

    def spooled_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files() if p.exists())


@pytest.fixture
def console(users, tmp_path):
    started: list[Replica] = []

    def start(**env) -> Console:
        root = tmp_path / f"artifacts-{len(started)}"
        server = Replica(f"console-{len(started)}", embedded=True, log_dir=tmp_path,
                         ARTIFACT_ROOT=str(root), **env)
        started.append(server)
        server.wait_live()
        return Console(server, root / "tmp")

    model_create(name="big", actor=Actor.system("test"))
    yield start
    for server in started:
        server.stop()


def bearer(role: str, name: str = "upload") -> str:
    _, raw = token_create(username=role, name=f"{role}-{name}", actor=Actor.system("test"))
    return f"Bearer {raw}"


# -- a plain HTTP/1.1 client that stops sending once answered ---------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes the client got to send before the answer

    def json(self) -> dict:
        return json.loads(self.body)


def zeros(total: int, chunk: int = 256 * 1024) -> Iterator[bytes]:
    """`total` bytes as a stream of chunks, never held whole (1 GiB costs 256 KiB)."""
    block = bytes(chunk)
    full, rest = divmod(total, chunk)
    yield from itertools.repeat(block, full)
    if rest:
        yield block[:rest]


class Request:
    """One request on its own connection: `send_head`, then `send` body bytes (stopping at an
    answer) or `answer` to wait for one."""

    def __init__(self, console: Console, method: str, path: str, headers: dict[str, str]):
        self.sock = socket.create_connection(("127.0.0.1", console.server.port), timeout=10)
        self.sock.setblocking(False)
        self.method, self.path, self.headers = method, path, headers
        self.sent = 0
        self._received = b""
        self._answer: Answer | None = None

    def send_head(self) -> None:
        lines = [f"{self.method} {self.path} HTTP/1.1", "Host: 127.0.0.1",
                 *(f"{k}: {v}" for k, v in self.headers.items()), "", ""]
        self._send_all("\r\n".join(lines).encode(), count=False)

    def send(self, chunks: Iterable[bytes], *, every: float = 0.0) -> Answer | None:
        """Send `chunks` (one each `every` seconds), unless an answer comes first: then stop
        and return it; None when all was sent and none came yet."""
        for chunk in chunks:
            if not self._send_all(chunk):
                return self._answer
            if every:
                time.sleep(every)
        return None

    def answer(self, timeout: float = 60) -> Answer:
        deadline = time.monotonic() + timeout
        while self._answer is None:
            left = deadline - time.monotonic()
            assert left > 0, f"no answer within {timeout} s ({self._received[:200]!r})"
            readable, _, _ = select.select([self.sock], [], [], left)
            if readable:
                self._read()
        return self._answer

    def close(self) -> None:
        self.sock.close()

    def _send_all(self, data: bytes, count: bool = True) -> bool:
        """False once an answer came (or the server closed): the rest is not sent."""
        view = memoryview(data)
        while view:
            readable, writable, _ = select.select([self.sock], [self.sock], [], 60)
            if readable:
                self._read()
                if self._answer is not None:
                    return False
            if writable:
                try:
                    n = self.sock.send(view)
                except (BrokenPipeError, ConnectionResetError):
                    self.answer(timeout=10)
                    return False
                view = view[n:]
                if count:
                    self.sent += n
        return True

    def _read(self) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        self._received += data
        head, found, body = self._received.partition(b"\r\n\r\n")
        if not found:
            assert data, f"connection closed without an answer ({self._received[:200]!r})"
            return
        status_line, *lines = head.decode("latin1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
        length = int(headers.get("content-length", 0))
        if len(body) >= length:
            self._answer = Answer(int(status_line.split()[1]), headers, body[:length], self.sent)
        else:
            assert data, f"connection closed mid-answer ({self._received[:200]!r})"


def put(console: Console, declared: int, chunks: Iterable[bytes], headers: dict | None = None,
        path: str = UPLOAD) -> Answer:
    request = Request(console, "PUT", path, {"Content-Type": "application/octet-stream",
                                             "Content-Length": str(declared), **(headers or {})})
    try:
        request.send_head()
        return request.send(chunks) or request.answer()
    finally:
        request.close()


class SpoolWatch:
    """The most bytes and files the spool held while the block ran, sampled by a thread, and
    whether anything was created in it at all (the folder's mtime)."""

    def __init__(self, console: Console):
        self.console = console
        self.most_bytes = self.most_files = 0
        self._stop = threading.Event()

    def __enter__(self) -> SpoolWatch:
        self._mtime = self.console.spool.stat().st_mtime_ns
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                files = self.console.files()
                self.most_files = max(self.most_files, len(files))
                self.most_bytes = max(self.most_bytes, self.console.spooled_bytes())
            except FileNotFoundError:  # a file removed between the listing and its stat
                continue
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.untouched = self.console.spool.stat().st_mtime_ns == self._mtime

    def assert_nothing_stored(self) -> None:
        assert (self.most_bytes, self.most_files) == (0, 0)
        assert self.untouched, "a file was created in the upload spool"
        assert self.console.files() == []


# -- refused from the headers: nothing stored ---------------------------------------------------


def test_an_anonymous_1_gib_put_is_refused_after_its_headers_and_stores_nothing(console):
    server = console()
    with SpoolWatch(server) as watch:
        answer = put(server, GIB, zeros(GIB))
    assert answer.status == 401, answer.body
    assert answer.json() == {"error": "Authentication credentials were not provided."}
    assert answer.headers["www-authenticate"] == "Bearer"
    # the server reads nothing before it answers, so only what the sockets' buffers take gets
    # sent: nowhere near the gigabyte
    assert answer.sent < 256 * MIB
    watch.assert_nothing_stored()


def test_concurrent_anonymous_puts_are_all_refused_and_store_nothing(console):
    server = console()
    with SpoolWatch(server) as watch, ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: put(server, GIB, zeros(GIB)), range(4)))
    assert [a.status for a in answers] == [401] * 4
    assert all(a.sent < 256 * MIB for a in answers)
    watch.assert_nothing_stored()


@pytest.mark.parametrize("authorization, status, error", [
    ("Bearer mmc_not-a-token", 401, "Invalid token."),
    ("viewer", 403, "this needs the engineer role in the team 'default', which owns the "
                    "model 'big'"),
])
def test_a_bad_token_or_a_viewer_put_is_refused_and_stores_nothing(console, authorization,
                                                                   status, error):
    server = console()
    if not authorization.startswith("Bearer"):
        authorization = bearer(authorization)
    with SpoolWatch(server) as watch:
        answer = put(server, 256 * MIB, zeros(256 * MIB), {"Authorization": authorization})
    assert answer.status == status, answer.body
    assert answer.json() == {"error": error}
    watch.assert_nothing_stored()


def test_a_read_only_token_of_an_engineer_may_not_upload(console):
    server = console()
    _, raw = token_create(username="engineer", name="ci-read", actor=Actor.system("test"),
                          read_only=True)
    with SpoolWatch(server) as watch:
        answer = put(server, 64 * MIB, zeros(64 * MIB), {"Authorization": f"Bearer {raw}"})
    assert answer.status == 403 and "read-only" in answer.json()["error"]
    watch.assert_nothing_stored()


@pytest.mark.parametrize("case", ["larger-than-the-disk", "below-the-free-space-floor"])
def test_an_upload_the_disk_has_no_room_for_is_refused_with_507_before_its_body(console,
                                                                                 tmp_path, case):
    disk = shutil.disk_usage(tmp_path).total
    if case == "larger-than-the-disk":
        keep, declared = 256 * MIB, disk + 1
    else:  # fits on the disk, but would leave less free than the floor (the whole disk)
        keep, declared = disk, 8 * MIB
    server = console(MMC_MAX_UPLOAD_BYTES=str(1 << 50), MMC_STORE_MIN_FREE_BYTES=str(keep),
                     MMC_BODY_IDLE_TIMEOUT_S="2")
    with SpoolWatch(server) as watch:  # at most 64 MiB: a server that took it would time out
        answer = put(server, declared, zeros(min(declared, 64 * MIB)),
                     {"Authorization": bearer("engineer")})
    assert answer.status == 507, answer.body
    error = answer.json()["error"]
    assert "bytes free" in error and f"need {declared + keep}" in error, error
    assert "MMC_STORE_MIN_FREE_BYTES" in error
    watch.assert_nothing_stored()


def chunked(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """HTTP/1.1 chunked transfer coding: a body that declares no length."""
    for chunk in chunks:
        yield b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    yield b"0\r\n\r\n"


def test_an_upload_of_undeclared_size_stops_with_507_where_the_disk_reaches_its_floor(
        console, tmp_path):
    # the floor: 64 MiB under what is free now, so about 64 MiB of the (at most 1 GiB) body fit
    keep = shutil.disk_usage(tmp_path).free - 64 * MIB
    server = console(MMC_STORE_MIN_FREE_BYTES=str(keep))
    request = Request(server, "PUT", UPLOAD, {"Content-Type": "application/octet-stream",
                                              "Transfer-Encoding": "chunked",
                                              "Authorization": bearer("engineer")})
    try:
        request.send_head()
        answer = request.send(chunked(zeros(GIB))) or request.answer()
    finally:
        request.close()
    assert answer.status == 507, answer.body
    assert "MMC_STORE_MIN_FREE_BYTES" in answer.json()["error"]
    assert answer.sent < GIB
    assert server.files() == []  # what it had written is removed


# -- uploads in progress per user --------------------------------------------------------------


def held_upload(server: Console, authorization: str) -> Request:
    """An upload that sent its headers and 2 MiB of its 8 MiB, then waits."""
    request = Request(server, "PUT", UPLOAD, {"Content-Type": "application/octet-stream",
                                              "Content-Length": str(8 * MIB),
                                              "Authorization": authorization})
    request.send_head()
    assert request.send(zeros(2 * MIB)) is None
    return request


def test_one_upload_more_than_a_user_may_have_in_progress_is_refused_with_429(console):
    server = console(MMC_MAX_UPLOADS_PER_USER="2", MMC_BODY_IDLE_TIMEOUT_S="300")
    engineer = bearer("engineer")
    held = []
    try:
        held = [held_upload(server, engineer) for _ in range(2)]
        wait_until(lambda: len(server.files()) == 2, timeout=60, what="two uploads admitted")
        answer = put(server, GIB, zeros(GIB), {"Authorization": engineer})
        assert answer.status == 429, answer.body
        assert "2 uploads in progress" in answer.json()["error"]
        assert "MMC_MAX_UPLOADS_PER_USER" in answer.json()["error"]
        assert int(answer.headers["retry-after"]) > 0
        assert answer.sent < 256 * MIB and len(server.files()) == 2  # refused before its body

        # the cap is per user: another one uploads meanwhile
        data = os.urandom(3 * MIB)
        answer = put(server, len(data), [data], {"Authorization": bearer("admin")})
        assert answer.status == 201, answer.body

        held.pop(0).close()  # one ends: its slot (and partial file) goes
        wait_until(lambda: len(server.files()) == 1, timeout=60, what="the closed upload gone")
        data = os.urandom(3 * MIB)
        answer = put(server, len(data), [data], {"Authorization": engineer})
        assert answer.status == 201, answer.body
        assert answer.json()["sha256"] == hashlib.sha256(data).hexdigest()
    finally:
        for request in held:
            request.close()


# -- a body that stalls or trickles -------------------------------------------------------------


def test_a_stalled_upload_is_answered_408_and_its_partial_file_removed(console):
    server = console(MMC_BODY_IDLE_TIMEOUT_S="4", MMC_BODY_MIN_RATE="1")
    request = Request(server, "PUT", UPLOAD, {"Content-Type": "application/octet-stream",
                                              "Content-Length": str(64 * MIB),
                                              "Authorization": bearer("engineer")})
    try:
        request.send_head()
        assert request.send(zeros(2 * MIB)) is None
        # a byte every 0.2 s keeps it alive (far inside the 4 s) until its partial file is seen
        while server.spooled_bytes() < MIB:
            assert request.send([b"\0"], every=0.2) is None
        answer = request.answer(timeout=120)  # then nothing more: it stalls
    finally:
        request.close()
    assert answer.status == 408, answer.body
    assert answer.json()["error"].startswith("no request body bytes arrived for 4 s")
    assert answer.headers["connection"] == "close"
    assert server.files() == []  # removed before the answer


def test_a_trickling_upload_is_answered_408_under_the_minimum_rate(console):
    server = console(MMC_BODY_IDLE_TIMEOUT_S="5", MMC_BODY_MIN_RATE="65536")
    request = Request(server, "PUT", UPLOAD, {"Content-Type": "application/octet-stream",
                                              "Content-Length": str(64 * MIB),
                                              "Authorization": bearer("engineer")})
    try:
        request.send_head()
        # a byte every 0.2 s: never idle for 5 s, far under 64 KiB/s
        answer = request.send(itertools.repeat(b"\0", 10_000), every=0.2) or request.answer()
    finally:
        request.close()
    assert answer.status == 408, answer.body
    assert "slower than the minimum of 65536 bytes/s" in answer.json()["error"]
    assert server.files() == []


# -- what still works ---------------------------------------------------------------------------


def test_an_engineer_put_is_stored_and_becomes_a_version(console):
    server = console()
    data = os.urandom(5 * MIB + 3)
    answer = put(server, len(data), [data[:MIB], data[MIB:]], {"Authorization": bearer("engineer")})
    assert answer.status == 201, answer.body
    assert answer.sent == len(data)
    body = answer.json()
    assert (body["sha256"], body["size_bytes"]) == (hashlib.sha256(data).hexdigest(), len(data))
    assert server.files() == []  # moved into the store, nothing left in the spool


# -- other request bodies: over 1 MiB only from a known caller ----------------------------------


@pytest.mark.parametrize("method, path", [("POST", MULTIPART), ("POST", "/login/"),
                                          ("PATCH", "/api/v1/models/big/")])
def test_an_anonymous_body_over_1_mib_is_refused_before_django_spools_it(console, method, path):
    server = console()
    request = Request(server, method, path, {
        "Content-Type": "multipart/form-data; boundary=x", "Content-Length": str(GIB)})
    with SpoolWatch(server) as watch:
        try:
            request.send_head()
            answer = request.send(zeros(GIB)) or request.answer()
        finally:
            request.close()
    assert answer.status == 401, answer.body
    assert "needs an API token" in answer.json()["error"]
    assert answer.headers["www-authenticate"] == "Bearer"
    assert answer.sent < 256 * MIB
    watch.assert_nothing_stored()


def test_the_login_form_and_a_signed_in_session_upload_still_work(console):
    # plain HTTP here: the clustered default (Secure cookies) would keep the CSRF cookie from
    # an http:// client, as a browser would
    server = console(SECURE_COOKIES="false")
    with httpx.Client(base_url=server.server.url, timeout=60) as browser:
        browser.get("/login/")
        signed_in = browser.post("/login/", data={
            "username": "engineer", "password": "engineer-password-1",
            "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
        assert signed_in.status_code == 302, signed_in.text
        data = os.urandom(3 * MIB)  # over the anonymous limit: the session cookie admits it
        answer = browser.post(MULTIPART, files={"file": ("m.onnx", data)},
                              headers={"X-CSRFToken": browser.cookies["csrftoken"]})
        assert answer.status_code == 201, answer.text
        assert answer.json()["sha256"] == hashlib.sha256(data).hexdigest()
        # a raw upload from the session is admitted the same way, its CSRF token checked first
        refused = browser.put(UPLOAD, content=data)
        assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
        data = os.urandom(2 * MIB)
        answer = browser.put(UPLOAD, content=data,
                             headers={"X-CSRFToken": browser.cookies["csrftoken"]})
        assert answer.status_code == 201, answer.text


def test_an_api_token_admits_a_large_body_elsewhere_too(console):
    server = console()
    data = os.urandom(3 * MIB)
    answer = httpx.post(f"{server.server.url}{MULTIPART}", files={"file": ("m.onnx", data)},
                        headers={"Authorization": bearer("engineer")}, timeout=60)
    assert answer.status_code == 201, answer.text
