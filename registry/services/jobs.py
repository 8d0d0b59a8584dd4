"""Jobs: register a dataset, submit an async inference or a batch transform, cancel one. Each is
one audited transaction; the job starts on a worker after commit."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.errors import Gone, InvalidRequest, LifecycleError, NotFound
from registry.integrations.addresses import refusal
from registry.jobs.batch import match_columns
from registry.jobs.housekeeping import enqueue_job
from registry.models import (
    Dataset,
    Endpoint,
    Job,
    JobKind,
    JobStatus,
    ModelVersion,
    RegisteredModel,
)
from registry.selectors import ready_version
from registry.store.files import FileWriter, dataset_path, detect_format, inspect_dataset, job_dir
from serving.core.tensor_signature import batch_dimension

OUTPUT_FORMATS = ("npy", "npz", "jsonl")
MAX_CHUNK_ROWS = 1_000_000


def resolve_version(model_name: str, number: int | None) -> ModelVersion:
    """The version asked for, else the endpoint's stable one; it must be ready."""
    if number is None:
        ep = Endpoint.objects.select_related("model", "stable").filter(
            model__name=model_name).first()
        if ep is None or ep.stable is None:
            if not ModelVersion.objects.filter(model__name=model_name).exists():
                raise NotFound(f"model {model_name!r} does not exist or has no versions",
                               field="model")
            raise LifecycleError(f"model {model_name!r} has no stable version; pass ?version=N",
                                 field="version")
        model, number = ep.model, ep.stable.number
    else:
        model = RegisteredModel.objects.filter(name=model_name).first()
        if model is None:
            raise NotFound(f"model {model_name!r} has no version {number}", field="version")
    version = ready_version(model, number)
    if version.pipeline is not None:
        raise LifecycleError(f"{model_name}:{version.number} is a pipeline: jobs run one model "
                             f"file; send its requests to /v2/models/{model_name}/infer on a "
                             "replica", field="version")
    return version


def _callback(url: str, secret: str) -> tuple[str, str]:
    """A job's completion callback: an http(s) URL to a public address (or one the operator's
    MMC_OUTBOUND_ALLOW names), checked again before each POST."""
    url = (url or "").strip()
    if len(url) > 500 or len(secret or "") > 200:
        raise InvalidRequest("callback_url (500) or callback_secret (200) is too long",
                             field="callback_url")
    problem = refusal(url) if url else None
    if problem:
        raise InvalidRequest(f"callback_url {problem}", field="callback_url")
    return url, secret or ""


def dataset_create(*, upload: FileWriter, filename: str, actor: Actor,
                   format: str | None = None) -> Dataset:
    """Register a streamed upload as a dataset after reading its headers."""
    try:
        fmt = detect_format(filename, format)
        upload.close()
        rows, columns = inspect_dataset(upload.path, fmt)
    except BaseException:
        upload.abort()
        raise
    dataset = Dataset(filename=(filename or "")[:255], format=fmt, size_bytes=upload.size,
                      sha256=upload.sha256, rows=rows, columns=columns, created_by=actor.user,
                      expires_at=timezone.now() + timedelta(seconds=settings.DATASET_TTL))
    path = upload.move_to(dataset_path(dataset))
    try:
        with transaction.atomic():
            dataset.save(force_insert=True)
            record(actor, "dataset.upload", target_type="dataset", target=str(dataset.pk),
                   after={"filename": dataset.filename, "format": fmt, "rows": rows,
                          "size_bytes": dataset.size_bytes, "sha256": dataset.sha256,
                          "expires_at": dataset.expires_at.isoformat()})
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return dataset


