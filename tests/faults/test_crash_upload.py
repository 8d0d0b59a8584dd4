"""A console killed with SIGKILL in the middle of an upload leaves its temp behind (a file in the
store's tmp/ folder, or an open multipart upload in an object store); the periodic garbage
collection sweeps it once it is older than the grace (an upload in progress keeps writing, so
its temp stays fresh), and removes nothing else.

Under uvicorn, a raw PUT's body goes into the store's own temp (tmp/upload-* in the folder, a
multipart upload under tmp/ in an object store) while it arrives (console.asgi), which exists
until the view has stored it. The spec kills the real console process inside that window, on each
store backend."""

import os
import threading
import time
from datetime import timedelta

import httpx
import pytest

from registry import samples
from registry.audit import Actor
from registry.models import AuditEvent
from registry.services import token_create
from registry.store.artifacts import default_store
from registry.store.gc import collect_garbage
from tests.conftest import upload
from tests.replicas import Replica, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
SIZE = 96 * 1024 * 1024  # large enough that hashing and fsyncing it takes a while


def body(sent: list[int]):
    chunk = os.urandom(1024 * 1024)
    for _ in range(SIZE // len(chunk)):
        sent[0] += len(chunk)
        yield chunk


def test_a_crash_mid_upload_leaves_a_temp_that_gc_sweeps_after_the_grace(
        engineer, backend, tmp_path):
    """Folder: the store's temp file (tmp/upload-*). Object store: an open multipart upload
    with the parts sent so far."""
    store = default_store()  # the backend's, shared with the console process
    assert engineer.post("/api/v1/models/", {"name": "big"}, format="json").status_code == 201
    kept = upload(engineer, "big", samples.mlp()).json()["sha256"]  # a version's blob
    _, token = token_create(username="engineer", name="crash", actor=Actor.system("test"))

    console = Replica("console", embedded=True, log_dir=tmp_path, ARTIFACT_ROOT=str(backend.root),
                      ARTIFACT_STORE=backend.url, AWS_ENDPOINT_URL=backend.endpoint,
                      MMC_GC_SECONDS="0")  # the spec runs the collection itself
    try:
        console.wait_live()
        sent, answer = [0], []

        def put():
            try:
                answer.append(httpx.put(
                    f"{console.url}/api/v1/models/big/versions/upload/?filename=big.onnx",
                    content=body(sent), timeout=60,
                    headers={"Authorization": f"Bearer {token}",
                             "Content-Type": "application/octet-stream",
                             "Content-Length": str(SIZE)}).status_code)
            except httpx.HTTPError as exc:
                answer.append(type(exc).__name__)

        client = threading.Thread(target=put)
        client.start()
        wait_until(lambda: [t for t in store.temps() if t.size > 0], timeout=60,
                   interval=0.002 if backend.kind == "file" else 0.05,  # a listing: 3 requests
                   what="the store's temp of the upload")
        console.stop(sig_kill=True)
        client.join(30)
    finally:
        console.stop(sig_kill=True)
    assert answer and answer[0] != 201, answer  # the client saw the connection drop

    (left,) = store.temps()
    assert 0 < left.size <= SIZE
    grace = timedelta(seconds=2)
    assert collect_garbage(grace=timedelta(minutes=10)) == {  # nothing is old yet
        "blobs": [], "bytes": 0, "temp_files": 0, "temp_paths": [], "temp_bytes": 0,
        "dry_run": False}

    time.sleep(2.2)  # past the grace (an object store dates things to the second)
    young = store.save_bytes(b"an upload still committing").sha256  # unreferenced, fresh
    fresh = store.writer()  # another upload, still writing
    fresh.write(b"x" * (9 * 1024 * 1024))
    done = collect_garbage(grace=grace)
    assert done == {"blobs": [], "bytes": left.size, "temp_files": 1,
                    "temp_paths": [left.name], "temp_bytes": left.size, "dry_run": False}
    assert store.exists(kept) and store.exists(young)
    assert engineer.get("/api/v1/models/big/versions/1/artifact/").status_code == 200
    event = AuditEvent.objects.get(action="artifacts.gc")
    assert event.actor_name == "gc" and event.after["temp_paths"] == [left.name]
    assert event.after["temp_bytes"] == left.size and event.after["blobs"] == []
    (still,) = store.temps()
    assert still.name != left.name
    fresh.abort()
    assert store.temps() == []
