"""Content-addressed artifact store: blobs live at sha256/<2 hex>/<64 hex> under ARTIFACT_ROOT.

Writes stream to a temporary file in the store's own folder while hashing, are fsynced and renamed
atomically, so a reader never sees a partial blob and a crash leaves only a temp file behind.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from registry.errors import PayloadTooLarge

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    size: int
    path: Path


class BlobWriter:
    """One upload in progress. `write` chunks, then `finish` (or `abort`)."""

    def __init__(self, store: ArtifactStore):
        self.store = store
        fd, name = tempfile.mkstemp(prefix="upload-", dir=store.tmp_dir)
        self._file = os.fdopen(fd, "wb", buffering=0)
        self._tmp = Path(name)
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.store.max_bytes:
            self.abort()
            raise PayloadTooLarge(
                f"artifact is larger than the limit of {self.store.max_bytes} bytes", field="file"
            )
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self) -> StoredBlob:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        sha = self._hash.hexdigest()
        final = self.store.path_for(sha)
        if final.exists():
            self._tmp.unlink()  # same bytes already stored: share the blob
        else:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._tmp, final)
            dir_fd = os.open(final.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return StoredBlob(sha256=sha, size=self.size, path=final)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)


class ArtifactStore:
    def __init__(self, root: Path, max_bytes: int):
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.tmp_dir = self.root / "tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self.root / "sha256" / sha256[:2] / sha256

    def writer(self) -> BlobWriter:
        return BlobWriter(self)

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

    def verify(self, sha256: str) -> bool:
        """Re-hash a stored blob: serving checks this before loading it."""
        h = hashlib.sha256()
        with open(self.path_for(sha256), "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        return h.hexdigest() == sha256

    def blobs(self) -> Iterable[str]:
        base = self.root / "sha256"
        if base.exists():
            for p in base.glob("*/*"):
                yield p.name

    def remove(self, sha256: str) -> None:
        self.path_for(sha256).unlink(missing_ok=True)


def default_store() -> ArtifactStore:
    return ArtifactStore(settings.ARTIFACT_ROOT, settings.MAX_UPLOAD_BYTES)
