"""Content-addressed artifact store: a blob is named by its sha256 (sha256/<2 hex>/<64 hex>).

Two backends keep the same contract: `FileStore`, a folder (ARTIFACT_ROOT, a local disk or a
ReadWriteMany volume), and `S3Store` (store/s3.py), a bucket of an S3-compatible object store
(ARTIFACT_STORE=s3://bucket/prefix). Either way a write streams while it is hashed and only a
whole blob ever becomes visible under its digest; an interrupted write leaves at most a
temporary object that garbage collection (store/gc.py) sweeps after the grace period.

Whatever the backend, the local folder ARTIFACT_ROOT still holds Django's upload spool (tmp/),
job files (jobs/) and, for an object store, verified copies of blobs (cache/) that onnxruntime
loads from.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.core.checks import Error, register

from registry.store.blobs import (
    ArtifactStore,
    ArtifactUnavailable,
    BlobStat,
    StoredBlob,
    check_digest,
    check_object_key,
    stat_or_none,
)
from registry.store.writer import CHUNK, HashingWriter
from serving.core.extras import MissingExtra, require
from serving.core.hashing import file_sha256

__all__ = ["CHUNK", "ArtifactStore", "ArtifactUnavailable", "BlobStat", "FileStore",
           "StoredBlob", "default_store"]


class BlobWriter(HashingWriter):
    """One upload in progress into a FileStore: a temp file in tmp/, renamed into place."""

    def __init__(self, store: FileStore):
        super().__init__(tmp_dir=store.tmp_dir, limit=store.max_bytes, what="artifact",
                         field="file", prefix="upload-")
        self.store = store

    def finish(self) -> StoredBlob:
        sha = self.sha256
        final = self.store.path_for(sha)
        try:
            # Same bytes already stored: share the blob, and restart its garbage-collection grace
            # period, since no version may reference it yet.
            os.utime(final)
        except FileNotFoundError:
            self.move_to(final)
        else:
            self.abort()
        return StoredBlob(sha256=sha, size=self.size, path=final)


class FileStore(ArtifactStore):
    """Blobs as files under a folder: fsynced temp file, then an atomic rename."""

    on_local_disk = True

    def __init__(self, root: Path, max_bytes: int):
        super().__init__(root, max_bytes)
        self.root = Path(root)
        self.location = str(self.root)

    def path_for(self, sha256: str) -> Path:
        check_digest(sha256)
        return self.root / "sha256" / sha256[:2] / sha256

    def writer(self) -> BlobWriter:
        return BlobWriter(self)

    def stat(self, sha256: str) -> BlobStat | None:
        st = stat_or_none(self.path_for(sha256))
        return None if st is None else BlobStat(st.st_size, st.st_mtime)

    def open(self, sha256: str) -> BinaryIO:
        try:
            return open(self.path_for(sha256), "rb")
        except FileNotFoundError:
            raise ArtifactUnavailable(f"blob {sha256} is not in the store") from None

    def cached_path(self, sha256: str) -> Path:
        return self.path_for(sha256)

    def local_path(self, sha256: str) -> Path:
        path = self.path_for(sha256)
        if not path.is_file():
            raise ArtifactUnavailable(f"blob {sha256} is not in the store")
        return path

    def verify(self, sha256: str) -> bool:
        path = self.path_for(sha256)
        return path.is_file() and file_sha256(path) == sha256

    def blob_stats(self) -> Iterator[tuple[str, BlobStat]]:
        base = self.root / "sha256"
        if base.exists():
            for p in base.glob("*/*"):
                if (st := stat_or_none(p)) is not None:
                    yield p.name, BlobStat(st.st_size, st.st_mtime)

    def remove(self, sha256: str) -> None:
        self.path_for(sha256).unlink(missing_ok=True)

    def object_path(self, key: str) -> Path:
        return self.root / check_object_key(key)

    def put_object(self, key: str, data: bytes) -> None:
        from registry.store.files import atomic_write
        atomic_write(self.object_path(key), lambda f: f.write(data), durable=False)

    def get_object(self, key: str) -> bytes:
        try:
            return self.object_path(key).read_bytes()
        except FileNotFoundError:
            raise ArtifactUnavailable(f"object {key} is not in the store") from None

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        folder = prefix.rpartition("/")[0]
        base = self.root / check_object_key(folder) if folder else self.root
        if not base.is_dir():
            return
        found = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith("."):
                    continue  # a write in progress (atomic_write's temp file)
                path = Path(dirpath) / name
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix) and (st := stat_or_none(path)) is not None:
                    found.append((key, st.st_size))
        yield from sorted(found)

    def delete_object(self, key: str) -> None:
        path = self.object_path(key)
        path.unlink(missing_ok=True)
        for parent in path.parents:  # empty partition folders go with their last file
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:
                break


def default_store() -> ArtifactStore:
    """The store settings name: ARTIFACT_STORE=s3://bucket/prefix, else the folder ARTIFACT_ROOT."""
    url = settings.ARTIFACT_STORE
    if url.startswith("s3://"):
        return _s3_store(url, settings.AWS_ENDPOINT_URL, Path(settings.ARTIFACT_ROOT),
                         settings.MAX_UPLOAD_BYTES)
    if url:
        raise ValueError(f"ARTIFACT_STORE must be empty (the folder ARTIFACT_ROOT) or "
                         f"s3://bucket/prefix, not {url!r}")
    return FileStore(settings.ARTIFACT_ROOT, settings.MAX_UPLOAD_BYTES)


def _s3_feature(url: str) -> str:
    return f"The S3 artifact store is on (ARTIFACT_STORE={url})"


@register()
def artifact_store_extra(app_configs=None, **kwargs) -> list:
    """ARTIFACT_STORE=s3://… without the [s3] extra stops `manage.py start` (and every command
    that runs the system checks) before it serves, rather than failing the first upload.
    Registered as the registry app loads this module (tests/test_extras.py checks it is)."""
    url = settings.ARTIFACT_STORE
    if not url.startswith("s3://"):
        return []
    try:
        require("s3", feature=_s3_feature(url))
    except MissingExtra as exc:
        return [Error(str(exc), id="mmc.store.E001")]
    return []


@functools.lru_cache(maxsize=8)
def _s3_store(url: str, endpoint_url: str, local_root: Path, max_bytes: int) -> ArtifactStore:
    """One S3Store (and its boto3 client, thread-safe and slow to make) per configuration."""
    require("s3", feature=_s3_feature(url))  # a Celery worker runs no system checks
    from registry.store.s3 import S3Store  # boto3 only where an object store is configured

    return S3Store(url, endpoint_url=endpoint_url or None, local_root=local_root,
                   max_bytes=max_bytes)
