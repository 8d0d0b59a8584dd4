"""The one way bytes come in: hashed (sha256) and counted against a limit while they stream to
where they are staged (a temporary file here; a multipart upload in store/s3.py), then put into
place at once.

A reader never sees a partial file, and a crash (or a refused upload) leaves at most a temporary
file behind. Artifacts (store/artifacts.py) and job files (store/files.py) both write this way.
A disk that fills up mid-write (ENOSPC) is StoreFull (507) naming the free space, with what was
written removed, whichever path the bytes came by (a multipart upload, a raw PUT, a job body).
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Self

from registry.errors import PayloadTooLarge, StoreFull
from registry.store.space import free_space

#: Read and write this much at a time: a multi-gigabyte upload never sits in memory whole.
CHUNK = 1024 * 1024


class StreamWriter:
    """Hashes and counts what is written; subclasses say where the bytes go (`_put`) and how an
    unfinished write is undone (`abort`).

    Past `limit` bytes `write` aborts and raises PayloadTooLarge, so callers need not clean up
    after a refusal.
    """

    def __init__(self, *, limit: int, what: str, field: str | None = None):
        self._hash = hashlib.sha256()
        self.limit, self.what, self.field = limit, what, field
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            self.abort()
            raise PayloadTooLarge(f"{self.what} is larger than the limit of {self.limit} bytes",
                                  field=self.field)
        self._hash.update(chunk)
        self._put(chunk)

    def _put(self, chunk: bytes) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def read_from(self, read: Callable[[int], bytes]) -> Self:
        """Copy a file-like `read(n)` to its end, aborting (nothing left behind) on any error."""
        try:
            while chunk := read(CHUNK):
                self.write(chunk)
        except BaseException:
            self.abort()
            raise
        return self

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


class HashingWriter(StreamWriter):
    """One incoming file, staged in a temporary file: `write` chunks (or `read_from` a stream),
    then `move_to` or `abort`."""

    def __init__(self, *, tmp_dir: Path, limit: int, what: str, field: str | None = None,
                 prefix: str = "in-", where: str = "the artifact store"):
        super().__init__(limit=limit, what=what, field=field)
        self.where = where  # named in StoreFull: never the path, which callers must not learn
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=prefix, dir=tmp_dir)
        self._file = os.fdopen(fd, "wb")
        self.path = Path(name)

    def _put(self, chunk: bytes) -> None:
        try:
            self._file.write(chunk)
        except OSError as exc:
            raise self._failed(exc) from None

    def close(self) -> None:
        """Flush and fsync: the bytes are on disk before anything names them."""
        if not self._file.closed:
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError as exc:
                raise self._failed(exc) from None
            self._file.close()

    def move_to(self, dest: Path) -> Path:
        """Rename the finished file to `dest` atomically and make the rename durable."""
        self.close()
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path, dest)
        except OSError as exc:
            raise self._failed(exc) from None
        dir_fd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return dest

    def _failed(self, exc: OSError) -> Exception:
        """Undo the write; what to raise: StoreFull for a full disk, else `exc` itself."""
        self.abort()
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return exc
        free = free_space(self.path.parent).free
        return StoreFull(f"{self.where} is out of space: it has {free} bytes free, and this "
                         f"{self.what} needs at least {self.size} bytes (what had arrived when "
                         f"the disk filled); nothing of it was kept", field=self.field)

    def abort(self) -> None:
        if not self._file.closed:
            try:
                self._file.close()  # flushes what is buffered: on a full disk, that fails too
            except OSError:
                pass
        self.path.unlink(missing_ok=True)
