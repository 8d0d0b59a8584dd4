"""An upload larger than the store's free space is a 507 JSON answer naming the store, its free
space and the size needed, written to the log as one line without a traceback, and leaves
nothing half-written: no temporary file, no blob, no version. On a real full disk (a 2 MiB
tmpfs, where the process may mount one) and where the disk says ENOSPC to any write."""

from __future__ import annotations

import errno
import logging
import re
import subprocess

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.models import ModelVersion
from registry.store import writer
from registry.store.artifacts import default_store

pytestmark = pytest.mark.django_db(transaction=True)
MiB = 1024**2


@pytest.fixture
def small_disk(settings, tmp_path):
    """ARTIFACT_ROOT on a 2 MiB tmpfs (root only: skipped where mounting is not allowed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    settings.ARTIFACT_ROOT = disk
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)  # even while a file is open


@pytest.fixture
def disk_says_full(settings, tmp_path, monkeypatch):
    """Every artifact write past the first MiB fails as a full disk would (ENOSPC)."""
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    put = writer.HashingWriter._put

    def fill(self, chunk: bytes) -> None:
        if self.size > MiB:
            class Full:  # what a file on a full disk does
                closed = False

                def write(self, data):
                    raise OSError(errno.ENOSPC, "No space left on device")

                def close(self):
                    self.closed = True

            self._file.close()
            self._file = Full()
        put(self, chunk)

    monkeypatch.setattr(writer.HashingWriter, "_put", fill)
    return settings.ARTIFACT_ROOT


def multipart(client, data: bytes):
    return client.post("/api/v1/models/m/versions/", {"file": SimpleUploadedFile("m.onnx", data)})


def raw_put(client, data: bytes):
    return client.generic("PUT", "/api/v1/models/m/versions/upload/?filename=m.onnx", data,
                          content_type="application/octet-stream")


def _nothing_kept(root) -> None:
    assert ModelVersion.objects.count() == 0
    assert list(default_store().blobs()) == []
    leftovers = [p for p in (root / "tmp").rglob("*") if p.is_file()]
    assert leftovers == []


def _refused_as_full(r, caplog, root) -> None:
    assert r.status_code == 507, r.content
    assert r["Content-Type"] == "application/json"
    error = r.json()["error"]
    assert re.match(r"the artifact store is out of space: it has \d+ bytes free, and this "
                    r"artifact needs at least \d+ bytes \(what had arrived when the disk "
                    r"filled\); nothing of it was kept$", error), error
    assert str(root) not in error
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None, errors
    assert "Insufficient Storage" in errors[0].getMessage()
    _nothing_kept(root)


@pytest.mark.parametrize("send", [multipart, raw_put])
def test_an_upload_larger_than_a_small_disk_is_a_507_that_keeps_nothing(engineer, small_disk,
                                                                        caplog, send):
    assert engineer.post("/api/v1/models/", {"name": "m"}, format="json").status_code == 201
    caplog.clear()
    with caplog.at_level(logging.INFO):
        r = send(engineer, b"\x00" * (3 * MiB))
    _refused_as_full(r, caplog, small_disk)
    free = int(re.search(r"it has (\d+) bytes free", r.json()["error"])[1])
    assert MiB < free <= 2 * MiB  # the partial file is gone: its space is free again
    from registry import samples

    assert send(engineer, samples.mlp()).status_code == 201  # what fits is stored as ever


@pytest.mark.parametrize("send", [multipart, raw_put])
def test_a_write_the_disk_refuses_with_enospc_is_a_507_that_keeps_nothing(engineer,
                                                                          disk_says_full,
                                                                          caplog, send):
    assert engineer.post("/api/v1/models/", {"name": "m"}, format="json").status_code == 201
    caplog.clear()
    with caplog.at_level(logging.INFO):
        r = send(engineer, b"\x00" * (3 * MiB))
    _refused_as_full(r, caplog, disk_says_full)


@pytest.mark.parametrize("how", ["raw-put", "multipart"])
def test_through_the_real_server_a_full_disk_is_a_507_json_and_no_traceback(users, small_disk,
                                                                            tmp_path, how):
    """The console as it runs (uvicorn, console.asgi): a raw PUT streams into the store as it
    arrives, a multipart body is parsed into it. A raw PUT sent chunked (no declared length to
    refuse up front) with no free space kept back (MMC_STORE_MIN_FREE_BYTES=0) fills the disk
    while it is written; a multipart body needs its length (Django parses none without), which
    is refused up front. The answer is a JSON 507 either way, whichever check saw it first."""
    import httpx
    from urllib3 import encode_multipart_formdata

    from registry.audit import Actor
    from registry.services import model_create, token_create
    from tests.replicas import Replica

    model_create(name="m", actor=Actor.system("test"))
    _, raw = token_create(username="engineer", name="full", actor=Actor.system("test"))
    console = Replica("console", embedded=True, log_dir=tmp_path, ARTIFACT_ROOT=small_disk,
                      MMC_STORE_MIN_FREE_BYTES=0)
    try:
        console.wait_live()
        headers = {"Authorization": f"Bearer {raw}"}
        if how == "raw-put":
            body = b"\x00" * (3 * MiB)
            content_type = "application/octet-stream"
            url = f"{console.url}/api/v1/models/m/versions/upload/?filename=m.onnx"
        else:
            body, content_type = encode_multipart_formdata(
                {"file": ("m.onnx", b"\x00" * (3 * MiB))}, boundary="mmc-boundary")
            url = f"{console.url}/api/v1/models/m/versions/"
        chunks = (body[i:i + 256 * 1024] for i in range(0, len(body), 256 * 1024))
        r = httpx.request("PUT" if how == "raw-put" else "POST", url,
                          content=chunks if how == "raw-put" else body,
                          headers={**headers, "Content-Type": content_type}, timeout=60)
        assert r.status_code == 507, r.text
        assert r.headers["content-type"] == "application/json"
        assert re.search(r"has \d+ bytes free", r.json()["error"]), r.text
        assert str(small_disk) not in r.text
    finally:
        console.stop()
    assert "Traceback" not in console.log.read_text()
    _nothing_kept(small_disk)
