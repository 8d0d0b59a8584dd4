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
import time
import uuid
from pathlib import Path

from registry.cli.client import CliError, print_json

FINISHED = ("succeeded", "failed", "cancelled")


def _wait(c, job_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = c.call("GET", f"jobs/{job_id}/")
        if job["status"] in FINISHED:
            return job
        if time.monotonic() > deadline:
            p = job["progress"]
            raise CliError(f"job {job_id} still {job['status']} after {timeout:.0f}s "
                           f"({p['rows_done']}/{p['rows_total']} rows)")
        time.sleep(0.5)


def _download(c, job: dict, out: str) -> None:
    with c.http.stream("GET", f"jobs/{job['id']}/result/") as r:
        if r.status_code >= 400:
            r.read()
            raise CliError(f"{r.status_code}: {r.text}")
        with open(out, "wb") as f:
            for chunk in r.iter_bytes(1024 * 1024):
                f.write(chunk)
        if r.headers.get("Inference-Header-Content-Length"):
            print(f"binary response: JSON header is the first "
                  f"{r.headers['Inference-Header-Content-Length']} bytes", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)


def _finish(c, job: dict, a) -> int:
    if a.wait:
        job = _wait(c, job["id"], a.wait)
        if job["status"] == "succeeded" and a.out:
            _download(c, job, a.out)
    print_json(job)
    return 0 if job["status"] != "failed" else 2


def cmd_async_infer(c, a) -> int:
    path = Path(a.file)
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    headers = {"Content-Type": "application/json" if a.header_length is None
               else "application/octet-stream"}
    if a.header_length is not None:
        headers["Inference-Header-Content-Length"] = str(a.header_length)
    if a.callback_url:
        headers["X-MMC-Callback-Url"] = a.callback_url
    if a.callback_secret:
        headers["X-MMC-Callback-Secret"] = a.callback_secret
    params = {"version": a.version} if a.version else {}
    with path.open("rb") as f:
        job = c.call("POST", f"models/{a.model}/async-infer/", params=params, content=f,
                     headers=headers)
    return _finish(c, job, a)


def _upload(c, file: str, fmt: str | None) -> dict:
    path = Path(file)
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    params = {"filename": path.name, **({"format": fmt} if fmt else {})}
    with path.open("rb") as f:
        return c.call("PUT", "datasets/upload/", params=params, content=f,
                      headers={"Content-Type": "application/octet-stream"})


def cmd_batch_upload(c, a) -> int:
    print_json(_upload(c, a.file, a.format))
    return 0


def cmd_batch_run(c, a) -> int:
    try:
        dataset = str(uuid.UUID(a.dataset))
    except ValueError:
        dataset = _upload(c, a.dataset, a.format)["id"]
        print(f"uploaded dataset {dataset}", file=sys.stderr)
    body = {"dataset": dataset, "version": a.version, "batch_size": a.batch_size,
            "chunk_rows": a.chunk_rows, "output_format": a.output_format,
            "max_rows_per_second": a.max_rows_per_second, "callback_url": a.callback_url or "",
            "callback_secret": a.callback_secret or ""}
    job = c.call("POST", f"models/{a.model}/batch/",
                 json={k: v for k, v in body.items() if v is not None})
    return _finish(c, job, a)


def cmd_job(c, a) -> int:
    if a.cancel:
        job = c.call("POST", f"jobs/{a.id}/cancel/", json={"reason": a.reason})
    else:
        job = _wait(c, a.id, a.wait) if a.wait else c.call("GET", f"jobs/{a.id}/")
    if a.result:
        _download(c, job, a.result)
    print_json(job)
    return 0 if job["status"] != "failed" else 2


def cmd_jobs(c, a) -> int:
    params = {k: v for k, v in (("kind", a.kind), ("status", a.status), ("model", a.model)) if v}
    for j in c.call("GET", "jobs/", params=params)["results"]:
        p = j["progress"]
        rows = f"{p['rows_done']}/{p['rows_total']}" if p["rows_total"] else ""
        print(f"{j['id']}  {j['kind']:5} {j['status']:9} {j['model']}:{j['version']:<4} "
              f"{rows:>16}  {j['failure_reason'][:50]}")
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
