"""Multipart uploads stream straight into a StreamWriter while they arrive: no copy in memory,
no second temporary file. Model artifacts go into the artifact store, datasets under jobs/."""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler

from registry.errors import InvalidRequest
from registry.store.artifacts import CHUNK, ArtifactStore, StoredBlob
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
