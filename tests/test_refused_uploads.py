"""A refused upload leaves no blob in the store (it was streamed there before the refusal), a
blob a version uses is never removed by someone else's refusal, and the periodic garbage
collection removes what is left unreferenced past the grace period."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from registry import services
from registry.audit import Actor
from registry.errors import LifecycleError
from registry.models import AuditEvent, ModelVersion
from registry.store.artifacts import StoredBlob, default_store
from tests.conftest import upload

pytestmark = pytest.mark.django_db(transaction=True)


def raw_put(client, model: str, data: bytes, query: str = ""):
    return client.generic("PUT", f"/api/v1/models/{model}/versions/upload/?filename=m.onnx"
                          f"{query}", data, content_type="application/octet-stream")


def multipart(client, model: str, data: bytes, **fields):
    return client.post(f"/api/v1/models/{model}/versions/",
                       {"file": SimpleUploadedFile("m.onnx", data), **fields})


def viewer_session(users) -> Client:
    """A browser session with a valid CSRF token: the CSRF check parses the body (and so stores
    the artifact) before the role check refuses it."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["viewer"])
    client.get("/models/")  # sets the csrftoken cookie
    client.defaults["HTTP_X_CSRFTOKEN"] = client.cookies["csrftoken"].value
    return client


REFUSALS = {
    "multipart-metadata-not-json": (
        lambda c, u, m, d: multipart(c, m, d, metadata="{nope"), 400),
    "multipart-second-file-field": (
        lambda c, u, m, d: multipart(c, m, d, extra=SimpleUploadedFile("x.bin", b"x")), 400),
    "multipart-session-without-the-role": (
        lambda c, u, m, d: multipart(viewer_session(u), m, d), 403),
    "put-metadata-not-json": (lambda c, u, m, d: raw_put(c, m, d, "&metadata=%7Bnope"), 400),
    "put-metadata-not-an-object": (lambda c, u, m, d: raw_put(c, m, d, "&metadata=%5B1%5D"), 400),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refused_upload_leaves_no_blob(engineer, users, backend, case):
    assert engineer.post("/api/v1/models/", {"name": "m"}, format="json").status_code == 201
    store = default_store()
    data = f"refused upload: {case}".encode() * 1000
    sha = hashlib.sha256(data).hexdigest()
    send, status = REFUSALS[case]
    r = send(engineer, users, "m", data)
    assert r.status_code == status, r.content
    assert not store.exists(sha)
    assert backend.names() == [] and store.temps() == []  # no blob, no temp file or upload
    assert not ModelVersion.objects.exists()
    # the same bytes, sent properly, are stored and registered
    assert raw_put(engineer, "m", data).status_code == 201
    assert store.exists(sha) and backend.names() == [f"sha256/{sha[:2]}/{sha}"]


def test_a_refused_upload_keeps_a_blob_a_version_uses(engineer, backend):
    assert engineer.post("/api/v1/models/", {"name": "m"}, format="json").status_code == 201
    data = b"registered bytes" * 1000
    first = upload(engineer, "m", data)
    assert first.status_code == 201
    assert raw_put(engineer, "m", data, "&metadata=%7Bnope").status_code == 400
    assert multipart(engineer, "m", data, metadata="{nope").status_code == 400
    r = engineer.get("/api/v1/models/m/versions/1/artifact/")
    assert r.status_code == 200 and b"".join(r.streaming_content) == data


def test_registering_a_blob_removed_meanwhile_is_refused_not_left_dangling(engineer, backend):
    """What the blob lock guards: a refused upload of the same bytes removed the blob between
    this upload storing it and registering it. The version is refused, not created without
    its artifact."""
    assert engineer.post("/api/v1/models/", {"name": "m"}, format="json").status_code == 201
    store = default_store()
    blob = store.save_bytes(b"removed meanwhile" * 100)
    store.remove(blob.sha256)
    with pytest.raises(LifecycleError, match="removed while it was being registered"):
        services.version_upload(model_name="m", blob=StoredBlob(blob.sha256, blob.size,
                                                                blob.path),
                                actor=Actor.system("test"))
    assert not ModelVersion.objects.exists()
    assert not AuditEvent.objects.filter(action="version.upload").exists()


def test_the_periodic_gc_removes_unreferenced_blobs(engineer, settings, tmp_path):
    from console.celery import app

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"  # a store of its own: no other test's blobs
    assert settings.PERIODIC_TASKS["registry.gc_artifacts"] == settings.GC_SECONDS > 0
    assert settings.CELERY_BEAT_SCHEDULE["registry.gc_artifacts"]["task"] == "registry.gc_artifacts"
    assert engineer.post("/api/v1/models/", {"name": "kept"}, format="json").status_code == 201
    kept = upload(engineer, "kept", b"a version's bytes" * 100).json()["sha256"]
    store = default_store()
    old = store.save_bytes(b"left behind long ago").sha256
    young = store.save_bytes(b"an upload still committing").sha256
    past = time.time() - settings.GC_GRACE_SECONDS - 60
    for sha in (old, kept):
        os.utime(store.path_for(sha), (past, past))

    app.tasks["registry.gc_artifacts"]()  # what beat (or the embedded scheduler) runs

    assert not store.path_for(old).exists()
    assert store.path_for(young).exists() and store.path_for(kept).exists()
    event = AuditEvent.objects.get(action="artifacts.gc")
    assert event.after["blobs"] == [old] and event.actor_name == "gc"
