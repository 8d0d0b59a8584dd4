"""Artifact store, garbage collection and recovery of interrupted validations."""

import hashlib
import os
import subprocess
import sys
import time
import tracemalloc
from datetime import timedelta
from shutil import which

import pytest
from django.utils import timezone

from registry import samples
from registry.errors import PayloadTooLarge
from registry.models import AuditEvent, ModelVersion, VersionStatus
from registry.store.gc import collect_garbage
from tests.conftest import REPO, upload, wait_validated

MIB = 1024 * 1024


def test_store_is_content_addressed_and_shares_identical_blobs(backend):
    store = backend.store(max_bytes=10_000)
    data = b"abc" * 100
    a = store.save_bytes(data)
    b = store.save_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    assert a.sha256 == b.sha256 == sha and a.size == len(data)
    assert backend.names() == [f"sha256/{sha[:2]}/{sha}"]  # one blob, no temp left
    assert list(store.blobs()) == [sha] and store.exists(sha) and store.verify(sha)
    with store.open(sha) as f:
        assert f.read() == data
    assert store.local_path(sha).read_bytes() == data


def test_store_refuses_past_its_limit_and_leaves_nothing(backend):
    store = backend.store(max_bytes=20 * MIB)  # an object store has sent two parts by then
    with pytest.raises(PayloadTooLarge):
        store.save_stream(iter([b"x" * (8 * MIB)] * 3))
    assert backend.names() == []
    assert list(store.blobs()) == [] and store.temps() == []


def test_store_rejects_a_name_that_is_not_a_digest(backend):
    store = backend.store(max_bytes=10)
    for call in (store.cached_path, store.stat, store.open, store.remove):
        with pytest.raises(ValueError):
            call("../../etc/passwd")


