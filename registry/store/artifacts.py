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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

from registry.store.writer import CHUNK, HashingWriter, StreamWriter
from serving.hashing import file_sha256


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    size: int
    path: Path | None = None  # where a FileStore keeps it; None in an object store


@dataclass(frozen=True)
class BlobStat:
    size: int
    mtime: float  # seconds since the epoch: last written (or rewritten by an identical upload)


@dataclass(frozen=True)
class Temp:
    """Something an unfinished write left: a temporary file or object, an open multipart upload.
    `mtime` is its last activity: a write in progress keeps it fresh."""

    name: str
    size: int
    mtime: float
    ref: object = None  # what the store needs to remove it


class ArtifactUnavailable(Exception):
    """A blob is not in the store, or its bytes do not hash to its name."""


def check_digest(sha256: str) -> str:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return sha256


class ArtifactStore:
    """What every backend offers. `local_root` is ARTIFACT_ROOT: the upload spool (tmp/) and job
    files (jobs/) stay on the local (or shared) filesystem whatever the backend."""

    #: Shown in health and audit: where the blobs are.
    location: str
    #: Whether blobs live on the local filesystem (free space then matters for uploads).
    on_local_disk: bool

    def __init__(self, local_root: Path, max_bytes: int):
        self.local_root = Path(local_root)
        self.max_bytes = max_bytes
        self.tmp_dir = self.local_root / "tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    # -- writing --------------------------------------------------------------------------

    def writer(self) -> StreamWriter:
        """One upload in progress: `write` chunks, then `finish() -> StoredBlob` (or `abort`)."""
        raise NotImplementedError

    def save_stream(self, chunks: Iterable[bytes]) -> StoredBlob:
        writer = self.writer()
        try:
            for chunk in chunks:
                writer.write(chunk)
        except BaseException:
            writer.abort()
            raise
        return writer.finish()

    def save_bytes(self, data: bytes) -> StoredBlob:
        return self.save_stream([data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""])

    def ping(self) -> None:
        """Raise unless the store answers (health); a folder always does."""

    # -- reading --------------------------------------------------------------------------

    def exists(self, sha256: str) -> bool:
        return self.stat(sha256) is not None

    def stat(self, sha256: str) -> BlobStat | None:
        raise NotImplementedError

    def open(self, sha256: str) -> BinaryIO:
        """The blob's bytes as a stream (read in CHUNK pieces; never whole in memory)."""
        raise NotImplementedError

    def cached_path(self, sha256: str) -> Path:
        """Where the blob is, or will be once `local_path` fetched it, on this host's disk."""
        raise NotImplementedError

    def local_path(self, sha256: str) -> Path:
        """A local file holding the blob (what onnxruntime loads); raises ArtifactUnavailable."""
        raise NotImplementedError

    def verify(self, sha256: str) -> bool:
        """Re-hash the blob: serving and validation check this before loading it."""
        raise NotImplementedError

    def blobs(self) -> Iterator[str]:
        return (sha for sha, _ in self.blob_stats())

    def blob_stats(self) -> Iterator[tuple[str, BlobStat]]:
        raise NotImplementedError

    # -- removing -------------------------------------------------------------------------

    def remove(self, sha256: str) -> None:
        raise NotImplementedError

    def temps(self) -> list[Temp]:
        """What unfinished writes left behind, fresh or not (gc.py decides by `mtime`). Here:
        files in the local temp folders (tmp/: Django's spool and the file store's writer;
        jobs/tmp/: job request bodies and datasets)."""
        found = []
        for folder in (self.tmp_dir, self.local_root / "jobs" / "tmp"):
            if folder.is_dir():
                for p in folder.iterdir():
                    if p.is_file() and (st := _stat(p)) is not None:
                        found.append(Temp(str(p.relative_to(self.local_root)), st.st_size,
                                          st.st_mtime, p))
        return found

    def remove_temp(self, temp: Temp, cutoff: float) -> bool:
        """Remove `temp` if it is still untouched since `cutoff` (looked at again: a write may
        have gone on since the listing); True if removed."""
        path = temp.ref
        st = _stat(path)
        if st is None or st.st_mtime >= cutoff:
            return False
        path.unlink(missing_ok=True)
        return True


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
        st = _stat(self.path_for(sha256))
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
                if (st := _stat(p)) is not None:
                    yield p.name, BlobStat(st.st_size, st.st_mtime)

    def remove(self, sha256: str) -> None:
        self.path_for(sha256).unlink(missing_ok=True)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


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


@functools.lru_cache(maxsize=8)
def _s3_store(url: str, endpoint_url: str, local_root: Path, max_bytes: int) -> ArtifactStore:
    """One S3Store (and its boto3 client, thread-safe and slow to make) per configuration."""
    from registry.store.s3 import S3Store  # boto3 only where an object store is configured

    return S3Store(url, endpoint_url=endpoint_url or None, local_root=local_root,
                   max_bytes=max_bytes)
