"""Async inference: a stored v2 request (JSON or binary) run by a worker through the serving
code (decode → validate against the version's signature → onnxruntime → encode), its response
stored as a file with the headers it needs.

Why a control-plane endpoint and not `/v2/models/{m}/infer?async=true` on the data plane: taking a
job means writing a row and an up-to-1-GiB body durably, and the data plane's request path has no
database and no Django, by design; a replica that took the body would also lose it on a restart.
So the request goes to the console's API, which stores it and answers 202.
"""

from __future__ import annotations

from django.conf import settings

from registry.jobs.lease import JobFailed, Lease, open_body, predict_rows, session_for
from registry.models import Job
from registry.store.files import atomic_write, job_dir
from serving.core.tensor_signature import batch_dimension, validate_inputs, validate_outputs
from serving.http.codec import decode_infer_request, encode_infer_response

NO_LIMIT = 1 << 62


def request_path(job: Job):
    return job_dir(job.pk) / "request.bin"


def result_path(job: Job):
    return job_dir(job.pk) / "response.bin"


def run_async(job: Job, lease: Lease) -> dict:
    version = job.version
    if not version.signature:
        raise JobFailed(f"version {version.number} has no signature (is it ready?)")
    path = request_path(job)
    if not path.exists():
        raise JobFailed("the stored request body is missing")
    header_length = job.params.get("header_length")
    body = open_body(path) if header_length is not None else path.read_bytes()
    request = decode_infer_request(body, header_length=header_length,
                                   content_encoding=job.params.get("content_encoding"),
                                   max_bytes=settings.ASYNC_MAX_BYTES)
    batched = batch_dimension(version.signature) and version.max_batch_size > 0
    # The real-time max_batch_size bounds one run, not the request: run it in slices of that size.
    feeds = validate_inputs(request.inputs, version.signature, NO_LIMIT if batched else 0)
    if request.outputs:
        validate_outputs([o.name for o in request.outputs], version.signature)
    runtime = session_for(version)
    names = [o.name for o in request.outputs] if request.outputs else None
    rows = next(iter(feeds.values())).shape[0] if batched else 1
    outputs = predict_rows(runtime, feeds, rows, version.max_batch_size if batched else rows,
                           names, lease)
    data, headers = encode_infer_response(
        model_name=version.model.name, model_version=str(version.number), request_id=request.id,
        outputs=outputs, requested=request.outputs, binary_output=request.binary_output,
        batched=batched)
    del feeds, request, outputs
    atomic_write(result_path(job), lambda f: f.write(data))
    return {"result_name": "response.bin", "result_bytes": len(data), "result_headers": headers}
