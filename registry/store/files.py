"""Files of jobs under ARTIFACT_ROOT/jobs/: async request bodies, uploaded datasets, chunk parts
and results, plus streaming readers for datasets (.npy, .npz, JSON Lines).

Everything is written to a temporary file on the same filesystem (jobs/tmp/ for uploads, the
destination's folder otherwise) and renamed into place, so a reader (or a worker resuming after
kill -9) sees a whole file or none. Datasets are never loaded
whole: .npy files and .npz members are read a chunk of rows at a time, JSON Lines a line at a
time.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from django.conf import settings

from registry.errors import InvalidRequest
from registry.store.writer import HashingWriter

FORMAT_BY_SUFFIX = {".npy": "npy", ".npz": "npz", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def jobs_root() -> Path:
    return Path(settings.ARTIFACT_ROOT) / "jobs"


def job_dir(job_id) -> Path:
    return jobs_root() / str(job_id)


def dataset_path(dataset) -> Path:
    return jobs_root() / "datasets" / f"{dataset.id}.{dataset.format}"


class FileWriter(HashingWriter):
    """A job's incoming file (request body, dataset), staged under jobs/tmp/ while it streams in;
    `move_to` puts it where it will live."""

    def __init__(self, *, limit: int, what: str):
        super().__init__(tmp_dir=jobs_root() / "tmp", limit=limit, what=what,
                         where="the job files' store (ARTIFACT_ROOT/jobs)")


def atomic_write(dest: Path, write, *, durable: bool = True) -> None:
    """Call write(file) on a temporary file and rename it to `dest`. `durable` fsyncs first;
    without it the file survives a killed process (the page cache keeps it) but maybe not a
    machine crash, so whoever reads it after a restart must check it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(name, dest)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- datasets


def detect_format(filename: str, declared: str | None) -> str:
    if declared:
        if declared not in ("npy", "npz", "jsonl"):
            raise InvalidRequest("format must be npy, npz or jsonl", field="format")
        return declared
    fmt = FORMAT_BY_SUFFIX.get(Path(filename or "").suffix.lower())
    if fmt is None:
        raise InvalidRequest("cannot tell the dataset format from the file name; name it .npy, "
                             ".npz or .jsonl, or pass format=", field="format")
    return fmt


def _npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    major, _minor = np.lib.format.read_magic(f)
    if major == 1:
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


def _column(shape, dtype: np.dtype, name: str) -> dict:
    if dtype.hasobject:
        raise InvalidRequest(f"array {name or 'in the .npy'} has dtype object; datasets hold "
                             f"numeric arrays (use JSON Lines for strings)", field="file")
    if not shape:
        raise InvalidRequest(f"array {name or 'in the .npy'} is a scalar; the first dimension "
                             f"must be the rows", field="file")
    return {"dtype": dtype.str, "shape": list(shape[1:]), "rows": int(shape[0])}


def inspect_dataset(path: Path, fmt: str) -> tuple[int | None, dict]:
    """Read only headers: (rows, columns). Raises InvalidRequest on a file that is not `fmt`."""
    try:
        if fmt == "npy":
            with open(path, "rb") as f:
                shape, _fortran, dtype = _npy_header(f)
            columns = {"": _column(shape, dtype, "")}
        elif fmt == "npz":
            columns = {}
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    if not info.filename.endswith(".npy"):
                        continue
                    with zf.open(info) as f:
                        shape, _fortran, dtype = _npy_header(f)
                    name = info.filename[:-4]
                    columns[name] = _column(shape, dtype, name)
            if not columns:
                raise InvalidRequest("the .npz holds no arrays", field="file")
        else:
            with open(path, "rb") as f:
                first = next((line for line in f if line.strip()), None)
            if first is None:
                raise InvalidRequest("the JSON Lines file has no records", field="file")
            import orjson

            if not isinstance(orjson.loads(first), dict):
                raise InvalidRequest("each JSON Lines record must be a JSON object", field="file")
            return None, {}
    except InvalidRequest:
        raise
    except Exception as exc:  # numpy/zipfile/orjson raise several unrelated types
        raise InvalidRequest(f"not a valid .{fmt} file: {exc}", field="file") from None
    rows = {c["rows"] for c in columns.values()}
    if len(rows) != 1:
        raise InvalidRequest(f"arrays have different numbers of rows: {sorted(rows)}",
                             field="file")
    return rows.pop(), columns


class ArraySource:
    """Rows [start, stop) of a .npy or an .npz member, read with plain reads into a fresh
    buffer, one chunk in memory at a time.

    Not np.load(mmap_mode="r"): mapped pages count in the worker's RSS, and dropping them with
    madvise(MADV_DONTNEED) held only while the reader outran the model (measured with bench/
    batch.py: a 256 MB .npy left 250 MB mapped); reads keep the peak flat at any dataset size.
    """

    def __init__(self, path: Path, fmt: str):
        self._path = path
        self._zip = zipfile.ZipFile(path) if fmt == "npz" else None
        self._members: dict[str, list] = {}

    def _member(self, name: str) -> list:
        if name not in self._members:
            f = self._zip.open(name + ".npy") if self._zip is not None else open(self._path, "rb")
            shape, fortran, dtype = _npy_header(f)
            if fortran and len(shape) > 1:
                raise InvalidRequest(f"array {name or 'in the .npy'} is Fortran-ordered; save "
                                     f"it C-ordered")
            row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
            self._members[name] = [f, f.tell(), 0, shape, dtype, row_bytes]  # pos in rows
        return self._members[name]

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        m = self._member(name)
        f, data_at, pos, shape, dtype, row_bytes = m
        if pos != start:  # only after a resume (a ZipExtFile seeks by re-reading)
            f.seek(data_at + start * row_bytes)
        out = np.empty((stop - start, *shape[1:]), dtype=dtype)
        view = memoryview(out.reshape(-1).view(np.uint8))
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise InvalidRequest(f"dataset ends after {start + got // row_bytes} rows; "
                                     f"its header says {shape[0]}")
            got += n
        m[2] = stop
        return out

    def close(self) -> None:
        for m in self._members.values():
            m[0].close()
        self._members.clear()
        if self._zip is not None:
            self._zip.close()


def index_lines(path: Path, every: int) -> tuple[int, list[int]]:
    """Count the records (non-blank lines) of a JSON Lines file and return the byte offset at
    which every `every`-th record starts: where each chunk begins."""
    offsets, rows, at = [], 0, 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                if rows % every == 0:
                    offsets.append(at)
                rows += 1
            at += len(line)
    return rows, offsets


def read_lines(path: Path, offset: int, count: int) -> Iterator[bytes]:
    with open(path, "rb") as f:
        f.seek(offset)
        for line in f:
            if not line.strip():
                continue
            yield line
            count -= 1
            if count == 0:
                return
