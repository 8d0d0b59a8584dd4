"""`mmc` subcommands for jobs: async inference, datasets and batch transforms.

    mmc async-infer fraud request.json [--version 3] [--wait 60 --out response.json]
    mmc async-infer fraud request.bin --header-length 154        # binary v2 body
    mmc batch upload rows.npy                                    # -> dataset id
    mmc batch run fraud rows.npy --wait 600 --out scores.npy     # upload + run + download
    mmc batch run fraud <dataset-id> --batch-size 64 --max-rows-per-second 50000
    mmc job <id> [--wait 60] [--cancel] [--result out.npy]       mmc jobs [--kind batch]
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from mmc import Client, Dataset, Job
from registry.cli.output import CliError, print_json


def _download(c: Client, job: Job, out: str) -> None:
    result = c.download_result(job.id, out)
    if result.headers.get("inference-header-content-length"):
        print(f"binary response: JSON header is the first "
              f"{result.headers['inference-header-content-length']} bytes", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)


def _finish(c: Client, job: Job, a) -> int:
    if a.wait:
        job = c.wait_job(job.id, timeout=a.wait)
        if job.status == "succeeded" and a.out:
            _download(c, job, a.out)
    print_json(job.raw)
    return 0 if job.status != "failed" else 2


def _file(name: str) -> Path:
    path = Path(name)
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    return path


def cmd_async_infer(c: Client, a) -> int:
    job = c.async_infer(a.model, _file(a.file), version=a.version or None,
                        header_length=a.header_length, callback_url=a.callback_url,
                        callback_secret=a.callback_secret)
    return _finish(c, job, a)


def _upload(c: Client, file: str, fmt: str | None) -> Dataset:
    return c.upload_dataset(_file(file), format=fmt)


def cmd_batch_upload(c: Client, a) -> int:
    print_json(_upload(c, a.file, a.format).raw)
    return 0


def cmd_batch_run(c: Client, a) -> int:
    try:
        dataset = str(uuid.UUID(a.dataset))
    except ValueError:
        dataset = _upload(c, a.dataset, a.format).id
        print(f"uploaded dataset {dataset}", file=sys.stderr)
    job = c.batch(a.model, dataset, version=a.version, batch_size=a.batch_size,
                  chunk_rows=a.chunk_rows, output_format=a.output_format,
                  max_rows_per_second=a.max_rows_per_second,
                  callback_url=a.callback_url or "", callback_secret=a.callback_secret or "")
    return _finish(c, job, a)


def cmd_job(c: Client, a) -> int:
    if a.cancel:
        job = c.cancel_job(a.id, reason=a.reason)
    else:
        job = c.wait_job(a.id, timeout=a.wait) if a.wait else c.get_job(a.id)
    if a.result:
        _download(c, job, a.result)
    print_json(job.raw)
    return 0 if job.status != "failed" else 2


def cmd_jobs(c: Client, a) -> int:
    for j in c.list_jobs(kind=a.kind or None, status=a.status or None, model=a.model or None):
        p = j.progress
        rows = f"{p['rows_done']}/{p['rows_total']}" if p.get("rows_total") else ""
        print(f"{j.id}  {j.kind:5} {j.status:9} {j.model}:{j.version:<4} "
              f"{rows:>16}  {j.failure_reason[:50]}")
    return 0


def _callback_args(s) -> None:
    s.add_argument("--callback-url", help="POSTed a signed notice when the job ends")
    s.add_argument("--callback-secret", help="HMAC-SHA256 key for X-MMC-Signature")
    s.add_argument("--wait", type=float, default=0, help="seconds to wait for the job")
    s.add_argument("--out", help="with --wait: write the result here")


def job_parsers(sub) -> None:
    s = sub.add_parser("async-infer", help="queue a v2 request (JSON or binary) as a job")
    s.add_argument("model")
    s.add_argument("file", help="the v2 request body")
    s.add_argument("--version", type=int, help="default: the endpoint's stable version")
    s.add_argument("--header-length", type=int,
                   help="binary body: length of its JSON header (Inference-Header-Content-"
                        "Length)")
    _callback_args(s)
    s.set_defaults(fn=cmd_async_infer)
    batch = sub.add_parser("batch", help="datasets and batch transforms").add_subparsers(
        dest="batch_command", required=True)
    s = batch.add_parser("upload", help="upload a .npy, .npz or .jsonl dataset")
    s.add_argument("file")
    s.add_argument("--format", choices=["npy", "npz", "jsonl"])
    s.set_defaults(fn=cmd_batch_upload)
    s = batch.add_parser("run", help="transform a dataset (id, or a file to upload first)")
    s.add_argument("model")
    s.add_argument("dataset")
    s.add_argument("--format", choices=["npy", "npz", "jsonl"])
    s.add_argument("--version", type=int)
    s.add_argument("--batch-size", type=int)
    s.add_argument("--chunk-rows", type=int)
    s.add_argument("--output-format", choices=["npy", "npz", "jsonl"])
    s.add_argument("--max-rows-per-second", type=float, default=0)
    _callback_args(s)
    s.set_defaults(fn=cmd_batch_run)
    s = sub.add_parser("job", help="show, wait for, cancel or download a job")
    s.add_argument("id")
    s.add_argument("--wait", type=float, default=0)
    s.add_argument("--cancel", action="store_true")
    s.add_argument("--reason", default="")
    s.add_argument("--result", help="write the result to this file")
    s.set_defaults(fn=cmd_job)
    s = sub.add_parser("jobs", help="list jobs")
    s.add_argument("--kind", choices=["async", "batch"])
    s.add_argument("--status")
    s.add_argument("--model")
    s.set_defaults(fn=cmd_jobs)
