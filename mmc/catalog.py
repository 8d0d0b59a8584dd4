"""Models, their versions (upload, validation, conversion, metrics, pipelines), approvals and
aliases: the registry half of the client."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mmc.errors import WaitTimeout
from mmc.resources import Alias, Download, Model, Version
from mmc.transport import Progress, Source, Transport, filename_of


def _model(name: str) -> str:
    return f"models/{name}/"


def _version(model: str, number: int) -> str:
    return f"models/{model}/versions/{number}/"


def _reason(reason: str) -> dict[str, str] | None:
    return {"reason": reason} if reason else None


def _repeat(name: str, values: str | Iterable[str]) -> list[tuple[str, str]]:
    return [(name, values)] if isinstance(values, str) else [(name, v) for v in values]


class Catalog(Transport):
    # -- models ----------------------------------------------------------------------------

    def list_models(self, *, search: str | None = None, tag: str | None = None,
                    archived: bool | None = None) -> list[Model]:
        """Every model (all pages); `search` matches name or description."""
        params = {"search": search, "tag": tag,
                  "archived": None if archived is None else str(archived).lower()}
        return [Model.of(m) for m in self._pages("models/", params)]

    def get_model(self, name: str) -> Model:
        return Model.of(self._call("GET", _model(name)))

    def create_model(self, name: str, *, description: str = "",
                     tags: Sequence[str] = (), team: str | None = None) -> Model:
        """Register `name` in `team` (default: "default" where you may, else your only team
        where you are an engineer)."""
        body = {"name": name, "description": description, "tags": list(tags)}
        if team is not None:
            body["team"] = team
        return Model.of(self._call("POST", "models/", json=body))

    def update_model(self, name: str, *, description: str | None = None,
                     tags: Sequence[str] | None = None,
                     requires_approval: bool | None = None) -> Model:
        """Change what is given; `requires_approval`: promotion takes approved versions only."""
        body = {k: v for k, v in (("description", description), ("requires_approval",
                                  requires_approval)) if v is not None}
        if tags is not None:
            body["tags"] = list(tags)
        return Model.of(self._call("PATCH", _model(name), json=body))

    def archive_model(self, name: str, *, archived: bool = True, reason: str = "") -> Model:
        """Archive (no new uploads), or unarchive with archived=False."""
        return Model.of(self._call("POST", f"models/{name}/archive/",
                                   json={"archived": archived, "reason": reason}))

    def delete_model(self, name: str, *, reason: str = "") -> None:
        """Delete the model and all its versions; Conflict names what still holds one."""
        self._call("DELETE", _model(name), params=_reason(reason))

    # -- versions --------------------------------------------------------------------------

    def list_versions(self, model: str, *, metric: str | Iterable[str] = (),
                      metadata: str | Iterable[str] = (),
                      status: str | None = None) -> list[Version]:
        """Versions, newest first. `metric="auc>0.9"` and `metadata="team:ml"` filter (give
        several: all must hold)."""
        params = [*_repeat("metric", metric), *_repeat("metadata", metadata),
                  *([("status", status)] if status else [])]
        return [Version.of(v) for v in self._pages(f"models/{model}/versions/", params)]

    def get_version(self, model: str, number: int) -> Version:
        return Version.of(self._call("GET", _version(model, number)))

    def upload(self, model: str, source: Source, *, filename: str | None = None,
               metadata: Mapping[str, Any] | None = None,
               metrics: Mapping[str, float] | None = None,
               lineage: Mapping[str, str] | None = None,
               progress: Progress | None = None) -> Version:
        """Upload an .onnx file (a path, an open binary file, or bytes) as the next version,
        streamed; progress(sent_bytes, total_bytes) as it goes. `lineage`: run_url, git_commit,
        dataset. The answer's `created` is False when the same bytes already were a version.
        Validation runs on the server: see wait_validated."""
        params = {"filename": filename_of(source, filename) or None,
                  **{name: json.dumps(value) for name, value in (
                      ("metadata", metadata), ("metrics", metrics), ("lineage", lineage))
                     if value is not None}}
        return Version.of(self._upload("PUT", f"models/{model}/versions/upload/", source,
                                       params=params, progress=progress))

    def wait_validated(self, model: str, number: int, *, timeout: float = 120,
                       interval: float = 0.5) -> Version:
        """The version once validation decided (ready or failed); WaitTimeout after `timeout`
        seconds."""
        deadline = time.monotonic() + timeout
        while True:
            version = self.get_version(model, number)
            if not version.pending:
                return version
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{model}:{number} still {version.status} after "
                                  f"{timeout:.0f}s", last=version)
            time.sleep(interval)

    def convert(self, model: str, number: int) -> Version:
        """Convert a version whose IR version or opset is too new for the server's onnxruntime,
        as the next version (proven equivalent; what changed is in its metadata["conversion"]);
        Unprocessable when it cannot be."""
        return Version.of(self._call("POST", _version(model, number) + "convert/"))

    def update_version(self, model: str, number: int, *,
                       metrics: Mapping[str, float | None] | None = None,
                       lineage: Mapping[str, str | None] | None = None,
                       **settings: Any) -> Version:
        """Merge `metrics` and `lineage` (None removes a key), and change serving settings
        (max_batch_size, instance_count, response_cache, ...); nothing else of a version
        changes."""
        body = {**settings, **{k: dict(v) for k, v in (("metrics", metrics),
                                                        ("lineage", lineage)) if v is not None}}
        return Version.of(self._call("PATCH", _version(model, number), json=body))

    def delete_version(self, model: str, number: int, *, reason: str = "") -> None:
        """Delete a version nothing holds; Conflict names what holds it."""
        self._call("DELETE", _version(model, number), params=_reason(reason))

    def download_artifact(self, model: str, number: int,
                          dest: str | os.PathLike[str]) -> Download:
        """The version's .onnx file, written whole to `dest`."""
        return self._download(_version(model, number) + "artifact/", dest)

    def create_pipeline(self, model: str, spec: Mapping[str, Any]) -> Version:
        """A pipeline version from `spec`: {"steps": [{"name", "model", "version" or "alias"}],
        "edges": [{"from", "to"}]} (optional metadata, metrics, lineage). The same spec again
        answers the existing version."""
        return Version.of(self._call("POST", f"models/{model}/versions/pipeline/",
                                     json=spec))

    # -- approvals and aliases -------------------------------------------------------------

    def approve(self, model: str, number: int, *, comment: str = "") -> Version:
        """Approve a version for promotion (someone other than its uploader: else Forbidden)."""
        return Version.of(self._call("POST", _version(model, number) + "approve/",
                                     json={"comment": comment}))

    def reject(self, model: str, number: int, *, comment: str) -> Version:
        """Reject a version, saying why; its traffic, if any, ends."""
        return Version.of(self._call("POST", _version(model, number) + "reject/",
                                     json={"comment": comment}))

    def list_aliases(self, model: str) -> list[Alias]:
        return [Alias.of(a) for a in self._call("GET", f"models/{model}/aliases/")]

    def set_alias(self, model: str, alias: str, version: int) -> Alias:
        return Alias.of(self._call("PUT", f"models/{model}/aliases/{alias}/",
                                   json={"version": version}))

    def delete_alias(self, model: str, alias: str) -> None:
        self._call("DELETE", f"models/{model}/aliases/{alias}/")

