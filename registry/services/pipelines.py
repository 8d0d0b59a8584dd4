"""Pipelines: a version whose artifact is a small graph of other models' versions. Created in one
step (checked here against the registry, so there is nothing to validate later): every step
resolved and pinned to a ready version that may take traffic (the one gate: approved where its
model requires it), every edge checked, the pipeline's own signature derived. The spec is then
stored like any artifact, by sha256, and the version is ready. The gate checks the steps again
whenever the pipeline is given traffic."""

from __future__ import annotations

import json

from django.db import transaction

from registry.audit import Actor, record
from registry.batching import batch_size  # also imported from here (serving_source)
from registry.errors import InvalidRequest, LifecycleError
from registry.evaluation import clean_lineage, clean_metrics
from registry.models import Alias, ModelVersion, RegisteredModel, VersionStatus
from registry.services.catalog import lock_model, next_version_number
from registry.services.gate import admit
from registry.store.artifacts import default_store
from registry.store.gc import lock_blob
from serving.core.pipeline_graph import (
    STEP_NAME,
    Edge,
    PipelineError,
    PipelineGraph,
    Step,
    check_graph,
    parse_end,
)

SPEC_KEYS = {"steps", "edges"}
EXTRA_KEYS = {"metadata", "metrics", "lineage"}
FORMAT = "pipeline"


def _step_version(raw: dict, i: int) -> tuple[Step, ModelVersion, str | None]:
    """One step of the request resolved to a ready version: (step, version, alias used)."""
    field = f"steps[{i}]"
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{field} must be an object with name, model and version (or "
                             "alias)", field="steps")
    unknown = set(raw) - {"name", "model", "version", "alias"}
    if unknown:
        raise InvalidRequest(f"{field}: unknown key(s) {', '.join(sorted(unknown))}",
                             field="steps")
    name = raw.get("name")
    if not isinstance(name, str) or not STEP_NAME.match(name):
        raise InvalidRequest(f"{field}: name must be 1-64 letters, digits, '-' or '_' (no dot)",
                             field="steps")
    what = f"step {name!r}"
    model_name = raw.get("model")
    if not isinstance(model_name, str) or not model_name:
        raise InvalidRequest(f"{what}: model must be a model name", field="steps")
    has_version, has_alias = "version" in raw, "alias" in raw
    if has_version == has_alias:
        raise InvalidRequest(f"{what}: give exactly one of version (a number) or alias",
                             field="steps")
    model = RegisteredModel.objects.filter(name=model_name).first()
    if model is None:
        raise InvalidRequest(f"{what}: unknown model {model_name!r}", field="steps")
    alias = None
    if has_alias:
        alias = raw["alias"]
        found = (Alias.objects.select_related("version").filter(model=model, name=alias).first()
                 if isinstance(alias, str) else None)
        if found is None:
            raise InvalidRequest(f"{what}: model {model_name!r} has no alias {alias!r}",
                                 field="steps")
        version = found.version
    else:
        number = raw["version"]
        if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < 2**31:
            raise InvalidRequest(f"{what}: version must be a version number", field="steps")
        version = model.versions.filter(number=number).first()
        if version is None:
            raise InvalidRequest(f"{what}: model {model_name!r} has no version {number}",
                                 field="steps")
    label = f"{model_name}:{version.number}" + (f" (alias {alias})" if alias else "")
    if version.status != VersionStatus.READY:
        raise InvalidRequest(f"{what}: {label} is {version.status}, not ready", field="steps")
    if version.pipeline is not None:
        raise InvalidRequest(f"{what}: {label} is itself a pipeline; a step must be a model "
                             "version (pipelines do not nest)", field="steps")
    version.model = model
    return Step(name, model_name, str(version.number)), version, alias