def test_store_streams_a_large_upload_without_holding_it_in_memory(backend):
    """An object store holds at most a few 8 MiB parts: the one filling, the ones sending."""
    store = backend.store(max_bytes=256 * MIB)
    chunk = os.urandom(MIB)
    tracemalloc.start()
    try:
        blob = store.save_stream(chunk for _ in range(64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert blob.size == 64 * MIB
    assert blob.sha256 == hashlib.sha256(chunk * 64).hexdigest() and store.verify(blob.sha256)
    assert peak < 32 * MIB, f"peak {peak / MIB:.0f} MiB of Python memory for a 64 MiB upload"


def test_a_blob_becomes_visible_whole_or_not_at_all(backend):
    store = backend.store()
    data = os.urandom(20 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    writer = store.writer()
    for i in range(0, len(data), MIB):
        writer.write(data[i:i + MIB])
    # 20 MiB sent (a multipart upload in an object store): nothing is there under the digest
    assert not store.exists(sha) and list(store.blobs()) == []
    assert not any(name.startswith("sha256/") for name in backend.names())
    assert [t.size for t in store.temps()] and all(t.mtime > time.time() - 60
                                                   for t in store.temps())
    blob = writer.finish()
    assert blob.sha256 == sha and store.exists(sha) and list(store.blobs()) == [sha]
    assert backend.names() == [f"sha256/{sha[:2]}/{sha}"] and store.temps() == []
    with store.open(sha) as f:
        assert hashlib.sha256(f.read()).hexdigest() == sha


def test_an_aborted_upload_leaves_nothing(backend):
    store = backend.store()
    writer = store.writer()
    for _ in range(20):
        writer.write(b"y" * MIB)
    writer.abort()
    assert backend.names() == [] and store.temps() == []


@pytest.mark.django_db(transaction=True)
def test_gc_sweeps_what_an_interrupted_upload_left_once_older_than_the_grace(backend):
    """A writer abandoned mid-stream (its process killed) leaves a temp file, or an open
    multipart upload; one still writing is left alone and finishes."""
    store = backend.store()
    crashed = store.writer()
    for _ in range(10):
        crashed.write(b"c" * MIB)  # never finished nor aborted
    (left,) = store.temps()
    time.sleep(2.2)  # object stores date things to the second: the grace is 2 s
    writing = store.writer()
    for _ in range(10):
        writing.write(b"w" * MIB)
    done = collect_garbage(store=store, grace=timedelta(seconds=2))
    assert done["temp_paths"] == [left.name] and done["temp_bytes"] == left.size > 0
    assert [t.name for t in store.temps()] != [left.name] and len(store.temps()) == 1
    blob = writing.finish()
    assert backend.names() == [f"sha256/{blob.sha256[:2]}/{blob.sha256}"]
    event = AuditEvent.objects.get(action="artifacts.gc")
    assert event.target == store.location and event.after["temp_paths"] == [left.name]


@pytest.mark.django_db(transaction=True)
def test_gc_removes_only_unreferenced_blobs_past_the_grace(engineer, backend):
    engineer.post("/api/v1/models/", {"name": "kept"}, format="json")
    kept = upload(engineer, "kept", samples.mlp()).json()["sha256"]
    from registry.store.artifacts import default_store

    store = default_store()
    orphan = store.save_bytes(b"orphaned upload").sha256
    fresh = collect_garbage(grace=timedelta(hours=1))
    assert fresh["blobs"] == []  # too young: may belong to an upload still committing
    dry = collect_garbage(grace=timedelta(0), dry_run=True)
    assert dry["blobs"] == [orphan] and store.exists(orphan)
    done = collect_garbage(grace=timedelta(0))
    assert done["blobs"] == [orphan]
    assert not store.exists(orphan) and store.exists(kept)
    assert backend.names() == [f"sha256/{kept[:2]}/{kept}"]
    assert AuditEvent.objects.filter(action="artifacts.gc").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_validation_interrupted_by_a_dead_worker_is_recovered(engineer):
    from registry.tasks import recover_validations

    engineer.post("/api/v1/models/", {"name": "orphan"}, format="json")
    upload(engineer, "orphan", samples.mlp())
    wait_validated(engineer, "orphan", 1)
    # what a worker killed mid-validation leaves behind
    ModelVersion.objects.filter(model__name="orphan", number=1).update(
        status=VersionStatus.VALIDATING, signature={},
        validation_started_at=timezone.now() - timedelta(hours=1),
        validation_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert recover_validations() == [ModelVersion.objects.get(model__name="orphan").pk]
    done = wait_validated(engineer, "orphan", 1)
    assert done["status"] == "ready" and done["signature"]["inputs"][0]["name"] == "x"


@pytest.mark.django_db(transaction=True)
def test_a_version_interrupted_too_often_fails_with_the_reason(engineer):
    from registry.validation import MAX_ATTEMPTS, validate_version

    engineer.post("/api/v1/models/", {"name": "crashy"}, format="json")
    upload(engineer, "crashy", samples.mlp())
    wait_validated(engineer, "crashy", 1)
    version = ModelVersion.objects.get(model__name="crashy")
    ModelVersion.objects.filter(pk=version.pk).update(  # its last worker's lease lapsed
        status=VersionStatus.VALIDATING, validation_attempts=MAX_ATTEMPTS,
        validation_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert validate_version(version.pk) == "failed"
    version.refresh_from_db()
    assert "interrupted 3 times" in version.failure_reason


@pytest.mark.skipif(not which("docker-compose"), reason="Debian docker-compose not installed")
def test_compose_file_is_valid():
    r = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config", "-q"], cwd=REPO,
                       env={"SECRET_KEY": "x", "MMC_REPLICA_TOKEN": "y", "PATH": "/usr/bin:/bin"},
                       capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_cli_help_lists_every_command():
    r = subprocess.run([sys.executable, "-m", "registry.cli.main", "--help"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for command in ("upload", "deploy", "canary", "promote", "rollback", "export", "batch"):
        assert command in r.stdout


@pytest.mark.django_db(transaction=True)
def test_periodic_gc_sweeps_temp_files_older_than_the_grace_and_keeps_fresh_ones(settings,
                                                                               tmp_path):
    import os
    import time

    from console.celery import app
    from registry.store.artifacts import default_store

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    settings.GC_GRACE_SECONDS = 600
    store = default_store()
    jobs_tmp = tmp_path / "artifacts" / "jobs" / "tmp"
    jobs_tmp.mkdir(parents=True)
    crashed = {store.tmp_dir / "upload-crashed": 3000, store.tmp_dir / "tmpdjango.upload": 200,
               jobs_tmp / "in-crashed": 50}
    fresh = store.tmp_dir / "upload-still-writing"
    (store.tmp_dir / "a-folder").mkdir()  # not a file: left alone
    past = time.time() - 3600
    for path, size in crashed.items():
        path.write_bytes(b"x" * size)
        os.utime(path, (past, past))
    fresh.write_bytes(b"y" * 10)
    os.utime(store.tmp_dir / "a-folder", (past, past))

    dry = collect_garbage(grace=timedelta(seconds=600), dry_run=True)
    assert dry["temp_files"] == 3 and dry["temp_bytes"] == 3250 and all(p.exists() for p in crashed)

    app.tasks["registry.gc_artifacts"]()  # what beat (or the embedded scheduler) runs

    assert not any(p.exists() for p in crashed)
    assert fresh.exists() and (store.tmp_dir / "a-folder").is_dir()
    event = AuditEvent.objects.get(action="artifacts.gc")
    assert event.after == {"blobs": [], "bytes": 3250, "temp_files": 3, "temp_bytes": 3250,
                           "temp_paths": ["jobs/tmp/in-crashed", "tmp/tmpdjango.upload",
                                          "tmp/upload-crashed"]}
