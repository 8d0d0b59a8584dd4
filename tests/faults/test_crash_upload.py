"""A console killed with SIGKILL in the middle of an upload leaves its temp file in the store's
tmp/ folder; the periodic garbage collection sweeps it once it is older than the grace (an upload
in progress keeps writing, so its file stays fresh), and removes nothing else.

Under uvicorn, a raw PUT's body goes into the store's own temp file (tmp/upload-*) while it
arrives (console.asgi), which exists until the view has fsynced and renamed it. The spec kills
the real console process inside that window."""

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

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


def test_a_crash_mid_upload_leaves_a_temp_file_that_gc_sweeps_after_the_grace(
        engineer, settings, tmp_path):
    root = tmp_path / "artifacts"  # a store of its own, shared with the console process
    settings.ARTIFACT_ROOT = root
    store = default_store()
    assert engineer.post("/api/v1/models/", {"name": "big"}, format="json").status_code == 201
    kept = upload(engineer, "big", samples.mlp()).json()["sha256"]  # a version's blob
    young = store.save_bytes(b"an upload still committing").sha256  # unreferenced, fresh
    _, token = token_create(username="engineer", name="crash", actor=Actor.system("test"))

    console = Replica("console", embedded=True, log_dir=tmp_path, ARTIFACT_ROOT=str(root),
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
        partial = wait_until(lambda: [p for p in store.tmp_dir.glob("upload-*")
                                      if p.stat().st_size > 0], timeout=60, interval=0.002,
                             what="the store's temp file of the upload")
        console.stop(sig_kill=True)
        client.join(30)
    finally:
        console.stop(sig_kill=True)
    assert answer and answer[0] != 201, answer  # the client saw the connection drop

    (left,) = [p for p in partial if p.exists()]
    size = left.stat().st_size
    assert 0 < size <= SIZE
    fresh = store.tmp_dir / "upload-in-progress"  # another upload, still writing
    fresh.write_bytes(b"x" * 1000)
    grace = timedelta(minutes=10)
    assert collect_garbage(grace=grace) == {  # the crash was just now: nothing is old yet
        "blobs": [], "bytes": 0, "temp_files": 0, "temp_paths": [], "temp_bytes": 0,
        "dry_run": False}

    an_hour_ago = time.time() - 3600
    os.utime(left, (an_hour_ago, an_hour_ago))
    done = collect_garbage(grace=grace)
    name = str(left.relative_to(root))
    assert done == {"blobs": [], "bytes": size, "temp_files": 1, "temp_paths": [name],
                    "temp_bytes": size, "dry_run": False}
    assert not left.exists() and fresh.exists()
    assert store.path_for(kept).exists() and store.path_for(young).exists()
    assert engineer.get("/api/v1/models/big/versions/1/artifact/").status_code == 200
    event = AuditEvent.objects.get(action="artifacts.gc")
    assert event.actor_name == "gc" and event.after["temp_paths"] == [name]
    assert event.after["temp_bytes"] == size and event.after["blobs"] == []
    assert sorted(p.name for p in Path(store.tmp_dir).iterdir()) == ["upload-in-progress"]
