"""The registry's ties to the world outside: a Triton repository or KServe resources exported to
files, TensorRT engine builds, and webhooks (admin)."""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mmc.resources import Export, Version, Webhook, WebhookDelivery
from mmc.transport import Transport


class Integrations(Transport):
    def export(self, model: str, dest: str | os.PathLike[str], *, format: str = "triton",
               versions: str | Iterable[int] | None = None, kind: str | None = None,
               runtime: str | None = None, storage_uri: str | None = None,
               name: str | None = None) -> Export:
        """triton: a model repository .tar.gz written whole to `dest` (versions: "all" (every
        ready one, the default), "stable", or numbers; kind: auto, cpu or gpu). kserve: a
        ServingRuntime and an InferenceService for what the endpoint routes, unpacked into the
        folder `dest` (runtime: mmc or triton; storage_uri: the artifact store as KServe reaches
        it; name: the InferenceService's). A refusal leaves nothing behind."""
        dest = Path(dest)
        if format != "kserve":
            if versions is not None and not isinstance(versions, str):
                versions = ",".join(str(v) for v in versions)
            got = self._download(f"models/{model}/export", dest, what="export", params={
                "format": format, "versions": versions or "all", "kind": kind})
            return Export(path=dest, versions=_numbers(got.headers), files=(dest,),
                          size_bytes=got.size_bytes)
        fd, archive = tempfile.mkstemp(prefix="mmc-kserve-", suffix=".tar.gz")
        os.close(fd)
        try:
            got = self._download(f"models/{model}/export", Path(archive), what="export", params={
                "format": "kserve", "runtime": runtime or "mmc", "storage_uri": storage_uri,
                "name": name})
            files = _unpack(Path(archive), dest)
        finally:
            Path(archive).unlink(missing_ok=True)
        return Export(path=dest, versions=_numbers(got.headers), files=tuple(files),
                      size_bytes=sum(f.stat().st_size for f in files))

    def build_tensorrt(self, model: str, number: int, *, precision: str = "fp16") -> Version:
        """Build a TensorRT engine for a version on a GPU worker (fp16 or fp32); its status is
        in tensorrt_status and the version's validation_report."""
        return Version.of(self._call("POST", f"models/{model}/versions/{number}/tensorrt/",
                                     json={"precision": precision}))

    def tensorrt_status(self, model: str, number: int) -> dict[str, Any]:
        """Per precision: the engine build's status, time and engine."""
        answer = self._call("GET", f"models/{model}/versions/{number}/tensorrt/")
        return answer.get("tensorrt") or {}

    # -- webhooks (admin) ------------------------------------------------------------------

    def list_webhooks(self) -> list[Webhook]:
        return [Webhook.of(h) for h in self._pages("webhooks/")]

    def get_webhook(self, webhook_id: int) -> Webhook:
        return Webhook.of(self._call("GET", f"webhooks/{webhook_id}/"))

    def create_webhook(self, url: str, *, model: str | None = None, events: Sequence[str] = (),
                       name: str = "", secret: str | None = None) -> Webhook:
        """Subscribe `url` to lifecycle events (empty: all) of one model (None: every model);
        the answer's `secret` signs each delivery and is shown once."""
        body = {"url": url, "model": model, "name": name, "events": list(events)}
        if secret is not None:
            body["secret"] = secret
        return Webhook.of(self._call("POST", "webhooks/", json=body))

    def update_webhook(self, webhook_id: int, **changes: Any) -> Webhook:
        """Change name, url, model, events, active or secret."""
        return Webhook.of(self._call("PATCH", f"webhooks/{webhook_id}/", json=changes))

    def delete_webhook(self, webhook_id: int) -> None:
        self._call("DELETE", f"webhooks/{webhook_id}/")

    def test_webhook(self, webhook_id: int) -> WebhookDelivery:
        """Send a `ping` event now (one attempt); the delivery says how it went."""
        return WebhookDelivery.of(self._call("POST", f"webhooks/{webhook_id}/test/"))

    def list_deliveries(self, webhook_id: int, *, status: str | None = None,
                        event: str | None = None) -> list[WebhookDelivery]:
        """A webhook's deliveries, newest first, each with its attempts."""
        return [WebhookDelivery.of(d) for d in self._pages(
            f"webhooks/{webhook_id}/deliveries/", {"status": status, "event": event})]


def _numbers(headers: dict[str, str]) -> tuple[int, ...]:
    raw = headers.get("x-exported-versions", "")
    return tuple(int(v) for v in raw.split(",") if v.strip().isdigit())


def _unpack(archive: Path, folder: Path) -> list[Path]:
    """The archive's files under `folder`, without its top-level folder; tarfile's "data"
    filter refuses links and paths that would leave `folder`."""
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            _, _, rest = m.name.partition("/")
            if rest:
                m.name = rest
                members.append(m)
        folder.mkdir(parents=True, exist_ok=True)
        tar.extractall(folder, members=members, filter="data")
    return sorted(folder / m.name for m in members if m.isfile())
