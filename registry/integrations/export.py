"""Export a model as a Triton model repository: `<model>/config.pbtxt` plus `<model>/<n>/model.onnx`
per chosen version, as a streamed .tar.gz, for teams that move serving onto Triton/KServe while
this console stays the registry. The config is the same document `/v2/models/{m}/config` serves
(serving.core.dataplane.triton_model_config), written in protobuf text format."""

from __future__ import annotations

import tarfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from registry.batching import batch_size
from registry.errors import InvalidRequest, LifecycleError
from registry.models import ModelVersion, VersionStatus
from registry.selectors import endpoint_get, model_get, ready_versions
from registry.store.artifacts import CHUNK, ArtifactStore, default_store
from serving.core.dataplane import triton_ensemble_config, triton_model_config
from serving.core.pipeline_graph import PipelineGraph
from serving.core.tensor_signature import batch_dimension

FORMATS = ("triton", "kserve")  # kserve: registry/integrations/kserve.py
KINDS = {"auto": None, "cpu": "KIND_CPU", "gpu": "KIND_GPU"}
_GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
# Fields whose values are protobuf enums: written bare, not quoted.
_ENUM_FIELDS = {"data_type", "kind"}
# Protobuf map fields: text format writes them as repeated {key, value} entries.
_MAP_FIELDS = {"parameters", "input_map", "output_map"}


@dataclass(frozen=True)
class TritonExport:
    model: str
    versions: list[ModelVersion]
    config: dict
    # A pipeline's export also carries its step models, each a model of the same repository.
    steps: list[TritonExport] = field(default_factory=list)

    @property
    def filename(self) -> str:
        return f"{self.model}-triton.tar.gz"

    def pbtxt(self) -> str:
        return to_pbtxt(self.config)


def parse_versions(raw: str | list | None) -> str | list[int]:
    """`all` (default: every ready version), `stable` (the endpoint's), or numbers `1,2`."""
    if raw is None or raw == "" or raw == "all":
        return "all"
    if raw == "stable":
        return "stable"
    items = raw if isinstance(raw, list) else str(raw).split(",")
    try:
        numbers = sorted({int(str(v).strip()) for v in items if str(v).strip()})
    except ValueError:
        raise InvalidRequest("versions must be 'all', 'stable' or numbers like 1,2",
                             field="versions") from None
    if not numbers or numbers[0] < 1:
        raise InvalidRequest("versions must be positive numbers", field="versions")
    return numbers


def _chosen(model, versions: str | list[int]) -> list[ModelVersion]:
    ready = model.versions.filter(status=VersionStatus.READY)
    if versions == "all":
        chosen = list(ready.order_by("number"))
        if not chosen:
            raise LifecycleError(f"model {model.name!r} has no ready version to export")
        return chosen
    if versions == "stable":
        ep = endpoint_get(model)
        if ep is None or ep.stable is None:
            raise LifecycleError(f"model {model.name!r} has no stable version on its endpoint")
        return [ep.stable]
    return ready_versions(model, versions, field="versions")


def triton_export(*, model_name: str, versions: str | list[int] = "all",
                  kind: str = "auto") -> TritonExport:
    """Choose the versions and build the config. The newest chosen version's signature and
    serving settings make the config; versions whose signatures differ cannot share one."""
    if kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}", field="kind")
    model = model_get(model_name)
    chosen = _chosen(model, versions)
    newest = chosen[-1]
    if any(v.pipeline is not None for v in chosen):
        return _ensemble_export(model.name, chosen, kind)
    for v in chosen:
        if v.signature != newest.signature:
            raise LifecycleError(
                f"versions {v.number} and {newest.number} of {model_name!r} have different "
                f"signatures; one Triton config cannot describe both: export them separately")
    providers = (newest.validation_report or {}).get("providers") or []
    triton_kind = KINDS[kind] or ("KIND_GPU" if providers[:1] and providers[0] in _GPU_PROVIDERS
                                  else "KIND_CPU")
    mbs = newest.max_batch_size if batch_dimension(newest.signature) else 0
    config = triton_model_config(
        name=model.name, signature=newest.signature, max_batch_size=mbs,
        preferred_batch_sizes=newest.preferred_batch_sizes or [],
        max_queue_delay_us=newest.max_queue_delay_us, max_queue_size=newest.max_queue_size,
        instance_count=newest.instance_count, kind=triton_kind,
        versions=[v.number for v in chosen], response_cache=newest.response_cache)
    _reshape_scalars(config, mbs)
    return TritonExport(model=model.name, versions=chosen, config=config)


def _reshape_scalars(config: dict, mbs: int) -> None:
    if mbs:
        for tensor in config["input"] + config["output"]:
            if not tensor["dims"]:  # only the batch dim: Triton wants [1] reshaped to []
                tensor["dims"], tensor["reshape"] = [1], {"shape": []}


