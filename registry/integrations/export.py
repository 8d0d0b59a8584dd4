"""Export a model as a Triton model repository: `<model>/config.pbtxt` plus `<model>/<n>/model.onnx`
per chosen version, as a streamed .tar.gz, for teams that move serving onto Triton/KServe while
this console stays the registry. The config is the same document `/v2/models/{m}/config` serves
(serving.dataplane.triton_model_config), written in protobuf text format."""

from __future__ import annotations

import tarfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from registry.errors import InvalidRequest, LifecycleError
from registry.models import ModelVersion, VersionStatus
from registry.selectors import endpoint_get, model_get, ready_versions
from registry.store.artifacts import CHUNK, ArtifactStore, default_store
from serving.dataplane import triton_model_config
from serving.signature import batch_dimension

FORMATS = ("triton",)
KINDS = {"auto": None, "cpu": "KIND_CPU", "gpu": "KIND_GPU"}
_GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
# Fields whose values are protobuf enums: written bare, not quoted.
_ENUM_FIELDS = {"data_type", "kind"}


@dataclass(frozen=True)
class TritonExport:
    model: str
    versions: list[ModelVersion]
    config: dict

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
        versions=[v.number for v in chosen])
    if mbs:
        for tensor in config["input"] + config["output"]:
            if not tensor["dims"]:  # only the batch dim: Triton wants [1] reshaped to []
                tensor["dims"], tensor["reshape"] = [1], {"shape": []}
    return TritonExport(model=model.name, versions=chosen, config=config)


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
    """A Triton config (JSON form, as /config serves it) in protobuf text format. `parameters`
    is a map, which text format writes as repeated {key, value} entries."""
    pad = "  " * indent
    lines: list[str] = []
    for key, value in config.items():
        if key == "parameters" and isinstance(value, dict):
            for k, v in value.items():
                lines.append(f"{pad}parameters {{\n{pad}  key: {_scalar('', k)}\n"
                             f"{pad}  value {{\n{to_pbtxt(v, indent + 2)}{pad}  }}\n{pad}}}")
        elif isinstance(value, dict):
            lines.append(f"{pad}{key} {{\n{to_pbtxt(value, indent + 1)}{pad}}}")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines += [f"{pad}{key} {{\n{to_pbtxt(v, indent + 1)}{pad}}}" for v in value]
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [{', '.join(_scalar(key, v) for v in value)}]")
        else:
            lines.append(f"{pad}{key}: {_scalar(key, value)}")
    return "".join(line + "\n" for line in lines)


class _Gzip:
    """A gzip stream fed in pieces; counts the uncompressed bytes for tar's record padding."""

    def __init__(self) -> None:
        self._z = zlib.compressobj(6, zlib.DEFLATED, 31)
        self.size = 0

    def feed(self, data: bytes) -> bytes:
        self.size += len(data)
        return self._z.compress(data)

    def end(self) -> bytes:
        return self._z.flush()


def _member(name: str, size: int, *, directory: bool = False, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.mtime = int(mtime)
    if directory:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.size, info.mode = size, 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)


def stream_tar_gz(export: TritonExport, store: ArtifactStore | None = None) -> Iterator[bytes]:
    """The repository as .tar.gz chunks, reading each model.onnx in CHUNK pieces: memory stays
    flat whatever the model size."""
    store = store or default_store()
    gz, now, root = _Gzip(), time.time(), export.model
    config = export.pbtxt().encode()

    def file_bytes(name: str, data: bytes) -> bytes:
        return gz.feed(_member(name, len(data), mtime=now) + data
                       + b"\0" * (-len(data) % tarfile.BLOCKSIZE))

    yield gz.feed(_member(f"{root}/", 0, directory=True, mtime=now))
    yield file_bytes(f"{root}/config.pbtxt", config)
    for v in export.versions:
        yield gz.feed(_member(f"{root}/{v.number}/", 0, directory=True, mtime=now))
        yield gz.feed(_member(f"{root}/{v.number}/model.onnx", v.size_bytes, mtime=now))
        sent = 0
        with store.open(v.sha256) as f:
            while chunk := f.read(CHUNK):
                sent += len(chunk)
                out = gz.feed(chunk)
                if out:
                    yield out
        if sent != v.size_bytes:  # the header promised size_bytes; a short file corrupts the tar
            raise OSError(f"artifact of {root}:{v.number} is {sent} bytes, expected "
                          f"{v.size_bytes}")
        yield gz.feed(b"\0" * (-sent % tarfile.BLOCKSIZE))
    tail = b"\0" * (2 * tarfile.BLOCKSIZE)
    tail += b"\0" * (-(gz.size + len(tail)) % tarfile.RECORDSIZE)
    yield gz.feed(tail) + gz.end()
