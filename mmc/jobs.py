"""Work the server does in the background: async inference, datasets and batch transforms, load
tests; waiting for a job and fetching its result."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from mmc.errors import WaitTimeout
from mmc.resources import Dataset, Download, Job
from mmc.transport import Progress, Source, Transport, filename_of


class Jobs(Transport):
    def async_infer(self, model: str, request: Mapping[str, Any] | Source, *,
                    version: int | None = None, header_length: int | None = None,
                    content_type: str | None = None, callback_url: str | None = None,
                    callback_secret: str | None = None) -> Job:
        """Queue a v2 infer request as a job: a dict (sent as JSON), or a body (a path, a
        binary file, bytes) that is JSON, or binary with `header_length` (its JSON header's
        length). `callback_url` is POSTed a notice signed with `callback_secret` when it ends."""
        binary = header_length is not None
        headers = {"Content-Type": content_type or ("application/octet-stream" if binary
                                                    else "application/json")}
        if binary:
            headers["Inference-Header-Content-Length"] = str(header_length)
        if callback_url:
            headers["X-MMC-Callback-Url"] = callback_url
        if callback_secret:
            headers["X-MMC-Callback-Secret"] = callback_secret
        path, params = f"models/{model}/async-infer/", {"version": version}
        if isinstance(request, Mapping):
            body = json.dumps(dict(request)).encode()
            return Job.of(self._call("POST", path, params=params, content=body, headers=headers))
        return Job.of(self._upload("POST", path, request, params=params, headers=headers))

    def upload_dataset(self, source: Source, *, format: str | None = None,
                       filename: str | None = None, progress: Progress | None = None) -> Dataset:
        """A .npy, .npz or .jsonl dataset for batch transforms (format: from the name, unless
        given), streamed; progress(sent_bytes, total_bytes) as it goes."""
        params = {"filename": filename_of(source, filename) or None, "format": format}
        return Dataset.of(self._upload("PUT", "datasets/upload/", source, params=params,
                                       progress=progress))

    def list_datasets(self) -> list[Dataset]:
        return [Dataset.of(d) for d in self._pages("datasets/")]

    def get_dataset(self, dataset_id: str) -> Dataset:
        return Dataset.of(self._call("GET", f"datasets/{dataset_id}/"))

    def batch(self, model: str, dataset: str, *, version: int | None = None,
              batch_size: int | None = None, chunk_rows: int | None = None,
              output_format: str | None = None, max_rows_per_second: float = 0,
              callback_url: str = "", callback_secret: str = "") -> Job:
        """Transform a dataset (its id) with a version (default: the stable one)."""
        body = {"dataset": dataset, "version": version, "batch_size": batch_size,
                "chunk_rows": chunk_rows, "output_format": output_format,
                "max_rows_per_second": max_rows_per_second, "callback_url": callback_url,
                "callback_secret": callback_secret}
        return Job.of(self._call("POST", f"models/{model}/batch/",
                                 json={k: v for k, v in body.items() if v is not None}))

    def loadtest(self, model: str, number: int, *, requests: int | None = None,
                 seconds: int | None = None, concurrency: int = 1, replica: str = "",
                 confirm: bool = False, key: str = "") -> Job:
        """Load-test a version with generated inputs (`requests` or `seconds`); req/s and
        latency percentiles land in the job's `summary`. `confirm` when it takes real traffic;
        `key`: a predict key for a protected endpoint (never stored)."""
        body = {"requests": requests, "seconds": seconds, "concurrency": concurrency,
                "replica": replica, "confirm": confirm, "key": key}
        return Job.of(self._call("POST", f"models/{model}/versions/{number}/loadtest/",
                                 json={k: v for k, v in body.items() if v is not None}))

    def list_jobs(self, *, kind: str | None = None, status: str | None = None,
                  model: str | None = None) -> list[Job]:
        return [Job.of(j) for j in self._pages("jobs/", {"kind": kind, "status": status,
                                                         "model": model})]

    def get_job(self, job_id: str) -> Job:
        return Job.of(self._call("GET", f"jobs/{job_id}/"))

    def cancel_job(self, job_id: str, *, reason: str = "") -> Job:
        return Job.of(self._call("POST", f"jobs/{job_id}/cancel/", json={"reason": reason}))

    def wait_job(self, job_id: str, *, timeout: float = 600, interval: float = 0.5) -> Job:
        """The job once it succeeded, failed or was cancelled; WaitTimeout after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.finished:
                return job
            if time.monotonic() > deadline:
                p = job.progress
                raise WaitTimeout(f"job {job_id} still {job.status} after {timeout:.0f}s "
                                  f"({p.get('rows_done')}/{p.get('rows_total')} rows)", last=job)
            time.sleep(interval)

    def download_result(self, job_id: str, dest: str | os.PathLike[str]) -> Download:
        """A succeeded job's result, written whole to `dest`: an async job's v2 response (its
        headers in `.headers`), a batch job's output file."""
        return self._download(f"jobs/{job_id}/result/", dest)
