"""A real S3-compatible server for the object-store specs: moto's server mode, in its own process
on a free 127.0.0.1 port (one per test run), and the two artifact-store backends side by side."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.replicas import free_port

#: What boto3 needs to sign requests; moto accepts any credentials.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mmc-test", "AWS_SECRET_ACCESS_KEY": "mmc-test-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}


class MotoServer:
    def __init__(self, log_dir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_dir / "moto.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **CREDENTIALS})
        deadline = time.time() + 30
        while True:
            try:
                httpx.get(self.url + "/moto-api/", timeout=1)
                return
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start: "
                                       + Path(self._log.name).read_text()[-2000:]) from None
                time.sleep(0.1)

    def new_bucket(self) -> str:
        import boto3

        name = f"mmc-{uuid.uuid4().hex[:16]}"
        boto3.client("s3", endpoint_url=self.url).create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


@dataclass
class Backend:
    """One artifact-store backend under test: `settings` values that select it, a factory for
    stores, and `names()`: everything it holds (blobs, temps, open multipart uploads)."""

    kind: str
    root: Path  # ARTIFACT_ROOT
    url: str = ""  # ARTIFACT_STORE
    endpoint: str = ""  # AWS_ENDPOINT_URL

    def select(self, settings) -> Backend:
        """Make this backend the one default_store() returns."""
        settings.ARTIFACT_ROOT = self.root
        settings.ARTIFACT_STORE, settings.AWS_ENDPOINT_URL = self.url, self.endpoint
        return self

    def store(self, max_bytes: int = 64 * 1024 * 1024, root: Path | None = None):
        from registry.store.artifacts import FileStore
        from registry.store.s3 import S3Store

        if self.kind == "file":
            return FileStore(root or self.root, max_bytes)
        return S3Store(self.url, endpoint_url=self.endpoint, local_root=root or self.root,
                       max_bytes=max_bytes)

    def names(self) -> list[str]:
        store = self.store()
        if self.kind == "file":
            return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*")
                          if p.is_file())
        keys = [o["Key"] for o in store._objects("")]
        uploads = store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
        return sorted([k.removeprefix(store.prefix) for k in keys]
                      + [f"multipart upload of {u['Key'].removeprefix(store.prefix)}"
                         for u in uploads])
