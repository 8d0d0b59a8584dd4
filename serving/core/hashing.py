"""Content hashes of artifact files, shared by the registry (storing) and replicas (verifying)."""

from __future__ import annotations

import hashlib
import os

#: Read this much at a time: a multi-gigabyte model never sits in memory whole.
CHUNK_BYTES = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, streamed in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
