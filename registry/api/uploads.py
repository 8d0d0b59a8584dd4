"""Multipart uploads stream straight into a StreamWriter while they arrive: no copy in memory,
no second temporary file. Model artifacts go into the artifact store, datasets under jobs/."""

from __future__ import annotations

import asyncio
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler

from registry.errors import InvalidRequest
from registry.store.artifacts import CHUNK, ArtifactStore, StoredBlob, default_store
from registry.store.files import FileWriter
from registry.store.gc import discard_unreferenced
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


#: A raw version upload (`PUT …/versions/upload/`): console.asgi streams its body into the
#: store as it arrives and hands the view the writer under this scope key (RECEIVED_BODY).
RAW_UPLOAD_PATH = re.compile(r"^/api/v1/models/[^/]+/versions/upload/")
RECEIVED_BODY = "mmc.received_body"


#: received body bytes handed to the writing thread at a time, and how many such hand-offs may
#: wait for it (memory held per upload: about their product)
_HAND_OFF_BYTES = 1024 * 1024
_HAND_OFFS_WAITING = 4


async def receive_into_store(receive) -> StreamWriter | None:
    """Hash and write an ASGI request body into a new store writer while it arrives (None: the
    client went away). Django's ASGI handler would first spool the whole body to a temporary
    file, which the view then read back and wrote again: py-spy on a 400 MB PUT put a third of
    the request's time in those extra reads and writes. Hashing and writing (both release the
    GIL) run in one thread of their own, a megabyte at a time, while the event loop receives
    the next one. Raises PayloadTooLarge past the store's limit, having removed what it wrote."""
    loop = asyncio.get_running_loop()
    writer = default_store().writer()
    pending: deque[asyncio.Future] = deque()
    parts: list[bytes] = []
    held = 0
    with ThreadPoolExecutor(1, thread_name_prefix="mmc-upload") as pool:
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone
                body = message.get("body")
                if body:
                    parts.append(body)
                    held += len(body)
                more = message.get("more_body", False)
                if held >= _HAND_OFF_BYTES or (not more and parts):
                    pending.append(loop.run_in_executor(pool, _write_all, writer, parts))
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
            raise


class _ClientGone(Exception):
    """The client disconnected before its body was complete."""


def _write_all(writer: StreamWriter, parts: list[bytes]) -> None:
    for part in parts:
        writer.write(part)


def received_writer(request) -> StreamWriter | None:
    """The store writer console.asgi already filled with this request's body, if it did."""
    scope = getattr(request, "scope", None)
    return scope.get(RECEIVED_BODY) if scope else None
