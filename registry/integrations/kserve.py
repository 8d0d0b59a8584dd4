"""Export a model for KServe: a ServingRuntime (mmc-serve, or Triton) and an InferenceService that
mirrors the model's endpoint: the stable version, or, during a canary, the candidate with
`canaryTrafficPercent` at its weight (KServe sends the rest to the revision rolled out before,
which `inferenceservice-stable.yaml` makes on a cluster that has none yet).

Storage URIs point at the artifact store: the mmc-serve runtime reads a version's blob where the
store keeps it (`<root>/sha256/<2 hex>/<64 hex>`); Triton needs a model repository, which the
archive carries under `artifacts/` (the Triton export's layout, one per version) for the team to
copy into the store. The registry stays the source of truth: export again after each change."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import yaml
from django.conf import settings

from registry.errors import InvalidRequest, LifecycleError
from registry.integrations.export import (
    TarGzStream,
    TritonExport,
    repository_members,
    triton_export,
)
from registry.models import ModelVersion
from registry.selectors import endpoint_get, model_get
from registry.store.artifacts import ArtifactStore, default_store

RUNTIMES = {"mmc": "mmc-serve", "triton": "mmc-triton"}  # ?runtime= -> ServingRuntime name
PORT = 8080  # KServe's convention for a predictor's HTTP port
_STORAGE_URI = re.compile(r"^(pvc|s3|gs|hdfs|webhdfs|https?)://[^\s/][^\s]*$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# The mmc-serve runtime: KServe puts the artifact at /mnt/models (the file itself when a claim is
# mounted directly, or inside the folder when the storage initializer copied it); mmc-serve wants
# <repository>/<model>/<version>/model.onnx, named by the InferenceService's environment.
MMC_SERVE_SCRIPT = """\
set -e
src=/mnt/models
if [ -d "$src" ]; then src=$(find "$src" -type f ! -name '.*' | head -n 1); fi
dir="/tmp/mmc-repository/$MMC_MODEL_NAME/$MMC_MODEL_VERSION"
mkdir -p "$dir"
ln -sf "$src" "$dir/model.onnx"
exec mmc-serve --model-repository /tmp/mmc-repository --host 0.0.0.0 --port 8080 --workers 1
"""


@dataclass(frozen=True)
class KServeExport:
    model: str
    runtime: str  # a key of RUNTIMES
    stable: ModelVersion
    candidate: ModelVersion | None
    files: dict[str, str]  # file name -> YAML text
    repositories: list[tuple[str, TritonExport]] = field(default_factory=list)  # (prefix, repo)

    @property
    def filename(self) -> str:
        return f"{self.model}-kserve.tar.gz"

    @property
    def versions(self) -> list[ModelVersion]:
        return [v for v in (self.stable, self.candidate) if v is not None]


def clean_storage_uri(raw: str | None) -> str:
    uri = (raw or settings.KSERVE_STORAGE_URI).rstrip("/")
    if not _STORAGE_URI.match(uri):
        raise InvalidRequest("storage_uri must be a URI KServe can fetch: pvc://<claim>[/path], "
                             "s3://, gs://, hdfs://, webhdfs://, http(s)://", field="storage_uri")
    return uri


def service_name(model: str, raw: str | None = None) -> str:
    """The InferenceService's name: the model's, made a DNS-1035 label ('_' and '.' become
    '-'), unless one is given."""
    name = raw or model.replace("_", "-").replace(".", "-")
    if not (_DNS_1035.match(name) and len(name) <= 63):
        raise InvalidRequest(f"{name!r} is not a valid InferenceService name (lowercase letters, "
                             "digits and '-', starting with a letter, at most 63): give one "
                             "with name=", field="name")
    return name


def serving_runtime(runtime: str) -> dict:
    """A namespaced ServingRuntime for ONNX over the v2 protocol. autoSelect off: it serves the
    InferenceServices that name it, never another team's ONNX models by surprise."""
    if runtime == "mmc":
        container = {
            "image": settings.KSERVE_IMAGE, "command": ["sh", "-c"], "args": [MMC_SERVE_SCRIPT],
            "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": PORT}},
        }
        protocols = ["v2"]
    else:  # the image's entrypoint runs the args, as KServe's own Triton runtime does
        container = {
            "image": settings.KSERVE_TRITON_IMAGE,
            "args": ["tritonserver", "--model-store=/mnt/models", "--grpc-port=9000",
                     f"--http-port={PORT}", "--allow-grpc=true", "--allow-http=true"],
        }
        protocols = ["v2", "grpc-v2"]
    container = {"name": "kserve-container", **container,
                 "ports": [{"containerPort": PORT, "protocol": "TCP"}],
                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                               "limits": {"memory": "4Gi"}}}
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": RUNTIMES[runtime],
                     "annotations": {"prometheus.kserve.io/port": str(PORT),
                                     "prometheus.kserve.io/path": "/metrics"}},
        "spec": {"supportedModelFormats": [{"name": "onnx", "version": "1",
                                            "autoSelect": False}],
                 "protocolVersions": protocols, "containers": [container]},
    }


