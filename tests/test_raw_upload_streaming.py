"""A raw version upload (`PUT …/versions/upload/`) through the real ASGI server: the body goes
into the artifact store once, while it arrives, and a refused or oversized one leaves nothing
behind in the store or its temporary folder."""

from __future__ import annotations

import hashlib
import os

import httpx
import pytest
from django.conf import settings

from registry.audit import Actor
from registry.services import model_create, token_create
from registry.store.artifacts import default_store
from tests.replicas import Replica

pytestmark = pytest.mark.django_db(transaction=True)


def leftovers() -> set[str]:
    return {p.name for p in (settings.ARTIFACT_ROOT / "tmp").iterdir()}


@pytest.fixture
def console(users, tmp_path):
    def start(**env) -> Replica:
        server = Replica("console", embedded=True, log_dir=tmp_path, **env)
        started.append(server)
        server.wait_live()
        return server

    started: list[Replica] = []
    model_create(name="big", actor=Actor.system("test"))
    yield start
    for server in started:
        server.stop()


def token(role: str) -> dict:
    _, raw = token_create(username=role, name=f"{role}-upload", actor=Actor.system("test"))
    return {"Authorization": f"Bearer {raw}"}


def put(server: Replica, body, headers: dict) -> httpx.Response:
    return httpx.put(f"{server.url}/api/v1/models/big/versions/upload/?filename=big.onnx",
                     content=body, headers={"Content-Type": "application/octet-stream",
                                            **headers}, timeout=60)


def test_a_raw_put_is_stored_once_under_its_sha256_and_becomes_a_version(console):
    server = console()
    before = leftovers()
    data = os.urandom(3 * 1024 * 1024 + 17)
    answer = put(server, data, token("engineer"))
    assert answer.status_code == 201, answer.text
    sha = hashlib.sha256(data).hexdigest()
    assert answer.json()["sha256"] == sha and answer.json()["size_bytes"] == len(data)
    assert default_store().path_for(sha).read_bytes() == data
    assert leftovers() <= before


def test_a_chunked_raw_put_arrives_whole(console):
    server = console()
    parts = [os.urandom(100_000) for _ in range(25)]
    answer = put(server, iter(parts), token("engineer"))  # no Content-Length: chunked
    assert answer.status_code == 201, answer.text
    assert answer.json()["sha256"] == hashlib.sha256(b"".join(parts)).hexdigest()


@pytest.mark.parametrize("role, status", [(None, 401), ("viewer", 403)])
def test_a_refused_raw_put_leaves_nothing_in_the_store(console, role, status):
    server = console()
    before = leftovers()
    data = os.urandom(2 * 1024 * 1024)
    answer = put(server, data, token(role) if role else {})
    assert answer.status_code == status, answer.text
    assert not default_store().path_for(hashlib.sha256(data).hexdigest()).exists()
    assert leftovers() <= before


def test_a_chunked_raw_put_over_the_limit_is_refused_with_413_and_leaves_nothing(console):
    server = console(MMC_MAX_UPLOAD_BYTES=str(1024 * 1024))
    before = leftovers()
    answer = put(server, iter([os.urandom(256 * 1024) for _ in range(8)]), token("engineer"))
    assert answer.status_code == 413
    assert "over the limit of 1048576 bytes" in answer.json()["error"]
    assert leftovers() <= before
