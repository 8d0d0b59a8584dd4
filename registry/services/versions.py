from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from registry.audit import Actor, record
from registry.choices import GraphOptimizationLevel
from registry.errors import InvalidRequest, LifecycleError, NotFound
from registry.evaluation import clean_lineage, clean_metrics, merge_patch
from registry.models import ModelVersion, VersionStatus
from registry.notify import bump_revision
from registry.services.catalog import lock_model, next_version_number
from registry.store.artifacts import StoredBlob, default_store
from registry.store.gc import lock_blob
from registry.validation import queue_validation
from serving.core.tensor_signature import batch_dimension

#: Serving settings a version's owner may change after upload (int ones with their range).
CONFIG_FIELDS = {
    "max_batch_size": (int, 0, 1 << 16),
    "max_queue_delay_us": (int, 0, 10_000_000),
    "max_queue_size": (int, 1, 1 << 20),
    "instance_count": (int, 1, 16),
    "intra_op_threads": (int, 0, 256),
    "max_output_bytes": (int, 0, 1 << 40),  # 0 = the replica's default (MMC_MAX_OUTPUT_BYTES)
}
#: Serving settings that are on or off.
FLAG_FIELDS = ("response_cache",)
SERVING_FIELDS = (*CONFIG_FIELDS, "preferred_batch_sizes", "graph_optimization_level",
                  *FLAG_FIELDS)
#: Descriptive fields that may change after upload (version_describe), besides serving settings.
DESCRIPTIVE_FIELDS = ("metrics", "lineage")


def version_upload(*, model_name: str, blob: StoredBlob, actor: Actor, filename: str = "",
                   metadata: dict | None = None, metrics: dict | None = None,
                   lineage: dict | None = None) -> tuple[ModelVersion, bool]:
    """Register a stored blob as the model's next version and queue its validation.

    Returns (version, created). The same bytes uploaded again return the existing version, so a
    CI retry never creates a duplicate (its metrics and lineage stay; PATCH changes them).
    """
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be a JSON object", field="metadata")
    metrics = clean_metrics(metrics) if metrics is not None else {}
    lineage = clean_lineage(lineage) if lineage is not None else {}
    with transaction.atomic():
        model = lock_model(model_name)  # serialises numbering per model
        existing = model.versions.filter(sha256=blob.sha256).first()
        if existing is not None:
            return existing, False
        number = next_version_number(model)
        version = ModelVersion.objects.create(
            model=model, number=number, sha256=blob.sha256, size_bytes=blob.size,
            original_filename=(filename or "")[:255], metadata=metadata or {},
            metrics=metrics, lineage=lineage,
            status=VersionStatus.VALIDATING, created_by=actor.user,
            validation_heartbeat_at=timezone.now(),  # queued: the recovery tick's clock starts
        )
        lock_blob(blob.sha256)  # a refused upload of the same bytes may be removing the blob
        if not default_store().exists(blob.sha256):
            raise LifecycleError("the artifact was removed while it was being registered (a "
                                 "refused upload of the same bytes); upload it again",
                                 field="file")
        record(actor, "version.upload", target_type="version", target=str(version),
               model_name=model_name,
               after={"number": number, "sha256": blob.sha256, "size_bytes": blob.size,
                      "filename": version.original_filename, "metrics": metrics,
                      "lineage": lineage})

        queue_validation(version.pk)
    return version, True


def _version_for_update(model_name: str, number: int) -> ModelVersion:
    """The version, row-locked (its model too, so numbering and settings serialise)."""
    model = lock_model(model_name, allow_archived=True)
    try:
        return model.versions.select_for_update().get(number=number)
    except ModelVersion.DoesNotExist:
        raise NotFound(f"model {model_name!r} has no version {number}", field="version") from None


def version_configure(*, model_name: str, number: int, actor: Actor, **changes) -> ModelVersion:
    """Change serving settings of a version (batching, instances, threads, response cache);
    replicas reload it."""
    unknown = set(changes) - set(SERVING_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown setting(s): {', '.join(sorted(unknown))}",
                             field=sorted(unknown)[0])
    with transaction.atomic():
        version = _version_for_update(model_name, number)
        if version.pipeline is not None:
            raise InvalidRequest(f"{model_name}:{number} is a pipeline: its batching and threads "
                                 "are its steps' own; configure the step versions",
                                 field=sorted(changes)[0] if changes else None)
        before = {k: getattr(version, k) for k in changes}
        for key, value in changes.items():
            if key in CONFIG_FIELDS:
                _, lo, hi = CONFIG_FIELDS[key]
                if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                    raise InvalidRequest(f"{key} must be an integer from {lo} to {hi}", field=key)
            elif key == "preferred_batch_sizes":
                if not isinstance(value, list) or not all(
                        isinstance(v, int) and v > 0 for v in value):
                    raise InvalidRequest("preferred_batch_sizes must be a list of positive "
                                         "integers", field=key)
                value = sorted(set(value))
            elif key in FLAG_FIELDS:
                if not isinstance(value, bool):
                    raise InvalidRequest(f"{key} must be true or false", field=key)
            elif value not in GraphOptimizationLevel.values:
                raise InvalidRequest("graph_optimization_level must be "
                                     + ", ".join(GraphOptimizationLevel.values), field=key)
            setattr(version, key, value)
        if version.max_batch_size and version.signature and not batch_dimension(version.signature):
            raise InvalidRequest("max_batch_size > 0 needs a dynamic first dimension on every "
                                 "input", field="max_batch_size")
        version.save()
        record(actor, "version.configure", target_type="version", target=str(version),
               model_name=model_name, before=before,
               after={k: getattr(version, k) for k in changes})
        bump_revision()
    return version


def version_describe(*, model_name: str, number: int, actor: Actor, metrics: dict | None = None,
                     lineage: dict | None = None) -> ModelVersion:
    """Change a version's evaluation metrics and lineage, as a JSON merge patch (a key set to
    null is removed). Serving is untouched: no route revision."""
    if metrics is None and lineage is None:
        raise InvalidRequest("nothing to change: send metrics and/or lineage", field="metrics")
    if metrics is not None and not isinstance(metrics, dict):
        clean_metrics(metrics)  # raises, worded
    if lineage is not None and not isinstance(lineage, dict):
        clean_lineage(lineage)
    with transaction.atomic():
        version = _version_for_update(model_name, number)
        before, after = {}, {}
        if metrics is not None:
            before["metrics"] = version.metrics
            version.metrics = clean_metrics(merge_patch(version.metrics or {}, metrics))
            after["metrics"] = version.metrics
        if lineage is not None:
            before["lineage"] = version.lineage
            version.lineage = clean_lineage(merge_patch(version.lineage or {}, lineage))
            after["lineage"] = version.lineage
        version.save(update_fields=list(after))
        record(actor, "version.describe", target_type="version", target=str(version),
               model_name=model_name, before=before, after=after)
    return version