def resolve_spec(spec: object) -> tuple[dict, dict, int]:
    """The request's spec checked against the registry: (resolved spec, signature, the
    pipeline's max_batch_size). Raises InvalidRequest naming the bad step or edge."""
    if not isinstance(spec, dict):
        raise InvalidRequest("the pipeline spec must be a JSON object with steps and edges")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise InvalidRequest(f"unknown key(s) {', '.join(sorted(unknown))}: a pipeline spec has "
                             "steps and edges", field=sorted(unknown)[0])
    raw_steps, raw_edges = spec.get("steps"), spec.get("edges")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise InvalidRequest("steps must be a non-empty list", field="steps")
    if not isinstance(raw_edges, list) or not raw_edges:
        raise InvalidRequest("edges must be a non-empty list of {\"from\": …, \"to\": …}",
                             field="edges")
    resolved = [_step_version(raw, i) for i, raw in enumerate(raw_steps)]
    for step, version, _ in resolved:  # approval is a state, not a typo: the gate's 409
        admit(version, role=f"be step {step.name!r} of a pipeline")
    steps = [step for step, _, _ in resolved]
    try:
        edges = []
        for i, raw in enumerate(raw_edges):
            if not isinstance(raw, dict) or set(raw) != {"from", "to"}:
                raise PipelineError(f"edges[{i}] must be an object with exactly from and to",
                                    field="edges")
            edges.append(Edge(parse_end(raw["from"], field=f"edges[{i}].from"),
                              parse_end(raw["to"], field=f"edges[{i}].to")))
        signature = check_graph(steps, edges, {s.name: v.signature for s, v, _ in resolved})
    except PipelineError as exc:
        raise InvalidRequest(exc.message, field="edges" if "edges" in exc.field else exc.field
                             ) from None
    stored = {
        "steps": [{"name": s.name, "model": s.model, "version": v.number,
                   **({"alias": alias} if alias else {})} for s, v, alias in resolved],
        "edges": [{"from": raw["from"], "to": raw["to"]} for raw in raw_edges],
    }
    return stored, signature, batch_size(signature, [v for _, v, _ in resolved])


def graph_of(version: ModelVersion) -> PipelineGraph:
    return PipelineGraph.from_json(version.pipeline)


def pipeline_create(*, model_name: str, spec: object, actor: Actor,
                    metadata: dict | None = None, metrics: dict | None = None,
                    lineage: dict | None = None) -> tuple[ModelVersion, bool]:
    """Register a pipeline as the model's next version, ready at once. The same resolved spec
    again returns the existing version (a CI retry creates nothing)."""
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be a JSON object", field="metadata")
    metrics = clean_metrics(metrics) if metrics is not None else {}
    lineage = clean_lineage(lineage) if lineage is not None else {}
    with transaction.atomic():
        model = lock_model(model_name)  # serialises numbering per model
        stored, signature, max_batch = resolve_spec(spec)
        data = json.dumps(stored, sort_keys=True, separators=(",", ":")).encode()
        blob = default_store().save_bytes(data)
        existing = model.versions.filter(sha256=blob.sha256).first()
        if existing is not None:
            return existing, False
        number = next_version_number(model)
        steps = ", ".join(f"{s['name']}={s['model']}:{s['version']}" for s in stored["steps"])
        version = ModelVersion.objects.create(
            model=model, number=number, sha256=blob.sha256, size_bytes=blob.size,
            format=FORMAT, original_filename="pipeline.json", metadata=metadata or {},
            metrics=metrics, lineage=lineage, signature=signature, pipeline=stored,
            status=VersionStatus.READY, max_batch_size=max_batch, created_by=actor.user,
            validation_report={"pipeline": f"{len(stored['steps'])} step(s) checked: {steps}"},
        )
        lock_blob(blob.sha256)
        if not blob.path.exists():
            raise LifecycleError("the pipeline spec was removed while it was being registered; "
                                 "send it again", field="steps")
        record(actor, "version.pipeline", target_type="version", target=str(version),
               model_name=model_name,
               after={"number": number, "sha256": blob.sha256, "pipeline": stored,
                      "metrics": metrics, "lineage": lineage})
        record(actor, "version.ready", target_type="version", target=str(version),
               model_name=model_name, after={"status": version.status, "reason": "",
                                             "providers": None})
    return version, True
