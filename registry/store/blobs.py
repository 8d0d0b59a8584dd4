"""What every artifact-store backend offers (the folder in store/artifacts.py, the object store
in store/s3.py), and the records they answer with."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from registry.store.writer import CHUNK, StreamWriter


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


def check_object_key(key: str) -> str:
    """A named object's key: slash-separated parts of letters, digits and ._-, none of them
    empty, "." or ".." (nothing a folder store could be led out of its root by)."""
    parts = key.split("/")
    if not key or len(key) > 512 or any(
            not p or p in (".", "..") or not all(c.isalnum() or c in "._-" for c in p)
            for p in parts):
        raise ValueError(f"not an object key: {key!r}")
    return key


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

    # -- named objects (model monitoring's captured requests: registry.monitoring.capture_store)

    def put_object(self, key: str, data: bytes) -> None:
        """Store `data` under `key` ("capture/..."), whole or not at all."""
        raise NotImplementedError

    def get_object(self, key: str) -> bytes:
        """The bytes under `key`; raises ArtifactUnavailable when there are none."""
        raise NotImplementedError

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object whose key starts with `prefix`, in key order."""
        raise NotImplementedError

    def delete_object(self, key: str) -> None:
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
                    if p.is_file() and (st := stat_or_none(p)) is not None:
                        found.append(Temp(str(p.relative_to(self.local_root)), st.st_size,
                                          st.st_mtime, p))
        return found

    def remove_temp(self, temp: Temp, cutoff: float) -> bool:
        """Remove `temp` if it is still untouched since `cutoff` (looked at again: a write may
        have gone on since the listing); True if removed."""
        path = temp.ref
        st = stat_or_none(path)
        if st is None or st.st_mtime >= cutoff:
            return False
        path.unlink(missing_ok=True)
        return True


def stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None