def _ensemble_export(model: str, chosen: list[ModelVersion], kind: str) -> TritonExport:
    """A pipeline version as a Triton ensemble, with every step model it runs (their own
    configs and model files, only the versions the pipeline pins) in the same repository."""
    newest = chosen[-1]
    for v in chosen:
        if v.pipeline != newest.pipeline:
            raise LifecycleError(
                f"versions {v.number} and {newest.number} of {model!r} are not the same "
                f"pipeline; one Triton ensemble config describes one: export a single "
                f"version (versions={newest.number})")
    graph = PipelineGraph.from_json(newest.pipeline)
    numbers: dict[str, list[int]] = {}
    for step in graph.steps:
        numbers.setdefault(step.model, []).append(int(step.version))
    if model in numbers:
        raise LifecycleError(f"pipeline {model!r} runs a version of its own model; a Triton "
                             "repository holds one config per model: export the steps apart")
    steps = [triton_export(model_name=m, versions=sorted(set(ns)), kind=kind)
             for m, ns in sorted(numbers.items())]
    step_versions = [v for part in steps for v in part.versions]
    mbs = batch_size(newest.signature, step_versions)
    try:
        config = triton_ensemble_config(name=model, signature=newest.signature,
                                        max_batch_size=mbs, graph=graph,
                                        versions=[v.number for v in chosen])
    except ValueError as exc:
        raise LifecycleError(str(exc)) from None
    _reshape_scalars(config, mbs)
    return TritonExport(model=model, versions=chosen, config=config, steps=steps)


def _scalar(key: str, value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    if key in _ENUM_FIELDS:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_pbtxt(config: dict, indent: int = 0) -> str:
    """A Triton config (JSON form, as /config serves it) in protobuf text format. `parameters`,
    `input_map` and `output_map` are maps, which text format writes as repeated {key, value}
    entries."""
    pad = "  " * indent
    lines: list[str] = []
    for key, value in config.items():
        if key in _MAP_FIELDS and isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, dict):
                    lines.append(f"{pad}{key} {{\n{pad}  key: {_scalar('', k)}\n"
                                 f"{pad}  value {{\n{to_pbtxt(v, indent + 2)}{pad}  }}\n{pad}}}")
                else:
                    lines.append(f"{pad}{key} {{ key: {_scalar('', k)} value: "
                                 f"{_scalar('', v)} }}")
        elif isinstance(value, dict):
            lines.append(f"{pad}{key} {{\n{to_pbtxt(value, indent + 1)}{pad}}}")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines += [f"{pad}{key} {{\n{to_pbtxt(v, indent + 1)}{pad}}}" for v in value]
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [{', '.join(_scalar(key, v) for v in value)}]")
        else:
            lines.append(f"{pad}{key}: {_scalar(key, value)}")
    return "".join(line + "\n" for line in lines)


class TarGzStream:
    """A .tar.gz written in pieces: each method returns the compressed bytes to send next.
    Counts the uncompressed bytes for tar's record padding at the end."""

    def __init__(self) -> None:
        self._z = zlib.compressobj(6, zlib.DEFLATED, 31)
        self.size = 0
        self.mtime = int(time.time())

    def feed(self, data: bytes) -> bytes:
        self.size += len(data)
        return self._z.compress(data)

    def directory(self, name: str) -> bytes:
        info = tarfile.TarInfo(name.rstrip("/") + "/")
        info.mtime, info.type, info.mode = self.mtime, tarfile.DIRTYPE, 0o755
        return self.feed(info.tobuf(format=tarfile.PAX_FORMAT))

    def _header(self, name: str, size: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.mtime, info.size, info.mode = self.mtime, size, 0o644
        return info.tobuf(format=tarfile.PAX_FORMAT)

    def file(self, name: str, data: bytes) -> bytes:
        return self.feed(self._header(name, len(data)) + data
                         + b"\0" * (-len(data) % tarfile.BLOCKSIZE))

    def stored(self, name: str, opened, size: int) -> Iterator[bytes]:
        """A file read in CHUNK pieces from `opened` (a context manager giving a binary file:
        the artifact store's open), so memory stays flat whatever its size; it must be `size`
        bytes, as the header already said."""
        yield self.feed(self._header(name, size))
        sent = 0
        with opened as f:
            while chunk := f.read(CHUNK):
                sent += len(chunk)
                out = self.feed(chunk)
                if out:
                    yield out
        if sent != size:  # a short file would corrupt the tar
            raise OSError(f"{name} is {sent} bytes, expected {size}")
        yield self.feed(b"\0" * (-sent % tarfile.BLOCKSIZE))

    def end(self) -> bytes:
        tail = b"\0" * (2 * tarfile.BLOCKSIZE)
        tail += b"\0" * (-(self.size + len(tail)) % tarfile.RECORDSIZE)
        return self.feed(tail) + self._z.flush()


def repository_members(tar: TarGzStream, export: TritonExport, store: ArtifactStore,
                       prefix: str = "") -> Iterator[bytes]:
    """`<prefix><model>/config.pbtxt` and `<prefix><model>/<n>/model.onnx` per version."""
    root = prefix + export.model
    yield tar.directory(root)
    yield tar.file(f"{root}/config.pbtxt", export.pbtxt().encode())
    for v in export.versions:
        yield tar.directory(f"{root}/{v.number}")
        if v.pipeline is not None:  # Triton's ensembles have no file of their own
            continue
        yield from tar.stored(f"{root}/{v.number}/model.onnx", store.open(v.sha256),
                              v.size_bytes)


def stream_tar_gz(export: TritonExport, store: ArtifactStore | None = None) -> Iterator[bytes]:
    """The repository as .tar.gz chunks (a pipeline's step models beside it), reading each
    model.onnx in pieces: memory stays flat whatever the model size."""
    tar = TarGzStream()
    store = store or default_store()
    for part in [export, *export.steps]:
        yield from repository_members(tar, part, store)
    yield tar.end()
