"""Multipart uploads stream straight into a StreamWriter while they arrive: no copy in memory,
no second temporary file. Model artifacts go into the artifact store, datasets under jobs/."""

from __future__ import annotations

import asyncio
import re
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler

from registry.errors import InsufficientStorage, InvalidRequest, RequestTimeout, TooManyAttempts
from registry.store.artifacts import CHUNK, ArtifactStore, StoredBlob, default_store
from registry.store.files import FileWriter
from registry.store.gc import discard_unreferenced
from registry.store.space import free_space
from registry.store.writer import StreamWriter


class StreamingUploadHandler(FileUploadHandler):
    """Takes the one multipart file field `file`; any other file field is an error.

    Subclasses say how to open a writer and what request.FILES gets once the file is complete.
    """

    chunk_size = CHUNK
    what = "file"  # what the field holds, for the error message

    def __init__(self, request=None):
        super().__init__(request)
        self.writer: StreamWriter | None = None

    def open_writer(self) -> StreamWriter:
        raise NotImplementedError

    def uploaded(self, writer: StreamWriter):
        """What request.FILES["file"] holds for the finished `writer`."""
        raise NotImplementedError

    def new_file(self, field_name, *args, **kwargs):
        if field_name != "file":
            raise InvalidRequest(f"unexpected file field {field_name!r}; send the {self.what} as "
                                 f"'file'", field=field_name)
        super().new_file(field_name, *args, **kwargs)
        self.writer = self.open_writer()

    def receive_data_chunk(self, raw_data, start):
        self.writer.write(raw_data)  # raises PayloadTooLarge (and cleans up) past the limit
        return None

    def file_complete(self, file_size):
        writer, self.writer = self.writer, None
        return self.uploaded(writer)

    def upload_interrupted(self):
        if self.writer is not None:
            self.writer.abort()


def remember_blob(request, blob: StoredBlob) -> None:
    """Note a blob this request put in the store: `discard_refused_blobs` looks at it once the
    answer is known."""
    if not hasattr(request, "stored_blobs"):
        request.stored_blobs = []
    request.stored_blobs.append(blob)


def discard_refused_blobs(request) -> None:
    """Whatever the answer, an upload leaves no blob behind that no version references: a
    refused one (bad metadata, archived model, no role...) removes what it stored at once."""
    for blob in getattr(request, "stored_blobs", ()):
        discard_unreferenced(blob)
    request.stored_blobs = []


class StoredUpload:
    """What request.FILES holds for a file that is already in the store."""

    def __init__(self, name: str, blob: StoredBlob):
        self.name = name
        self.blob = blob
        self.size = blob.size

    def close(self) -> None:
        """Django closes every parsed file when a later part of the body is refused: nothing is
        open here (the blob itself goes with the refusal, see `discard_refused_blobs`)."""


class StoreUploadHandler(StreamingUploadHandler):
    """A model version's artifact, streamed into the artifact store."""

    what = "model"

    def __init__(self, store: ArtifactStore, request=None):
        super().__init__(request)
        self.store = store

    def open_writer(self) -> StreamWriter:
        return self.store.writer()

    def uploaded(self, writer) -> StoredUpload:
        blob = writer.finish()
        remember_blob(self.request, blob)
        return StoredUpload(self.file_name or "", blob)


class DatasetUploadHandler(StreamingUploadHandler):
    """A dataset, streamed into a FileWriter; dataset_create moves it into place."""

    what = "dataset"

    def open_writer(self) -> FileWriter:
        return FileWriter(limit=settings.MAX_UPLOAD_BYTES, what="dataset")

    def uploaded(self, writer: FileWriter) -> FileWriter:
        writer.name = self.file_name or ""
        return writer


#: A raw version upload (`PUT …/versions/upload/`, with or without a file name after it):
#: console.asgi admits it from its headers, streams its body into the store as it arrives and
#: hands the view the writer under this scope key (RECEIVED_BODY).
RAW_UPLOAD_PATH = re.compile(r"^/api/v1/models/[^/]+/versions/upload/[^/]*$")
RECEIVED_BODY = "mmc.received_body"
#: what a client refused for having too many uploads in progress is told to wait (seconds)
UPLOAD_RETRY_AFTER = 5


#: received body bytes handed to the writing thread at a time, and how many such hand-offs may
#: wait for it (memory held per upload: about their product)
_HAND_OFF_BYTES = 1024 * 1024
_HAND_OFFS_WAITING = 4