def async_create(*, model_name: str, version_number: int | None, body: FileWriter,
                 header_length: int | None, content_encoding: str | None, actor: Actor,
                 callback_url: str = "", callback_secret: str = "") -> Job:
    """Queue a stored v2 request body for inference by `model_name` (version or stable)."""
    try:
        version = resolve_version(model_name, version_number)
        url, secret = _callback(callback_url, callback_secret)
        if header_length is not None and not 0 <= header_length <= body.size:
            raise InvalidRequest(f"Inference-Header-Content-Length {header_length} is outside "
                                 f"the body of {body.size} bytes")
    except BaseException:
        body.abort()
        raise
    job = Job(kind=JobKind.ASYNC, version=version, input_bytes=body.size, callback_url=url,
              callback_secret=secret, created_by=actor.user,
              params={"header_length": header_length, "content_encoding": content_encoding})
    path = body.move_to(job_dir(job.pk) / "request.bin")
    try:
        with transaction.atomic():
            job.save(force_insert=True)
            record(actor, "job.create", target_type="job", target=str(job.pk),
                   model_name=model_name,
                   after={"kind": job.kind, "version": version.number, "bytes": body.size,
                          "callback_url": url})
            enqueue_job(job.pk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return job


def batch_create(*, model_name: str, dataset_id, actor: Actor, version_number: int | None = None,
                 batch_size: int | None = None, chunk_rows: int | None = None,
                 output_format: str | None = None, max_rows_per_second: float = 0,
                 callback_url: str = "", callback_secret: str = "") -> Job:
    """Queue a batch transform of a dataset by one version."""
    from registry.selectors import dataset_list

    version = resolve_version(model_name, version_number)
    dataset = dataset_list(actor.user).filter(pk=dataset_id).first()
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} does not exist", field="dataset")
    if not batch_dimension(version.signature):
        raise InvalidRequest(f"{version} has no batch dimension (every input's first dimension "
                             f"must be dynamic) so rows cannot be batched", field="version")
    if dataset.format != "jsonl":
        match_columns(dataset.columns, version.signature)
    batch_size = batch_size or version.max_batch_size or 32
    chunk_rows = chunk_rows or settings.JOB_CHUNK_ROWS
    if not 1 <= batch_size <= 1 << 16:
        raise InvalidRequest("batch_size must be from 1 to 65536", field="batch_size")
    if not 1 <= chunk_rows <= MAX_CHUNK_ROWS:
        raise InvalidRequest(f"chunk_rows must be from 1 to {MAX_CHUNK_ROWS}", field="chunk_rows")
    chunk_rows = max(chunk_rows, batch_size)
    outputs = len(version.signature.get("outputs") or [])
    if output_format is None:
        output_format = ("jsonl" if dataset.format == "jsonl"
                         else "npy" if dataset.format == "npy" and outputs == 1 else "npz")
    allowed = ("jsonl",) if dataset.format == "jsonl" else ("npy", "npz")
    if output_format not in allowed or (output_format == "npy" and outputs != 1):
        raise InvalidRequest(f"output_format for a .{dataset.format} dataset of a model with "
                             f"{outputs} output(s) must be "
                             f"{' or '.join(allowed) if outputs == 1 else 'npz'}",
                             field="output_format")
    if max_rows_per_second < 0:
        raise InvalidRequest("max_rows_per_second must be >= 0", field="max_rows_per_second")
    url, secret = _callback(callback_url, callback_secret)
    with transaction.atomic():
        # Under the row lock the expiry sweeper takes too: either this job keeps the file
        # alive (a new expiry, TTL from now), or the file is already gone and the job is refused.
        dataset = Dataset.objects.select_for_update().get(pk=dataset.pk)
        if dataset.expired:
            raise Gone(f"dataset {dataset.pk} expired at {dataset.expires_at:%Y-%m-%d %H:%M:%S} "
                       f"UTC and its file was deleted: upload it again", field="dataset")
        dataset.expires_at = timezone.now() + timedelta(seconds=settings.DATASET_TTL)
        dataset.save(update_fields=["expires_at"])
        job = Job.objects.create(
            kind=JobKind.BATCH, version=version, dataset=dataset, input_bytes=dataset.size_bytes,
            rows_total=dataset.rows, callback_url=url, callback_secret=secret,
            created_by=actor.user,
            params={"batch_size": batch_size, "chunk_rows": chunk_rows,
                    "output_format": output_format, "max_rows_per_second": max_rows_per_second})
        record(actor, "job.create", target_type="job", target=str(job.pk), model_name=model_name,
               after={"kind": job.kind, "version": version.number, "dataset": str(dataset.pk),
                      **job.params})
        enqueue_job(job.pk)
    return job


def job_cancel(*, job_id, actor: Actor, reason: str = "") -> Job:
    """Stop a queued or running job. A running worker notices within a chunk (or a lease beat),
    stops and removes its partial output."""
    with transaction.atomic():
        job = (Job.objects.select_for_update(of=("self",)).select_related("version__model")
               .filter(pk=job_id).first())
        if job is None:
            raise NotFound(f"job {job_id} does not exist", field="job")
        if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
            raise LifecycleError(f"job is already {job.status}")
        before = job.status
        now = timezone.now()
        job.status, job.finished_at, job.expires_at = JobStatus.CANCELLED, now, now
        job.failure_reason = f"cancelled by {actor.name}" + (f": {reason}" if reason else "")
        job.save(update_fields=["status", "finished_at", "expires_at", "failure_reason"])
        record(actor, "job.cancel", target_type="job", target=str(job.pk),
               model_name=job.version.model.name, before={"status": before},
               after={"status": job.status, "rows_done": job.rows_done}, reason=reason)
    return job
