"""Artifact store, garbage collection and recovery of interrupted validations."""

import hashlib
import subprocess
import sys
from datetime import timedelta
from shutil import which

import pytest
from django.utils import timezone

from registry import samples
from registry.errors import PayloadTooLarge
from registry.models import AuditEvent, ModelVersion, VersionStatus
from registry.store.artifacts import ArtifactStore
from registry.store.gc import collect_garbage
from tests.conftest import REPO, upload, wait_validated


def test_store_is_content_addressed_and_shares_identical_blobs(tmp_path):
    store = ArtifactStore(tmp_path, max_bytes=10_000)
    a = store.save_bytes(b"abc" * 100)
    b = store.save_bytes(b"abc" * 100)
    assert a.path == b.path and a.sha256 == hashlib.sha256(b"abc" * 100).hexdigest()
    assert a.path.relative_to(tmp_path).parts == ("sha256", a.sha256[:2], a.sha256)
    assert store.verify(a.sha256)
    assert list(store.tmp_dir.iterdir()) == []


def test_store_refuses_past_its_limit_and_leaves_nothing(tmp_path):
    store = ArtifactStore(tmp_path, max_bytes=1000)
    with pytest.raises(PayloadTooLarge):
        store.save_stream(iter([b"x" * 600, b"x" * 600]))
    assert list(store.tmp_dir.iterdir()) == []
    assert list(store.blobs()) == []


def test_store_rejects_a_path_that_is_not_a_digest(tmp_path):
    with pytest.raises(ValueError):
        ArtifactStore(tmp_path, 10).path_for("../../etc/passwd")


@pytest.mark.django_db(transaction=True)
def test_gc_removes_only_unreferenced_blobs_past_the_grace(engineer, settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"  # a store of its own: no other test's blobs
    engineer.post("/api/v1/models/", {"name": "kept"}, format="json")
    kept = upload(engineer, "kept", samples.mlp()).json()["sha256"]
    from registry.store.artifacts import default_store

    store = default_store()
    orphan = store.save_bytes(b"orphaned upload").sha256
    fresh = collect_garbage(grace=timedelta(hours=1))
    assert fresh["blobs"] == []  # too young: may belong to an upload still committing
    dry = collect_garbage(grace=timedelta(0), dry_run=True)
    assert dry["blobs"] == [orphan] and store.path_for(orphan).exists()
    done = collect_garbage(grace=timedelta(0))
    assert done["blobs"] == [orphan]
    assert not store.path_for(orphan).exists() and store.path_for(kept).exists()
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
                       env={"SECRET_KEY": "x", "PATH": "/usr/bin:/bin"}, capture_output=True,
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