def storage_uri(root: str, runtime: str, model: str, version: ModelVersion) -> str:
    if runtime == "mmc":  # the blob, where the artifact store keeps it
        return f"{root}/sha256/{version.sha256[:2]}/{version.sha256}"
    return f"{root}/{triton_prefix(model, version)}".rstrip("/")


def triton_prefix(model: str, version: ModelVersion) -> str:
    """Where a version's Triton repository goes in the store (and under artifacts/ in the
    archive)."""
    return f"kserve/triton/{model}/{version.number}/"


def inference_service(*, name: str, model: str, runtime: str, root: str, revision: int,
                      stable: ModelVersion, candidate: ModelVersion | None,
                      weight: int) -> dict:
    served = candidate or stable
    spec_model: dict = {
        "modelFormat": {"name": "onnx", "version": "1"},
        "runtime": RUNTIMES[runtime],
        "protocolVersion": "v2",
        "storageUri": storage_uri(root, runtime, model, served),
    }
    if runtime == "mmc":
        spec_model["env"] = [{"name": "MMC_MODEL_NAME", "value": model},
                             {"name": "MMC_MODEL_VERSION", "value": str(served.number)}]
    predictor: dict = {"model": spec_model}
    annotations = {"mmc-model": model, "mmc-stable-version": str(stable.number),
                   "mmc-route-revision": str(revision)}
    if candidate is not None:
        predictor = {"canaryTrafficPercent": weight, **predictor}
        annotations["mmc-candidate-version"] = str(candidate.number)
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"predictor": predictor},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the runtime's script) as literal blocks, as a person writes them."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _yaml(doc: dict, comment: str) -> str:
    lines = "".join(f"# {line}\n" for line in comment.splitlines())
    return lines + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100)


def kserve_export(*, model_name: str, runtime: str = "mmc", storage: str | None = None,
                  name: str | None = None) -> KServeExport:
    """What the endpoint routes now, for KServe. Needs a stable (or live) version."""
    if runtime not in RUNTIMES:
        raise InvalidRequest(f"runtime must be one of {', '.join(RUNTIMES)}", field="runtime")
    root = clean_storage_uri(storage)
    model = model_get(model_name)
    isvc = service_name(model.name, name)
    ep = endpoint_get(model)
    stable = ep.live_version if ep is not None else None
    if stable is None:
        raise LifecycleError(f"model {model.name!r} has no stable version on its endpoint: "
                             "deploy one, then export")
    candidate = ep.candidate if not ep.live_color else None
    weight = ep.candidate_weight if candidate is not None else 0
    common = dict(name=isvc, model=model.name, runtime=runtime, root=root,
                  revision=ep.revision, stable=stable)
    how = (f"Model {model.name!r} from the model management console, route revision "
           f"{ep.revision}.\nExport again after every change in the registry.")
    files = {"servingruntime.yaml": _yaml(serving_runtime(runtime), how)}
    if candidate is not None:
        files["inferenceservice-stable.yaml"] = _yaml(
            inference_service(**common, candidate=None, weight=0),
            f"{how}\nThe stable version alone: apply it first where KServe has no revision of "
            f"{isvc!r} yet,\nthen inferenceservice.yaml (KServe sends the canary's share to "
            "the latest revision,\nthe rest to the one before).")
    files["inferenceservice.yaml"] = _yaml(
        inference_service(**common, candidate=candidate, weight=weight), how)
    repositories = []
    if runtime == "triton":
        for v in (stable, candidate):
            if v is not None:
                repositories.append((f"artifacts/{triton_prefix(model.name, v)}",
                                     triton_export(model_name=model.name, versions=[v.number])))
    return KServeExport(model=model.name, runtime=runtime, stable=stable, candidate=candidate,
                        files=files, repositories=repositories)


def stream_kserve(export: KServeExport, store: ArtifactStore | None = None) -> Iterator[bytes]:
    """`<model>-kserve/` with the YAML files, and for Triton `artifacts/` to copy into the
    store, as .tar.gz chunks."""
    store = store or default_store()
    tar, root = TarGzStream(), f"{export.model}-kserve"
    yield tar.directory(root)
    for filename, text in export.files.items():
        yield tar.file(f"{root}/{filename}", text.encode())
    for prefix, repository in export.repositories:
        yield from repository_members(tar, repository, store, prefix=f"{root}/{prefix}")
    yield tar.end()
