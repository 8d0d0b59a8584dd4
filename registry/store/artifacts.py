"""Content-addressed artifact store: blobs live at sha256/<2 hex>/<64 hex> under ARTIFACT_ROOT.

Writes stream to a temporary file in the store's own folder while hashing (store/writer.py), are
fsynced and renamed atomically, so a reader never sees a partial blob and a crash leaves only a
temp file behind.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from registry.store.writer import CHUNK, HashingWriter
from serving.hashing import file_sha256


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    size: int
    path: Path


class BlobWriter(HashingWriter):
    """One upload in progress into the store. `write` chunks, then `finish` (or `abort`)."""

    def __init__(self, store: ArtifactStore):
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
        return file_sha256(self.path_for(sha256)) == sha256

    def blobs(self) -> Iterable[str]:
        base = self.root / "sha256"
        if base.exists():
            for p in base.glob("*/*"):
                yield p.name

    def remove(self, sha256: str) -> None:
        self.path_for(sha256).unlink(missing_ok=True)


def default_store() -> ArtifactStore:
    return ArtifactStore(settings.ARTIFACT_ROOT, settings.MAX_UPLOAD_BYTES)
