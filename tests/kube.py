"""Kubernetes documents checked offline: render a kustomization, validate each document against
the Kubernetes API schemas (kubernetes-validate), the Prometheus Operator's ServiceMonitor
(cloudcoil's models, generated from its CRD) and KServe's API (the `kserve` SDK's models).

No cluster is needed. `kubectl kustomize` renders when kubectl is installed; otherwise
`render_simple` applies the few kustomize features our overlays use, the way kustomize does."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import shutil
import subprocess
import sys
import types
from pathlib import Path

import kubernetes_validate
import yaml

# The Kubernetes release the manifests are validated against (the schemas ship with
# kubernetes-validate; 1.35 is the oldest release upstream still supports as we write this).
KUBERNETES_VERSION = "1.35.0"


# -- rendering --------------------------------------------------------------------------------


def load_documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(directory: Path) -> list[dict]:
    """The documents a kustomization folder renders to: kustomize's own answer when kubectl is
    installed, the simple renderer's otherwise."""
    if shutil.which("kubectl"):
        return render_kubectl(directory)
    return render_simple(directory)


def render_kubectl(directory: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render_simple(directory: Path) -> list[dict]:
    """resources (files and folders), namespace, images, replicas and strategic-merge patches
    from files: what our base and overlays use. Anything else is refused, not ignored."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(k) - {"apiVersion", "kind", "resources", "namespace", "images",
                            "replicas", "patches"}
    if unsupported:
        raise ValueError(f"{directory}: render_simple does not do {sorted(unsupported)}")
    docs: list[dict] = []
    for resource in k.get("resources", []):
        path = directory / resource
        docs += render_simple(path) if path.is_dir() else load_documents(path)
    for patch in k.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{directory}: only file patches are supported, not {patch}")
        for p in load_documents(directory / patch["path"]):
            target = _find(docs, p["kind"], p["metadata"]["name"])
            target.update(strategic_merge(target, p))
    for r in k.get("replicas", []):
        _find(docs, "Deployment", r["name"])["spec"]["replicas"] = r["count"]
    for image in k.get("images", []):
        for doc in docs:
            for c in _containers(doc):
                if c["image"].split(":")[0] == image["name"]:
                    name = image.get("newName", image["name"])
                    tag = image.get("newTag") or (c["image"].partition(":")[2] or None)
                    c["image"] = f"{name}:{tag}" if tag else name
    if "namespace" in k:
        for doc in docs:
            doc["metadata"]["namespace"] = k["namespace"]
    return docs


def strategic_merge(base: dict, patch: dict) -> dict:
    """Maps merge key by key; lists of named items (containers, env, volumes) merge by name;
    any other list is replaced: kustomize's strategic merge for the fields our patches touch."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = strategic_merge(old, value)
        elif (isinstance(old, list) and isinstance(value, list)
              and all(isinstance(v, dict) and "name" in v for v in old + value)):
            # kustomize's order: the patch's items first, then the ones it did not name
            before = {v["name"]: v for v in old}
            named = [strategic_merge(before.get(v["name"], {}), v) for v in value]
            out[key] = named + [v for v in old if v["name"] not in {n["name"] for n in value}]
        else:
            out[key] = copy.deepcopy(value)
    return out


def _find(docs: list[dict], kind: str, name: str) -> dict:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise KeyError(f"no {kind} {name}")


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


# -- validation -------------------------------------------------------------------------------


class SchemaError(AssertionError):
    pass


def validate(doc: dict) -> None:
    """Kubernetes kinds against the pinned release's schemas (strict: no unknown field);
    a ServiceMonitor against the Prometheus Operator's; KServe kinds against the SDK."""
    where = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
    if doc.get("apiVersion") == "monitoring.coreos.com/v1":
        validate_service_monitor(doc)
        return
    if str(doc.get("apiVersion", "")).startswith("serving.kserve.io/"):
        kserve_round_trip(doc)
        return
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise SchemaError(f"{where}: {exc.message} at {'.'.join(map(str, exc.path))}") from None


def validate_service_monitor(doc: dict) -> None:
    """cloudcoil's models are generated from the operator's CRD: required fields and types are
    checked by pydantic; it drops unknown fields, so a lossy round trip means one was there."""
    from cloudcoil.models.prometheus_operator import v1

    if doc.get("kind") != "ServiceMonitor":
        raise SchemaError(f"unexpected monitoring.coreos.com kind {doc.get('kind')}")
    try:
        model = v1.ServiceMonitor.model_validate(doc)
    except ValueError as exc:
        raise SchemaError(f"ServiceMonitor: {exc}") from None
    _same(doc, model.model_dump(by_alias=True, exclude_none=True), "ServiceMonitor")


# -- KServe ------------------------------------------------------------------------------------

_PRIMITIVES = {"str": str, "int": int, "float": (int, float), "bool": bool, "object": object,
               "datetime": str, "bytes": str,
               "ResourceQuantity": (str, int, float)}  # "1Gi", 2, 0.5: Kubernetes quantities


def kserve_models():
    """The `kserve` SDK's API models (kserve.models: generated from KServe's OpenAPI, needing
    only kserve.configuration), loaded without `kserve/__init__`: that one starts the model
    server's imports, whose gRPC protos clash with tritonclient's in one process (both define
    `inference.ServerLiveRequest`)."""
    if "kserve" not in sys.modules:
        spec = importlib.util.find_spec("kserve")
        package = types.ModuleType("kserve")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kserve"] = package
    return importlib.import_module("kserve.models")


def _model_class(name: str):
    import kubernetes.client.models

    cls = getattr(kserve_models(), name, None) or getattr(kubernetes.client.models, name, None)
    if cls is None:
        raise SchemaError(f"unknown type {name}")
    return cls


def _container_type(type_name: str) -> tuple[str, str] | None:
    """("list", item type) or ("dict", value type) for the generators' spellings: list[X],
    List[X], dict(str, X), Dict[str, X]."""
    for prefix in ("list[", "List["):
        if type_name.startswith(prefix):
            return "list", type_name[len(prefix):-1]
    for prefix in ("dict(", "Dict["):
        if type_name.startswith(prefix):
            return "dict", type_name[type_name.index(",") + 1:-1].strip()
    return None


def kserve_load(data, type_name: str, path: str = ""):
    """Deserialize into the SDK's models (kserve's, and kubernetes' for the core types they
    embed), refusing any field the model does not define: the SDK's own deserializer drops
    them silently."""
    container = _container_type(type_name)
    if container and container[0] == "list":
        if not isinstance(data, list):
            raise SchemaError(f"{path}: expected a list")
        return [kserve_load(v, container[1], f"{path}[{i}]") for i, v in enumerate(data)]
    if container:
        if not isinstance(data, dict):
            raise SchemaError(f"{path}: expected a map")
        return {k: kserve_load(v, container[1], f"{path}.{k}") for k, v in data.items()}
    if type_name in _PRIMITIVES:
        if not isinstance(data, _PRIMITIVES[type_name]) or (
                type_name in ("int", "float") and isinstance(data, bool)):
            raise SchemaError(f"{path}: expected {type_name}, got {data!r}")
        return data
    cls = _model_class(type_name)
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: expected a {type_name} object")
    by_json = {j: a for a, j in cls.attribute_map.items()}
    unknown = sorted(set(data) - set(by_json))
    if unknown:
        raise SchemaError(f"{path or type_name}: unknown field(s) {unknown} for {type_name}")
    kwargs = {by_json[k]: kserve_load(v, cls.openapi_types[by_json[k]], f"{path}.{k}")
              for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:  # required fields, enums (pydantic's errors are ValueErrors)
        raise SchemaError(f"{path or type_name}: {exc}") from None


KSERVE_KINDS = {("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
                ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
                ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"):
                    "V1alpha1ClusterServingRuntime"}


def kserve_dump(obj):
    """A model back to JSON by its attribute map (kserve's generated models predate the
    pydantic ones kubernetes' client now has; both carry the map)."""
    if isinstance(obj, list):
        return [kserve_dump(v) for v in obj]
    if isinstance(obj, dict):
        return {k: kserve_dump(v) for k, v in obj.items()}
    if hasattr(obj, "attribute_map"):
        return {j: kserve_dump(getattr(obj, a)) for a, j in obj.attribute_map.items()
                if getattr(obj, a) is not None}
    return obj


def kserve_round_trip(doc: dict):
    """The document as the SDK's model, and back to the same JSON."""
    type_name = KSERVE_KINDS.get((doc.get("apiVersion"), doc.get("kind")))
    if type_name is None:
        raise SchemaError(f"not a KServe kind we know: {doc.get('apiVersion')} {doc.get('kind')}")
    model = kserve_load(doc, type_name)
    _same(doc, kserve_dump(model), doc["kind"])
    return model


def _same(expected, got, path: str) -> None:
    """Equal, or a SchemaError naming the first place they differ."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            if key not in got:
                raise SchemaError(f"{path}.{key}: not in the schema (dropped on the round trip)")
            if key not in expected and got[key] != "":  # "": a default the SDK fills in
                raise SchemaError(f"{path}.{key}: appeared on the round trip")
            if key in expected:
                _same(expected[key], got[key], f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for i, (a, b) in enumerate(zip(expected, got, strict=True)):
            _same(a, b, f"{path}[{i}]")
    elif expected != got:
        raise SchemaError(f"{path}: {expected!r} came back as {got!r}")