def ensure_room(size: int) -> None:
    """Refuse (507) `size` more bytes on the local disk (ARTIFACT_ROOT: the store, the upload
    spool, job files, and SQLite embedded) when they would leave it below STORE_MIN_FREE_BYTES."""
    keep = settings.STORE_MIN_FREE_BYTES
    free = free_space().free
    if size + keep > free:
        raise InsufficientStorage(
            f"not enough free space: the store has {free} bytes free, and {size} bytes of "
            f"request body plus the {keep} bytes it keeps free (MMC_STORE_MIN_FREE_BYTES) "
            f"need {size + keep}")


class UploadSlots:
    """Raw uploads in progress per user, in this process: past `limit` one more is refused
    (429, Retry-After) before a byte of its body is read. Used on the event loop only."""

    def __init__(self) -> None:
        self._in_progress: Counter = Counter()

    def take(self, user_id: int, limit: int) -> None:
        """Count one more upload of `user_id` in progress (until `release`), or refuse it."""
        if limit > 0 and self._in_progress[user_id] >= limit:
            raise TooManyAttempts(
                f"you have {self._in_progress[user_id]} uploads in progress, the most at once "
                f"(MMC_MAX_UPLOADS_PER_USER); send this one when one of them has finished",
                retry_after=UPLOAD_RETRY_AFTER)
        self._in_progress[user_id] += 1

    def release(self, user_id: int) -> None:
        self._in_progress[user_id] -= 1
        if self._in_progress[user_id] <= 0:
            del self._in_progress[user_id]


async def receive_into_store(receive, *, idle_timeout_s: float = 0.0,
                             min_rate: float = 0.0) -> StreamWriter | None:
    """Hash and write an ASGI request body into a new store writer while it arrives (None: the
    client went away). Django's ASGI handler would first spool the whole body to a temporary
    file, which the view then read back and wrote again: py-spy on a 400 MB PUT put a third of
    the request's time in those extra reads and writes. Hashing and writing (both release the
    GIL) run in one thread of their own, a megabyte at a time, while the event loop receives
    the next one. Raises, having removed what it wrote: PayloadTooLarge past the store's limit,
    RequestTimeout when no byte arrives for `idle_timeout_s` or, after that long, fewer than
    `min_rate` bytes a second arrived on average (as the data plane's serving.edge_limits), and
    InsufficientStorage when a local store's disk gets down to what it keeps free."""
    loop = asyncio.get_running_loop()
    store = default_store()
    writer = store.writer()
    local = store.on_local_disk
    pending: deque[asyncio.Future] = deque()
    parts: list[bytes] = []
    held = received = 0
    start = loop.time()
    with ThreadPoolExecutor(1, thread_name_prefix="mmc-upload") as pool:
        try:
            async with asyncio.timeout(None) as clock:  # runs only while waiting for the client
                while True:
                    if idle_timeout_s > 0:
                        clock.reschedule(loop.time() + idle_timeout_s)
                    message = await receive()
                    clock.reschedule(None)
                    if message["type"] == "http.disconnect":
                        raise _ClientGone
                    body = message.get("body")
                    more = message.get("more_body", False)
                    if body:
                        parts.append(body)
                        held += len(body)
                        received += len(body)
                    elapsed = loop.time() - start
                    if more and min_rate > 0 and received < min_rate * (elapsed - idle_timeout_s):
                        raise RequestTimeout(
                            f"request body arrives slower than the minimum of {min_rate:g} "
                            f"bytes/s ({received} bytes in {elapsed:.0f} s)")
                    if held >= _HAND_OFF_BYTES or (not more and parts):
                        pending.append(loop.run_in_executor(pool, _write_all, writer, parts,
                                                            local))
                        parts, held = [], 0
                        while len(pending) > _HAND_OFFS_WAITING or (pending and not more):
                            await pending.popleft()  # raises PayloadTooLarge past the limit
                    if not more:
                        return writer
        except BaseException as exc:
            for future in pending:
                future.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            writer.abort()
            if isinstance(exc, _ClientGone):
                return None
            if isinstance(exc, TimeoutError) and clock.expired():
                raise RequestTimeout(f"no request body bytes arrived for {idle_timeout_s:g} s "
                                     f"({received} bytes received)") from None
            raise


class _ClientGone(Exception):
    """The client disconnected before its body was complete."""


def _write_all(writer: StreamWriter, parts: list[bytes], local: bool) -> None:
    if local:  # a statvfs per megabyte: a body of undeclared length is bounded too
        ensure_room(sum(len(part) for part in parts))
    for part in parts:
        writer.write(part)


def received_writer(request) -> StreamWriter | None:
    """The store writer console.asgi already filled with this request's body, if it did."""
    scope = getattr(request, "scope", None)
    return scope.get(RECEIVED_BODY) if scope else None
