"""Artifacts in an S3-compatible object store (ARTIFACT_STORE=s3://bucket/prefix), against a real
S3 server process (moto's server mode): what only an object store has to do beyond the shared
store contract of test_store.py. A replica on another host fetches a version's blob by sha256
into its own cache and refuses bytes that do not match; uploads, validation, downloads and
serving work unchanged; health names the object store."""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta

import pytest

from registry import samples
from registry.store.artifacts import ArtifactUnavailable, default_store
from registry.store.gc import collect_garbage
from tests.conftest import upload, wait_validated
from tests.objectstore import Backend
from tests.replicas import free_port


@pytest.fixture
def s3(s3_server, tmp_path, settings) -> Backend:
    """A bucket of its own on the S3 server, selected in settings, with a fresh ARTIFACT_ROOT."""
    return Backend("s3", tmp_path / "artifacts", f"s3://{s3_server.new_bucket()}/artifacts",
                   s3_server.url).select(settings)


def test_a_replica_on_another_host_fetches_a_blob_by_digest_and_verifies_it(s3, tmp_path):
    registry_host = s3.store()
    data = b"model bytes" * 10_000
    sha = registry_host.save_bytes(data).sha256

    replica_host = s3.store(root=tmp_path / "replica")  # its own, empty ARTIFACT_ROOT
    assert not replica_host.cached_path(sha).exists()
    path = replica_host.local_path(sha)
    assert path == replica_host.cached_path(sha) and path.read_bytes() == data
    assert path.is_relative_to(tmp_path / "replica" / "cache")

    # someone overwrites the object with other bytes: a host without a copy refuses them
    registry_host.client.put_object(Bucket=registry_host.bucket,
                                    Key=registry_host.blob_key(sha), Body=b"tampered")
    third_host = s3.store(root=tmp_path / "third")
    with pytest.raises(ArtifactUnavailable, match="hash to " + hashlib.sha256(b"tampered")
                       .hexdigest()):
        third_host.local_path(sha)
    assert [p for p in (tmp_path / "third").rglob("*") if p.is_file()] == []  # no copy kept
    assert not third_host.verify(sha)
    assert replica_host.verify(sha)  # its verified copy stays good


def test_a_missing_blob_is_unavailable_not_an_empty_file(s3):
    store = s3.store()
    sha = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(ArtifactUnavailable):
        store.local_path(sha)
    assert not store.cached_path(sha).exists() and not store.verify(sha)


@pytest.mark.django_db(transaction=True)
def test_gc_deletes_a_tmp_object_left_between_completion_and_copy_after_the_grace(s3):
    store = s3.store()
    store.client.put_object(Bucket=store.bucket, Key=store.key("tmp/left-by-a-crash"),
                            Body=b"x" * 1000)
    name = f"s3://{store.bucket}/{store.key('tmp/left-by-a-crash')}"
    assert collect_garbage(store=store, grace=timedelta(hours=1))["temp_files"] == 0
    time.sleep(1.1)  # LastModified is to the second
    done = collect_garbage(store=store, grace=timedelta(0))
    assert done["temp_paths"] == [name] and done["temp_bytes"] == 1000
    assert s3.names() == []


@pytest.mark.django_db(transaction=True)
def test_upload_validate_download_and_serve_from_the_object_store(engineer, s3, settings,
                                                                  tmp_path):
    from registry.models import ModelVersion
    from registry.serving_source import RegistrySource, _spec
    from serving.core.reconciler import load_version

    model = samples.mlp()
    assert engineer.post("/api/v1/models/", {"name": "s3m"}, format="json").status_code == 201
    r = upload(engineer, "s3m", model)
    assert r.status_code == 201, r.content
    sha = r.json()["sha256"]
    assert s3.names() == [f"sha256/{sha[:2]}/{sha}"]
    assert wait_validated(engineer, "s3m", 1)["status"] == "ready"

    download = engineer.get("/api/v1/models/s3m/versions/1/artifact/")
    assert download.status_code == 200 and download["X-Checksum-Sha256"] == sha
    assert b"".join(download.streaming_content) == model

    settings.ARTIFACT_ROOT = tmp_path / "replica-host"  # a replica with an empty cache
    spec = _spec(ModelVersion.objects.get(model__name="s3m"), default_store())
    RegistrySource().fetch_artifact(spec)
    loaded = load_version(spec)
    try:
        assert loaded.runtime.providers
        assert spec.artifact_path.startswith(str(tmp_path / "replica-host" / "cache"))
    finally:
        loaded.batcher.close()
        loaded.runtime.unload()


@pytest.mark.parametrize("size", [1000, 9 * 1024 * 1024], ids=["one-put", "multipart"])
def test_an_upload_while_the_object_store_does_not_answer_is_a_503_and_registers_nothing(
        engineer, settings, tmp_path, size):
    from registry.models import ModelVersion

    down = Backend("s3", tmp_path / "artifacts", "s3://mmc-unreachable/artifacts",
                   f"http://127.0.0.1:{free_port()}").select(settings)  # nothing listens
    assert engineer.post("/api/v1/models/", {"name": "m"}, format="json").status_code == 201
    r = engineer.generic("PUT", "/api/v1/models/m/versions/upload/?filename=m.onnx",
                         b"x" * size, content_type="application/octet-stream")
    assert r.status_code == 503 and r["Retry-After"] == "5"
    assert "did not answer" in r.json()["error"] and "nothing was kept" in r.json()["error"]
    assert not ModelVersion.objects.exists()
    assert [p for p in down.root.rglob("*") if p.is_file()] == []  # nothing kept locally


def test_health_names_the_object_store_and_no_free_space_of_it(s3, settings):
    from console import health

    settings.STORE_MIN_FREE_BYTES = 0
    check = health._ping_object_store()
    assert check.ok and check.detail == f"object store {default_store().location} reachable"
    settings.AWS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens there
    check = health._ping_object_store()
    assert not check.ok and "unreachable" in check.detail
