"""Multipart uploads go straight into the artifact store while hashing: no copy in memory, no
second temporary file."""

from __future__ import annotations

from django.core.files.uploadhandler import FileUploadHandler

from registry.store.artifacts import ArtifactStore, BlobWriter, StoredBlob


class StoredUpload:
    """What request.FILES holds for a file that is already in the store."""

    def __init__(self, name: str, blob: StoredBlob):
        self.name = name
        self.blob = blob
        self.size = blob.size


class StoreUploadHandler(FileUploadHandler):
    chunk_size = 1024 * 1024

    def __init__(self, store: ArtifactStore, request=None):
        super().__init__(request)
        self.store = store
        self.writer: BlobWriter | None = None

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        self.writer = self.store.writer()

    def receive_data_chunk(self, raw_data, start):
        self.writer.write(raw_data)  # raises PayloadTooLarge (and cleans up) past the limit
        return None

    def file_complete(self, file_size):
        blob = self.writer.finish()
        self.writer = None
        return StoredUpload(self.file_name or "", blob)

    def upload_interrupted(self):
        if self.writer is not None:
            self.writer.abort()
