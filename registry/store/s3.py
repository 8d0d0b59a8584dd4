"""Artifacts in an S3-compatible object store (boto3): ARTIFACT_STORE=s3://bucket/prefix.

Keys: <prefix>sha256/<2 hex>/<64 hex> for blobs, <prefix>tmp/<uuid> while an upload streams.
An upload is hashed while its parts go to a multipart upload under a temporary key (the digest,
and so the name, is known only at the end); once complete it is copied server-side to its
content key and the temporary object deleted. S3 makes an object visible only when its PUT,
copy or multipart completion succeeds, so a reader never sees a half-written blob; an upload
cut short leaves an open multipart upload (or, between completion and copy, a tmp/ object) that
garbage collection aborts (deletes) once it is older than the grace period.

Endpoint and credentials come from boto3's usual chain (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, ~/.aws, an instance role); settings can pin the
endpoint (AWS_ENDPOINT_URL).

Onnxruntime loads files, so whoever loads a blob (validation, jobs, a serving replica on
another host) fetches it once into ARTIFACT_ROOT/cache/, hashing on the way and refusing bytes
that do not match the digest.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from registry.errors import StoreUnavailable
from registry.store.blobs import (
    ArtifactStore,
    ArtifactUnavailable,
    BlobStat,
    StoredBlob,
    Temp,
    check_digest,
    check_object_key,
)
from registry.store.writer import CHUNK, StreamWriter
from serving.core.hashing import file_sha256

log = logging.getLogger(__name__)

#: Bytes per multipart part (S3's minimum is 5 MiB, except the last).
PART = 8 * 1024 * 1024
#: Parts on their way at once while the next one fills: receiving overlaps sending, and an
#: upload holds at most (IN_FLIGHT + 1) parts in memory.
IN_FLIGHT = 2
#: Copy a finished upload to its content key in one CopyObject (S3 allows up to 5 GiB).
COPY = TransferConfig(multipart_threshold=5 * 1024**3, multipart_chunksize=1024**3)
NOT_FOUND = {"404", "NoSuchKey", "NoSuchUpload", "NotFound"}


class S3BlobWriter(StreamWriter):
    """One upload in progress into an S3Store."""

    def __init__(self, store: S3Store):
        super().__init__(limit=store.max_bytes, what="artifact", field="file")
        self.store = store
        self.tmp_key = store.key(f"tmp/{uuid.uuid4().hex}")
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[Future] = []  # each part's {"PartNumber", "ETag"}, in order
        self._senders: ThreadPoolExecutor | None = None
        self._tmp_object = False  # the multipart upload completed: tmp_key is an object

    def _put(self, chunk: bytes) -> None:
        self._buffer += chunk
        if len(self._buffer) >= PART:
            with self._aborting():
                self._send_part()

    @contextlib.contextmanager
    def _aborting(self) -> Iterator[None]:
        """Any failure inside aborts the upload (nothing half-written stays); an S3 failure is
        raised as the store being unavailable."""
        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            self.abort()
            raise self.store.unavailable(exc) from exc
        except BaseException:
            self.abort()
            raise

    def _send_part(self) -> None:
        """Hand the filled buffer to a sender thread, waiting while IN_FLIGHT parts are on
        their way; a part that failed fails the upload here."""
        if self._upload_id is None:
            self._upload_id = self.store.client.create_multipart_upload(
                Bucket=self.store.bucket, Key=self.tmp_key)["UploadId"]
            self._senders = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="mmc-s3-part")
        sending = [f for f in self._parts if not f.done()]
        if len(sending) >= IN_FLIGHT:
            wait(sending, return_when=FIRST_COMPLETED)
        for done in self._parts:
            if done.done() and done.exception() is not None:
                raise done.exception()
        body, self._buffer = self._buffer, bytearray()
        self._parts.append(self._senders.submit(self._upload_part, len(self._parts) + 1, body))
        if len(self._parts) == 1:
            # Garbage collection dates an upload by its newest part; without one it falls back
            # on the upload's start, which some servers (moto) misreport: have a part at once.
            self._parts[0].result()

    def _upload_part(self, number: int, body: bytearray) -> dict:
        answer = self.store.client.upload_part(
            Bucket=self.store.bucket, Key=self.tmp_key, UploadId=self._upload_id,
            PartNumber=number, Body=body)
        return {"PartNumber": number, "ETag": answer["ETag"]}

    def _stop_sending(self) -> None:
        """Wait for the parts on their way (none may land after an abort) and end the threads."""
        if self._senders is not None:
            for part in self._parts:
                part.cancel()
            self._senders.shutdown(wait=True)
            self._senders = None

    def finish(self) -> StoredBlob:
        """Make the blob visible under its digest in one step. Bytes already stored are
        written again: that restarts their garbage-collection grace period, as for a file."""
        s3, bucket = self.store.client, self.store.bucket
        sha = self.sha256
        key = self.store.blob_key(sha)
        with self._aborting():
            if self._upload_id is None:  # small: one PUT straight to its name
                s3.put_object(Bucket=bucket, Key=key, Body=bytes(self._buffer))
            else:
                if self._buffer:
                    self._send_part()
                parts = [part.result() for part in self._parts]
                self._stop_sending()
                s3.complete_multipart_upload(Bucket=bucket, Key=self.tmp_key,
                                             UploadId=self._upload_id,
                                             MultipartUpload={"Parts": parts})
                self._upload_id, self._tmp_object = None, True
                s3.copy({"Bucket": bucket, "Key": self.tmp_key}, bucket, key, Config=COPY)
                s3.delete_object(Bucket=bucket, Key=self.tmp_key)
                self._tmp_object = False
        self._buffer = bytearray()
        return StoredBlob(sha256=sha, size=self.size)

    def abort(self) -> None:
        """Drop what was sent. If the store cannot be reached, what is left is swept by
        garbage collection after the grace period."""
        s3, bucket = self.store.client, self.store.bucket
        self._buffer = bytearray()
        self._stop_sending()
        try:
            if self._upload_id is not None:
                s3.abort_multipart_upload(Bucket=bucket, Key=self.tmp_key,
                                          UploadId=self._upload_id)
                self._upload_id = None
            if self._tmp_object:
                s3.delete_object(Bucket=bucket, Key=self.tmp_key)
                self._tmp_object = False
        except Exception as exc:  # noqa: BLE001 - botocore raises many types; gc cleans up
            log.warning("could not clean up the upload %s: %s", self.tmp_key, exc)


class S3Store(ArtifactStore):
    """Blobs as objects in one bucket under one prefix."""

    on_local_disk = False

    def __init__(self, url: str, *, local_root: Path, max_bytes: int,
                 endpoint_url: str | None = None):
        super().__init__(local_root, max_bytes)
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3://bucket/prefix URL: {url!r}")
        self.bucket = parts.netloc
        prefix = parts.path.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.location = f"s3://{self.bucket}/{self.prefix}"
        self.cache_dir = self.local_root / "cache"
        self.client = _client(endpoint_url)

    def key(self, name: str) -> str:
        return self.prefix + name

    def blob_key(self, sha256: str) -> str:
        check_digest(sha256)
        return self.key(f"sha256/{sha256[:2]}/{sha256}")

    def writer(self) -> S3BlobWriter:
        return S3BlobWriter(self)

    def unavailable(self, exc: BotoCoreError | ClientError) -> StoreUnavailable:
        """What a client sees when the object store does not answer (or refuses): a 503."""
        return StoreUnavailable(f"the artifact store {self.location} did not answer "
                                f"({type(exc).__name__}); nothing was kept, try again")

    def ping(self) -> None:
        """Raise unless the bucket answers (health)."""
        self.client.head_bucket(Bucket=self.bucket)

    # -- reading --------------------------------------------------------------------------

    def stat(self, sha256: str) -> BlobStat | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.blob_key(sha256))
        except ClientError as exc:
            if _code(exc) in NOT_FOUND:
                return None
            raise
        return BlobStat(head["ContentLength"], head["LastModified"].timestamp())

    def open(self, sha256: str) -> BinaryIO:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.blob_key(sha256))["Body"]
        except ClientError as exc:
            if _code(exc) in NOT_FOUND:
                raise ArtifactUnavailable(f"blob {sha256} is not in {self.location}") from None
            raise self.unavailable(exc) from exc
        except BotoCoreError as exc:
            raise self.unavailable(exc) from exc

    def cached_path(self, sha256: str) -> Path:
        check_digest(sha256)
        return self.cache_dir / "sha256" / sha256[:2] / sha256

    def local_path(self, sha256: str) -> Path:
        path = self.cached_path(sha256)
        return path if path.is_file() else self._fetch(sha256)

    def verify(self, sha256: str) -> bool:
        path = self.cached_path(sha256)
        if path.is_file() and file_sha256(path) == sha256:
            return True
        path.unlink(missing_ok=True)  # a damaged copy: fetch it again
        try:
            self._fetch(sha256)
        except ArtifactUnavailable:
            return False
        return True

    def _fetch(self, sha256: str) -> Path:
        """Download into the cache, hashing on the way: a temp file renamed into place only if
        its bytes hash to `sha256`."""
        dest = self.cached_path(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        body = self.open(sha256)
        fd, name = tempfile.mkstemp(prefix=f".{sha256}.", dir=dest.parent)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as f:
                for chunk in body.iter_chunks(CHUNK):
                    digest.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            if digest.hexdigest() != sha256:
                raise ArtifactUnavailable(f"blob {sha256} in {self.location} has bytes that hash "
                                          f"to {digest.hexdigest()}; refusing it")
            os.replace(name, dest)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
        finally:
            body.close()
        return dest

    def blob_stats(self) -> Iterator[tuple[str, BlobStat]]:
        for obj in self._objects("sha256/"):
            name = obj["Key"].rpartition("/")[2]
            try:
                check_digest(name)
            except ValueError:
                continue  # not ours
            yield name, BlobStat(obj["Size"], obj["LastModified"].timestamp())

    def _objects(self, under: str) -> Iterator[dict]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.key(under))
        for page in pages:
            yield from page.get("Contents", ())

    # -- named objects ---------------------------------------------------------------------

    def put_object(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key(check_object_key(key)),
                                   Body=data)
        except (BotoCoreError, ClientError) as exc:
            raise self.unavailable(exc) from exc

    def get_object(self, key: str) -> bytes:
        try:
            body = self.client.get_object(Bucket=self.bucket,
                                          Key=self.key(check_object_key(key)))["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ArtifactUnavailable(f"object {key} is not in the store") from None
            raise self.unavailable(exc) from exc
        except BotoCoreError as exc:
            raise self.unavailable(exc) from exc
        try:
            return body.read()
        finally:
            body.close()

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        for obj in self._objects(prefix):
            yield obj["Key"][len(self.prefix):], obj["Size"]

    def delete_object(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(check_object_key(key)))

    # -- removing -------------------------------------------------------------------------

    def remove(self, sha256: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.blob_key(sha256))
        self.cached_path(sha256).unlink(missing_ok=True)

    def temps(self) -> list[Temp]:
        """Local temp files, tmp/ objects (an upload stopped between completing and copying)
        and open multipart uploads, each dated by its last activity (its newest part)."""
        found = super().temps()
        for obj in self._objects("tmp/"):
            found.append(Temp(f"s3://{self.bucket}/{obj['Key']}", obj["Size"],
                              obj["LastModified"].timestamp(), ("object", obj["Key"])))
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=self.key("tmp/"))
        for page in pages:
            for upload in page.get("Uploads", ()):
                size, mtime = self._activity(upload["Key"], upload["UploadId"],
                                             upload["Initiated"].timestamp())
                if mtime is not None:
                    found.append(Temp(f"s3://{self.bucket}/{upload['Key']} (multipart upload)",
                                      size, mtime, ("multipart", upload["Key"],
                                                    upload["UploadId"],
                                                    upload["Initiated"].timestamp())))
        return found

    def _activity(self, key: str, upload_id: str, initiated: float
                  ) -> tuple[int, float | None]:
        """(bytes sent, last activity) of a multipart upload; (0, None) once it is gone."""
        size, latest = 0, initiated
        try:
            for page in self.client.get_paginator("list_parts").paginate(
                    Bucket=self.bucket, Key=key, UploadId=upload_id):
                for part in page.get("Parts", ()):
                    size += part["Size"]
                    latest = max(latest, part["LastModified"].timestamp())
        except ClientError as exc:
            if _code(exc) in NOT_FOUND:
                return 0, None
            raise
        return size, latest

    def remove_temp(self, temp: Temp, cutoff: float) -> bool:
        if not isinstance(temp.ref, tuple):
            return super().remove_temp(temp, cutoff)
        kind, key, *upload = temp.ref
        if kind == "object":
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _code(exc) in NOT_FOUND:
                    return False
                raise
            if head["LastModified"].timestamp() >= cutoff:
                return False
            self.client.delete_object(Bucket=self.bucket, Key=key)
            return True
        upload_id, initiated = upload
        _, mtime = self._activity(key, upload_id, initiated)
        if mtime is None or mtime >= cutoff:
            return False
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if _code(exc) in NOT_FOUND:
                return False
            raise
        return True


@functools.lru_cache(maxsize=8)
def _client(endpoint_url: str | None):
    """One boto3 client per endpoint (thread-safe; making one reads botocore's service models,
    which takes a while), with credentials from boto3's chain."""
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url,
        config=Config(connect_timeout=5, read_timeout=60,
                      retries={"mode": "standard", "max_attempts": 3}))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
